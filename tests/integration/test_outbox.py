"""The transactional outbox, its relay and the notifications consumer, end to end.

HTTP tests run on the session database with the container's own relay. The relay
mechanics tests (retries, poison events, concurrent relays, leases) each get a
fresh database: a relay claims *every* pending row, so sharing a backlog with
other tests would make their counts meaningless (and mark other tests' events
done with test-only subscriptions)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from reservo.app import create_app
from reservo.appointments import events as appointment_events
from reservo.appointments.gate import full_key
from reservo.bootstrap import Container, build
from reservo.core.db.database import Database, Queries
from reservo.core.kernel.clock import OffsetClock
from reservo.core.messaging.deadletters import LocalDeadLetters
from reservo.core.messaging.inbox import once, once_many
from reservo.core.messaging.notify import Notification
from reservo.core.messaging.outbox import OutboxRelay, emit
from reservo.core.messaging.transport.base import Event, Subscriptions
from reservo.core.messaging.transport.local import LocalTransport
from reservo.core_modules import Outbox
from reservo.notifications.channels import NotificationError
from reservo.notifications.consumer import NotificationConsumer
from reservo.settings import Settings
from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import auth, new_id
from tests.helpers.waiting import drain

Q = Queries.load("reservo.core.messaging")
BOOKED = appointment_events.BOOKED
CANCELLED = appointment_events.CANCELLED


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

    await drain(container.module(Outbox).relay)

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
    await container.cache.clear_mark(full_key(slot))
    r = await book(client, slot, loser)
    assert r.status_code == 409, r.text
    assert r.json()["code"] == "slot_full"

    assert (
        await db.fetchval(
            "SELECT count(*) FROM outbox WHERE payload->>'patientId' = $1", str(loser)
        )
        == 0
    )
    await drain(container.module(Outbox).relay)
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
    await drain(container.module(Outbox).relay)

    for _ in range(2):  # the second cancel is a no-op that must emit nothing
        c = await client.delete(f"/api/appointments/{appt}", headers=auth("patient", patient))
        assert c.status_code == 200, c.text
        assert c.json()["status"] == "CANCELLED"

    rows = await outbox_rows(db, CANCELLED, appt)
    assert len(rows) == 1
    await drain(container.module(Outbox).relay)

    sent = await notifications_for(db, patient)
    assert [(n["topic"], n["status"]) for n in sent] == [(BOOKED, "SENT"), (CANCELLED, "SENT")]
    assert sent[1]["event_id"] == rows[0]["event_id"]
    assert await db.fetchval("SELECT status FROM outbox WHERE id = $1", rows[0]["id"]) == "DONE"


# ------------------------------------------------------ relay mechanics (own DB)


@pytest.fixture
async def own_db(own_database: str) -> AsyncIterator[Database]:
    database = Database(own_database, min_size=1, max_size=10)
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
        "backoff_base_s": settings.outbox_backoff_base_s,
        "backoff_max_s": settings.outbox_backoff_max_s,
        "poll_interval_s": settings.outbox_poll_interval_s,
    }
    options.update(kw)
    return OutboxRelay(
        database, LocalTransport(subs, LocalDeadLetters(database, clock)), clock, **options
    )


async def readyz_backlog(url: str, settings: Settings) -> dict[str, Any]:
    container = build(settings.with_(database_url=url))
    try:
        transport = httpx.ASGITransport(app=create_app(container, owns_container=False))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            r = await client.get("/readyz")
    finally:
        await container.close()
    assert r.status_code == 200, r.text
    backlog: dict[str, Any] = r.json()["backlog"]
    return backlog


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
        await once(own_db, "test-effects", ev, write)
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


async def test_a_rejected_event_is_parked_at_once_for_its_consumer_alone(
    own_db: Database, base_settings: Settings, clock: OffsetClock
) -> None:
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
    subs.add("test-ok", ["test.ok.v1", "test.poison.v1"], ok)
    relay = relay_over(own_db, subs, clock, base_settings)

    # The poison event sits between healthy ones in the same batch.
    before = await emit_many(own_db, clock, "test.ok.v1", 3)
    (bad,) = await emit_many(own_db, clock, "test.poison.v1", 1)
    after = await emit_many(own_db, clock, "test.ok.v1", 3)
    await retry_until_idle(relay, clock, own_db)

    async with own_db.connection() as conn:
        statuses = dict(await conn.fetch("SELECT event_id, status FROM outbox"))
        parked = await conn.fetch("SELECT consumer, topic, event_id, error FROM dead_letter")
    # Rejected: parked once, for the consumer that rejected it, never retried...
    assert poison_calls == 1
    assert [(p["consumer"], p["topic"], p["event_id"]) for p in parked] == [
        ("test-poison", "test.poison.v1", bad)
    ]
    assert "cannot ever handle this payload" in parked[0]["error"]
    # ...and the other consumer of that topic and every other event flowed through.
    assert set(statuses.values()) == {"DONE"} and len(statuses) == 7
    assert all(ok_calls[e] == 1 for e in [*before, bad, *after])
    clock.advance(timedelta(hours=1))
    assert await relay.run_once() == 0
    assert poison_calls == 1


async def test_a_consumer_outage_outlasting_any_budget_delays_no_other_consumer(
    own_db: Database, own_database: str, base_settings: Settings, clock: OffsetClock
) -> None:
    """One consumer's dependency is away for 30 deliveries (the old budget was 8):
    the event is never DEAD, the other consumer of the topic applied it on the
    first pass, and the failing one applies it once when its dependency is back."""
    async with own_db.connection() as conn:
        await conn.execute("CREATE TABLE effect2 (consumer text, event_id uuid)")
    away = True
    flaky_calls = 0

    def effect(consumer: str) -> Any:
        async def handle(ev: Event) -> None:
            nonlocal flaky_calls
            if consumer == "flaky":
                flaky_calls += 1
                if away:
                    raise ConnectionRefusedError("smtp refused the connection")

            async def write(conn: asyncpg.Connection) -> None:
                await conn.execute("INSERT INTO effect2 VALUES ($1, $2)", consumer, ev.id)

            await once(own_db, f"test-{consumer}", ev, write)

        return handle

    subs = Subscriptions()
    subs.add("flaky", ["test.outage.v1"], effect("flaky"))
    subs.add("healthy", ["test.outage.v1"], effect("healthy"))
    relay = relay_over(own_db, subs, clock, base_settings)
    (event_id,) = await emit_many(own_db, clock, "test.outage.v1", 1)

    async def applied() -> list[str]:
        async with own_db.connection() as conn:
            rows = await conn.fetch("SELECT consumer FROM effect2 WHERE event_id = $1", event_id)
        return sorted(r[0] for r in rows)

    await relay.run_once()
    assert await applied() == ["healthy"]
    for _ in range(30):
        clock.advance(timedelta(seconds=relay.backoff_max_s + 1))
        await relay.run_once()
    async with own_db.connection() as conn:
        row = await conn.fetchrow("SELECT * FROM outbox WHERE event_id = $1", event_id)
    assert row["status"] == "PENDING" and row["attempts"] == 31 and flaky_calls == 31
    assert "smtp refused the connection" in row["last_error"]
    # Capped backoff: the next try is never more than the cap away.
    assert row["available_at"] - clock.now() <= timedelta(seconds=relay.backoff_max_s)
    # An operator sees it: /readyz stays 200 and shows the event being retried.
    backlog = await readyz_backlog(own_database, base_settings)
    assert backlog["outboxRetrying"] == 1 and backlog["deadLetters"] == 0
    away = False
    await retry_until_idle(relay, clock, own_db)
    assert await applied() == ["flaky", "healthy"]
    assert (await readyz_backlog(own_database, base_settings))["outboxPending"] == 0
    async with own_db.connection() as conn:
        assert await conn.fetchval("SELECT status FROM outbox WHERE event_id = $1", event_id) == (
            "DONE"
        )
        assert await conn.fetchval("SELECT count(*) FROM dead_letter") == 0


async def test_two_concurrent_relays_deliver_each_event_exactly_once(
    own_database: str, base_settings: Settings, clock: OffsetClock
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
    pools = [Database(own_database, min_size=1, max_size=5) for _ in range(2)]
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


# -- batch handlers and the pipelined relay -------------------------------------


def _event(n: int, key: str = "k") -> Event:
    return Event(uuid.uuid4(), "test.batch.v1", key, {"n": n}, datetime.now().astimezone())


async def _emit_keyed(db: Database, clock: OffsetClock, topic: str, n: int, keys: int) -> None:
    async with db.transaction() as conn:
        for i in range(n):
            await emit(conn, topic, f"agg-{i % keys}", {"seq": i // keys}, clock.now())


async def test_once_many_applies_each_event_once_in_order(own_db: Database) -> None:
    a, b, c = _event(1), _event(2), _event(3)
    applied: list[list[int]] = []

    async def apply(conn: asyncpg.Connection, fresh: list[Event]) -> None:
        applied.append([e.payload["n"] for e in fresh])

    # b twice in one batch (a redelivered record fetched with its first copy).
    assert await once_many(own_db, "batch-test", [a, b, b], apply) == 2
    # A redelivery of the whole batch plus a new event: only the new one runs.
    assert await once_many(own_db, "batch-test", [a, b, c], apply) == 1
    assert await once_many(own_db, "batch-test", [c, a], apply) == 0
    assert applied == [[1, 2], [3]]


async def test_failed_batch_rolls_back_its_inbox_rows(own_db: Database) -> None:
    a = _event(1)

    async def boom(conn: asyncpg.Connection, fresh: list[Event]) -> None:
        raise RuntimeError("handler failed")

    with pytest.raises(RuntimeError):
        await once_many(own_db, "batch-test-rb", [a], boom)
    seen: list[Event] = []

    async def apply(conn: asyncpg.Connection, fresh: list[Event]) -> None:
        seen.extend(fresh)

    assert await once_many(own_db, "batch-test-rb", [a], apply) == 1  # not marked applied
    assert seen == [a]


async def test_pipelined_relay_delivers_each_event_once_in_order_per_key(
    own_db: Database, base_settings: Settings, clock: OffsetClock
) -> None:
    topic = "test.pipeline.v1"
    await _emit_keyed(own_db, clock, topic, 1200, keys=7)
    seen: dict[str, list[int]] = defaultdict(list)
    ids: Counter[uuid.UUID] = Counter()

    async def handler(event: Event) -> None:
        ids[event.id] += 1
        assert event.key is not None
        seen[event.key].append(event.payload["seq"])
        await asyncio.sleep(0)

    subs = Subscriptions()
    subs.add("pipeline", [topic], handler)
    relay = relay_over(own_db, subs, clock, base_settings, batch_size=100, pipelined=True)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        for _ in range(400):
            if relay.settled_total >= 1200:
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task
    assert len(ids) == 1200 and set(ids.values()) == {1}
    for key, seqs in seen.items():
        assert seqs == sorted(seqs), f"{key} out of order"
    async with own_db.connection() as conn:
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM outbox WHERE topic = $1 AND status = 'DONE'", topic
            )
            == 1200
        )


class _GatedTransport:
    """Delivers after ``release`` is set; tells when a delivery started."""

    def __init__(self) -> None:
        self.started, self.release = asyncio.Event(), asyncio.Event()
        self.delivered: list[uuid.UUID] = []

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def deliver(self, events: Sequence[Event]) -> list[BaseException | None]:
        self.started.set()
        await self.release.wait()
        self.delivered += [e.id for e in events]
        return [None] * len(events)


async def test_stopping_relay_settles_its_batch_and_hands_back_its_prefetch(
    own_db: Database, clock: OffsetClock
) -> None:
    topic = "test.prefetch.v1"
    await _emit_keyed(own_db, clock, topic, 300, keys=3)
    transport = _GatedTransport()
    relay = OutboxRelay(own_db, transport, clock, batch_size=100, lease_s=300, pipelined=True)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    await asyncio.wait_for(transport.started.wait(), 10)
    for _ in range(200):  # the next batch is claimed while the first is out
        async with own_db.connection() as conn:
            leased = await conn.fetchval(
                "SELECT count(*) FROM outbox WHERE topic = $1 AND locked_until IS NOT NULL", topic
            )
        if leased == 200:
            break
        await asyncio.sleep(0.02)
    assert leased == 200
    stop.set()
    transport.release.set()
    await asyncio.wait_for(task, 10)
    async with own_db.connection() as conn:
        rows = await conn.fetch(
            "SELECT status, attempts, locked_until IS NULL AS free FROM outbox WHERE topic = $1",
            topic,
        )
    status = Counter((r["status"], r["attempts"], r["free"]) for r in rows)
    # The batch in flight is recorded DONE; the prefetched one is free again at
    # once (not after its 300 s lease), without an attempt spent; the third was
    # never claimed.
    assert status == {("DONE", 1, True): 100, ("PENDING", 0, True): 200}
    assert len(transport.delivered) == 100


class _RecordingChannel:
    """An outbound channel that records what it was asked to send (and can fail)."""

    name = "test"

    def __init__(self, fail_subject: str | None = None) -> None:
        self.sent: list[tuple[int, str]] = []
        self.fail_subject = fail_subject

    async def send(self, n: Notification) -> None:
        await asyncio.sleep(0)
        if n.subject == self.fail_subject:
            raise NotificationError("provider refused")
        self.sent.append((n.recipient_user_id, n.subject))


def _render(event: Event) -> list[Notification]:
    return [Notification(event.payload["to"], event.payload["subject"], "body", str(event.id))]


def _notify_batch(topic: str, per_key: int, clock: OffsetClock) -> list[Event]:
    """Events for aggregates 1 and 2, interleaved; subject "<aggregate>-<n>"."""
    return [
        Event(uuid.uuid4(), topic, f"appt:{k}", {"to": k, "subject": f"{k}-{n}"}, clock.now())
        for n in range(per_key)
        for k in (1, 2)
    ]


async def test_notification_batch_sends_each_message_once_in_order_per_aggregate(
    own_db: Database, clock: OffsetClock
) -> None:
    topic = "test.notify.v1"
    batch = _notify_batch(topic, 3, clock)
    channel = _RecordingChannel()
    consumer = NotificationConsumer(own_db, channel, clock, {topic: _render})
    # The batch, with its first event delivered a second time inside it.
    await consumer.handle_many([*batch, batch[0]])
    assert sorted(channel.sent) == sorted((e.payload["to"], e.payload["subject"]) for e in batch)
    for k in (1, 2):  # one aggregate's messages go out in event order
        assert [s for to, s in channel.sent if to == k] == [f"{k}-0", f"{k}-1", f"{k}-2"]
    # Redelivered as a whole: everything is already SENT, nothing goes out again.
    await consumer.handle_many(batch)
    assert len(channel.sent) == 6
    async with own_db.connection() as conn:
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM notification WHERE topic = $1 AND status = 'SENT'", topic
            )
            == 6
        )


async def test_notification_batch_failure_keeps_what_was_sent(
    own_db: Database, clock: OffsetClock
) -> None:
    topic = "test.notifyfail.v1"
    batch = _notify_batch(topic, 2, clock)
    channel = _RecordingChannel(fail_subject="1-0")
    consumer = NotificationConsumer(own_db, channel, clock, {topic: _render})
    with pytest.raises(NotificationError):
        await consumer.handle_many(batch)
    # Aggregate 1 stopped at its failed first message; aggregate 2 went out.
    assert channel.sent == [(2, "2-0"), (2, "2-1")]
    channel.fail_subject = None
    await consumer.handle_many(batch)  # the retry sends only what is missing
    assert sorted(channel.sent) == [(1, "1-0"), (1, "1-1"), (2, "2-0"), (2, "2-1")]


class _PeekingChannel:
    """Sends nothing; records, for each message, the notification rows that
    existed while it was being sent (the consumer writes a row after its send)."""

    name = "test"

    def __init__(self, db: Database, fail: bool = False) -> None:
        self.db, self.fail = db, fail
        self.rows_during_send: list[int] = []

    async def send(self, n: Notification) -> None:
        async with self.db.connection() as conn:
            self.rows_during_send.append(
                await conn.fetchval(
                    "SELECT count(*) FROM notification WHERE event_id = $1", uuid.UUID(n.event_id)
                )
            )
        if self.fail:
            raise NotificationError("provider refused")


async def test_notification_row_is_written_once_after_its_send(
    own_db: Database, clock: OffsetClock
) -> None:
    topic = "test.notifyonce.v1"
    batch = _notify_batch(topic, 2, clock)
    channel = _PeekingChannel(own_db)
    consumer = NotificationConsumer(own_db, channel, clock, {topic: _render})
    await consumer.handle_many(batch)
    assert channel.rows_during_send == [0, 0, 0, 0]  # no PENDING row written first
    async with own_db.connection() as conn:
        rows = await conn.fetch(
            "SELECT status, attempts, sent_at, last_error FROM notification WHERE topic = $1",
            topic,
        )
    assert [(r["status"], r["attempts"], r["last_error"]) for r in rows] == [("SENT", 0, None)] * 4
    assert all(r["sent_at"] == rows[0]["sent_at"] is not None for r in rows)


async def test_notification_failed_send_is_kept_pending_then_sent_once(
    own_db: Database, clock: OffsetClock
) -> None:
    topic = "test.notifyretry.v1"
    batch = _notify_batch(topic, 1, clock)
    channel = _PeekingChannel(own_db, fail=True)
    consumer = NotificationConsumer(own_db, channel, clock, {topic: _render})
    for _ in range(2):
        with pytest.raises(NotificationError):
            await consumer.handle_many(batch)

    async def rows() -> list[tuple[str, int, str | None]]:
        async with own_db.connection() as conn:
            got = await conn.fetch(
                "SELECT status, attempts, last_error FROM notification WHERE topic = $1"
                " ORDER BY recipient",
                topic,
            )
        return [(r["status"], r["attempts"], r["last_error"]) for r in got]

    # Each failed send counted, with its reason, on the message's one PENDING row.
    assert await rows() == [("PENDING", 2, "provider refused")] * 2
    channel.fail = False
    await consumer.handle_many(batch)
    await consumer.handle_many(batch)  # redelivered once more: nothing is sent again
    assert channel.rows_during_send == [0, 0, 1, 1, 1, 1]
    assert await rows() == [("SENT", 2, None)] * 2


class _FailingOnceTransport:
    """Fails the first delivery of the events whose ``seq`` is in ``fail`` (a
    transient failure: a broker that timed out), and the rest of that key's events
    in the same delivery (as Kafka does: one batch in flight per partition, and the
    ones queued behind an expired batch expire too); delivers everything else and
    records the order in which each key's events went out."""

    def __init__(self, fail: set[int]) -> None:
        self.fail = set(fail)
        self.sent: dict[str, list[int]] = defaultdict(list)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def deliver(self, events: Sequence[Event]) -> list[BaseException | None]:
        results: list[BaseException | None] = []
        stuck: set[str | None] = set()
        for e in events:
            seq = e.payload["seq"]
            if seq in self.fail or e.key in stuck:
                self.fail.discard(seq)
                stuck.add(e.key)
                results.append(TimeoutError("the broker did not acknowledge in time"))
            else:
                self.sent[e.key or ""].append(seq)
                results.append(None)
        return results


@pytest.mark.parametrize("pipelined", [False, True])
async def test_a_failed_event_keeps_its_keys_later_events_behind_it(
    own_db: Database, clock: OffsetClock, pipelined: bool
) -> None:
    """A key's first events fail once (retried after a backoff): the key's later
    events, in the same batch's successors and in a batch claimed meanwhile, wait
    for them; other keys go on."""
    topic = "test.key-order.v1"
    await _emit_keyed(own_db, clock, topic, 300, keys=3)
    transport = _FailingOnceTransport(fail={0, 1, 60})
    relay = OutboxRelay(
        own_db,
        transport,
        clock,
        batch_size=50,
        backoff_base_s=0.05,
        backoff_max_s=0.1,
        poll_interval_s=0.01,
        pipelined=pipelined,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        for _ in range(400):
            if sum(len(v) for v in transport.sent.values()) == 300:
                break
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        await task
    assert sum(len(v) for v in transport.sent.values()) == 300
    for key, seqs in transport.sent.items():
        assert seqs == sorted(seqs), f"{key} out of order"
