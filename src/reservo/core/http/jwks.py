"""Tokens of an identity provider (Keycloak, Auth0, Entra, Cognito, ...): signed
with RS256, ES256 or EdDSA by keys the provider publishes as a JWKS and rotates.

``KeySet`` keeps the provider's keys by ``kid``: fetched at start and every
refresh period, and again when a token names a ``kid`` it does not know (at most
one fetch per ``min_interval_s``, shared by every request waiting for it, so a
flood of made-up kids is not a flood of fetches). A failed fetch keeps the last
good set. ``Provider`` verifies one token against it and maps the provider's
claims (where the role and the user id sit, the provider's role names) to a
``Principal``. Both are plain values: the composition root wires them from
settings (RESERVO_JWT_*).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import jwt
import orjson
import structlog

from reservo.core.aio.loops import pause
from reservo.core.http.auth import (
    ROLES,
    Principal,
    UnknownKey,
    _check_expiry,
    _number,
    _segments,
    unauthenticated,
    user_id,
)
from reservo.core.http.schemas import MAX_ID

log = structlog.get_logger(__name__)

# The asymmetric algorithms a provider's key may sign with. A symmetric ("oct")
# key in a published set would let anyone who read the set sign tokens: never
# taken, nor "none".
ALGORITHMS = frozenset(
    {
        "RS256",
        "RS384",
        "RS512",
        "PS256",
        "PS384",
        "PS512",
        "ES256",
        "ES384",
        "ES512",
        "EdDSA",
    }
)
# A JWKS is a few kilobytes; a provider answering megabytes is not one.
MAX_JWKS_BYTES = 1 << 20
# The provider's clock and ours disagree a little: a token whose nbf is this far
# in our future is taken all the same.
NBF_LEEWAY_S = 60


@dataclass(frozen=True)
class ProviderConfig:
    jwks_url: str
    issuer: str | None = None
    # Any one of these in the token's aud; empty: aud is not checked.
    audiences: tuple[str, ...] = ()
    role_claim: str = "role"
    sub_claim: str = "sub"
    # The provider's role names -> reservo's. Empty: the names are reservo's own.
    role_map: Mapping[str, str] = field(default_factory=dict)
    refresh_s: float = 300.0
    min_interval_s: float = 10.0
    timeout_s: float = 5.0


class KeySet:
    """The provider's signing keys by kid, refreshed in the background and on
    demand (rate limited), the last good set kept through the provider's outages."""

    def __init__(self, url: str, *, refresh_s: float, min_interval_s: float, timeout_s: float):
        self.url = url
        self.refresh_s = refresh_s
        self.min_interval_s = min_interval_s
        self.timeout_s = timeout_s
        self.keys: dict[str, jwt.PyJWK] = {}
        self._last_attempt = -float("inf")  # time.monotonic() of the last fetch started
        self._inflight: asyncio.Task[bool] | None = None
        # Called when a kid leaves the set (the verifier forgets the tokens it
        # verified, so a key taken out of the set stops working at once).
        self.on_removed: list[Callable[[], None]] = []

    async def refresh_for(self, kid: str) -> None:
        """Fetch the set again for a token naming ``kid``, unless another request
        already did (or is doing it), or one was started within min_interval_s."""
        if kid in self.keys:
            return
        if self._inflight is None and time.monotonic() - self._last_attempt < self.min_interval_s:
            return  # rate limited: the token is refused with "unknown kid"
        await self.refresh()

    async def refresh(self) -> bool:
        """Fetch the set (joining a fetch in flight); True when it was fetched.
        The fetch runs as its own task: a request that gives up (its client went
        away) does not cancel it for the others waiting."""
        if self._inflight is None:
            self._last_attempt = time.monotonic()
            self._inflight = asyncio.ensure_future(self._fetch())
            self._inflight.add_done_callback(self._landed)
        return await asyncio.shield(self._inflight)

    def _landed(self, _: asyncio.Task[bool]) -> None:
        self._inflight = None

    async def run(self, stop: asyncio.Event) -> None:
        """Keeps the set fresh until ``stop``: every refresh_s, and every
        min_interval_s while the provider fails (requests go on with the last set)."""
        while not stop.is_set():
            ok = await self.refresh()
            await pause(stop, self.refresh_s if ok else min(self.refresh_s, self.min_interval_s))

    async def _fetch(self) -> bool:
        try:
            document = await self._download()
            keys = parse_jwks(document)
        except Exception as exc:
            # Whatever goes wrong (network, TLS, an odd URL, a broken document),
            # the requests waiting on this fetch and the refresh loop go on with
            # the last good set; the next fetch may succeed.
            log.warning("jwks_fetch_failed", url=self.url, error=str(exc) or repr(exc))
            return False
        gone = self.keys.keys() - keys.keys()
        if keys.keys() != self.keys.keys():  # a rotation (or the first set): worth a line
            log.info("jwks_keys", url=self.url, kids=sorted(keys), retired=sorted(gone))
        self.keys = keys
        if gone:
            for forget in self.on_removed:
                forget()
        return True

    async def _download(self) -> bytes:
        async with (
            httpx.AsyncClient(timeout=self.timeout_s) as client,
            client.stream("GET", self.url, headers={"Accept": "application/json"}) as answer,
        ):
            if answer.status_code != 200:
                raise ValueError(f"the JWKS URL answered {answer.status_code}")
            body = bytearray()
            async for chunk in answer.aiter_bytes():
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    raise ValueError(f"the JWKS is larger than {MAX_JWKS_BYTES} bytes")
            return bytes(body)


