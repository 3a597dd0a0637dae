"""The inbox and the notification table partitioned by the day their events
were created (migration 0026): a redelivered event, on another day or after a
clock move, meets its first delivery's row (the key holds across partitions and
across a row's move out of the default partition), and retention drops a whole
old day but keeps a day that may still see a redelivery.

Each test has a database of its own: the keeper drops every old day it sees."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from reservo.betting import events as betting_events
from reservo.betting import repo as betting_repo
from reservo.betting.resender import FallbackResender
from reservo.betting.setup import Betting
from reservo.bootstrap import Container, build, declared_retention
from reservo.core.db.database import Database
from reservo.core.db.migrate import migrate
from reservo.core.kernel.clock import OffsetClock
from reservo.core.maintenance.partitions import PartitionKeeper
from reservo.core.maintenance.retention import Pruner
from reservo.core.messaging.deadletters import LocalDeadLetters
from reservo.core.messaging.inbox import once
from reservo.core.messaging.notify import Notification
from reservo.core.messaging.outbox import OutboxRelay, emit
from reservo.core.messaging.transport.base import Event, Subscriptions
from reservo.core.messaging.transport.envelope import from_cloudevent, to_cloudevent
from reservo.core.messaging.transport.local import LocalTransport
from reservo.core_modules import PARTITION_MARGIN, partitioned
from reservo.notifications.consumer import NotificationConsumer
from reservo.settings import Settings
from tests.helpers.databases import DatabaseAt

DEFAULTS = Settings()
D = timedelta(days=1)
H = timedelta(hours=1)
TOPIC = "test.history.v1"


@pytest.fixture
async def own_db(own_database: str) -> AsyncIterator[Database]:
    db = Database(own_database, min_size=1, max_size=4)
    yield db
    await db.close()


@pytest.fixture
async def conn(own_database: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(own_database)
    yield c
    await c.close()


def keeper(db: Database, clock: OffsetClock, days_ahead: int = 7) -> PartitionKeeper:
    return PartitionKeeper(
        db, clock, partitioned(DEFAULTS), days_ahead=days_ahead, lock_tries=1, pause_s=0
    )


def midday(days_ago: int) -> datetime:
    """Noon (UTC) of the day ``days_ago`` days before today."""
    today = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
    return today - days_ago * D


async def where(c: asyncpg.Connection, table: str, event_id: uuid.UUID) -> list[str]:
    """The partitions holding ``table``'s rows of ``event_id``."""
    rows = await c.fetch(
        f"SELECT tableoid::regclass::text FROM {table} WHERE event_id = $1", event_id
    )
    return [r[0] for r in rows]


class Recorder:
    """A notification channel that keeps what it was asked to send."""

    name = "log"

    def __init__(self) -> None:
        self.sent: list[Notification] = []

    async def send(self, n: Notification) -> None:
        self.sent.append(n)


def one_message(event: Event) -> list[Notification]:
    return [Notification(7, "s", "b", str(event.id))]


# ----------------------------------------------------------------------- tests


async def test_a_redelivery_by_the_relay_days_later_applies_the_event_once(
    own_db: Database, conn: asyncpg.Connection
) -> None:
    """An event applied, whose DONE mark was lost (its outbox row PENDING again),
    is delivered again by a relay whose clock is three days on: the second
    delivery carries the same creation time, lands on the same day's partition,
    and the inbox refuses it; the notification is sent once."""
    clock = OffsetClock()
    async with own_db.transaction() as c:
        event_id = await emit(c, TOPIC, "k", {}, clock.now())
    applied: list[uuid.UUID] = []

    async def apply(c: asyncpg.Connection) -> None:
        applied.append(event_id)

    async def effect(event: Event) -> None:
        await once(own_db, "test-history", event, apply)

    channel = Recorder()
    notes = NotificationConsumer(own_db, channel, clock, {TOPIC: one_message})
    subs = Subscriptions()
    subs.add("test-history", [TOPIC], effect)
    subs.add("notifications", [TOPIC], notes.handle)
    relay = OutboxRelay(own_db, LocalTransport(subs, LocalDeadLetters(own_db, clock)), clock)
    assert await relay.run_once() == 1

    await conn.execute("UPDATE outbox SET status = 'PENDING', published_at = NULL")
    clock.advance(3 * D)
    assert await relay.run_once() == 1

    assert applied == [event_id]
    assert len(channel.sent) == 1
    today = f"_p{datetime.now(UTC):%Y%m%d}"
    assert await where(conn, "inbox", event_id) == [f"inbox{today}"]
    assert await where(conn, "notification", event_id) == [f"notification{today}"]
    # One row, written once when sent: the redelivery read it SENT and wrote nothing.
    assert await conn.fetchval("SELECT count(*) FROM notification") == 1
    assert await conn.fetchval("SELECT attempts FROM notification") == 0


