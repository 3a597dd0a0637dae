"""Verified tokens are remembered by their raw text until their exp: the cached
answer must be the answer a fresh decode gives (expiry by the injected clock,
refusals never cached, the number of remembered tokens bounded)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import httpx
from fastapi import FastAPI

from reservo.app import create_app
from reservo.bootstrap import build
from reservo.core.http.auth import TokenVerifier, mint_token
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import make_slots
from tests.helpers.auth import JWT_SECRET, new_id


def _bearer(role: str, sub: int, ttl_s: int, now: datetime) -> dict[str, str]:
    token = mint_token(JWT_SECRET, role, sub, timedelta(seconds=ttl_s), now)
    return {"Authorization": f"Bearer {token}"}


def _tokens(client: httpx.AsyncClient) -> TokenVerifier:
    transport = client._transport
    assert isinstance(transport, httpx.ASGITransport)
    app = transport.app
    assert isinstance(app, FastAPI)
    tokens: TokenVerifier = app.state.tokens
    return tokens


async def test_a_cached_token_expires_at_its_exp_by_the_injected_clock(
    client: httpx.AsyncClient, clock: OffsetClock
) -> None:
    _, slots = await make_slots(client)
    doctor, day = slots[0]["doctorId"], slots[0]["startAt"][:10]
    headers = _bearer("patient", new_id(), 60, clock.now())
    url = f"/api/doctors/{doctor}/slots"
    for _ in range(2):  # the second answer comes from the cache
        r = await client.get(url, params={"date": day}, headers=headers)
        assert r.status_code == 200, r.text
    token = headers["Authorization"].removeprefix("Bearer ")
    assert token in _tokens(client)._verified
    clock.advance(timedelta(seconds=61))
    r = await client.get(url, params={"date": day}, headers=headers)
    assert r.status_code == 401
    assert r.json()["code"] == "unauthenticated"
    assert r.json()["detail"] == "token expired"
    assert r.headers["www-authenticate"] == "Bearer"
    assert token not in _tokens(client)._verified
    # Still refused (decoded afresh now, with the same answer).
    r = await client.get(url, params={"date": day}, headers=headers)
    assert (r.status_code, r.json()["detail"]) == (401, "token expired")


async def test_refused_tokens_are_not_remembered(client: httpx.AsyncClient) -> None:
    wrong = mint_token(
        "another-secret-0123456789-abcdef", "admin", 1, timedelta(hours=1), datetime.now(UTC)
    )
    for _ in range(2):
        r = await client.get(
            "/api/appointments/4611686018427387904", headers={"Authorization": f"Bearer {wrong}"}
        )
        assert r.status_code == 401
        assert r.json()["code"] == "unauthenticated"
    assert wrong not in _tokens(client)._verified


@asynccontextmanager
async def _app(settings: Settings, size: int) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    container = build(settings.with_(token_cache_size=size), OffsetClock())
    app = create_app(container)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
            yield app, c
    finally:
        await container.close()


async def test_the_cache_holds_at_most_its_size(base_settings: Settings) -> None:
    async with _app(base_settings, 3) as (app, c):
        now = datetime.now(UTC)
        subs = [new_id() for _ in range(5)]
        for sub in subs:
            r = await c.get(
                "/api/appointments/4611686018427387904", headers=_bearer("patient", sub, 600, now)
            )
            assert r.status_code == 404, r.text  # authenticated, then not found
        tokens: TokenVerifier = app.state.tokens
        assert len(tokens) == 3
        # The oldest went first; the newest are remembered.
        remembered = {entry[0].sub for entry in tokens._verified.values()}
        assert remembered == set(subs[2:])
        # An evicted token is simply verified again.
        r = await c.get(
            "/api/appointments/4611686018427387904", headers=_bearer("patient", subs[0], 600, now)
        )
        assert r.status_code == 404


async def test_size_zero_turns_the_cache_off(base_settings: Settings) -> None:
    async with _app(base_settings, 0) as (app, c):
        r = await c.get(
            "/api/appointments/4611686018427387904",
            headers=_bearer("patient", new_id(), 600, datetime.now(UTC)),
        )
        assert r.status_code == 404
        assert len(app.state.tokens) == 0
