"""Operations: the dead-letter list and replay, through HTTP. A replay delivers
the parked event to the consumer that parked it again, and it is applied at most
once however often it is asked for."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from reservo.app import create_app
from reservo.bootstrap import Container, build
from reservo.core.db.database import Database
from reservo.core.kernel.clock import OffsetClock, SystemClock
from reservo.core.messaging.deadletters import DeadLetterBox, Q
from reservo.core.messaging.failures import Rejected
from reservo.core.messaging.inbox import once
from reservo.core.messaging.outbox import emit
from reservo.core.messaging.transport.base import Event, Subscriptions
from reservo.core_modules import Outbox
from reservo.settings import Settings
from tests.helpers.auth import auth

ADMIN = auth("admin", 1)
TOPIC = "test.dead-letters.v1"
MINE = {"consumer": "test-replay"}


class Flaky:
    """A consumer that rejects events until told otherwise, then applies each once."""

    def __init__(self, c: Container) -> None:
        self.c, self.mode = c, "reject"

    async def __call__(self, event: Event) -> None:
        if self.mode == "reject":
            raise Rejected(f"cannot handle {event.payload['n']}")
        if self.mode == "away":
            raise ConnectionRefusedError("the dependency is away")

        async def apply(conn: asyncpg.Connection) -> None:
            await conn.execute("INSERT INTO replay_effect VALUES ($1)", event.id)

        await once(self.c.db, "test-replay", event, apply)


@pytest.fixture
async def own(base_settings: Settings, own_database: str) -> AsyncIterator[Container]:
    c = build(base_settings.with_(database_url=own_database), OffsetClock())
    async with c.db.connection() as conn:
        await conn.execute("CREATE TABLE replay_effect (event_id uuid NOT NULL)")
    yield c
    await c.close()


async def _client(c: Container) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(c, owns_container=False))
    return httpx.AsyncClient(transport=transport, base_url="http://reservo.test")


async def _park(c: Container, flaky: Flaky, n: int) -> list[uuid.UUID]:
    c.subscriptions.add("test-replay", [TOPIC], flaky)
    async with c.db.transaction() as conn:
        # One key: delivered (and parked) in the order emitted.
        ids = [await emit(conn, TOPIC, "k", {"n": i}, c.clock.now()) for i in range(n)]
    while await c.module(Outbox).relay.run_once():
        pass
    return ids


async def test_list_and_replay_a_rejected_event_once(own: Container) -> None:
    flaky = Flaky(own)
    ids = await _park(own, flaky, 3)
    async with await _client(own) as client:
        r = await client.get(
            "/api/ops/dead-letters", params={"consumer": "test-replay"}, headers=ADMIN
        )
        assert r.status_code == 200, r.text
        items = r.json()["items"]
        assert [i["eventId"] for i in items] == [str(e) for e in reversed(ids)]  # newest first
        first: dict[str, Any] = items[-1]
        assert first["consumer"] == "test-replay" and first["topic"] == TOPIC
        assert "cannot handle 0" in first["error"] and first["attempts"] == 1
        assert first["createdAt"] and first["replayedAt"] is None
        assert r.json()["next"] is None

        # Paging: one at a time, each page where the last one stopped.
        seen, after = [], None
        while True:
            params: dict[str, Any] = {"consumer": "test-replay", "limit": 1}
            if after:
                params["after"] = after
            r = await client.get("/api/ops/dead-letters", params=params, headers=ADMIN)
            seen += [i["id"] for i in r.json()["items"]]
            after = r.json()["next"]
            if after is None:
                break
        assert seen == [i["id"] for i in items]

        # Still refused: 409, stays parked with one more attempt.
        r = await client.post(f"/api/ops/dead-letters/{first['id']}/replay", headers=ADMIN)
        assert (r.status_code, r.json()["code"]) == (409, "not_replayable"), r.text
        # The dependency away: 503, stays parked.
        flaky.mode = "away"
        r = await client.post(f"/api/ops/dead-letters/{first['id']}/replay", headers=ADMIN)
        assert (r.status_code, r.json()["code"]) == (503, "unavailable"), r.text
        # Fixed: replayed, applied once, however often it is asked.
        flaky.mode = "apply"
        for _ in range(3):
            r = await client.post(f"/api/ops/dead-letters/{first['id']}/replay", headers=ADMIN)
            assert (r.status_code, r.json()) == (200, {"replayed": True}), r.text
        r = await client.get(
            "/api/ops/dead-letters", params={"consumer": "test-replay"}, headers=ADMIN
        )
        replayed = next(i for i in r.json()["items"] if i["id"] == first["id"])
        assert replayed["replayedAt"] is not None and replayed["attempts"] == 3
    async with own.db.connection() as conn:
        effects = await conn.fetch("SELECT event_id FROM replay_effect")
    assert [e[0] for e in effects] == [ids[0]]


async def test_who_may_and_bad_requests(own: Container) -> None:
    await _park(own, Flaky(own), 1)
    async with await _client(own) as client:
        for role in ("patient", "service", "bettor"):
            headers = auth(role, 5)
            r = await client.get("/api/ops/dead-letters", headers=headers)
            assert (r.status_code, r.json()["code"]) == (403, "forbidden")
            r = await client.post("/api/ops/dead-letters/1/replay", headers=headers)
            assert (r.status_code, r.json()["code"]) == (403, "forbidden")
        r = await client.get("/api/ops/dead-letters")
        assert r.status_code == 401
        r = await client.post("/api/ops/dead-letters/999999/replay", headers=ADMIN)
        assert (r.status_code, r.json()["code"]) == (404, "not_found")
        for bad in ("x", "WzFd", "WyJhIl0", "Wy0xXQ", "W1szXV0", ""):  # junk, [1]-ish, ["a"], [-1]
            r = await client.get("/api/ops/dead-letters", params={"after": bad}, headers=ADMIN)
            if bad == "WzFd":  # [1]: a real cursor shape
                assert r.status_code == 200, r.text
                continue
            assert (r.status_code, r.json()["code"]) == (422, "validation_error"), (bad, r.text)
        for limit in (0, 201, -1):
            r = await client.get("/api/ops/dead-letters", params={"limit": limit}, headers=ADMIN)
            assert r.status_code == 422


async def test_every_page_is_planned_for_its_values(database_url: str) -> None:
    # A prepared statement gets a generic plan after five runs; for the list's
    # `$1 IS NULL OR consumer = $1` that plan walks the primary key and filters,
    # reading every letter when the consumer has few (docs/BENCHMARKS.md, "Console").
    db = Database(database_url, min_size=1, max_size=1)  # one connection: its statements
    try:
        box = DeadLetterBox(db, SystemClock(), Subscriptions())
        for _ in range(8):
            await box.page("test-nobody", None, 51)
            await box.page(None, 1, 51)
        async with db.connection() as conn:
            row = await conn.fetchrow(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement = $1",
                Q.dead_letter_page,
            )
        assert row is not None
        assert (row["generic_plans"], row["custom_plans"]) == (0, 16)
    finally:
        await db.close()