async def test_a_row_that_moved_out_of_the_default_partition_still_refuses_a_redelivery(
    own_db: Database, conn: asyncpg.Connection
) -> None:
    """An event created on a day no partition covered yet (a producer's clock
    ahead, or days the maintenance role had not created): its first delivery's
    rows land in the default partition and move into the day when it is
    created; a redelivery, through a Kafka envelope, then meets them there."""
    created = midday(-30)  # thirty days ahead: beyond the days created ahead
    event = Event(uuid.uuid4(), TOPIC, "k", {}, created)
    applied: list[uuid.UUID] = []

    async def apply(c: asyncpg.Connection) -> None:
        applied.append(event.id)

    channel = Recorder()
    notes = NotificationConsumer(own_db, channel, OffsetClock(), {TOPIC: one_message})
    assert await once(own_db, "test-history", event, apply)
    await notes.handle(event)
    assert await where(conn, "inbox", event.id) == ["inbox_default"]
    assert await where(conn, "notification", event.id) == ["notification_default"]

    await keeper(own_db, OffsetClock(created - datetime.now(UTC)), days_ahead=1).ensure_ahead()
    day = f"_p{created:%Y%m%d}"
    assert await where(conn, "inbox", event.id) == [f"inbox{day}"]
    assert await where(conn, "notification", event.id) == [f"notification{day}"]

    again = from_cloudevent(to_cloudevent(event, "test"))
    assert again.created_at == created
    assert not await once(own_db, "test-history", again, apply)
    await notes.handle(again)
    assert applied == [event.id]
    assert len(channel.sent) == 1
    assert await conn.fetchval("SELECT count(*) FROM inbox") == 1
    assert await conn.fetchval("SELECT count(*) FROM notification") == 1


async def test_concurrent_redeliveries_across_a_day_being_created_apply_once(
    own_db: Database, own_database: str, conn: asyncpg.Connection
) -> None:
    """Deliveries of one event (each on its own connection, released together)
    race the creation of the event's day, which moves the default partition's
    rows into it: the event is applied once."""
    created = midday(-30)
    event = Event(uuid.uuid4(), TOPIC, "k", {}, created)
    deliveries = 12
    barrier = asyncio.Barrier(deliveries + 1)
    db = Database(own_database, min_size=deliveries, max_size=deliveries)

    async def apply(c: asyncpg.Connection) -> None:
        await c.execute("INSERT INTO applied VALUES ($1)", event.id)
        await asyncio.sleep(0.02)

    async def deliver() -> bool:
        await barrier.wait()
        return await once(db, "test-history", event, apply)

    async def create_day() -> None:
        await barrier.wait()
        clock = OffsetClock(created - datetime.now(UTC))
        await keeper(own_db, clock, days_ahead=1).ensure_ahead()

    await conn.execute("CREATE TABLE applied (event_id uuid NOT NULL)")
    try:
        *outcomes, _ = await asyncio.gather(*(deliver() for _ in range(deliveries)), create_day())
    finally:
        await db.close()
    assert outcomes.count(True) == 1
    assert await conn.fetchval("SELECT count(*) FROM applied") == 1
    assert await where(conn, "inbox", event.id) == [f"inbox_p{created:%Y%m%d}"]


