"""The local transport hands a consumer with a batch handler its events of a
relay batch in one call: the settled-bet notifications of many matches are
read and recorded in one statement each (one event, three statements, at a
time before: in `reservo up` the notifications fell tens of seconds behind a
results burst, docs/BENCHMARKS.md). Each event keeps its consumer span, and the
batch path keeps exactly-once: each winner paid once, one notification row per
settled bet and channel, also when the batch is delivered again, twice at once.
A batch that fails applied nothing and its events go one by one, where a
rejected one is parked and the others applied."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from reservo.app import create_app
from reservo.betting.setup import Betting
from reservo.bootstrap import Container, build
from reservo.core.kernel.clock import OffsetClock
from reservo.core.messaging.failures import Rejected
from reservo.core.messaging.inbox import once, once_many
from reservo.core.messaging.outbox import emit
from reservo.core.messaging.transport.base import Event
from reservo.core_modules import Outbox
from reservo.notifications.consumer import Q as NOTIFY_SQL
from reservo.settings import Settings
from tests.helpers.betting import kick_off, make_account, make_match, place
from tests.helpers.statements import Statements
from tests.helpers.waiting import drain

MATCHES = 12
SETTLED = "betting.match.bets-settled.v1"
# What the notifications consumer sends PostgreSQL for a batch of events.
NOTIFY_STATEMENTS = {
    NOTIFY_SQL.contact_of_many,
    NOTIFY_SQL.notification_recorded_before,
    NOTIFY_SQL.notification_record_sent,
}


@pytest.fixture
async def own(base_settings: Settings, own_database: str) -> AsyncIterator[Container]:
    """A graph on a database of its own: the relay sees only this test's events."""
    c = build(base_settings.with_(database_url=own_database), OffsetClock())
    yield c
    await c.close()


@pytest.fixture
async def own_client(own: Container) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(own, owns_container=False))
    async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as c:
        yield c


async def settle(c: Container, client: httpx.AsyncClient) -> list[int]:
    """MATCHES matches with one single each (HOME), every other one won by the
    home side; settled in one batch, the events before it relayed. Returns the
    bet ids."""
    matches = [await make_match(client, timedelta(minutes=5)) for _ in range(MATCHES)]
    bets = []
    for m in matches:
        account, owner = await make_account(client, 10_000)
        r = await place(client, account, owner, 100, [(m["id"], "1X2", "HOME")])
        assert r.status_code == 201, r.text
        bets.append(r.json()["id"])
    assert isinstance(c.clock, OffsetClock)
    kick_off(c.clock, *matches)
    relay = c.module(Outbox).relay
    await drain(relay)  # the placements' events: not what is counted
    settlement = c.module(Betting).settlement
    payloads: list[dict[str, Any]] = [
        {
            "matchExternalId": m["externalId"],
            "status": "FINISHED",
            "homeScore": i % 2,
            "awayScore": 0,
            "providerEventId": f"lt-{uuid.uuid4()}",
        }
        for i, m in enumerate(matches)
    ]
    async with c.db.transaction() as conn:
        ids = await settlement.accept_many_in_tx(conn, payloads)
    await settlement.settle_many(ids)
    return bets


