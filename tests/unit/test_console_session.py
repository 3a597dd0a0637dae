"""The console's session cookie and CSRF values (pure: no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from reservo.console.session import Sessions, csrf_matches
from reservo.core.http.auth import Principal

SECRET = "console-test-secret-0123456789abcdef"
NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
ADMIN = Principal(sub=7, role="admin")


def sessions(lifetime_s: int = 3600) -> Sessions:
    return Sessions(SECRET, lifetime_s, secure=False)


def test_a_session_reads_back_until_it_expires() -> None:
    s = sessions()
    cookie, session = s.open(ADMIN, NOW.timestamp() + 86_400, NOW)
    assert s.read(cookie, NOW) == session
    assert session.sub == 7
    assert session.expires == int(NOW.timestamp()) + 3600
    assert s.read(cookie, NOW + timedelta(seconds=3599)) == session
    assert s.read(cookie, NOW + timedelta(seconds=3600)) is None


def test_a_session_never_outlives_the_token() -> None:
    cookie, session = sessions().open(ADMIN, NOW.timestamp() + 60.9, NOW)
    assert session.expires == int(NOW.timestamp()) + 60
    assert sessions().read(cookie, NOW + timedelta(seconds=61)) is None


def test_the_cookie_carries_neither_the_secret_nor_a_usable_signature_elsewhere() -> None:
    cookie, _ = sessions().open(ADMIN, NOW.timestamp() + 600, NOW)
    assert SECRET not in cookie
    # Signed with a key derived from another secret: refused.
    assert Sessions("another-secret-0123456789abcdef", 3600, secure=False).read(cookie, NOW) is None


def test_a_tampered_or_foreign_cookie_is_no_session() -> None:
    s = sessions()
    cookie, _ = s.open(ADMIN, NOW.timestamp() + 600, NOW)
    payload, _, signature = cookie.rpartition(".")
    assert s.read(payload + "." + signature[::-1], NOW) is None
    assert s.read("", NOW) is None
    assert s.read(None, NOW) is None
    assert s.read("not.a.cookie", NOW) is None
    # The sign-in form's value is signed for another purpose: not a session.
    form_cookie, _ = s.sign_in_token()
    assert s.read(form_cookie, NOW) is None


def test_csrf_values_are_per_session_and_compared_exactly() -> None:
    s = sessions()
    _, one = s.open(ADMIN, NOW.timestamp() + 600, NOW)
    _, two = s.open(ADMIN, NOW.timestamp() + 600, NOW)
    assert one.csrf != two.csrf and len(one.csrf) >= 40
    assert csrf_matches(one, one.csrf)
    assert not csrf_matches(one, two.csrf)
    assert not csrf_matches(one, None)
    assert not csrf_matches(one, "")


def test_the_sign_in_form_value_must_match_its_cookie() -> None:
    s = sessions()
    cookie, nonce = s.sign_in_token()
    assert s.sign_in_matches(cookie, nonce)
    _, other_nonce = s.sign_in_token()
    assert not s.sign_in_matches(cookie, other_nonce)
    assert not s.sign_in_matches(None, nonce)
    assert not s.sign_in_matches(cookie, None)
    assert not s.sign_in_matches("forged." + cookie, nonce)