async def test_a_claim_routed_just_before_its_day_is_attached_is_applied_once(
    own_db: Database, own_database: str, conn: asyncpg.Connection
) -> None:
    """The interleaving the race above can hit, forced: the keeper has created
    the event's day and holds the default partition while the delivery's insert
    routes its row there (the day is not visible to it yet) and waits; the
    keeper commits. PostgreSQL then refuses the row at the default partition's
    constraint. The delivery runs again and lands in the new day, applied once."""
    created = midday(-30)
    event = Event(uuid.uuid4(), TOPIC, "k", {}, created)
    applied: list[uuid.UUID] = []

    async def apply(c: asyncpg.Connection) -> None:
        applied.append(event.id)

    keeper_conn = await asyncpg.connect(own_database)
    try:
        tx = keeper_conn.transaction()
        await tx.start()
        assert await keeper_conn.fetchval(
            "SELECT history_partition_add('inbox', $1::date)", created.date()
        )
        delivery = asyncio.create_task(once(own_db, "test-history", event, apply))
        # The delivery's insert waits for the default partition's lock.
        waiting = (
            "SELECT count(*) FROM pg_locks"
            " WHERE NOT granted AND relation = 'inbox_default'::regclass"
        )
        for _ in range(200):
            if await conn.fetchval(waiting):
                break
            await asyncio.sleep(0.02)
        assert await conn.fetchval(waiting) == 1
        await tx.commit()
        assert await asyncio.wait_for(delivery, 10)
    finally:
        await keeper_conn.close()
    assert applied == [event.id]
    assert await where(conn, "inbox", event.id) == [f"inbox_p{created:%Y%m%d}"]


async def inbox_row(c: asyncpg.Connection, created: datetime, processed: datetime) -> uuid.UUID:
    event = uuid.uuid4()
    await c.execute(
        """INSERT INTO inbox (consumer, event_id, processed_at, event_created_at)
           VALUES ('test', $1, $2, $3)""",
        event,
        processed,
        created,
    )
    return event


async def notification_row(
    c: asyncpg.Connection, created: datetime, status: str, sent: datetime | None
) -> uuid.UUID:
    event = uuid.uuid4()
    await c.execute(
        """INSERT INTO notification (event_id, topic, recipient, channel, subject, body,
                                     status, created_at, sent_at, event_created_at)
           VALUES ($1, $2, 1, 'log', 's', 'b', $3, $4, $5, $4)""",
        event,
        TOPIC,
        status,
        created,
        sent,
    )
    return event


async def test_retention_drops_old_days_whole_and_keeps_days_a_redelivery_may_still_reach(
    own_db: Database, conn: asyncpg.Connection
) -> None:
    await keeper(own_db, OffsetClock(-45 * D), days_ahead=45).ensure_ahead()
    # Inbox (10 days): a day of events all applied then goes whole; a day with an
    # event applied late (2 days ago) stays, as does a day whose outbox still
    # holds a PENDING event (the relay delivers it again); 3 days ago is young.
    gone_in = [await inbox_row(conn, midday(13), midday(13) + H) for _ in range(30)]
    late_in = await inbox_row(conn, midday(12), midday(2))
    pending_in = await inbox_row(conn, midday(11), midday(11) + H)
    await conn.execute(
        """INSERT INTO outbox (event_id, topic, payload, created_at, available_at)
           VALUES ($1, $2, '{}'::jsonb, $3, $3)""",
        pending_in,  # applied once; its DONE mark was lost: delivered again
        TOPIC,
        midday(11),
    )
    young_in = await inbox_row(conn, midday(3), midday(3))
    # Notifications (30 days): a day of SENT messages goes whole, its PENDING one
    # moves to the default partition; a day with a message sent 2 days ago stays.
    gone_sent = [await notification_row(conn, midday(40), "SENT", midday(40)) for _ in range(30)]
    unsent = await notification_row(conn, midday(40), "PENDING", None)
    late_sent = await notification_row(conn, midday(35), "SENT", midday(2))
    young_sent = await notification_row(conn, midday(20), "SENT", midday(20))

    tables = ("inbox", "notification")
    p = Pruner(
        own_db,
        OffsetClock(),
        [r for r in declared_retention(DEFAULTS) if r.table in tables],
        pause_s=0,
        partitions=keeper(own_db, OffsetClock()),
    )
    batches = await p.run()
    results = {r.table: r for r in p.last_partitions}

    inbox, notes = results["inbox"], results["notification"]
    assert f"inbox_p{midday(13):%Y%m%d}" in inbox.dropped
    assert inbox.held == [f"inbox_p{midday(12):%Y%m%d}", f"inbox_p{midday(11):%Y%m%d}"]
    assert f"notification_p{midday(40):%Y%m%d}" in notes.dropped
    assert notes.held == [f"notification_p{midday(35):%Y%m%d}"]
    assert notes.kept_rows == 1
    # Everything went with the days: the batch rules found nothing left to delete.
    assert [b.rows for b in batches] == [{"inbox": 0}, {"notification": 0}]
    assert await conn.fetchval("SELECT count(*) FROM inbox WHERE event_id = ANY($1)", gone_in) == 0
    assert (
        await conn.fetchval("SELECT count(*) FROM notification WHERE event_id = ANY($1)", gone_sent)
        == 0
    )
    for event, table in [(late_in, "inbox"), (pending_in, "inbox"), (young_in, "inbox")]:
        assert len(await where(conn, table, event)) == 1
    assert await where(conn, "notification", unsent) == ["notification_default"]
    assert await where(conn, "notification", late_sent) == [f"notification_p{midday(35):%Y%m%d}"]
    assert len(await where(conn, "notification", young_sent)) == 1

    # The moved PENDING message is still its event's row: a redelivery sends it once.
    channel = Recorder()
    consumer = NotificationConsumer(
        own_db, channel, OffsetClock(), {TOPIC: lambda e: [Notification(1, "s", "b", str(unsent))]}
    )
    await consumer.handle(Event(uuid.uuid4(), TOPIC, None, {}, midday(40)))
    assert len(channel.sent) == 1
    assert await conn.fetchval("SELECT status FROM notification WHERE event_id = $1", unsent) == (
        "SENT"
    )
    assert await conn.fetchval("SELECT count(*) FROM notification WHERE event_id = $1", unsent) == 1


