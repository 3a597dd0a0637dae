"""Who is calling: JWT bearer tokens (roles, owner rules) and signed webhooks."""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import jwt

from reservo.core.errors import DomainError

Role = Literal["admin", "doctor", "patient", "customer", "host", "bettor", "service"]
ROLES: frozenset[str] = frozenset(
    {"admin", "doctor", "patient", "customer", "host", "bettor", "service"}
)
# User ids are PostgreSQL bigints from 1 up; 0 and below belong to no user, so no
# token may carry them (system accounts have no owner at all).
MAX_SUB = 2**63 - 1
# One spelling per id: ASCII digits, no sign, no leading zero. str.isdigit()/int()
# also take "01", U+0660 (Arabic-Indic zero) or U+FF11 (fullwidth one), which
# would alias other users.
_SUB = re.compile(r"[1-9][0-9]*", re.ASCII)
# X-Signature parts: a Unix time (12 digits reach the year 33658) and a SHA-256 hex MAC.
_SIG_T = re.compile(r"[0-9]{1,12}", re.ASCII)
_SIG_V1 = re.compile(r"[0-9a-f]{64}", re.ASCII)


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
            raise DomainError("forbidden", "this role may not do that")

    def require_owner(self, role: str, owner_id: int) -> None:
        """Admin, or ``role`` acting for itself (``owner_id == sub``)."""
        if self.is_admin:
            return
        if self.role != role or self.sub != owner_id:
            raise DomainError("forbidden", "you may only act for yourself")


def unauthenticated(detail: str) -> DomainError:
    return DomainError("unauthenticated", detail, headers={"WWW-Authenticate": "Bearer"})


def mint_token(secret: str, role: str, sub: int, ttl: timedelta, now: datetime) -> str:
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; one of {sorted(ROLES)}")
    if not 1 <= sub <= MAX_SUB:
        raise ValueError(f"sub must be a user id in [1, {MAX_SUB}]")
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
    except Exception as exc:
        # The token is untrusted input: whatever the parser trips on (OverflowError,
        # ValueError, TypeError, RecursionError on odd headers or claims) is a
        # refusal, never a 500.
        raise unauthenticated("invalid token") from exc
    return _principal(claims, now)


def _principal(claims: dict[str, Any], now: datetime) -> Principal:
    """The caller named by verified claims; every claim is checked by type and
    shape, since JSON can put lists, objects, NaN or huge numbers anywhere."""
    exp: Any = claims.get("exp")
    # bool is an int; NaN compares False to everything, so it would never expire.
    # (No isfinite() on ints: a huge one overflows the float conversion.)
    finite = isinstance(exp, int) or (isinstance(exp, float) and math.isfinite(exp))
    if isinstance(exp, bool) or not finite:
        raise unauthenticated("token has an invalid exp")
    if exp <= now.timestamp():
        raise unauthenticated("token expired")
    role, sub = claims.get("role"), claims.get("sub")
    if not isinstance(role, str) or role not in ROLES:
        raise unauthenticated("token has an unknown role")
    # Length first: int() of thousands of digits raises instead of answering.
    if not isinstance(sub, str) or len(sub) > 19 or not _SUB.fullmatch(sub) or int(sub) > MAX_SUB:
        raise unauthenticated("token sub must be a user id in [1, 2^63-1]")
    return Principal(sub=int(sub), role=role)


def sign_webhook(secret: str, body: bytes, t: int | None = None) -> str:
    """The X-Signature header value for ``body`` (used by tests and the sandbox gateway)."""
    t = int(time.time()) if t is None else t
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def parse_signature(header: str | None) -> tuple[str, str]:
    """(t, v1) of an ``X-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>`` header.

    Strict on purpose: the header is attacker-controlled, and a lenient parse
    (int() of hundreds of digits, Unicode digits, non-ASCII MACs) raised instead
    of refusing. Unknown parts are ignored; t and v1 must appear exactly once."""
    bad = DomainError("bad_signature", "missing or invalid X-Signature")
    if not header:
        raise bad
    seen: dict[str, str] = {}
    for part in header.split(","):
        name, sep, value = part.partition("=")
        name = name.strip(" \t")
        if not sep or name not in ("t", "v1"):
            continue
        if name in seen:
            raise bad
        seen[name] = value.strip(" \t")
    t, v1 = seen.get("t", ""), seen.get("v1", "")
    if not _SIG_T.fullmatch(t) or not _SIG_V1.fullmatch(v1):
        raise bad
    return t, v1


def verify_webhook(
    secret: str, header: str | None, body: bytes, now: datetime, tolerance_s: int = 300
) -> None:
    t, v1 = parse_signature(header)
    # The MAC covers t as sent (leading zeros included), so t stays text here.
    if abs(now.timestamp() - int(t)) > tolerance_s:
        raise DomainError("bad_signature", "signature timestamp outside tolerance")
    expected = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode("ascii"), v1.encode("ascii")):
        raise DomainError("bad_signature", "missing or invalid X-Signature")