async def delivered_once(db: asyncpg.Connection, bets: list[int], channels: int) -> None:
    """Each winner credited once; one notification row per settled bet and channel."""
    paid = await db.fetch(
        "SELECT reference, count(*) FROM wallet_transfer WHERE kind = 'PAYOUT'"
        " AND reference = ANY($1::text[]) GROUP BY reference",
        [f"bet:{b}" for b in bets],
    )
    assert sorted(r["count"] for r in paid) == [1] * (MATCHES // 2)
    rows = await db.fetch(
        "SELECT subject, count(*) FROM notification WHERE topic = $1 GROUP BY subject", SETTLED
    )
    assert len(rows) == MATCHES and {r["count"] for r in rows} == {channels}
    assert {r["subject"] for r in rows} == {
        f"Bet #{b} {'won' if i % 2 else 'lost'}" for i, b in enumerate(bets)
    }


async def test_a_relay_batch_of_settled_bets_is_notified_in_three_statements(
    own: Container, own_client: httpx.AsyncClient, own_database: str
) -> None:
    bets = await settle(own, own_client)
    statements = Statements(own)
    relay = own.module(Outbox).relay
    assert await relay.run_once() >= MATCHES  # every settled-bet event in one claim
    sent = [q for q in statements.take() if q in NOTIFY_STATEMENTS]
    # One read of the contacts, one of the deliveries already recorded, one write:
    # for the whole batch (3 per event, 36 here, one event at a time).
    assert len(sent) == len(NOTIFY_STATEMENTS), sent
    db = await asyncpg.connect(own_database)
    try:
        await delivered_once(db, bets, len(own.settings.notify_channel.split(",")))
    finally:
        await db.close()


async def test_a_batch_delivered_again_twice_at_once_sends_nothing_twice(
    own: Container, own_client: httpx.AsyncClient, own_database: str
) -> None:
    """As after a relay that died between the delivery and marking its rows:
    the batch comes again, here twice at once (barrier), through the batch path."""
    bets = await settle(own, own_client)
    relay = own.module(Outbox).relay
    db = await asyncpg.connect(own_database)
    try:
        async with own.db.connection() as conn:  # its JSON codec: the payload as the relay reads it
            rows = await conn.fetch(
                "SELECT event_id, topic, key, payload, created_at FROM outbox"
                " WHERE topic = $1 ORDER BY id",
                SETTLED,
            )
        events = [Event(r[0], r[1], r[2], r[3], r[4]) for r in rows]
        assert len(events) == MATCHES
        await drain(relay)
        barrier = asyncio.Barrier(2)

        async def again() -> list[BaseException | None]:
            await barrier.wait()
            return await relay.transport.deliver(events)

        outcomes = await asyncio.gather(again(), again())
        assert outcomes == [[None] * MATCHES] * 2
        await delivered_once(db, bets, len(own.settings.notify_channel.split(",")))
    finally:
        await db.close()


async def test_a_batch_with_a_rejected_event_goes_one_by_one(own: Container) -> None:
    """The batch fails and applies nothing; one by one, the others are applied
    once and the rejected one is parked as the consumer's dead letter."""
    calls: list[int] = []
    async with own.db.connection() as conn:
        await conn.execute("CREATE TABLE batch_effect (n int NOT NULL)")

    def check(event: Event) -> int:
        n = int(event.payload["n"])
        if n == 2:
            raise Rejected(f"cannot handle {n}")
        return n

    async def handler(event: Event) -> None:
        n = check(event)

        async def apply(conn: asyncpg.Connection) -> None:
            await conn.execute("INSERT INTO batch_effect VALUES ($1)", n)

        await once(own.db, "test-batch", event, apply)

    async def batch(events: Sequence[Event]) -> None:
        calls.append(len(events))

        async def apply(conn: asyncpg.Connection, fresh: list[Event]) -> None:
            for e in fresh:
                await conn.execute("INSERT INTO batch_effect VALUES ($1)", check(e))

        await once_many(own.db, "test-batch", events, apply)

    own.subscriptions.add("test-batch", ["test.batch.v1"], handler, batch)
    async with own.db.transaction() as conn:
        for i in range(5):
            await emit(conn, "test.batch.v1", f"k{i}", {"n": i}, own.clock.now())
    assert await own.module(Outbox).relay.run_once() == 5
    assert calls == [5]
    async with own.db.connection() as conn:
        applied = await conn.fetch("SELECT n FROM batch_effect ORDER BY n")
        parked = await conn.fetch("SELECT consumer, key FROM dead_letter")
        pending = await conn.fetchval("SELECT count(*) FROM outbox WHERE status <> 'DONE'")
    assert [r["n"] for r in applied] == [0, 1, 3, 4]
    assert [(r["consumer"], r["key"]) for r in parked] == [("test-batch", "k2")]
    assert pending == 0
