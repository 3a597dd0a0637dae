"""Retention of the inbox and the notification table (migration 0026): one day
of N rows dropped whole by reservo.core.maintenance.partitions' keeper vs another day of N
rows deleted the way those tables were pruned before 0026 (5,000-row
statements by ctid, in time order, with the pruner's 0.05 s pause), then
VACUUM of that day (the dead tuples a DELETE leaves are part of its cost).

Nothing else runs: this is the pruning's own cost (wall time, CPU of its
PostgreSQL backend, WAL). WAL is the server's WAL position before and after,
so on a shared server it includes other clients' records: a ceiling.

    python bench/retention/history_drop.py                         # N = 500,000, both tables
    python bench/retention/history_drop.py --rows 200000 --table inbox

Own database (BENCH_DB, default reservo_bench_history), dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import psutil

from reservo.core.db.database import Database
from reservo.core.db.migrate import migrate
from reservo.core.kernel.clock import OffsetClock
from reservo.core.maintenance.partitions import PartitionKeeper
from reservo.core_modules import partitioned
from reservo.settings import Settings

os.environ.setdefault("BENCH_DB", "reservo_bench_history")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib  # after BENCH_DB is set

D = timedelta(days=1)
H = timedelta(hours=1)
SETTINGS = Settings()
OLDEST = 40  # days ago: past both tables' retention (10 and 30 days)

# $1 rows over the day starting at $2, applied / sent a minute after their event.
FILL = {
    "inbox": """
INSERT INTO inbox (consumer, event_id, processed_at, event_created_at)
SELECT 'bench', gen_random_uuid(), t + interval '1 minute', t
  FROM generate_series(1, $1::int) AS g,
       LATERAL (SELECT $2::timestamptz + (g::float8 / $1) * interval '23 hours' AS t) x""",
    "notification": """
INSERT INTO notification (event_id, topic, recipient, channel, subject, body, status,
                          created_at, sent_at, event_created_at)
SELECT gen_random_uuid(), 'bench.v1', g, 'log', 'Bet #' || g || ' won',
       'You won 10.00; it is in your account.', 'SENT',
       t + interval '1 minute', t + interval '2 minutes', t
  FROM generate_series(1, $1::int) AS g,
       LATERAL (SELECT $2::timestamptz + (g::float8 / $1) * interval '23 hours' AS t) x""",
}
# The statements of before 0026 (prune_by_ctid with inbox_prunable /
# notification_prunable), on the day's partition.
BATCH = {
    "inbox": """
WITH gone AS (DELETE FROM {part} WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {part} WHERE processed_at < $1 ORDER BY processed_at
    LIMIT 5000 FOR UPDATE SKIP LOCKED)) RETURNING 1)
SELECT count(*) FROM gone""",
    "notification": """
WITH gone AS (DELETE FROM {part} WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {part} WHERE created_at < $1 AND status = 'SENT' AND sent_at < $1
     ORDER BY created_at LIMIT 5000 FOR UPDATE SKIP LOCKED)) RETURNING 1)
SELECT count(*) FROM gone""",
}


async def one_table(url: str, table: str, rows: int) -> None:
    (spec,) = [t for t in partitioned(SETTINGS) if t.table == table]
    db = Database(url, min_size=1, max_size=1, command_timeout=3600)
    c = await asyncpg.connect(url)
    try:
        await PartitionKeeper(
            db, OffsetClock(-OLDEST * D), [spec], days_ahead=OLDEST
        ).ensure_ahead()
        midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        dropped_day, deleted_day = midnight - OLDEST * D, midnight - (OLDEST - 1) * D
        for day in (dropped_day, deleted_day):
            await c.execute(FILL[table], rows, day)
        await c.execute(f"VACUUM ANALYZE {table}")
        async with db.connection() as pc:
            backend = psutil.Process(await pc.fetchval("SELECT pg_backend_pid()"))

        def cpu() -> float:
            t = backend.cpu_times()
            return t.user + t.system

        # 1. Dropped whole: a clock at which only the oldest day is past retention.
        await c.execute("CHECKPOINT")
        clock = OffsetClock(dropped_day + D + spec.keep + H - datetime.now(UTC))
        lsn, c0, t0 = await c.fetchval("SELECT pg_current_wal_lsn()"), cpu(), time.perf_counter()
        (result,) = await PartitionKeeper(db, clock, [spec], lock_tries=20).retire_old()
        took, used = time.perf_counter() - t0, cpu() - c0
        wal = await c.fetchval("SELECT pg_current_wal_lsn() - $1::pg_lsn", lsn)
        print(
            f"{table}: drop of {rows:,} rows: {took:.2f} s, {used:.2f} s backend CPU, "
            f"WAL <= {wal / 2**20:.1f} MiB (dropped {result.dropped}, held {result.held})"
        )
        # 2. Deleted by batches, then VACUUM.
        await c.execute("CHECKPOINT")
        part, total = f"{table}_p{deleted_day:%Y%m%d}", 0
        lsn, c0, t0 = await c.fetchval("SELECT pg_current_wal_lsn()"), cpu(), time.perf_counter()
        async with db.connection() as pc:
            while True:
                n = await pc.fetchval(BATCH[table].format(part=part), deleted_day + 2 * D)
                total += n
                if n < 5000:
                    break
                await asyncio.sleep(SETTINGS.retention_pause_s)
            deleting = time.perf_counter() - t0
            await pc.execute(f"VACUUM {part}")
        took, used = time.perf_counter() - t0, cpu() - c0
        wal = await c.fetchval("SELECT pg_current_wal_lsn() - $1::pg_lsn", lsn)
        print(
            f"{table}: batches of {total:,} rows: {deleting:.2f} s + VACUUM "
            f"{took - deleting:.2f} s, {used:.2f} s backend CPU, WAL <= {wal / 2**20:.1f} MiB"
        )
    finally:
        await c.close()
        await db.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=500_000, help="rows per day")
    ap.add_argument("--table", choices=["inbox", "notification", "both"], default="both")
    opts = ap.parse_args()
    await benchlib.drop_database()
    admin = await benchlib.connect(benchlib.PG_ADMIN_URL)
    try:
        await admin.execute(f'CREATE DATABASE "{benchlib.DB_NAME}"')
    finally:
        await admin.close()
    try:
        await migrate(benchlib.db_url())
        for table in ("inbox", "notification") if opts.table == "both" else (opts.table,):
            await one_table(benchlib.db_url(), table, opts.rows)
    finally:
        await benchlib.drop_database()


if __name__ == "__main__":
    asyncio.run(main())
