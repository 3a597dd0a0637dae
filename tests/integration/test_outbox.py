"""The transactional outbox, its relay and the notifications consumer, end to end.

HTTP tests run on the session database with the container's own relay. The relay
mechanics tests (retries, poison events, concurrent relays, leases) each get a
fresh database: a relay claims *every* pending row, so sharing a backlog with
other tests would make their counts meaningless (and mark other tests' events
done with test-only subscriptions)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from reservo.appointments import events as appointment_events
from reservo.appointments.service import _full_key
from reservo.bootstrap import Container
from reservo.core.clock import OffsetClock
from reservo.core.db import Database, Queries
from reservo.core.inbox import once
from reservo.core.migrate import migrate
from reservo.core.outbox import OutboxRelay, emit
from reservo.core.transport.base import Event, Subscriptions
from reservo.core.transport.local import LocalTransport
from reservo.settings import Settings
from tests.conftest import auth, new_id
from tests.helpers import book, make_slots

Q = Queries.load("reservo.core")
BOOKED = appointment_events.BOOKED
CANCELLED = appointment_events.CANCELLED


async def drain(relay: OutboxRelay, max_rounds: int = 200) -> None:
    """run_once until it claims nothing (bounded so a bug cannot hang the suite)."""
    for _ in range(max_rounds):
        if await relay.run_once() == 0:
            return
    pytest.fail(f"relay still busy after {max_rounds} rounds")


async def outbox_rows(
    db: asyncpg.Connection, topic: str, appointment_id: int
) -> list[asyncpg.Record]:
    return await db.fetch(
        "SELECT * FROM outbox WHERE topic = $1 AND payload->>'appointmentId' = $2",
        topic,
        str(appointment_id),
    )


async def notifications_for(db: asyncpg.Connection, patient: int) -> list[asyncpg.Record]:
    return await db.fetch("SELECT * FROM notification WHERE recipient = $1 ORDER BY id", patient)


# ----------------------------------------------------------------- through HTTP


async def test_booking_emits_one_event_and_one_sent_notification(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client)
    patient = new_id()
    r = await book(client, slots[0]["id"], patient)
    assert r.status_code == 201, r.text
    appt = r.json()["id"]

    rows = await outbox_rows(db, BOOKED, appt)
    assert len(rows) == 1
    assert rows[0]["key"] == f"appointment:{appt}"
    # Nothing is sent before the relay runs: the event waits in the outbox.
    assert await notifications_for(db, patient) == []

    await drain(container.relay)

    row = await db.fetchrow("SELECT status, attempts FROM outbox WHERE id = $1", rows[0]["id"])
    assert row["status"] == "DONE" and row["attempts"] == 1
    sent = await notifications_for(db, patient)
    assert len(sent) == 1
    assert sent[0]["status"] == "SENT"
    assert sent[0]["channel"] == "log"
    assert sent[0]["topic"] == BOOKED
    assert sent[0]["event_id"] == rows[0]["event_id"]
    assert sent[0]["sent_at"] is not None


async def test_refused_booking_emits_nothing(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client, capacity=1)
    slot = slots[0]["id"]
    winner, loser = new_id(), new_id()
    assert (await book(client, slot, winner)).status_code == 201
    # Drop Redis' "full" mark so the refusal comes from the database transaction,
    # the path that could have written (and must have rolled back) an event.
    await container.cache.clear_mark(_full_key(slot))
    r = await book(client, slot, loser)
    assert r.status_code == 409, r.text
    assert r.json()["code"] == "slot_full"

    assert (
        await db.fetchval(
            "SELECT count(*) FROM outbox WHERE payload->>'patientId' = $1", str(loser)
        )
        == 0
    )
    await drain(container.relay)
    assert await notifications_for(db, loser) == []
    assert len(await notifications_for(db, winner)) == 1


async def test_cancel_emits_one_event_even_when_repeated(
    client: httpx.AsyncClient, container: Container, db: asyncpg.Connection
) -> None:
    _, slots = await make_slots(client)
    patient = new_id()
    r = await book(client, slots[0]["id"], patient)
    assert r.status_code == 201, r.text
    appt = r.json()["id"]
    await drain(container.relay)

    for _ in range(2):  # the second cancel is a no-op that must emit nothing
        c = await client.delete(f"/api/appointments/{appt}", headers=auth("patient", patient))
        assert c.status_code == 200, c.text
        assert c.json()["status"] == "CANCELLED"

    rows = await outbox_rows(db, CANCELLED, appt)
    assert len(rows) == 1
    await drain(container.relay)

    sent = await notifications_for(db, patient)
    assert [(n["topic"], n["status"]) for n in sent] == [(BOOKED, "SENT"), (CANCELLED, "SENT")]
    assert sent[1]["event_id"] == rows[0]["event_id"]
    assert await db.fetchval("SELECT status FROM outbox WHERE id = $1", rows[0]["id"]) == "DONE"


# ------------------------------------------------------ relay mechanics (own DB)


@pytest.fixture(scope="module")
async def template_db(services: tuple[str, str]) -> AsyncIterator[str]:
    """One migrated database per module, copied (fast) for each test."""
    admin = services[0]
    name = f"reservo_outbox_tpl_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(admin)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    await migrate(f"{admin.rpartition('/')[0]}/{name}")
    yield name
    conn = await asyncpg.connect(admin)
    await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await conn.close()


@pytest.fixture
async def own_url(services: tuple[str, str], template_db: str) -> AsyncIterator[str]:
    admin = services[0]
    name = f"reservo_outbox_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(admin)
    await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    await conn.close()
    yield f"{admin.rpartition('/')[0]}/{name}"
    conn = await asyncpg.connect(admin)
    await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await conn.close()


@pytest.fixture
async def own_db(own_url: str) -> AsyncIterator[Database]:
    database = Database(own_url, min_size=1, max_size=10)
    yield database
    await database.close()


def relay_over(
    database: Database,
    subs: Subscriptions,
    clock: OffsetClock,
    settings: Settings,
    **kw: Any,
) -> OutboxRelay:
    options: dict[str, Any] = {
        "lease_s": settings.outbox_lease_s,
        "max_attempts": settings.outbox_max_attempts,
        "backoff_base_s": settings.outbox_backoff_base_s,
        "backoff_max_s": settings.outbox_backoff_max_s,
        "poll_interval_s": settings.outbox_poll_interval_s,
    }
    options.update(kw)
    return OutboxRelay(database, LocalTransport(subs), clock, **options)


async def emit_many(database: Database, clock: OffsetClock, topic: str, n: int) -> list[uuid.UUID]:
    async with database.transaction() as conn:
        return [await emit(conn, topic, None, {"n": i}, clock.now()) for i in range(n)]


async def retry_until_idle(
    relay: OutboxRelay, clock: OffsetClock, database: Database, rounds: int = 50
) -> None:
    """Run the relay, jumping the clock past any backoff, until nothing is pending."""
    for _ in range(rounds):
        await relay.run_once()
        async with database.connection() as conn:
            if not await conn.fetchval("SELECT count(*) FROM outbox WHERE status = 'PENDING'"):
                return
        clock.advance(timedelta(seconds=relay.backoff_max_s + 1))
    pytest.fail("outbox still has pending rows")


async def test_failing_handler_is_retried_and_its_effect_applies_once(
    own_db: Database, base_settings: Settings, clock: OffsetClock
) -> None:
    async with own_db.connection() as conn:
        await conn.execute("CREATE TABLE effect (event_id uuid NOT NULL)")
    calls: Counter[uuid.UUID] = Counter()

    async def apply(ev: Event) -> None:
        async def write(conn: asyncpg.Connection) -> None:
            await conn.execute("INSERT INTO effect (event_id) VALUES ($1)", ev.id)

        # The effect commits first, then the handler fails: the redeliveries must
        # not apply it again (inbox), and the event must still end DONE.
        await once(own_db, "test-effects", ev.id, write)
        calls[ev.id] += 1
        if calls[ev.id] <= 2:
            raise RuntimeError(f"transient failure {calls[ev.id]}")

    subs = Subscriptions()
    subs.add("test-effects", ["test.retry.v1"], apply)
    relay = relay_over(own_db, subs, clock, base_settings)
    (event_id,) = await emit_many(own_db, clock, "test.retry.v1", 1)

    await relay.run_once()
    async with own_db.connection() as conn:
        row = await conn.fetchrow("SELECT * FROM outbox WHERE event_id = $1", event_id)
    # After one failure the row waits for its backoff, it is not re-run at once.
    assert row["status"] == "PENDING" and row["attempts"] == 1
    assert "transient failure 1" in row["last_error"]
    assert row["available_at"] > clock.now()
    assert await relay.run_once() == 0

    await retry_until_idle(relay, clock, own_db)

    async with own_db.connection() as conn:
        row = await conn.fetchrow("SELECT * FROM outbox WHERE event_id = $1", event_id)
        effects = await conn.fetchval("SELECT count(*) FROM effect WHERE event_id = $1", event_id)
    assert row["status"] == "DONE"
    assert row["attempts"] == 3
    assert row["last_error"] is None
    assert calls[event_id] == 3
    assert effects == 1


async def test_poison_event_goes_dead_without_blocking_others(
    own_db: Database, base_settings: Settings, clock: OffsetClock
) -> None:
    max_attempts = base_settings.outbox_max_attempts
    poison_calls = 0
    ok_calls: Counter[uuid.UUID] = Counter()

    async def poison(ev: Event) -> None:
        nonlocal poison_calls
        poison_calls += 1
        raise ValueError("cannot ever handle this payload")

    async def ok(ev: Event) -> None:
        ok_calls[ev.id] += 1

    subs = Subscriptions()
    subs.add("test-poison", ["test.poison.v1"], poison)
    subs.add("test-ok", ["test.ok.v1"], ok)
    relay = relay_over(own_db, subs, clock, base_settings)

    # The poison event sits between healthy ones in the same batch.
    before = await emit_many(own_db, clock, "test.ok.v1", 3)
    (bad,) = await emit_many(own_db, clock, "test.poison.v1", 1)
    after = await emit_many(own_db, clock, "test.ok.v1", 3)
    later: list[uuid.UUID] = []
    for _ in range(max_attempts + 2):
        await relay.run_once()
        # New events keep arriving while the poison one is retried: each later
        # batch must flow through as well.
        later += await emit_many(own_db, clock, "test.ok.v1", 2)
        clock.advance(timedelta(seconds=relay.backoff_max_s + 1))
    await retry_until_idle(relay, clock, own_db)

    async with own_db.connection() as conn:
        dead = await conn.fetchrow("SELECT * FROM outbox WHERE event_id = $1", bad)
        statuses = dict(
            await conn.fetch(
                "SELECT event_id, status FROM outbox WHERE event_id = ANY($1::uuid[])",
                before + after + later,
            )
        )
    assert dead["status"] == "DEAD"
    assert dead["attempts"] == max_attempts
    assert poison_calls == max_attempts
    assert "cannot ever handle this payload" in dead["last_error"]
    assert len(statuses) == len(before + after + later)
    assert set(statuses.values()) == {"DONE"}
    assert all(ok_calls[e] == 1 for e in before + after + later)
    # A dead event is never claimed again.
    clock.advance(timedelta(hours=1))
    assert await relay.run_once() == 0
    assert poison_calls == max_attempts


async def test_two_concurrent_relays_deliver_each_event_exactly_once(
    own_url: str, base_settings: Settings, clock: OffsetClock
) -> None:
    n = 500
    calls: Counter[uuid.UUID] = Counter()
    by_relay: Counter[str] = Counter()
    lock = asyncio.Lock()

    def counting(name: str) -> Any:
        async def handler(ev: Event) -> None:
            async with lock:
                calls[ev.id] += 1
                by_relay[name] += 1
            await asyncio.sleep(0.001)  # some work, so the two relays overlap

        return handler

    # Two pools, like two worker processes.
    pools = [Database(own_url, min_size=1, max_size=5) for _ in range(2)]
    relays = []
    for i, pool in enumerate(pools):
        subs = Subscriptions()
        subs.add("test-count", ["test.count.v1"], counting(f"relay-{i}"))
        relays.append(relay_over(pool, subs, clock, base_settings, batch_size=20))
    try:
        ids = await emit_many(pools[0], clock, "test.count.v1", n)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(r.run(stop)) for r in relays]
        try:
            async with asyncio.timeout(60):
                while True:
                    async with pools[0].connection() as conn:
                        done = await conn.fetchval(
                            "SELECT count(*) FROM outbox WHERE status = 'DONE'"
                        )
                    if done == n:
                        break
                    await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        async with pools[0].connection() as conn:
            rows = await conn.fetch("SELECT status, attempts FROM outbox")
    finally:
        for pool in pools:
            await pool.close()

    assert len(rows) == n
    assert {(r["status"], r["attempts"]) for r in rows} == {("DONE", 1)}
    assert set(calls) == set(ids)
    assert set(calls.values()) == {1}
    # Both relays really took part (otherwise this proved nothing about sharing).
    assert by_relay["relay-0"] > 0 and by_relay["relay-1"] > 0, by_relay


async def test_lease_returns_rows_of_a_dead_relay(
    own_db: Database, base_settings: Settings, clock: OffsetClock
) -> None:
    lease_s = 5
    delivered: list[uuid.UUID] = []

    async def handler(ev: Event) -> None:
        delivered.append(ev.id)

    subs = Subscriptions()
    subs.add("test-lease", ["test.lease.v1"], handler)
    relay = relay_over(own_db, subs, clock, base_settings, lease_s=lease_s)
    (event_id,) = await emit_many(own_db, clock, "test.lease.v1", 1)

    # A relay claims the row and "dies": it never delivers nor settles it.
    async with own_db.connection() as conn:
        claimed = await conn.fetch(Q.outbox_claim, 10, clock.now(), float(lease_s))
    assert [r["event_id"] for r in claimed] == [event_id]

    # While the lease runs, nobody else may take the row.
    assert await relay.run_once() == 0
    clock.advance(timedelta(seconds=lease_s - 1))
    assert await relay.run_once() == 0
    assert delivered == []

    clock.advance(timedelta(seconds=2))  # the lease has now expired
    assert await relay.run_once() == 1
    assert delivered == [event_id]
    async with own_db.connection() as conn:
        row = await conn.fetchrow("SELECT * FROM outbox WHERE event_id = $1", event_id)
    assert row["status"] == "DONE"
    assert row["attempts"] == 2
    assert row["locked_until"] is None
