"""Retention: the pruner deletes old finished rows of every growing table, keeps
young ones and everything still needed, and works in small batches that are each
their own transaction and never wait on a row the hot path holds.

Each test has a database of its own: the pruner deletes every old row it can
see, so sharing the session database would delete other tests' rows (and count
them)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import asyncpg
import httpx
import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError

from reservo.app import create_app
from reservo.bootstrap import build, declared_retention, run_workers
from reservo.core.db.database import Database
from reservo.core.kernel.clock import OffsetClock
from reservo.core.maintenance.retention import Pruner
from reservo.core_modules import Outbox
from reservo.settings import Settings
from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import new_id

DEFAULTS = Settings()
H = timedelta(hours=1)
D = timedelta(days=1)


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


def pruner(db: Database, clock: OffsetClock, *, only: str | None = None, **kw: float) -> Pruner:
    chosen = [r for r in declared_retention(DEFAULTS) if only is None or r.name == only]
    return Pruner(db, clock, chosen, batch=int(kw.get("batch", 5000)), pause_s=kw.get("pause", 0))


# --------------------------------------------------------------- row builders


async def outbox(
    c: asyncpg.Connection, status: str, created: datetime, published: datetime | None
) -> int:
    return int(
        await c.fetchval(
            """INSERT INTO outbox (event_id, topic, payload, created_at, available_at, status,
                                   published_at)
               VALUES ($1, 'test.v1', '{}'::jsonb, $2, $2, $3, $4) RETURNING id""",
            uuid.uuid4(),
            created,
            status,
            published,
        )
    )


async def inbox(c: asyncpg.Connection, processed: datetime) -> uuid.UUID:
    event = uuid.uuid4()
    await c.execute(
        """INSERT INTO inbox (consumer, event_id, processed_at, event_created_at)
           VALUES ('test', $1, $2, $3)""",
        event,
        processed,
        processed - D,  # the event was created a day before it was applied
    )
    return event


async def notification(
    c: asyncpg.Connection, status: str, created: datetime, sent: datetime | None
) -> int:
    return int(
        await c.fetchval(
            """INSERT INTO notification (event_id, topic, recipient, channel, subject, body,
                                         status, created_at, sent_at, event_created_at)
               VALUES ($1, 'test.v1', 1, 'log', 's', 'b', $2, $3, $4, $5) RETURNING id""",
            uuid.uuid4(),
            status,
            created,
            sent,
            created - D,  # the event was created a day before the message
        )
    )


async def job(
    c: asyncpg.Connection, status: str, finished: datetime | None, executions: int = 1
) -> int:
    created = (finished or datetime.now().astimezone()) - D
    job_id = int(
        await c.fetchval(
            """INSERT INTO scheduled_job (category, urgency, run_at, status, max_attempts,
                                          finished_at, created_at, attempts)
               VALUES ('test', 5, $1, $2, 5, $3, $1, $4) RETURNING id""",
            created,
            status,
            finished,
            executions,
        )
    )
    for attempt in range(1, executions + 1):
        await c.execute(
            """INSERT INTO job_execution (job_id, attempt, started_at, finished_at, outcome)
               VALUES ($1, $2, $3, $3, 'FAILED')""",
            job_id,
            attempt,
            created,
        )
    return job_id


async def dead_letter(c: asyncpg.Connection, parked: datetime, replayed: datetime | None) -> int:
    return int(
        await c.fetchval(
            """INSERT INTO dead_letter (consumer, topic, partition, record_offset, value, error,
                                        attempts, parked_at, replayed_at)
               VALUES ('test', 't', 0, (SELECT count(*) FROM dead_letter), '\\x00', 'e', 5, $1, $2)
               RETURNING id""",
            parked,
            replayed,
        )
    )


async def fallback(
    c: asyncpg.Connection, status: str, created: datetime, resent: datetime | None
) -> uuid.UUID:
    row = uuid.uuid4()
    await c.execute(
        """INSERT INTO webhook_events_fallback (id, provider_event_id, payload, created_at,
                                                status, resent_at)
           VALUES ($1, $2, '{}'::jsonb, $3, $4, $5)""",
        row,
        str(row),
        created,
        status,
        resent,
    )
    return row


async def rejected(c: asyncpg.Connection, received: datetime) -> int:
    return int(
        await c.fetchval(
            """INSERT INTO webhook_events_rejected (source, body, error, received_at)
               VALUES ('results', '{', 'bad json', $1) RETURNING id""",
            received,
        )
    )


async def idem_key(c: asyncpg.Connection, created: datetime) -> str:
    k = str(uuid.uuid4())
    await c.execute(
        """INSERT INTO idempotency_key (caller, endpoint, key, request_hash, status, created_at)
           VALUES ('patient:1', 'POST /x', $1, '\\x00', 'DONE', $2)""",
        k,
        created,
    )
    return k


async def ids(c: asyncpg.Connection, sql: str) -> set[object]:
    return {r[0] for r in await c.fetch(sql)}


def pruned(table: str) -> float:
    return REGISTRY.get_sample_value("reservo_pruned_rows_total", {"table": table}) or 0.0


# ----------------------------------------------------------------------- tests


async def test_every_table_loses_its_old_finished_rows_and_keeps_the_rest(
    own_db: Database, conn: asyncpg.Connection
) -> None:
    clock = OffsetClock()
    now = clock.now()
    # Outbox: DONE rows go 72 h after publication; PENDING and DEAD rows stay, however old.
    old_done = await outbox(conn, "DONE", now - 100 * D, now - 73 * H)
    young_done = await outbox(conn, "DONE", now - 100 * D, now - 71 * H)
    pending = await outbox(conn, "PENDING", now - 100 * D, None)
    dead = await outbox(conn, "DEAD", now - 100 * D, None)
    # Inbox: 10 days (longer than the outbox's 72 h plus Kafka's 7 days).
    old_in = await inbox(conn, now - 241 * H)
    young_in = await inbox(conn, now - 239 * H)
    within_outbox = await inbox(conn, now - 71 * H)
    # Notifications: SENT ones after 30 days; a PENDING one is never pruned.
    old_sent = await notification(conn, "SENT", now - 40 * D, now - 31 * D)
    young_sent = await notification(conn, "SENT", now - 40 * D, now - 29 * D)
    unsent = await notification(conn, "PENDING", now - 400 * D, None)
    # Jobs: DONE/CANCELLED after 30 days with their executions, DEAD after 90 days;
    # unfinished jobs never, even with an old finished_at from an earlier state.
    old_ok = await job(conn, "DONE", now - 31 * D, executions=2)
    old_cancelled = await job(conn, "CANCELLED", now - 31 * D, executions=0)
    young_ok = await job(conn, "DONE", now - 29 * D)
    dead_31 = await job(conn, "DEAD", now - 31 * D, executions=3)
    dead_91 = await job(conn, "DEAD", now - 91 * D, executions=3)
    unfinished = [
        await job(conn, status, now - 400 * D)
        for status in ("SCHEDULED", "QUEUED", "RUNNING", "FAILED")
    ]
    # Dead letters: replayed ones after 90 days; one not replayed stays forever.
    old_replayed = await dead_letter(conn, now - 200 * D, now - 91 * D)
    young_replayed = await dead_letter(conn, now - 200 * D, now - 89 * D)
    unreplayed = await dead_letter(conn, now - 1000 * D, None)
    # Result fallback: RESENT after 7 days; PENDING and FAILED stay.
    old_resent = await fallback(conn, "RESENT", now - 30 * D, now - 169 * H)
    young_resent = await fallback(conn, "RESENT", now - 30 * D, now - 167 * H)
    fb_pending = await fallback(conn, "PENDING", now - 300 * D, None)
    fb_failed = await fallback(conn, "FAILED", now - 300 * D, None)
    # Rejected webhooks: 30 days. Idempotency keys: 24 h (RESERVO_IDEMPOTENCY_RETENTION_HOURS).
    old_rej = await rejected(conn, now - 31 * D)
    young_rej = await rejected(conn, now - 29 * D)
    old_key = await idem_key(conn, now - 25 * H)
    young_key = await idem_key(conn, now - 23 * H)

    before = {t: pruned(t) for t in ("outbox", "scheduled_job", "job_execution", "inbox")}
    results = await pruner(own_db, clock).run()

    assert await ids(conn, "SELECT id FROM outbox") == {young_done, pending, dead}
    assert old_done not in await ids(conn, "SELECT id FROM outbox")
    assert await ids(conn, "SELECT event_id FROM inbox") == {young_in, within_outbox}
    assert old_in not in await ids(conn, "SELECT event_id FROM inbox")
    assert await ids(conn, "SELECT id FROM notification") == {young_sent, unsent}
    assert old_sent not in await ids(conn, "SELECT id FROM notification")
    assert await ids(conn, "SELECT id FROM scheduled_job") == {young_ok, dead_31, *unfinished}
    assert {old_ok, old_cancelled, dead_91}.isdisjoint(
        await ids(conn, "SELECT id FROM scheduled_job")
    )
    # Executions go with their job, and only with it.
    assert await ids(conn, "SELECT DISTINCT job_id FROM job_execution") == {
        young_ok,
        dead_31,
        *unfinished,
    }
    assert await ids(conn, "SELECT id FROM dead_letter") == {young_replayed, unreplayed}
    assert old_replayed not in await ids(conn, "SELECT id FROM dead_letter")
    assert await ids(conn, "SELECT id FROM webhook_events_fallback") == {
        young_resent,
        fb_pending,
        fb_failed,
    }
    assert old_resent not in await ids(conn, "SELECT id FROM webhook_events_fallback")
    assert await ids(conn, "SELECT id FROM webhook_events_rejected") == {young_rej}
    assert old_rej not in await ids(conn, "SELECT id FROM webhook_events_rejected")
    assert await ids(conn, "SELECT key FROM idempotency_key") == {young_key}
    assert old_key not in await ids(conn, "SELECT key FROM idempotency_key")

    by_rule = {r.name: r.rows for r in results}
    assert by_rule["job_prune_finished"] == {"scheduled_job": 2, "job_execution": 2}
    assert by_rule["job_prune_dead"] == {"scheduled_job": 1, "job_execution": 3}
    assert pruned("outbox") - before["outbox"] == 1
    assert pruned("inbox") - before["inbox"] == 1
    assert pruned("scheduled_job") - before["scheduled_job"] == 3
    assert pruned("job_execution") - before["job_execution"] == 5

    # A second run finds nothing more.
    again = await pruner(own_db, clock).run()
    assert all(n == 0 for r in again for n in r.rows.values())


async def test_prunes_in_batches_each_its_own_transaction(
    own_db: Database, conn: asyncpg.Connection
) -> None:
    clock = OffsetClock()
    now = clock.now()
    for i in range(35):
        await outbox(conn, "DONE", now - 10 * D, now - 4 * D + i * timedelta(seconds=1))
    keep = await outbox(conn, "DONE", now - 10 * D, now - H)

    seen = [int(await conn.fetchval("SELECT count(*) FROM outbox"))]

    async def watch() -> None:
        # Another connection sees each batch as soon as it commits.
        while True:
            n = int(await conn.fetchval("SELECT count(*) FROM outbox"))
            if seen[-1] != n:
                seen.append(n)
            if n == 1:
                return
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch())
    (result,) = await pruner(own_db, clock, only="outbox_prune", batch=10, pause=0.3).run()
    await asyncio.wait_for(watcher, 5)

    assert result.batches == 4  # 10 + 10 + 10 + 5
    assert result.rows == {"outbox": 35}
    assert result.largest_batch == 10
    # Every batch committed on its own (35 old rows + the young one): another
    # connection saw 26, 16 and 6 rows left between the batches.
    assert seen == [36, 26, 16, 6, 1]
    assert await ids(conn, "SELECT id FROM outbox") == {keep}


async def test_a_row_locked_by_the_hot_path_is_skipped_not_waited_for(
    own_db: Database, conn: asyncpg.Connection, own_database: str
) -> None:
    clock = OffsetClock()
    now = clock.now()
    rows = [await outbox(conn, "DONE", now - 10 * D, now - 4 * D) for _ in range(35)]
    locked = rows[17]
    holder = await asyncpg.connect(own_database)
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT 1 FROM outbox WHERE id = $1 FOR UPDATE", locked)
        # Pruning the other 34 rows does not wait for the lock: well within a
        # lock_timeout-like bound, the run is over.
        (result,) = await asyncio.wait_for(
            pruner(own_db, clock, only="outbox_prune", batch=10).run(), 3
        )
        assert result.rows == {"outbox": 34}
        assert result.largest_batch <= 10
        assert await ids(conn, "SELECT id FROM outbox") == {locked}
        await tx.rollback()
    finally:
        await holder.close()
    # Released: the next run takes it.
    (result,) = await pruner(own_db, clock, only="outbox_prune", batch=10).run()
    assert result.rows == {"outbox": 1}
    assert await ids(conn, "SELECT id FROM outbox") == set()


async def test_the_maintenance_role_prunes_what_a_booking_left_and_keeps_the_booking(
    base_settings: Settings, own_database: str, conn: asyncpg.Connection
) -> None:
    """Through HTTP and the real worker role: a booking's key, event and
    notification go once old; the appointment (a business record) stays."""
    clock = OffsetClock()
    settings = base_settings.with_(
        database_url=own_database,
        redis_namespace=f"test-retention-{uuid.uuid4().hex[:8]}",
        retention_interval_s=0.1,
    )
    c = build(settings, clock)
    try:
        app = create_app(c, owns_container=False)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://reservo.test") as client:
            _, slots = await make_slots(client)
            r = await book(client, slots[0]["id"], new_id())
            assert r.status_code == 201, r.text
        while await c.module(Outbox).relay.run_once():
            pass
        counts = (
            "SELECT (SELECT count(*) FROM outbox WHERE status = 'DONE'), "
            "(SELECT count(*) FROM notification WHERE status = 'SENT'), "
            "(SELECT count(*) FROM idempotency_key)"
        )
        assert all(n >= 1 for n in await conn.fetchrow(counts))

        clock.advance(31 * D)
        stop = asyncio.Event()
        workers = asyncio.create_task(run_workers(c, ["maintenance"], stop))
        try:
            for _ in range(100):
                if tuple(await conn.fetchrow(counts)) == (0, 0, 0):
                    break
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.wait_for(workers, 10)
        assert tuple(await conn.fetchrow(counts)) == (0, 0, 0)
        assert await conn.fetchval("SELECT count(*) FROM appointment") == 1
        # The reminder job is not finished: kept.
        assert await conn.fetchval("SELECT count(*) FROM scheduled_job") == 1
    finally:
        await c.close()


def test_settings_refuse_an_inbox_that_could_forget_a_redelivered_event() -> None:
    assert DEFAULTS.retention_inbox_hours > DEFAULTS.retention_outbox_hours
    with pytest.raises(ValidationError, match="RETENTION_INBOX_HOURS"):
        Settings(retention_outbox_hours=72, retention_inbox_hours=72)
    with pytest.raises(ValidationError, match="RETENTION_NOTIFICATION_DAYS"):
        Settings(retention_notification_days=5)
    with pytest.raises(ValidationError, match="RETENTION_DEAD_JOB_DAYS"):
        Settings(retention_job_days=100)