async def test_consumers_keep_applying_while_an_old_inbox_day_is_dropped(
    own_db: Database, own_database: str, conn: asyncpg.Connection
) -> None:
    """Concurrent consumers (released together with the drop) record today's
    events in the inbox while an old day is dropped: every one commits, once."""
    await keeper(own_db, OffsetClock(-13 * D), days_ahead=13).ensure_ahead()
    for _ in range(200):
        await inbox_row(conn, midday(12), midday(12) + H)
    consumers, each = 12, 20
    barrier = asyncio.Barrier(consumers + 1)
    db = Database(own_database, min_size=consumers, max_size=consumers)

    async def nothing(_: asyncpg.Connection) -> None:
        return None

    async def consume() -> int:
        await barrier.wait()
        applied = 0
        for _ in range(each):
            event = Event(uuid.uuid4(), TOPIC, None, {}, datetime.now(UTC))
            applied += await once(db, "test-storm", event, nothing)
            applied -= await once(db, "test-storm", event, nothing)  # refused: 0
        return applied

    async def drop() -> list[str]:
        await barrier.wait()
        inbox = [t for t in partitioned(DEFAULTS) if t.table == "inbox"]
        k = PartitionKeeper(own_db, OffsetClock(), inbox, lock_tries=20, pause_s=0.05)
        (result,) = await k.retire_old()
        return result.dropped

    try:
        dropping = asyncio.create_task(drop())
        applied = await asyncio.gather(*(consume() for _ in range(consumers)))
        dropped = await dropping
    finally:
        await db.close()
    assert f"inbox_p{midday(12):%Y%m%d}" in dropped
    assert applied == [each] * consumers
    assert await conn.fetchval("SELECT count(*) FROM inbox WHERE consumer = 'test'") == 0
    assert (
        await conn.fetchval("SELECT count(*) FROM inbox WHERE consumer = 'test-storm'")
        == consumers * each
    )


def test_inbox_days_outlive_the_outbox_by_the_margin_whatever_the_settings() -> None:
    s = Settings(retention_outbox_hours=200, retention_inbox_hours=201)
    keep = {t.table: t.keep for t in partitioned(s)}
    assert keep["inbox"] == timedelta(hours=200) + PARTITION_MARGIN
    assert keep["notification"] == timedelta(days=s.retention_notification_days)
    assert keep["inbox"] > keep["outbox"]


