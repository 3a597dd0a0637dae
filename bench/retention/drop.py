"""Retention of the partitioned outbox: dropping old day partitions whole vs
deleting their rows in batches (the pruner's 5,000-row statements), each while
concurrent writers emit outbox events (the hot path a booking storm puts on
this table).

Two sets of N DONE rows, each spread over 4 old days (set 1: 12 to 9 days ago,
set 2: 8 to 5 days ago), are inserted once. Then:

1. writers alone for --window seconds (the baseline: writes/s, latency, and
   the WAL one write costs);
2. set 1 goes by dropping its 4 day partitions (reservo.core.partitions, the
   keeper run with a clock 5 days back so that only set 1 is past retention);
3. set 2 goes by the batch pruner (the outbox rule alone, default batch size
   and pause), then VACUUM of the outbox (the dead tuples a DELETE leaves are
   part of its cost; a drop leaves none).

Each step runs with the writers and after a CHECKPOINT (so both pay full-page
images from the same start). Printed per step: time, WAL written (total, and
net of the writers' own WAL, estimated from the baseline's WAL per write), the
CPU seconds of the pruning backend, and the writers' rate and latency.

    python bench/retention/drop.py                     # 2 x 2,000,000 rows
    python bench/retention/drop.py --rows 10000000 --drop-db

Own database (BENCH_DB, default reservo_bench_partitions).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import psutil

from reservo.core.clock import OffsetClock, SystemClock
from reservo.core.db import Database, Queries
from reservo.core.migrate import migrate
from reservo.core.partitions import PartitionKeeper
from reservo.core.retention import Pruner
from reservo.retention import partitioned, rules
from reservo.settings import Settings

os.environ.setdefault("BENCH_DB", "reservo_bench_partitions")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib  # after BENCH_DB is set

Q = Queries.load("reservo.core")
D = timedelta(days=1)
TOPIC = "bench.partitions.old.v1"
SETTINGS = Settings()

# N rows over 4 days starting `first` days ago (UTC midnight), each published a
# minute after its creation.
_FILL = f"""
INSERT INTO outbox (event_id, topic, key, payload, created_at, available_at, status,
                    attempts, published_at)
SELECT gen_random_uuid(), '{TOPIC}', 'appointment:' || g,
       jsonb_build_object('appointmentId', g, 'slotId', g, 'patientId', g,
                          'startAt', now(), 'status', 'BOOKED'),
       t.at, t.at, 'DONE', 1, t.at + interval '1 minute'
  FROM generate_series(1, $1::int) AS g
 CROSS JOIN LATERAL (SELECT date_trunc('day', now(), 'UTC') - $2::int * interval '1 day'
                            + ((g - 1)::float8 / $1::int) * interval '4 days' AS at) t
