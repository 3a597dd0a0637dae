"""The console's session cookie and its CSRF tokens.

There are no passwords in reservo: an admin proves who they are with an admin
JWT, pasted once into the sign-in form and verified by the same checks as every
API request. The console then issues its own cookie: a signed (not encrypted)
payload ``{sub, exp, csrf, sid}``, ``HttpOnly`` and ``SameSite=Strict``, expiring no
later than the token did. The signing key is derived from the JWT secret with
HMAC, so the secret never leaves the server, a cookie is no JWT and a JWT is no
cookie. The payload's ``csrf`` value is the token every form (and every htmx
request, as a header) must carry back.

Each session has a random id (``sid``, in the cookie). Signing out records that
id as revoked in PostgreSQL until the session's expiry (``web.py``), and every
console request refuses a revoked session: a copy of a signed-out cookie is
worth nothing. The lifetime is still kept short (``RESERVO_CONSOLE_SESSION_S``).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from itsdangerous import BadSignature, URLSafeSerializer

from reservo.core.http.auth import Principal

COOKIE = "reservo_console"
# Holds the sign-in form's own CSRF value until the admin signs in.
SIGN_IN_COOKIE = "reservo_console_sign_in"
PATH = "/console"
SIGN_IN_TTL_S = 3600


@dataclass(frozen=True)
class Session:
    sub: int
    expires: int  # Unix seconds
    csrf: str
    id: str  # what signing out revokes


def _key(jwt_secret: str) -> str:
    return hmac.new(jwt_secret.encode(), b"reservo console cookies", hashlib.sha256).hexdigest()


class Sessions:
    def __init__(self, jwt_secret: str, lifetime_s: int, *, secure: bool) -> None:
        key = _key(jwt_secret)
        self._session = URLSafeSerializer(key, salt="reservo-console-session")
        self._sign_in = URLSafeSerializer(key, salt="reservo-console-sign-in")
        self.lifetime_s = lifetime_s
        self.secure = secure

    def cookie_options(self, max_age: int) -> dict[str, Any]:
        return {
            "max_age": max_age,
            "path": PATH,
            "httponly": True,
            "samesite": "strict",
            "secure": self.secure,
        }

    # -- the session ---------------------------------------------------------------

    def open(self, principal: Principal, token_exp: float, now: datetime) -> tuple[str, Session]:
        """A new session for a verified admin: (cookie value, session)."""
        expires = min(math.floor(token_exp), int(now.timestamp()) + self.lifetime_s)
        session = Session(
            principal.sub, expires, secrets.token_urlsafe(32), secrets.token_urlsafe(18)
        )
        value = self._session.dumps(
            {"sub": session.sub, "exp": expires, "csrf": session.csrf, "sid": session.id}
        )
        return value, session

    def read(self, cookie: str | None, now: datetime) -> Session | None:
        """The session a cookie carries, or None (absent, forged or expired)."""
        if not cookie:
            return None
        try:
            data = self._session.loads(cookie)
        except BadSignature:
            return None
        if not isinstance(data, dict):
            return None
        sub, exp, csrf, sid = data.get("sub"), data.get("exp"), data.get("csrf"), data.get("sid")
        if not (isinstance(sub, int) and isinstance(exp, int) and isinstance(csrf, str)):
            return None
        # A cookie without an id (issued before sign-out revoked sessions) could
        # never be signed out: it is refused, and its admin signs in again.
        if not isinstance(sid, str) or not sid or len(sid) > 64:
            return None
        if exp <= now.timestamp():
            return None
        return Session(sub, exp, csrf, sid)

    # -- the sign-in form's CSRF value (double submit, before any session) ---------

    def sign_in_token(self) -> tuple[str, str]:
        """(cookie value, form value) for a fresh sign-in form."""
        nonce = secrets.token_urlsafe(32)
        return self._sign_in.dumps(nonce), nonce

    def sign_in_matches(self, cookie: str | None, sent: str | None) -> bool:
        if not cookie or not sent:
            return False
        try:
            nonce = self._sign_in.loads(cookie)
        except BadSignature:
            return False
        return isinstance(nonce, str) and hmac.compare_digest(nonce, sent)


def csrf_matches(session: Session, sent: str | None) -> bool:
    return sent is not None and hmac.compare_digest(session.csrf.encode(), sent.encode())
