"""Issue 22's token rules, through HTTP: a maximum lifetime (counted from iat, and
from now whatever iat says) on every path that authenticates (FastAPI routes,
the hot path, the verified-token cache, the console's sign-in), canonical
base64url in every segment, and `reservo token` keeping within the limit. Also:
no response echoes a hostile Host header (no trailing-slash redirects)."""

from __future__ import annotations

import base64
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from reservo.app import create_app
from reservo.bootstrap import build
from reservo.core.http.auth import mint_token
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import make_slots
from tests.helpers.auth import JWT_SECRET, auth, forge_token, new_id
from tests.helpers.console import sign_in
from tests.helpers.procs import BIN, env_for

# Authenticated, then not found: a 404 says the token was accepted, a 401 it was not.
PROBE = "/api/appointments/4611686018427387904"
DAY_S = 24 * 3600
ACCEPTED = (404, "appointment_not_found")


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _minted(ttl_s: int, now: datetime | None = None, role: str = "patient") -> str:
    return mint_token(
        JWT_SECRET, role, new_id(), timedelta(seconds=ttl_s), now or datetime.now(UTC)
    )


def _claims(exp: float, iat: float | str | None = None, sub: int | None = None) -> str:
    iat_part = "" if iat is None else f',"iat":{iat}'
    return forge_token(f'{{"sub":"{sub or new_id()}","role":"patient","exp":{int(exp)}{iat_part}}}')


async def _status(client: httpx.AsyncClient, token: str, path: str = PROBE) -> tuple[int, str]:
    r = await client.get(path, headers=_bearer(token))
    code = r.json().get("code", "") if r.status_code >= 400 else ""
    return r.status_code, code


@asynccontextmanager
async def _app(settings: Settings, clock: OffsetClock) -> AsyncIterator[httpx.AsyncClient]:
    container = build(settings, clock)
    app = create_app(container)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
            yield c
    finally:
        await container.close()


# -- maximum lifetime --------------------------------------------------------------------


async def test_a_token_valid_longer_than_the_maximum_is_401(client: httpx.AsyncClient) -> None:
    assert await _status(client, _minted(DAY_S - 60)) == ACCEPTED
    assert await _status(client, _minted(DAY_S + 60)) == (401, "unauthenticated")
    assert await _status(client, _minted(365 * DAY_S)) == (401, "unauthenticated")


async def test_the_lifetime_counts_from_iat_and_from_now(client: httpx.AsyncClient) -> None:
    now = datetime.now(UTC).timestamp()
    # Issued two days ago, one hour left: valid for 49 hours in all.
    assert await _status(client, _claims(now + 3600, iat=now - 2 * DAY_S)) == (
        401,
        "unauthenticated",
    )
    # An iat in the future does not make a far exp short.
    far = now + 30 * DAY_S
    assert await _status(client, _claims(far + 3600, iat=far)) == (401, "unauthenticated")
    # No iat: counted from now.
    assert await _status(client, _claims(now + 2 * DAY_S)) == (401, "unauthenticated")
    assert await _status(client, _claims(now + 3600)) == ACCEPTED
    assert await _status(client, _claims(now + 3600, iat=now - 60)) == ACCEPTED
    for odd in ('"x"', "true", "null", "1e400", "[1]"):
        assert await _status(client, _claims(now + 3600, iat=odd)) == (401, "unauthenticated")


async def test_the_hot_path_applies_the_same_limit(client: httpx.AsyncClient) -> None:
    _, slots = await make_slots(client)
    path = f"/api/doctors/{slots[0]['doctorId']}/slots?date={slots[0]['startAt'][:10]}"
    ok = await client.get(path, headers=_bearer(_minted(3600)))
    assert ok.status_code == 200, ok.text
    for token in (_minted(2 * DAY_S), _minted(3600) + "="):
        r = await client.get(path, headers=_bearer(token))
        assert (r.status_code, r.json()["code"]) == (401, "unauthenticated")


async def test_the_setting_sets_the_limit_and_the_cache_keeps_it(
    base_settings: Settings,
) -> None:
    clock = OffsetClock()
    settings = base_settings.with_(jwt_max_lifetime_s=600)
    async with _app(settings, clock) as c:
        assert await _status(c, _minted(900, clock.now())) == (401, "unauthenticated")
        token = _minted(590, clock.now())
        for _ in range(2):  # the second answer comes from the verified-token cache
            assert await _status(c, token) == ACCEPTED
        # Seen from earlier (a clock stepped back), the same token is valid longer
        # than the limit: the cache answers as a fresh decode would.
        clock.advance(timedelta(seconds=-60))
        assert await _status(c, token) == (401, "unauthenticated")
        clock.advance(timedelta(seconds=60))
        assert await _status(c, token) == ACCEPTED