async def test_a_result_resent_from_the_fallback_table_keeps_the_intakes_time(
    base_settings: Settings, own_database: str
) -> None:
    """Held by the fallback table while Kafka was away, then resent two days
    later: the event carries the time the intake stamped, as the Kafka publish
    it tried first did, not the resend's."""
    clock = OffsetClock()
    c: Container = build(base_settings.with_(database_url=own_database), clock)
    published: list[Event] = []

    class Recording:
        async def publish(self, event: Event) -> None:
            published.append(event)

    try:
        received = clock.now()
        payload = {"providerEventId": "prov-1", "matchExternalId": "m-1"}
        async with c.db.transaction() as tx:
            await betting_repo.fallback_insert(tx, uuid.uuid4(), "prov-1", payload, received)
        clock.advance(2 * D)
        resender = FallbackResender(
            c.db, clock, c.module(Betting).settlement, publisher=Recording()
        )
        assert await resender.run_once() == 1
    finally:
        await c.close()
    (event,) = published
    assert event.id == betting_events.result_event_id("prov-1")
    assert event.created_at == received


async def test_the_migration_keeps_every_row_and_its_key(
    database_at: DatabaseAt,
) -> None:
    """A database migrated up to 0025, with inbox and notification rows of an
    event still in the outbox and of one already pruned from it: after 0026
    every row is there with its columns (the notification with its id, and new
    ones continue the sequence); the row of the event still in the outbox has
    that event's creation time, so its redelivery is refused."""
    url = await database_at(25)
    c = await asyncpg.connect(url)
    try:
        created = midday(1)
        kept, pruned = uuid.uuid4(), uuid.uuid4()
        await c.execute(
            """INSERT INTO outbox (event_id, topic, payload, created_at, available_at,
                                   status, published_at)
               VALUES ($1, $2, '{}'::jsonb, $3, $3, 'DONE', $3)""",
            kept,
            TOPIC,
            created,
        )
        for event, at in ((kept, created + H), (pruned, midday(20))):
            await c.execute(
                "INSERT INTO inbox (consumer, event_id, processed_at) VALUES ('c', $1, $2)",
                event,
                at,
            )
            await c.execute(
                """INSERT INTO notification (event_id, topic, recipient, channel, subject,
                                             body, status, created_at, sent_at)
                   VALUES ($1, $2, 1, 'log', 's', 'b', 'SENT', $3, $3)""",
                event,
                TOPIC,
                at,
            )
        inbox_before = [tuple(r) for r in await c.fetch("SELECT * FROM inbox ORDER BY 3")]
        before = await c.fetch("SELECT * FROM notification ORDER BY 1")
        notes_before = [tuple(r) for r in before]
        await migrate(url)
        inbox_after = [
            tuple(r)
            for r in await c.fetch("SELECT consumer, event_id, processed_at FROM inbox ORDER BY 3")
        ]
        # The columns the rows had (later migrations add event_created_at, target).
        notes_after = [
            tuple(r[name] for name in before[0].keys())  # noqa: SIM118 (a Record iterates values)
            for r in await c.fetch("SELECT * FROM notification ORDER BY 1")
        ]
        assert inbox_after == inbox_before
        assert notes_after == notes_before
        times = dict(await c.fetch("SELECT event_id, event_created_at FROM inbox"))
        assert times == {kept: created, pruned: midday(20)}
        times = dict(await c.fetch("SELECT event_id, event_created_at FROM notification"))
        assert times == {kept: created, pruned: midday(20)}
        new_id = await c.fetchval(
            """INSERT INTO notification (event_id, topic, recipient, channel, subject, body,
                                         event_created_at)
               VALUES ($1, $2, 1, 'log', 's', 'b', now()) RETURNING id""",
            uuid.uuid4(),
            TOPIC,
        )
        assert new_id > max(r[0] for r in notes_before)
        db = Database(url, min_size=1, max_size=1)
        try:

            async def apply(_: asyncpg.Connection) -> None:
                raise AssertionError("applied twice")

            assert not await once(db, "c", Event(kept, TOPIC, None, {}, created), apply)
        finally:
            await db.close()
    finally:
        await c.close()
