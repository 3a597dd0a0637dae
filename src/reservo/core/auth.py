"""Who is calling: JWT bearer tokens (roles, owner rules) and signed webhooks."""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

import jwt

from reservo.core.errors import DomainError

Role = Literal["admin", "doctor", "patient", "customer", "host", "bettor", "service"]
ROLES: frozenset[str] = frozenset(
    {"admin", "doctor", "patient", "customer", "host", "bettor", "service"}
)


@dataclass(frozen=True)
class Principal:
    sub: int
    role: str

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def require(self, *roles: str) -> None:
        """Admin may do everything; otherwise the role must be listed."""
        if not self.is_admin and self.role not in roles:
            raise DomainError("forbidden", "this role may not do that", status=403)

    def require_owner(self, role: str, owner_id: int) -> None:
        """Admin, or ``role`` acting for itself (``owner_id == sub``)."""
        if self.is_admin:
            return
        if self.role != role or self.sub != owner_id:
            raise DomainError("forbidden", "you may only act for yourself", status=403)


def unauthenticated(detail: str) -> DomainError:
    return DomainError(
        "unauthenticated", detail, status=401, headers={"WWW-Authenticate": "Bearer"}
    )


def mint_token(secret: str, role: str, sub: int, ttl: timedelta, now: datetime) -> str:
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; one of {sorted(ROLES)}")
    exp = now + ttl
    return jwt.encode(
        {"sub": str(sub), "role": role, "exp": int(exp.timestamp())}, secret, algorithm="HS256"
    )


def decode_token(secret: str, authorization: str | None, now: datetime) -> Principal:
    if not authorization:
        raise unauthenticated("missing bearer token")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthenticated("expected 'Authorization: Bearer <token>'")
    try:
        # Expiry is checked against the injected clock, not the library's.
        claims = jwt.decode(
            token.strip(),
            secret,
            algorithms=["HS256"],
            options={"verify_exp": False, "require": ["sub", "role", "exp"]},
        )
    except jwt.PyJWTError as exc:
        raise unauthenticated(f"invalid token: {exc}") from exc
    exp = claims.get("exp")
    if not isinstance(exp, int | float) or exp <= now.timestamp():
        raise unauthenticated("token expired")
    role, sub = claims.get("role"), claims.get("sub")
    if role not in ROLES or not isinstance(sub, str) or not sub.isdigit():
        raise unauthenticated("token has an unknown role or a non-numeric sub")
    return Principal(sub=int(sub), role=role)


def sign_webhook(secret: str, body: bytes, t: int | None = None) -> str:
    """The X-Signature header value for ``body`` (used by tests and the sandbox gateway)."""
    t = int(time.time()) if t is None else t
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def verify_webhook(
    secret: str, header: str | None, body: bytes, now: datetime, tolerance_s: int = 300
) -> None:
    bad = DomainError("bad_signature", "missing or invalid X-Signature", status=401)
    if not header:
        raise bad
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    t, v1 = parts.get("t", ""), parts.get("v1", "")
    if not t.isdigit() or not v1:
        raise bad
    if abs(now.timestamp() - int(t)) > tolerance_s:
        raise DomainError("bad_signature", "signature timestamp outside tolerance", status=401)
    expected = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, v1.strip()):
        raise bad
