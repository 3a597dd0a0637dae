"""The clock every process decides on (core/db/clock.py): PostgreSQL's, counted
on the monotonic clock between readings. What a skewed process does with it is
tests/e2e/test_clock_skew.py; here, the clock itself against a real PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from reservo.core.db.clock import DatabaseClock
from reservo.core.db.database import Database


async def test_it_reads_postgresql_time_and_reports_this_process_skew(
    database_url: str, db: asyncpg.Connection
) -> None:
    pool = Database(database_url, min_size=1, max_size=2)
    clock = DatabaseClock(pool, sync_interval_s=10, alert_s=1e-9)
    try:
        assert not clock.synced  # the wall clock until a reading
        with capture_logs() as logs:
            skew = await clock.sync()
        assert clock.synced and abs(skew) < 0.5  # one machine: the same clock
        # An alert bound below any real skew: the reading says so.
        assert [e["event"] for e in logs] == ["clock_skew"]
        assert REGISTRY.get_sample_value("reservo_clock_skew_seconds") == skew
        before = clock.now()
        pg = await db.fetchval("SELECT clock_timestamp()")
        after = clock.now()
        assert before - timedelta(milliseconds=50) <= pg <= after + timedelta(milliseconds=50)
        readings = [clock.now()]
        for _ in range(5):  # new readings never move it back
            await clock.sync()
            readings.append(clock.now())
        assert readings == sorted(readings)
    finally:
        await pool.close()


async def test_without_postgresql_it_keeps_counting_from_its_last_reading(
    database_url: str,
) -> None:
    pool = Database(database_url, min_size=1, max_size=2)
    clock = DatabaseClock(pool, sync_interval_s=0.05, alert_s=1)
    await clock.sync()
    await pool.close()
    # PostgreSQL gone, as far as this clock knows: nothing listens there.
    clock.db = Database("postgresql://postgres@127.0.0.1:1/none", min_size=0, max_size=1)
    stop = asyncio.Event()
    with capture_logs() as logs:
        runner = asyncio.ensure_future(clock.run(stop))
        first = clock.now()
        await asyncio.sleep(0.2)
        stop.set()
        await runner
    assert "clock_sync_failed" in [e["event"] for e in logs]
    assert clock.synced
    elapsed = (clock.now() - first).total_seconds()
    assert 0.15 <= elapsed < 1.0