async def test_the_console_sign_in_applies_the_limit(client: httpx.AsyncClient) -> None:
    r = await sign_in(client, _minted(2 * DAY_S, role="admin"))
    assert r.status_code == 401
    assert "lifetime exceeds the maximum" in r.text
    assert (await client.get("/console")).status_code == 303


# -- canonical base64url ------------------------------------------------------------------


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _respellings(token: str) -> list[str]:
    """The same header, claims and signature, spelled in ways only a lenient
    base64url decoder reads as the same bytes."""
    header, payload, sig = token.split(".")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    # 32 signature bytes are 43 characters, the last carrying 2 unused bits.
    last = alphabet.index(sig[-1])
    loose_bits = sig[:-1] + alphabet[last ^ 1]
    padded_payload = payload + "=" * (-len(payload) % 4 or 4)
    return [
        f"{header}.{payload}.{sig}=",
        f"{header}.{payload}.{sig}==",
        f"{header}=.{payload}.{sig}" if len(header) % 4 else f"{header}====.{payload}.{sig}",
        f"{header}.{padded_payload}.{sig}",
        f"{header}.{payload}.{loose_bits}",
        f"{header}.{payload}.{sig[:20]}!{sig[20:]}",  # outside the alphabet
        f"{header}.{payload}.{sig[:20]}\n{sig[20:]}",
        f"{header}.{payload[:10]}.{payload[10:]}.{sig}",  # a fourth segment
        f"{header}.{payload}.{sig.replace('-', '+').replace('_', '/')}",
    ]


@pytest.mark.parametrize("shape", ["minted", "with iat"])
async def test_only_canonical_base64url_segments_are_accepted(
    client: httpx.AsyncClient, shape: str
) -> None:
    now = datetime.now(UTC)
    token = (
        _minted(3600, now)
        if shape == "minted"  # the verifier's fast path
        else _claims(now.timestamp() + 3600, iat=now.timestamp())  # PyJWT's path
    )
    assert await _status(client, token) == ACCEPTED
    for other in _respellings(token):
        if other == token:
            continue
        r = await client.get(PROBE, headers=[(b"authorization", f"Bearer {other}".encode())])
        assert (r.status_code, r.json()["code"]) == (401, "unauthenticated"), other
    # Non-canonical is refused even though the canonical spelling was cached.
    assert await _status(client, token) == ACCEPTED


# -- reservo token -------------------------------------------------------------------------


def _token_cli(base_settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN), "token", "--role", "admin", "--sub", "1", *args],
        env=env_for(base_settings, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_reservo_token_stays_within_the_limit(base_settings: Settings) -> None:
    within = _token_cli(base_settings, "--ttl", str(DAY_S))
    assert within.returncode == 0, within.stderr
    for ttl in (str(DAY_S + 1), "0", "-5"):
        refused = _token_cli(base_settings, f"--ttl={ttl}")
        assert refused.returncode == 2, (ttl, refused.stdout, refused.stderr)
        assert refused.stdout == ""
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert "--ttl" in refused.stderr and "RESERVO_JWT_MAX_LIFETIME_S" in refused.stderr
    # The default ttl (an hour) is above a ten-minute limit.
    short = _token_cli(base_settings, RESERVO_JWT_MAX_LIFETIME_S="600")
    assert short.returncode == 2 and "[1, 600]" in short.stderr
    unknown = subprocess.run(
        [str(BIN), "token", "--role", "root", "--sub", "1"],
        env=env_for(base_settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unknown.returncode == 2 and len(unknown.stderr.strip().splitlines()) == 1


# -- no Host header in any answer -----------------------------------------------------------


HOSTILE = "evil.example"


@pytest.mark.parametrize(
    "path",
    [
        "/api/doctors/",
        "/api/accounts/1/",
        "/api/jobs/",
        "/healthz/",
        "/console/",
        "/console/clinic/",
        "/console/sign-in/",
        "/api/cars/",
        "/api/doctors/1/slots/",
    ],
)
async def test_no_answer_echoes_the_host_header(client: httpx.AsyncClient, path: str) -> None:
    for method in ("GET", "POST", "HEAD"):
        r = await client.request(
            method, path, headers={"Host": HOSTILE, **auth("admin", 1)}, json=None
        )
        # A redirect, if any, is relative to this site: a path, never a host.
        location = r.headers.get("location", "/")
        assert location.startswith("/") and not location.startswith("//"), (method, location)
        for name, value in r.headers.items():
            assert HOSTILE not in value, (method, name, value)
        assert HOSTILE.encode() not in r.content
