"""The outbox's day partitions (migration 0025, reservo.core.maintenance.partitions): days
are created ahead, a day wholly past retention whose rows are all finished is
dropped whole, a day holding a pending event is not (the event survives and is
delivered), rows no day covers land in the default partition, and the consumer
inbox (not partitioned: its key must stay unique) still applies an event once
under concurrent duplicate deliveries.

Each test has a database of its own: the keeper drops every old day it sees."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from reservo.bootstrap import declared_retention
from reservo.core.db.database import Database, Queries
from reservo.core.db.migrate import migrate
from reservo.core.kernel.clock import OffsetClock
from reservo.core.maintenance.partitions import PartitionKeeper
from reservo.core.maintenance.retention import Pruner
from reservo.core.messaging.deadletters import LocalDeadLetters
from reservo.core.messaging.inbox import once
from reservo.core.messaging.outbox import OutboxRelay
from reservo.core.messaging.transport.base import Event, Subscriptions
from reservo.core.messaging.transport.local import LocalTransport
from reservo.core_modules import partitioned
from reservo.settings import Settings
from tests.helpers.databases import DatabaseAt

Q_maintenance = Queries.load("reservo.core.maintenance")
Q_messaging = Queries.load("reservo.core.messaging")
DEFAULTS = Settings()
D = timedelta(days=1)
H = timedelta(hours=1)


@pytest.fixture
async def own_db(own_database: str) -> AsyncIterator[Database]:
    db = Database(own_database, min_size=1, max_size=6)
    yield db
    await db.close()


@pytest.fixture
async def conn(own_database: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(own_database)
    yield c
    await c.close()


def keeper(db: Database, clock: OffsetClock, **kw: int) -> PartitionKeeper:
    return PartitionKeeper(
        db,
        clock,
        [t for t in partitioned(DEFAULTS) if t.table == "outbox"],
        days_ahead=kw.get("days_ahead", 7),
        lock_timeout_ms=kw.get("lock_timeout_ms", 200),
        lock_tries=kw.get("lock_tries", 1),
        pause_s=0,
    )


def pruner(db: Database, clock: OffsetClock) -> Pruner:
    outbox_rule = [r for r in declared_retention(DEFAULTS) if r.name == "outbox_prune"]
    return Pruner(db, clock, outbox_rule, batch=5000, pause_s=0, partitions=keeper(db, clock))


def midday(days_ago: int) -> datetime:
    """Noon (UTC) of the day ``days_ago`` days before today."""
    today = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
    return today - days_ago * D


async def outbox(
    c: asyncpg.Connection,
    status: str,
    created: datetime,
    published: datetime | None,
) -> int:
    return int(
        await c.fetchval(
            """INSERT INTO outbox (event_id, topic, payload, created_at, available_at, status,
                                   published_at)
               VALUES ($1, 'test.partitions.v1', '{}'::jsonb, $2, $2, $3, $4) RETURNING id""",
            uuid.uuid4(),
            created,
            status,
            published,
        )
    )


async def partitions(c: asyncpg.Connection) -> list[str]:
    return [r["name"] for r in await c.fetch(Q_maintenance.partition_list, "outbox")]


async def where(c: asyncpg.Connection, row_id: int) -> str | None:
    """The partition holding outbox row ``row_id`` (None: no such row)."""
    found = await c.fetchval("SELECT tableoid::regclass::text FROM outbox WHERE id = $1", row_id)
    return None if found is None else str(found)


async def make_old_days(db: Database, days_ago: int) -> None:
    """Creates the day partitions from ``days_ago`` days ago to today, as a
    keeper running all along would have."""
    await keeper(db, OffsetClock(-days_ago * D), days_ahead=days_ago).ensure_ahead()


# ----------------------------------------------------------------------- tests


async def test_the_migration_moves_existing_rows_keeping_their_ids_and_the_sequence(
    database_at: DatabaseAt,
) -> None:
    """A database migrated up to before 0025, with events of every status, old
    and new: after 0025 every row is there with its id and columns, in today's
    partition or the default one, and new events continue the same sequence."""
    url = await database_at(24)
    c = await asyncpg.connect(url)
    try:
        now = datetime.now(UTC)
        rows = [
            ("DONE", now - 5 * D, now - 5 * D + H),
            ("DEAD", now - 40 * D, None),
            ("PENDING", now - 2 * D, None),
            ("PENDING", now, None),
            ("DONE", now, now),
        ]
        ids = [await outbox(c, *r) for r in rows]
        before = [dict(r) for r in await c.fetch("SELECT * FROM outbox ORDER BY id")]
        await migrate(url)
        after = [dict(r) for r in await c.fetch("SELECT * FROM outbox ORDER BY id")]
        # Every row with its columns as they were; the columns later migrations
        # add (0042: trace context) are empty on the rows that existed before.
        assert [{k: r[k] for k in before[0]} for r in after] == before
        assert {v for r in after for k, v in r.items() if k not in before[0]} == {None}
        today = f"outbox_p{now:%Y%m%d}"
        assert [await where(c, i) for i in ids] == [
            "outbox_default",
            "outbox_default",
            "outbox_default",
            today,
            today,
        ]
        new_id = await outbox(c, "PENDING", now, None)
        assert new_id > max(ids)
        # The old rows are pruned by batches as before: the DONE one of 5 days ago.
        db = Database(url, min_size=1, max_size=1)
        try:
            outbox_rule = [r for r in declared_retention(DEFAULTS) if r.name == "outbox_prune"]
            (result,) = await Pruner(db, OffsetClock(), outbox_rule).run()
        finally:
            await db.close()
        assert result.rows == {"outbox": 1}
    finally:
        await c.close()


async def test_the_migration_left_today_and_the_next_week_and_a_keeper_adds_the_days_ahead(
    own_db: Database, conn: asyncpg.Connection
) -> None:
    today = datetime.now(UTC).date()
    expected = [f"outbox_p{today + d * D:%Y%m%d}" for d in range(8)]
    assert (await partitions(conn))[:8] == expected

    clock = OffsetClock(20 * D)  # twenty days later: none of those days exist yet
    (result,) = await keeper(own_db, clock, days_ahead=3).ensure_ahead()
    later = [f"outbox_p{today + d * D:%Y%m%d}" for d in range(20, 24)]
    assert result.created == later
    assert (await partitions(conn))[-4:] == later
    # Each new day is a real partition with the table's indexes.
    indexes = {
        r[0]
        for r in await conn.fetch("SELECT indexdef FROM pg_indexes WHERE tablename = $1", later[0])
    }
    assert any("(id, created_at)" in i and "UNIQUE" in i for i in indexes)
    assert any("WHERE (status = 'PENDING'::text)" in i for i in indexes)
    # Done once: a second run creates nothing.
    (again,) = await keeper(own_db, clock, days_ahead=3).ensure_ahead()
    assert again.created == []


async def test_rows_no_day_covers_land_in_the_default_partition_and_move_when_their_day_comes(
    own_db: Database, conn: asyncpg.Connection
) -> None:
    far = datetime(2099, 6, 1, 12, tzinfo=UTC)
    early = datetime(2001, 1, 1, tzinfo=UTC)
    late_row = await outbox(conn, "PENDING", far, None)
    early_row = await outbox(conn, "DONE", early, early)
    today_row = await outbox(conn, "PENDING", datetime.now(UTC), None)
    assert await where(conn, late_row) == "outbox_default"
    assert await where(conn, early_row) == "outbox_default"
    assert await where(conn, today_row) == f"outbox_p{datetime.now(UTC):%Y%m%d}"

    # The day of the far row is created (a keeper running then): the row moves
    # into it, same id, and the default partition keeps only the early row.
    await keeper(own_db, OffsetClock(far - datetime.now(UTC)), days_ahead=1).ensure_ahead()
    assert await where(conn, late_row) == "outbox_p20990601"
    assert await conn.fetchval("SELECT count(*) FROM outbox_default") == 1


async def test_an_old_day_whose_events_are_all_done_is_dropped_whole(
    own_db: Database, conn: asyncpg.Connection
) -> None:
    await make_old_days(own_db, 10)
    old_day = f"outbox_p{midday(9):%Y%m%d}"
    done = [await outbox(conn, "DONE", midday(9), midday(9) + H) for _ in range(50)]
    # A DEAD event of that day waits for a replay: it outlives its day.
    dead = await outbox(conn, "DEAD", midday(9), None)
    # A day within retention (72 h: two days ago ends 24-48 h ago) is kept.
    young = await outbox(conn, "DONE", midday(2), midday(2) + H)
    young_day = f"outbox_p{midday(2):%Y%m%d}"

    p = pruner(own_db, OffsetClock())
    (batches,) = await p.run()

    (result,) = p.last_partitions
    assert old_day in result.dropped
    assert result.held == [] and result.busy == []
    assert result.kept_rows == 1
    assert old_day not in await partitions(conn)
    assert young_day in await partitions(conn)
    # Gone with their partition, not by batches: the batch rule deleted nothing.
    assert batches.rows == {"outbox": 0}
    assert await conn.fetchval("SELECT count(*) FROM outbox WHERE id = ANY($1)", done) == 0
    assert await where(conn, dead) == "outbox_default"
    assert await conn.fetchval("SELECT status FROM outbox WHERE id = $1", dead) == "DEAD"
    assert await where(conn, young) == young_day


async def test_a_day_holding_a_pending_event_is_kept_and_the_event_is_delivered(
    own_db: Database, conn: asyncpg.Connection
) -> None:
    await make_old_days(own_db, 10)
    old_day = f"outbox_p{midday(9):%Y%m%d}"
    done = [await outbox(conn, "DONE", midday(9), midday(9) + H) for _ in range(20)]
    pending = await outbox(conn, "PENDING", midday(9), None)

    clock = OffsetClock()
    p = pruner(own_db, clock)
    (batches,) = await p.run()
    (result,) = p.last_partitions
    assert result.held == [old_day]
    assert old_day in await partitions(conn)
    # The fallback: that day's DONE rows go by batches; the pending row stays.
    assert batches.rows == {"outbox": 20}
    assert await conn.fetchval("SELECT count(*) FROM outbox WHERE id = ANY($1)", done) == 0
    assert await where(conn, pending) == old_day

    delivered: list[Event] = []

    async def handler(event: Event) -> None:
        delivered.append(event)

    subs = Subscriptions()
    subs.add("test-partitions", ["test.partitions.v1"], handler)
    relay = OutboxRelay(own_db, LocalTransport(subs, LocalDeadLetters(own_db, clock)), clock)
    assert await relay.run_once() == 1
    assert len(delivered) == 1
    assert await conn.fetchval("SELECT status FROM outbox WHERE id = $1", pending) == "DONE"

    # Published now, so kept for the retention from now; after it, the day goes whole.
    clock.advance(timedelta(hours=DEFAULTS.retention_outbox_hours) + H)
    p = pruner(own_db, clock)
    await p.run()
    assert old_day in p.last_partitions[0].dropped
    assert await where(conn, pending) is None


async def test_a_drop_waits_for_no_writer_and_checks_the_rows_under_its_lock(
    own_db: Database, conn: asyncpg.Connection, own_database: str
) -> None:
    """A transaction holding the table (here: turning an old DONE event back to
    PENDING, as an operator's replay would) keeps the drop from its lock: the
    drop gives up after its lock timeout instead of queueing every writer
    behind it. Once that commits, the check under the lock sees the PENDING
    row and keeps the day."""
    await make_old_days(own_db, 10)
    old_day = f"outbox_p{midday(9):%Y%m%d}"
    row = await outbox(conn, "DONE", midday(9), midday(9) + H)
    other = await asyncpg.connect(own_database)
    try:
        tx = other.transaction()
        await tx.start()
        await other.execute(
            "UPDATE outbox SET status = 'PENDING', published_at = NULL WHERE id = $1", row
        )
        (result,) = await asyncio.wait_for(
            keeper(own_db, OffsetClock(), lock_timeout_ms=300).retire_old(), 10
        )
        assert old_day in result.busy
        assert result.dropped == []
        assert old_day in await partitions(conn)
        await tx.commit()
    finally:
        await other.close()
    (result,) = await keeper(own_db, OffsetClock()).retire_old()
    assert result.held == [old_day]
    assert old_day not in result.dropped
    assert await where(conn, row) == old_day


async def test_writers_keep_writing_while_a_day_is_dropped(
    own_db: Database, conn: asyncpg.Connection
) -> None:
    """Many concurrent emitters (released together) write today's events while
    an old day is dropped: every one of them commits and is in the table."""
    await make_old_days(own_db, 10)
    for _ in range(200):
        await outbox(conn, "DONE", midday(9), midday(9) + H)
    writers, each = 16, 20
    barrier = asyncio.Barrier(writers + 1)

    async def write() -> int:
        await barrier.wait()
        for _ in range(each):
            async with own_db.transaction() as c:
                await c.execute(
                    Q_messaging.outbox_insert,
                    uuid.uuid4(),
                    "test.storm.v1",
                    None,
                    {},
                    datetime.now(UTC),
                    None,  # no trace context
                    None,  # no request id
                )
        return each

    async def drop() -> list[str]:
        await barrier.wait()
        (result,) = await keeper(own_db, OffsetClock(), lock_tries=20).retire_old()
        return result.dropped

    *written, dropped = await asyncio.gather(*(write() for _ in range(writers)), drop())
    assert f"outbox_p{midday(9):%Y%m%d}" in dropped
    assert (
        await conn.fetchval("SELECT count(*) FROM outbox WHERE topic = 'test.partitions.v1'") == 0
    )
    assert await conn.fetchval("SELECT count(*) FROM outbox WHERE topic = 'test.storm.v1'") == sum(
        written
    )


async def test_concurrent_duplicate_deliveries_of_an_event_apply_it_once(
    own_database: str, conn: asyncpg.Connection
) -> None:
    """The inbox's key (consumer, event_id, event_created_at) holds under
    concurrent duplicate deliveries: 24 deliveries of one event, each on its own
    connection and released together, apply it once."""
    await conn.execute("CREATE TABLE applied (event_id uuid NOT NULL)")
    event = Event(uuid.uuid4(), "test.dedup.v1", None, {}, datetime.now(UTC))
    deliveries = 24
    barrier = asyncio.Barrier(deliveries)
    db = Database(own_database, min_size=deliveries, max_size=deliveries)

    async def apply(c: asyncpg.Connection) -> None:
        await c.execute("INSERT INTO applied VALUES ($1)", event.id)
        await asyncio.sleep(0.05)  # hold the claim open while the others arrive

    async def deliver() -> bool:
        await barrier.wait()
        return await once(db, "test-dedup", event, apply)

    try:
        outcomes = await asyncio.gather(*(deliver() for _ in range(deliveries)))
    finally:
        await db.close()
    assert outcomes.count(True) == 1
    assert await conn.fetchval("SELECT count(*) FROM applied") == 1
    assert await conn.fetchval("SELECT count(*) FROM inbox WHERE consumer = 'test-dedup'") == 1
