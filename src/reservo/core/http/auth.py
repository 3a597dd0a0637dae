"""Who is calling: JWT bearer tokens (roles, owner rules) and signed webhooks."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

import jwt
from jwt.algorithms import HMACAlgorithm
from jwt.utils import base64url_decode

from reservo.core.http.schemas import MAX_ID
from reservo.core.kernel.errors import DomainError

Role = Literal["admin", "doctor", "patient", "customer", "host", "bettor", "service"]
ROLES: frozenset[str] = frozenset(
    {"admin", "doctor", "patient", "customer", "host", "bettor", "service"}
)
# User ids are PostgreSQL bigints from 1 up; 0 and below belong to no user, so no
# token may carry them (system accounts have no owner at all).
MAX_SUB = MAX_ID
# One spelling per id: ASCII digits, no sign, no leading zero. str.isdigit()/int()
# also take "01", U+0660 (Arabic-Indic zero) or U+FF11 (fullwidth one), which
# would alias other users.
_SUB = re.compile(r"[1-9][0-9]*", re.ASCII)
# X-Signature parts: a Unix time (12 digits reach the year 33658) and a SHA-256 hex MAC.
_SIG_T = re.compile(r"[0-9]{1,12}", re.ASCII)
_SIG_V1 = re.compile(r"[0-9a-f]{64}", re.ASCII)
# The longest a token may be valid, counted from its iat (or from now when it has
# none): a leaked token must not open the API for years. RESERVO_JWT_MAX_LIFETIME_S.
DEFAULT_MAX_LIFETIME_S = 24 * 3600
# A JWT segment's alphabet (RFC 7515: base64url without padding).
_B64URL = re.compile(rb"[A-Za-z0-9_-]*")


@dataclass(frozen=True)
class Principal:
    sub: int
    role: str

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def key_owner(self) -> str:
        """Whose Idempotency-Keys these are: the user (``sub``), whatever role the
        token carries. A user acting under two roles is one caller, so one key
        can never take effect twice through a change of role."""
        return str(self.sub)

    def require(self, *roles: str) -> None:
        """Admin may do everything; otherwise the role must be listed."""
        if not self.is_admin and self.role not in roles:
            raise DomainError("forbidden", "this role may not do that")

    def owns(self, role: str, owner_id: int | None) -> bool:
        """Admin, or ``role`` acting for itself (``owner_id == sub``)."""
        return self.is_admin or (self.role == role and self.sub == owner_id)

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


def bearer(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, or a 401."""
    if not authorization:
        raise unauthenticated("missing bearer token")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthenticated("expected 'Authorization: Bearer <token>'")
    return token.strip()


# The header every token minted here carries ({"alg":"HS256","typ":"JWT"}, as
# PyJWT encodes it), base64url: a token that starts with it needs no header parse.
_MINTED_HEADER = b"eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
_MINTED_PREFIX = _MINTED_HEADER.decode("ascii") + "."
_MINTED_CLAIMS = frozenset(("sub", "role", "exp"))


def _canonical(segment: bytes) -> bytes | None:
    """The bytes a JWT segment encodes when it is canonical base64url, else None.

    PyJWT's decoder pads the segment and decodes leniently: it takes ``=``
    padding, skips characters outside the alphabet and ignores non-zero trailing
    bits, so one signature had many spellings (each a distinct token, a distinct
    cache entry, and a token that is not the one that was issued). Only the one
    spelling an encoder writes is accepted: the alphabet, no padding, and the
    text the decoded bytes encode back to."""
    if not _B64URL.fullmatch(segment):
        return None
    try:
        raw = base64url_decode(segment)
    except ValueError:  # binascii.Error: a length no byte string encodes to
        return None
    if base64.urlsafe_b64encode(raw).rstrip(b"=") != segment:
        return None
    return raw


def _segments(token: str) -> tuple[bytes, bytes, bytes] | None:
    """(signing input, payload, signature) of a token of exactly three canonical
    base64url segments (the header's is checked, PyJWT parses it), else None."""
    try:
        raw = token.encode("utf-8")
    except UnicodeEncodeError:
        return None
    parts = raw.split(b".")
    if len(parts) != 3:
        return None
    decoded = [_canonical(part) for part in parts]
    if decoded[0] is None or decoded[1] is None or decoded[2] is None:
        return None
    return raw[: raw.rindex(b".")], decoded[1], decoded[2]