"""


@dataclass
class Writes:
    latencies_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def pct(self, p: float) -> float:
        xs = sorted(self.latencies_ms)
        return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else 0.0

    @property
    def rate(self) -> float:
        return len(self.latencies_ms) / self.seconds if self.seconds else 0.0


@dataclass
class Step:
    label: str
    rows: int
    seconds: float
    wal_bytes: int
    backend_cpu_s: float
    writes: Writes
    extra: str = ""


async def writers(db: Database, stop: asyncio.Event, n: int) -> Writes:
    """n concurrent emitters, one event per transaction, until ``stop``."""
    out = Writes()
    started = time.perf_counter()

    async def one() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            async with db.transaction() as conn:
                await conn.execute(
                    Q.outbox_insert, uuid.uuid4(), "bench.storm.v1", None, {}, datetime.now(UTC)
                )
            out.latencies_ms.append(1000 * (time.perf_counter() - t0))

    await asyncio.gather(*(one() for _ in range(n)))
    out.seconds = time.perf_counter() - started
    return out


async def wal_lsn(conn: asyncpg.Connection) -> str:
    return str(await conn.fetchval("SELECT pg_current_wal_lsn()::text"))


async def measured(
    label: str,
    rows: int,
    opts: argparse.Namespace,
    work: Callable[[Database], Awaitable[str]],
    min_window: float,
) -> Step:
    """Runs ``work(db)`` (an async callable on a one-connection Database) with the
    writers, after a CHECKPOINT; the writers run for at least ``min_window``."""
    url = benchlib.db_url()
    admin = await benchlib.connect()
    pruning = Database(url, min_size=1, max_size=1)
    writing = Database(url, min_size=opts.writers, max_size=opts.writers)
    try:
        await admin.execute("CHECKPOINT")
        async with pruning.connection() as conn:
            backend = psutil.Process(await conn.fetchval("SELECT pg_backend_pid()"))
        cpu0 = benchlib.cpu_s([backend.pid])
        lsn0 = await wal_lsn(admin)
        stop = asyncio.Event()
        writing_task = asyncio.create_task(writers(writing, stop, opts.writers))
        await asyncio.sleep(1.0)  # the writers at their pace before the work starts
        started = time.perf_counter()
        extra = await work(pruning)
        took = time.perf_counter() - started
        rest = min_window - (took + 1.0)
        if rest > 0:
            await asyncio.sleep(rest)
        stop.set()
        writes = await writing_task
        lsn1 = await wal_lsn(admin)
        wal = int(await admin.fetchval("SELECT pg_wal_lsn_diff($1, $2)", lsn1, lsn0))
        cpu = benchlib.cpu_s([backend.pid]) - cpu0
        return Step(label, rows, took, wal, cpu, writes, extra)
    finally:
        await writing.close()
        await pruning.close()
        await admin.close()


def keeper(db: Database, days_back: int) -> PartitionKeeper:
    return PartitionKeeper(
        db,
        OffsetClock(-days_back * D),
        partitioned(SETTINGS),
        days_ahead=7,
        lock_timeout_ms=SETTINGS.retention_partition_lock_timeout_ms,
        lock_tries=20,
    )


async def prepare(rows: int) -> float:
    admin = await benchlib.connect(benchlib.PG_ADMIN_URL)
    try:
        if not await admin.fetchval(
            "SELECT 1 FROM pg_database WHERE datname = $1", benchlib.DB_NAME
        ):
            await admin.execute(f'CREATE DATABASE "{benchlib.DB_NAME}"')
    finally:
        await admin.close()
    await migrate(benchlib.db_url())
    db = Database(benchlib.db_url(), min_size=1, max_size=1)
    conn = await benchlib.connect()
    try:
        await conn.execute("TRUNCATE outbox")
        # The days of both sets (12 to 5 days ago) and on to next week, as a
        # keeper running all along would have made them.
        await PartitionKeeper(
            db, OffsetClock(-13 * D), partitioned(SETTINGS), days_ahead=20
        ).ensure_ahead()
        started = time.perf_counter()
        await conn.execute(_FILL, rows, 12)
        await conn.execute(_FILL, rows, 8)
        took = time.perf_counter() - started
        await conn.execute("VACUUM ANALYZE outbox")
        return took
    finally:
        await conn.close()
        await db.close()


async def count_old(first: int) -> int:
    conn = await benchlib.connect()
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM outbox WHERE topic = $1 AND created_at >= "
                "date_trunc('day', now(), 'UTC') - $2::int * interval '1 day' AND created_at < "
                "date_trunc('day', now(), 'UTC') - ($2::int - 4) * interval '1 day'",
                TOPIC,
                first,
            )
        )
    finally:
        await conn.close()


async def baseline(opts: argparse.Namespace) -> Step:
    async def nothing(_: Database) -> str:
        return ""

    return await measured("writers alone", 0, opts, nothing, opts.window)


async def by_drop(opts: argparse.Namespace) -> Step:
    async def drop(db: Database) -> str:
        # Retention 72 h seen from 5 days back: only set 1's days (12 to 9 days
        # ago) ended before that cutoff.
        (result,) = await keeper(db, 5).retire_old()
        return f"dropped {len(result.dropped)} partitions, held {result.held}, busy {result.busy}"

    rows = await count_old(12)
    return await measured("drop partitions", rows, opts, drop, opts.window)


async def by_batches(opts: argparse.Namespace) -> Step:
    async def delete(db: Database) -> str:
        (rule,) = [r for r in rules(SETTINGS) if r.name == "outbox_prune"]
        pruner = Pruner(
            db,
            SystemClock(),
            [rule],
            batch=SETTINGS.retention_batch_size,
            pause_s=SETTINGS.retention_pause_s,
        )
        (result,) = await pruner.run()
        t0 = time.perf_counter()
        async with db.connection() as conn:
            await conn.execute("VACUUM outbox")
        return f"{result.batches} batches; then VACUUM outbox {time.perf_counter() - t0:.1f} s"

    rows = await count_old(8)
    return await measured("delete in batches + VACUUM", rows, opts, delete, opts.window)


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=2_000_000, help="DONE rows per set")
    p.add_argument("--writers", type=int, default=16, help="concurrent emitting connections")
    p.add_argument("--window", type=float, default=10.0, help="min seconds of writers per step")
    p.add_argument("--drop-db", action="store_true", help="drop the database at the end")
    opts = p.parse_args(argv)
    benchlib.stop_cleanly_on_signals()
    print(f"machine: {benchlib.machine()}")
    print(f"reservo code under test: {benchlib.reservo_source()}")
    print(f"when: {time.strftime('%Y-%m-%d %H:%M:%S %z')}")
    took = benchlib.run_async(prepare(opts.rows))
    print(f"outbox: 2 x {opts.rows:,} DONE rows over 4 days each, inserted in {took:.1f} s")

    steps = [
        benchlib.run_async(baseline(opts)),
        benchlib.run_async(by_drop(opts)),
        benchlib.run_async(by_batches(opts)),
    ]
    base = steps[0]
    wal_per_write = base.wal_bytes / max(1, len(base.writes.latencies_ms))
    print(f"\nwriters: {opts.writers} connections, one outbox event per transaction")
    print(
        "step                          rows        seconds   WAL total    WAL net      "
        "backend CPU  writes/s  p50 ms  p99 ms  max ms"
    )
    for s in steps:
        net = s.wal_bytes - wal_per_write * len(s.writes.latencies_ms)
        print(
            f"{s.label:<28} {s.rows:>11,}  {s.seconds:>8.2f}  {mib(s.wal_bytes):>11}  "
            f"{mib(max(0.0, net)):>11}  {s.backend_cpu_s:>9.2f} s  {s.writes.rate:>8,.0f}  "
            f"{s.writes.pct(0.5):>6.1f}  {s.writes.pct(0.99):>6.1f}  "
            f"{max(s.writes.latencies_ms, default=0):>6.0f}"
        )
        if s.extra:
            print(f"  {s.extra}")
    left = benchlib.run_async(count_old(12)) + benchlib.run_async(count_old(8))
    failures = [] if left == 0 else [f"{left:,} old rows left"]
    return benchlib.finish(failures, opts.drop_db, "every old row gone, every write committed")


if __name__ == "__main__":
    sys.exit(main())
