"""Who the tests are: the run's throwaway secrets, tokens for a role, ids no other test uses."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from datetime import timedelta

from reservo.core.http.auth import mint_token
from reservo.core.kernel.clock import OffsetClock, SystemClock

# Throwaway secrets of this test run (a deployment must set its own: settings.py).
JWT_SECRET = "test-secret-for-reservo-tests-0123456789"
PAY_SECRET = "test-payments-webhook-secret-0123456789"
RESULTS_SECRET = "test-results-webhook-secret-0123456789"


def token(role: str, sub: int, ttl_s: int = 3600, secret: str = JWT_SECRET) -> str:
    return mint_token(secret, role, sub, timedelta(seconds=ttl_s), SystemClock().now())


def auth(role: str, sub: int) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(role, sub)}"}


_ids = iter(range(10_000_000 + os.getpid() * 1000, 2**62))


def new_id() -> int:
    """A user id no other test uses (tests are independent of each other's data)."""
    return next(_ids)


ADMIN = auth("admin", 1)
SERVICE = auth("service", 1)


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def forge_token(
    payload: str | bytes,
    header: str | bytes = '{"alg":"HS256","typ":"JWT"}',
    secret: str = JWT_SECRET,
) -> str:
    """An HS256 JWT over exactly these header/payload bytes, correctly signed: for
    claims no JSON encoder writes (NaN, Infinity, odd types) or odd headers."""
    head = header.encode() if isinstance(header, str) else header
    body = payload.encode() if isinstance(payload, str) else payload
    signing_input = f"{_b64url(head)}.{_b64url(body)}"
    mac = hmac.new(secret.encode(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64url(mac)}"


def auth_at(clock: OffsetClock, role: str, sub: int) -> dict[str, str]:
    """A token valid by the app's clock (which tests move forward)."""
    return {
        "Authorization": "Bearer "
        + mint_token(JWT_SECRET, role, sub, timedelta(hours=1), clock.now())
    }