def _minted_claims(key: bytes, token: str) -> dict[str, Any] | None:
    """The claims of a valid token of exactly the shape ``mint_token`` writes (that
    header; claims sub, role and exp, none null, sub a string), checked as PyJWT
    checks it: the same signing input, HMAC-SHA256 and JSON parser, the segments
    canonical as ``_segments`` demands, and for these claims PyJWT's claim checks
    all pass. None for anything else (another shape, a bad signature, a parse
    error): PyJWT then decides, so every refusal and every other shape is exactly
    PyJWT's answer. About 7x cheaper than ``jwt.decode``, whose option handling
    dominates.

    The header is that one fixed canonical text, so it is compared, not decoded.
    The signature is compared as text with the canonical encoding of the expected
    MAC: a segment is canonical and decodes to the MAC exactly when it is that
    text (which holds no dot, so the token has three segments)."""
    if not token.startswith(_MINTED_PREFIX):
        return None
    try:
        raw = token.encode("ascii")  # a canonical segment is ASCII
    except UnicodeEncodeError:
        return None
    dot = raw.find(b".", len(_MINTED_PREFIX))
    if dot < 0:
        return None
    signing_input, signature = raw[:dot], raw[dot + 1 :]
    expected = base64.urlsafe_b64encode(hmac.digest(key, signing_input, "sha256")).rstrip(b"=")
    if not hmac.compare_digest(signature, expected):
        return None
    payload = _canonical(raw[len(_MINTED_PREFIX) : dot])
    if payload is None:
        return None
    try:
        claims = json.loads(payload)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError too
        return None
    if (
        type(claims) is not dict
        or claims.keys() != _MINTED_CLAIMS
        or any(v is None for v in claims.values())
        or not isinstance(claims["sub"], str)
    ):
        return None
    return claims


def _hmac_key(secret: str) -> bytes | None:
    """The key PyJWT signs HS256 with, or None when PyJWT refuses the secret as
    an HMAC key (then every token goes through PyJWT, which refuses it)."""
    try:
        key: bytes = HMACAlgorithm(HMACAlgorithm.SHA256).prepare_key(secret)
    except jwt.PyJWTError:
        return None
    return key