def parse_jwks(document: bytes) -> dict[str, jwt.PyJWK]:
    """The usable signing keys of a JWKS document by kid (ValueError when none):
    a key without a kid, for encryption, symmetric, of an algorithm not allowed or
    one PyJWT cannot load is skipped (and logged), the rest still serve."""
    try:
        data = orjson.loads(document)
    except orjson.JSONDecodeError as exc:
        raise ValueError("the JWKS is not JSON") from exc
    entries = data.get("keys") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError("the JWKS has no 'keys' list")
    keys: dict[str, jwt.PyJWK] = {}
    for entry in entries:
        kid = entry.get("kid") if isinstance(entry, dict) else None
        if not isinstance(kid, str) or not kid or kid in keys:
            continue
        if entry.get("use", "sig") != "sig":
            continue
        try:
            key = jwt.PyJWK(entry)
        except (jwt.PyJWTError, ValueError, TypeError, KeyError) as exc:
            log.warning("jwks_key_skipped", kid=kid, error=str(exc))
            continue
        if key.algorithm_name not in ALGORITHMS:
            log.warning("jwks_key_skipped", kid=kid, error=f"{key.algorithm_name} not allowed")
            continue
        keys[kid] = key
    if not keys:
        raise ValueError("the JWKS has no usable signing key")
    return keys


def claim(claims: Mapping[str, Any], name: str) -> Any:
    """The claim ``name``: a top-level claim of that exact name (Auth0's namespaced
    claims are URLs, dots included), else the dotted path (``realm_access.roles``)."""
    if name in claims:
        return claims[name]
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


class Provider:
    """Verifies a provider's token against the key set and names its caller."""

    def __init__(self, config: ProviderConfig, keys: KeySet) -> None:
        self.config = config
        self.keys = keys

    async def refresh_for(self, kid: str) -> None:
        await self.keys.refresh_for(kid)

    def on_keys_removed(self, forget: Callable[[], None]) -> None:
        self.keys.on_removed.append(forget)

    @staticmethod
    def header(token: str) -> dict[str, Any]:
        """The token's header (only once its segments are canonical base64url)."""
        if _segments(token) is None:
            raise unauthenticated("invalid token: segments must be unpadded canonical base64url")
        try:
            header = jwt.get_unverified_header(token)
        except Exception as exc:  # untrusted input: any parse failure is a refusal
            raise unauthenticated("invalid token") from exc
        return header

    def verify(
        self, token: str, header: dict[str, Any], now: datetime, max_lifetime_s: int
    ) -> tuple[Principal, int | float]:
        """The caller named by a token of the provider and its ``exp``; raises
        ``UnknownKey`` for a kid the set does not hold (the caller may refresh
        the set and try again)."""
        kid, alg = header.get("kid"), header.get("alg")
        if alg not in ALGORITHMS:  # no key could verify it: not worth a fetch either
            raise unauthenticated(f"invalid token: alg {alg!r} is not accepted")
        if not isinstance(kid, str) or not kid:
            raise unauthenticated("invalid token: no kid in its header")
        key = self.keys.keys.get(kid)
        if key is None:
            raise UnknownKey(kid)
        # The key decides the algorithm: an HS256 token over the public key, an RS
        # token under an EC key, or "none", is refused before any signature check.
        if alg != key.algorithm_name:
            raise unauthenticated(f"invalid token: alg {alg!r} does not match key {kid!r}")
        cfg = self.config
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[key.algorithm_name],
                audience=list(cfg.audiences) or None,
                issuer=cfg.issuer,
                # Times are checked against the injected clock, below.
                options={
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                    "verify_aud": bool(cfg.audiences),
                    "require": ["exp", *(["iss"] if cfg.issuer else [])],
                },
            )
        except jwt.PyJWTError as exc:
            raise unauthenticated(f"invalid token: {exc}") from exc
        except Exception as exc:
            raise unauthenticated("invalid token") from exc
        now_s = _check_expiry(claims, now, max_lifetime_s)
        nbf = claims.get("nbf")
        if nbf is not None and (not _number(nbf) or nbf > now_s + NBF_LEEWAY_S):
            raise unauthenticated("token not valid yet (nbf)")
        return Principal(sub=self._sub(claims), role=self._role(claims)), claims["exp"]

    def _role(self, claims: Mapping[str, Any]) -> str:
        """The first of the token's roles (a string or a list) that maps to one of
        reservo's: through the map when one is set, else by its own name."""
        value = claim(claims, self.config.role_claim)
        names = value if isinstance(value, list) else [value]
        mapping = self.config.role_map
        for name in names:
            if not isinstance(name, str):
                continue
            role = mapping.get(name) if mapping else name
            if role in ROLES:
                return role
        raise unauthenticated(f"token has no role reservo knows in {self.config.role_claim!r}")

    def _sub(self, claims: Mapping[str, Any]) -> int:
        """The user id: a positive 64-bit integer, as its canonical decimal string
        (as reservo's own tokens carry it) or a JSON integer (a provider's custom
        claim). A provider's own subject (a UUID, an e-mail) is refused."""
        value = claim(claims, self.config.sub_claim)
        if type(value) is int and 1 <= value <= MAX_ID:
            return value
        sub = user_id(value) if isinstance(value, str) else None
        if sub is not None:
            return sub
        raise unauthenticated(f"token {self.config.sub_claim!r} must be a user id in [1, 2^63-1]")


def provider_from(config: ProviderConfig) -> Provider:
    keys = KeySet(
        config.jwks_url,
        refresh_s=config.refresh_s,
        min_interval_s=config.min_interval_s,
        timeout_s=config.timeout_s,
    )
    return Provider(config, keys)
