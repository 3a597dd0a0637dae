"""A user's Web Push subscriptions and the rules one must meet to be stored.

The endpoint is a URL a user gives us that the service calls later from inside
the network: it obeys the egress rules of ``http`` jobs
(RESERVO_JOBS_HTTP_ALLOW), checked here (no DNS: a host written as an address)
and again, on every address the name resolves to, at each send (push.py)."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric import ec

from reservo.scheduler import egress

MAX_SUBSCRIPTIONS = 5
MAX_ENDPOINT = 2048
_B64URL = re.compile(r"^[A-Za-z0-9_-]+={0,2}$")
_P256_POINT = 65  # an uncompressed point: 0x04, x, y
_AUTH_SECRET = 16


@dataclass(frozen=True)
class PushSubscription:
    """The browser Push API's subscription (``PushSubscription.toJSON()``): the
    push service's endpoint, the browser's P-256 ECDH public key (``p256dh``) and
    its 16-byte auth secret, both base64url as the browser gives them."""

    endpoint: str
    p256dh: str
    auth: str


def b64url_bytes(text: str) -> bytes:
    """Base64url with or without padding; raises ValueError otherwise."""
    if not _B64URL.match(text):
        raise ValueError("not base64url")
    try:
        return base64.urlsafe_b64decode(text.rstrip("=") + "=" * (-len(text.rstrip("=")) % 4))
    except binascii.Error as exc:
        raise ValueError("not base64url") from exc


def keys_problem(p256dh: str, auth: str) -> str | None:
    """Why the keys are refused, or None: base64url, ``p256dh`` a point on P-256
    (uncompressed, 65 bytes), ``auth`` 16 bytes (RFC 8291)."""
    try:
        point = b64url_bytes(p256dh)
    except ValueError:
        return "keys.p256dh is not base64url"
    if len(point) != _P256_POINT:
        return f"keys.p256dh must be a {_P256_POINT}-byte uncompressed P-256 point"
    try:
        ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point)
    except ValueError:
        return "keys.p256dh is not a point on the P-256 curve"
    try:
        secret = b64url_bytes(auth)
    except ValueError:
        return "keys.auth is not base64url"
    if len(secret) != _AUTH_SECRET:
        return f"keys.auth must be {_AUTH_SECRET} bytes"
    return None


def endpoint_problem(allow: egress.AllowList, endpoint: str) -> str | None:
    """Why the endpoint is refused, or None: https (plain http only to a
    destination RESERVO_JOBS_HTTP_ALLOW lists: a test's or a lab's own push
    service) and nothing the egress rules refuse without DNS."""
    if len(endpoint) > MAX_ENDPOINT:
        return f"endpoint is longer than {MAX_ENDPOINT} characters"
    try:
        target = egress.parse_target(endpoint)
    except ValueError as exc:
        return f"endpoint is refused: {exc}"
    if target.url.scheme != "https" and not _allowed(allow, target):
        return "endpoint must be an https URL"
    why = egress.static_refusal(allow, endpoint)
    if why is not None:
        return (
            f"endpoint is refused: {why} (operators allow destinations with "
            "RESERVO_JOBS_HTTP_ALLOW)"
        )
    return None


def _allowed(allow: egress.AllowList, target: egress.Target) -> bool:
    if allow.allows_host(target.host, target.port):
        return True
    ip = egress.literal_address(target.host)
    return ip is not None and allow.allows_address(ip, target.port)
