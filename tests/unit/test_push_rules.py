"""The pure rules of Web Push: what a subscription must be to be stored, and the
VAPID key and subject a deployment must give (checked at start-up)."""

from __future__ import annotations

import httpx
import pytest

from reservo.notifications.push import PushChannel, load_vapid, origin
from reservo.notifications.subscriptions import endpoint_problem, keys_problem
from reservo.scheduler import AllowList, parse_allow
from tests.helpers.push import SUBJECT, Browser, VapidKeys, b64url


def test_a_browsers_keys_pass_and_malformed_ones_say_why() -> None:
    browser = Browser()
    assert keys_problem(browser.p256dh, b64url(browser.auth)) is None
    assert keys_problem(browser.p256dh + "==", b64url(browser.auth)) is None  # padded
    assert "base64url" in (keys_problem("a+b/", b64url(browser.auth)) or "")
    assert "65-byte" in (keys_problem(b64url(b"\x04" * 33), b64url(browser.auth)) or "")
    assert "curve" in (keys_problem(b64url(b"\x04" + b"\x00" * 64), b64url(browser.auth)) or "")
    assert "16 bytes" in (keys_problem(browser.p256dh, b64url(b"x" * 15)) or "")


@pytest.mark.parametrize(
    ("endpoint", "allow", "refused"),
    [
        ("https://fcm.googleapis.com/fcm/send/abc", "", False),
        ("https://updates.push.services.mozilla.com/wpush/v2/abc", "", False),
        ("http://fcm.googleapis.com/fcm/send/abc", "", True),  # not https
        ("https://127.0.0.1/x", "", True),
        ("https://10.1.2.3/x", "", True),
        ("https://[::ffff:169.254.169.254]/x", "", True),
        ("https://user:pw@fcm.googleapis.com/x", "", True),
        ("http://127.0.0.1:8080/push", "127.0.0.1:8080", False),  # allowed: http too
        ("http://127.0.0.1:8081/push", "127.0.0.1:8080", True),  # another port
        ("http://push.lab:8080/push", "push.lab:8080", False),
        ("https://x" + "y" * 2048, "", True),
    ],
)
def test_endpoints_follow_the_egress_rules(endpoint: str, allow: str, refused: bool) -> None:
    assert (endpoint_problem(parse_allow(allow), endpoint) is not None) is refused


def test_the_vapid_key_as_vapid_gen_writes_it_or_raw() -> None:
    keys = VapidKeys.generate()
    assert load_vapid(keys.private_pem).public_key is not None
    raw = load_vapid(keys.private_pem).private_key.private_numbers().private_value
    assert load_vapid(b64url(raw.to_bytes(32, "big"))).public_key is not None
    with pytest.raises(ValueError, match="RESERVO_PUSH_VAPID_PRIVATE_KEY"):
        load_vapid("not a key")


def test_a_subject_is_mailto_or_https() -> None:
    keys = VapidKeys.generate()
    with pytest.raises(ValueError, match="RESERVO_PUSH_VAPID_SUBJECT"):
        PushChannel(keys.private_pem, "ops@example.com", AllowList())
    assert PushChannel(keys.private_pem, SUBJECT, AllowList()).subject == SUBJECT


def test_the_audience_is_the_push_services_origin() -> None:
    assert origin(httpx.URL("https://fcm.googleapis.com/fcm/send/abc")) == (
        "https://fcm.googleapis.com"
    )
    assert origin(httpx.URL("https://push.example:8443/a")) == "https://push.example:8443"
    assert origin(httpx.URL("http://127.0.0.1:80/a")) == "http://127.0.0.1"