def _verify(
    secret: str, token: str, now: datetime, max_lifetime_s: int
) -> tuple[Principal, int | float]:
    """The caller named by a token and the token's ``exp`` (Unix seconds)."""
    if _segments(token) is None:
        raise unauthenticated("invalid token: segments must be unpadded canonical base64url")
    try:
        # Expiry is checked against the injected clock, not the library's.
        claims = jwt.decode(
            token,
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
    # exp as sent (an int may be too large for a float; it compares all the same).
    exp: int | float = claims["exp"]
    return _principal(claims, now, max_lifetime_s), exp


class UnknownKey(DomainError):
    """A token signed by a key the identity provider's set does not hold (yet): a
    401, unless the caller refreshes the set (an await) and the key turns up."""

    def __init__(self, kid: str) -> None:
        super().__init__(
            "unauthenticated",
            f"invalid token: unknown kid {kid!r}",
            headers={"WWW-Authenticate": "Bearer"},
        )
        self.kid = kid


class IdentityProvider(Protocol):
    """Tokens of an identity provider (core/http/jwks.py), beside reservo's HS256 ones."""

    def header(self, token: str) -> dict[str, Any]: ...

    def verify(
        self, token: str, header: dict[str, Any], now: datetime, max_lifetime_s: int
    ) -> tuple[Principal, int | float]: ...

    async def refresh_for(self, kid: str) -> None: ...

    def on_keys_removed(self, forget: Callable[[], None]) -> None: ...


class TokenVerifier:
    """Verifies bearer tokens, remembering the verified ones by their raw string
    until their ``exp``.

    PyJWT's decode (base64, JSON, HMAC) costs ~30 us per request; a dict lookup
    ~0.1 us, and the same caller sends the same token many times. Only tokens that
    passed every check are remembered, under their exact text, so a cached answer
    is the answer decode would give: the same principal while the injected clock
    is inside the token's window (from ``exp - max_lifetime_s``, the earliest
    moment its lifetime was within the limit, to ``exp``), a refusal outside it.
    A refused token is never cached (every refusal decodes again), and the cache
    holds at most ``max_entries`` tokens: when full, the oldest entry goes
    (insertion order), so memory is bounded whatever tokens callers send.

    With an identity ``provider``, its tokens are verified against its key set,
    and reservo's own HS256 tokens only when ``accept_hs256``. A token naming a
    key the set lacks raises ``UnknownKey``: ``verify`` stays synchronous (the
    HS256 path pays no await), and an async caller awaits ``learn`` and retries.
    When a key leaves the set, every remembered token is forgotten, so a token of
    a retired key is refused from that moment, not at its exp.
    """

    def __init__(
        self,
        secret: str,
        max_entries: int = 10_000,
        max_lifetime_s: int = DEFAULT_MAX_LIFETIME_S,
        provider: IdentityProvider | None = None,
        *,
        accept_hs256: bool = True,
    ) -> None:
        if max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        if max_lifetime_s < 1:
            raise ValueError("max_lifetime_s must be >= 1")
        self.secret = secret
        self.max_entries = max_entries
        self.max_lifetime_s = max_lifetime_s
        # token -> (principal, exp, earliest moment the token is acceptable), oldest
        # first. An OrderedDict, not a dict: a dict's oldest key, after many
        # deletions at its front, is found by scanning past every deleted slot
        # (4 us at 10,000 entries, every eviction); popitem(last=False) is O(1).
        self._verified: OrderedDict[str, tuple[Principal, int | float, int | float]] = OrderedDict()
        self._key = _hmac_key(secret)
        self.provider = provider
        # Without a provider, HS256 is the only kind of token there is.
        self.accept_hs256 = accept_hs256 or provider is None
        if provider is not None:
            provider.on_keys_removed(self._verified.clear)

    def __len__(self) -> int:
        return len(self._verified)

    def principal(self, authorization: str | None, now: datetime) -> Principal:
        return self.verify(bearer(authorization), now)

    def verify(self, token: str, now: datetime) -> Principal:
        hit = self._verified.get(token)
        if hit is not None:
            principal, exp, earliest = hit
            now_s = now.timestamp()
            if earliest <= now_s < exp:
                return principal
            del self._verified[token]
            raise unauthenticated("token expired" if exp <= now_s else _TOO_LONG)
        principal, exp = self.decode(token, now)
        if self.max_entries:
            if len(self._verified) >= self.max_entries:
                # The oldest insertion goes: a flood of distinct valid tokens
                # only ever replaces entries, never grows the cache.
                self._verified.popitem(last=False)
            # exp passed the lifetime check, so it is a number near now.
            self._verified[token] = (principal, exp, exp - self.max_lifetime_s)
        return principal

    def decode(self, token: str, now: datetime) -> tuple[Principal, int | float]:
        """The caller named by a token and its ``exp`` (Unix seconds), every check
        made afresh (no cache)."""
        if self.provider is None:
            return self._decode_hs256(token, now)
        header = self.provider.header(token)
        if header.get("alg") == "HS256":
            if not self.accept_hs256:
                raise unauthenticated("invalid token: HS256 tokens are not accepted here")
            return self._decode_hs256(token, now)
        return self.provider.verify(token, header, now, self.max_lifetime_s)

    def _decode_hs256(self, token: str, now: datetime) -> tuple[Principal, int | float]:
        claims = None if self._key is None else _minted_claims(self._key, token)
        if claims is not None:
            return _principal(claims, now, self.max_lifetime_s), claims["exp"]
        return _verify(self.secret, token, now, self.max_lifetime_s)

    async def learn(self, unknown: UnknownKey) -> None:
        """Refresh the provider's key set for the kid a token named (rate limited:
        at most one fetch per interval, shared by every request waiting)."""
        if self.provider is not None:
            await self.provider.refresh_for(unknown.kid)

    async def checked(self, token: str, now: datetime) -> tuple[Principal, int | float]:
        """``decode``, fetching the provider's keys once for an unknown kid (the
        console's sign-in, which caps its session at the token's exp)."""
        try:
            return self.decode(token, now)
        except UnknownKey as unknown:
            await self.learn(unknown)
            return self.decode(token, now)


_TOO_LONG = "token lifetime exceeds the maximum"


def _number(value: Any) -> bool:
    """A JSON number usable as a time: bool is an int; NaN compares False to
    everything. (No isfinite() on ints: a huge one overflows the float conversion.)"""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _check_lifetime(claims: dict[str, Any], exp: int | float, now_s: float, limit: int) -> None:
    """Refuses a token valid longer than ``limit`` seconds: counted from its iat
    and, whatever iat says (it may lie about the future), from now. Sums, not
    differences, so a huge integer claim is compared exactly, never converted."""
    if exp > now_s + limit:
        raise unauthenticated(_TOO_LONG)
    if "iat" in claims:
        iat = claims["iat"]
        if not _number(iat):
            raise unauthenticated("token has an invalid iat")
        if exp > iat + limit:
            raise unauthenticated(_TOO_LONG)


def _check_expiry(claims: dict[str, Any], now: datetime, max_lifetime_s: int) -> float:
    """Refuses a token without a usable exp, expired, or valid for too long;
    returns ``now`` in epoch seconds, what the other time claims compare to."""
    exp: Any = claims.get("exp")
    if not _number(exp):
        raise unauthenticated("token has an invalid exp")
    now_s = now.timestamp()
    if exp <= now_s:
        raise unauthenticated("token expired")
    _check_lifetime(claims, exp, now_s, max_lifetime_s)
    return now_s


def _principal(claims: dict[str, Any], now: datetime, max_lifetime_s: int) -> Principal:
    """The caller named by verified claims; every claim is checked by type and
    shape, since JSON can put lists, objects, NaN or huge numbers anywhere."""
    _check_expiry(claims, now, max_lifetime_s)
    role, sub = claims.get("role"), claims.get("sub")
    if not isinstance(role, str) or role not in ROLES:
        raise unauthenticated("token has an unknown role")
    user = user_id(sub) if isinstance(sub, str) else None
    if user is None:
        raise unauthenticated("token sub must be a user id in [1, 2^63-1]")
    return Principal(sub=user, role=role)


def user_id(text: str) -> int | None:
    """The user id ``text`` spells canonically (a decimal in [1, 2^63-1]), or None."""
    # Length first: int() of thousands of digits raises instead of answering.
    if len(text) > 19 or not _SUB.fullmatch(text):
        return None
    value = int(text)
    return value if value <= MAX_SUB else None


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
