"""RESERVO_HTTP_REQUEST_DEADLINE_S through the whole app and a real PostgreSQL:
a transfer held up by the database past the deadline is answered 503 at the
deadline (before, it waited as long as the database did); its batch goes on, and
the retry under the same Idempotency-Key finds the one transfer it made."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from reservo.app import create_app
from reservo.bootstrap import build
from reservo.core.kernel.clock import OffsetClock
from reservo.core.kernel.metrics import HTTP_REQUESTS
from reservo.settings import Settings
from tests.helpers.auth import ADMIN, auth
from tests.helpers.betting import make_account, make_match

DEADLINE_S = 1.0
HELD_S = 3.0


@pytest.fixture
async def deadline_client(
    base_settings: Settings, clock: OffsetClock
) -> AsyncIterator[httpx.AsyncClient]:
    container = build(base_settings.with_(http_request_deadline_s=DEADLINE_S), clock)
    app = create_app(container, owns_container=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://reservo.test"
    ) as client:
        yield client
    await container.close()


def _transfers_answered(status: int) -> float:
    return HTTP_REQUESTS.labels("POST", "/api/transfers", str(status))._value.get()


async def test_a_request_held_by_the_database_answers_503_at_the_deadline(
    deadline_client: httpx.AsyncClient, database_url: str
) -> None:
    client = deadline_client
    source, owner = await make_account(client, 100)
    target, _ = await make_account(client, 0)
    body = {"fromAccountId": source, "toAccountId": target, "amount": 30}
    headers = {**auth("bettor", owner), "Idempotency-Key": str(uuid.uuid4())}
    blocker = await asyncpg.connect(database_url)
    try:
        # The source account locked by someone else for HELD_S: the transfer's batch waits.
        locked = blocker.transaction()
        await locked.start()
        await blocker.execute("SELECT 1 FROM wallet_account WHERE id = $1 FOR UPDATE", source)
        release = asyncio.get_running_loop().call_later(
            HELD_S, lambda: asyncio.ensure_future(locked.rollback())
        )
        counted_before = _transfers_answered(503)
        t0 = time.monotonic()
        r = await client.post("/api/transfers", json=body, headers=headers)
        took = time.monotonic() - t0
        assert r.status_code == 503, f"{r.status_code} after {took:.1f} s: {r.text}"
        assert r.json()["code"] == "unavailable"
        # The request metrics count the answer the client got (not a 500).
        assert _transfers_answered(503) == counted_before + 1
        assert r.headers["retry-after"] == "1"
        assert DEADLINE_S <= took < HELD_S - 1, took
        await asyncio.sleep(HELD_S - took + 0.5)
        release.cancel()
    finally:
        await blocker.close()
    # The batch went on once the lock was gone: the retry gets its stored answer.
    for _ in range(20):
        again = await client.post("/api/transfers", json=body, headers=headers)
        if again.status_code != 409:
            break
        await asyncio.sleep(0.2)
    assert again.status_code in (200, 201), again.text
    conn = await asyncpg.connect(database_url)
    try:
        moved = await conn.fetchval(
            "SELECT count(*) FROM wallet_transfer WHERE kind = 'TRANSFER' AND from_account_id = $1",
            source,
        )
        balance = await conn.fetchval("SELECT balance FROM wallet_account WHERE id = $1", source)
    finally:
        await conn.close()
    assert (moved, balance) == (1, 70)


async def test_a_correction_or_void_is_left_to_its_own_statement_timeout(
    deadline_client: httpx.AsyncClient, database_url: str
) -> None:
    """A void reopens every bet of its match in one transaction (50 s at 500,000
    bets): cut at the deadline it would roll back on every retry, so the betting
    module declares it outside the deadline; a request held past it still ends."""
    client = deadline_client
    match = await make_match(client)
    blocker = await asyncpg.connect(database_url)
    try:
        locked = blocker.transaction()
        await locked.start()
        await blocker.execute("SELECT 1 FROM betting_match WHERE id = $1 FOR UPDATE", match["id"])
        release = asyncio.get_running_loop().call_later(
            HELD_S, lambda: asyncio.ensure_future(locked.rollback())
        )
        t0 = time.monotonic()
        r = await client.post(
            f"/api/matches/{match['id']}/void", json={"reason": "abandoned"}, headers=ADMIN
        )
        took = time.monotonic() - t0
        release.cancel()
    finally:
        await blocker.close()
    assert r.status_code == 202, f"{r.status_code} after {took:.1f} s: {r.text}"
    assert took >= HELD_S - 0.5, took  # it did wait for the lock, past the deadline
