"""Retention of the partitioned outbox: dropping old day partitions whole vs
deleting their rows in batches (the pruner's 5,000-row statements), alone and
while concurrent writers emit outbox events (the hot path a booking storm puts
on this table).

4 x N DONE rows over 8 old days (N/2 a day, 12 to 5 days ago) are inserted
once; then each pair of days goes one way:

1. writers alone for --window seconds (the baseline);
2. days 12-11 ago: dropped (reservo.core.maintenance.partitions' keeper, with a clock set so
   that only these two days are past the 72 h retention), nothing else running;
3. days 10-9 ago: dropped the same way, while the writers write;
4. days 8-7 ago: deleted by the outbox rule's statement in batches (default
   batch size and pause), nothing else running, then VACUUM of those two days
   (the dead tuples a DELETE leaves are part of its cost; a drop leaves none);
5. days 6-5 ago: deleted by the pruner itself (reservo.core.maintenance.retention), while
   the writers write, then VACUUM.

Each step starts after a CHECKPOINT (both ways pay full-page images from the
same start). WAL is measured per statement, not as the server's WAL position
(the PostgreSQL server is shared, and others write too): the batch DELETEs by
EXPLAIN (ANALYZE, WAL), VACUUM by its VERBOSE report, a drop by pg_walinspect
(the records of the drop's own transactions). CPU: the pruning backend's
(psutil). The writers (16 connections, one outbox event per transaction)
report writes/s and latency.

    python bench/retention/drop.py                     # N = 500,000
    python bench/retention/drop.py --rows 2500000 --drop-db

Own database (BENCH_DB, default reservo_bench_partitions).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from reservo.bootstrap import declared_retention
from reservo.core.db.database import Database, Queries
from reservo.core.db.migrate import migrate
from reservo.core.kernel.clock import OffsetClock
from reservo.core.maintenance.partitions import PartitionKeeper
from reservo.core.maintenance.retention import Pruner
from reservo.core_modules import partitioned
from reservo.settings import Settings

os.environ.setdefault("BENCH_DB", "reservo_bench_partitions")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib  # after BENCH_DB is set

Q = Queries.load("reservo.core.messaging")
D = timedelta(days=1)
TOPIC = "bench.partitions.old.v1"
SETTINGS = Settings()
# The outbox only (the inbox and notification days are not filled here).
OUTBOX = [t for t in partitioned(SETTINGS) if t.table == "outbox"]
FIRST_DAY = 12  # the oldest filled day, in days before today
DAYS = 8

# $1 rows over the DAYS days from FIRST_DAY days ago (UTC midnight), each
# published a minute after its creation.
_FILL = f"""
INSERT INTO outbox (event_id, topic, key, payload, created_at, available_at, status,
                    attempts, published_at)
SELECT gen_random_uuid(), '{TOPIC}', 'appointment:' || g,
       jsonb_build_object('appointmentId', g, 'slotId', g, 'patientId', g,
                          'startAt', now(), 'status', 'BOOKED'),
       t.at, t.at, 'DONE', 1, t.at + interval '1 minute'
  FROM generate_series(1, $1::int) AS g
 CROSS JOIN LATERAL (SELECT date_trunc('day', now(), 'UTC') - {FIRST_DAY} * interval '1 day'
                            + ((g - 1)::float8 / $1::int) * {DAYS} * interval '1 day' AS at) t
"""
_VACUUM_WAL = re.compile(r"WAL usage: (\d+) records, (\d+) full page images, (\d+) bytes")


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
    wal_bytes: int | None  # None: not measured (writers' WAL mixed in)
    backend_cpu_s: float
    writes: Writes | None
    extra: str = ""


Work = Callable[[Database, asyncpg.Connection], Awaitable[tuple[int | None, str]]]


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


async def measured(
    label: str, rows: int, opts: argparse.Namespace, work: Work, with_writers: bool
) -> Step:
    """Runs ``work`` on a one-connection Database after a CHECKPOINT, with the
    writers around it when asked (for at least --window seconds)."""
    url = benchlib.db_url()
    admin = await benchlib.connect()
    # No statement timeout: a VACUUM of a day of dead rows takes minutes.
    pruning = Database(url, min_size=1, max_size=1, command_timeout=3600)
    writing = Database(url, min_size=opts.writers, max_size=opts.writers)
    try:
        await admin.execute("CHECKPOINT")
        async with pruning.connection() as conn:
            backend = psutil.Process(await conn.fetchval("SELECT pg_backend_pid()"))
        cpu0 = benchlib.cpu_s([backend.pid])
        stop = asyncio.Event()
        task = asyncio.create_task(writers(writing, stop, opts.writers)) if with_writers else None
        if task is not None:
            await asyncio.sleep(1.0)  # the writers at their pace before the work starts
        started = time.perf_counter()
        wal, extra = await work(pruning, admin)
        took = time.perf_counter() - started
        if task is not None:
            await asyncio.sleep(max(0.0, opts.window - took - 1.0))
        stop.set()
        writes = await task if task is not None else None
        cpu = benchlib.cpu_s([backend.pid]) - cpu0
        return Step(label, rows, took, wal, cpu, writes, extra)
    finally:
        await writing.close()
        await pruning.close()
        await admin.close()


def keeper(db: Database, offset: timedelta, tries: int = 20) -> PartitionKeeper:
    return PartitionKeeper(
        db,
        OffsetClock(offset),
        OUTBOX,
        days_ahead=7,
        lock_timeout_ms=SETTINGS.retention_partition_lock_timeout_ms,
        lock_tries=tries,
    )


def pair_clock(newest_days_ago: int) -> timedelta:
    """The clock offset at which the 72 h retention has just passed the end of
    the day ``newest_days_ago`` days ago, and of no later day."""
    return -(newest_days_ago - 4) * D


def drop_pair(newest_days_ago: int, wal: bool) -> Work:
    """Drops the two days; ``wal``: measure its WAL (only alone: the writers'
    records would be counted too)."""

    async def work(db: Database, admin: asyncpg.Connection) -> tuple[int | None, str]:
        lsn0 = await admin.fetchval("SELECT pg_current_wal_lsn()")
        (result,) = await keeper(db, pair_clock(newest_days_ago)).retire_old()
        lsn1 = await admin.fetchval("SELECT pg_current_wal_lsn()")
        own = await drop_wal(admin, lsn0, lsn1) if wal else None
        return own, f"dropped {result.dropped}, held {result.held}, busy {result.busy}"

    return work


async def drop_wal(admin: asyncpg.Connection, lsn0: object, lsn1: object) -> int:
    """The WAL of this database's transactions between two positions: every
    record touching one of its relations, and the commit records of the
    transactions that wrote them (pg_walinspect; other databases excluded)."""
    await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    oid = await admin.fetchval("SELECT oid FROM pg_database WHERE datname = current_database()")
    return int(
        await admin.fetchval(
            """WITH r AS (SELECT * FROM pg_get_wal_records_info($1, $2))
               SELECT coalesce(sum(record_length), 0) FROM r
                WHERE block_ref LIKE '%/' || $3::text || '/%'
                   OR (xid <> 0 AND xid IN (SELECT xid FROM r
                                             WHERE block_ref LIKE '%/' || $3::text || '/%'))""",
            lsn0,
            lsn1,
            str(oid),
        )
    )


async def vacuum_days(conn: asyncpg.Connection, days: list[str]) -> tuple[int, float]:
    """VACUUM (VERBOSE) of those day partitions: WAL bytes (its report) and seconds."""
    notes: list[str] = []

    def listen(_: object, message: asyncpg.PostgresLogMessage) -> None:
        notes.append(str(message.message) + "\n" + str(getattr(message, "detail", "") or ""))

    conn.add_log_listener(listen)
    t0 = time.perf_counter()
    try:
        for day in days:
            await conn.execute(f"VACUUM (VERBOSE) {day}")  # names built from dates, quoted-safe
    finally:
        conn.remove_log_listener(listen)
    wal = sum(int(m[3]) for note in notes for m in _VACUUM_WAL.finditer(note))
    return wal, time.perf_counter() - t0


def day_names(newest_days_ago: int) -> list[str]:
    today = datetime.now(UTC).date()
    return [f"outbox_p{today - (newest_days_ago + i) * D:%Y%m%d}" for i in (1, 0)]


def delete_pair_explained(newest_days_ago: int) -> Work:
    """The outbox rule's statement, batch after batch with the pruner's pause,
    each under EXPLAIN (ANALYZE, WAL) to read its WAL bytes; then VACUUM."""

    async def work(db: Database, _: asyncpg.Connection) -> tuple[int | None, str]:
        (rule,) = [r for r in declared_retention(SETTINGS) if r.name == "outbox_prune"]
        cutoff = OffsetClock(pair_clock(newest_days_ago)).now() - rule.keep
        wal = batches = 0
        async with db.connection() as conn:
            while True:
                plan = await conn.fetchval(
                    f"EXPLAIN (ANALYZE, WAL, FORMAT JSON) {rule.sql}",
                    cutoff,
                    SETTINGS.retention_batch_size,
                )
                doc = (plan if isinstance(plan, list) else json.loads(plan))[0]
                batches += 1
                wal += _plan_wal(doc["Plan"])
                if _plan_deleted(doc["Plan"]) < SETTINGS.retention_batch_size:
                    break
                await asyncio.sleep(SETTINGS.retention_pause_s)
            vac_wal, vac_s = await vacuum_days(conn, day_names(newest_days_ago))
        return wal + vac_wal, (
            f"{batches} batches, DELETE WAL {mib(wal)}; VACUUM {vac_s:.1f} s, WAL {mib(vac_wal)}"
        )

    return work


def _plan_wal(node: dict[str, Any]) -> int:
    """WAL bytes of a plan tree: the largest node figure (each node's includes
    its children's, so that is the top's)."""
    return max([int(node.get("WAL Bytes", 0)), *(_plan_wal(c) for c in node.get("Plans", []))])


def _plan_deleted(node: dict[str, Any]) -> int:
    """Rows the statement's DELETE removed (the ModifyTable node's output)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if n.get("Node Type") == "ModifyTable":
            return int(n.get("Actual Rows", 0))
        stack.extend(n.get("Plans", []))
    return 0


def delete_pair_pruner(newest_days_ago: int) -> Work:
    async def work(db: Database, _: asyncpg.Connection) -> tuple[int | None, str]:
        (rule,) = [r for r in declared_retention(SETTINGS) if r.name == "outbox_prune"]
        pruner = Pruner(
            db,
            OffsetClock(pair_clock(newest_days_ago)),
            [rule],
            batch=SETTINGS.retention_batch_size,
            pause_s=SETTINGS.retention_pause_s,
        )
        t0 = time.perf_counter()
        (result,) = await pruner.run()
        took = time.perf_counter() - t0
        async with db.connection() as conn:
            _, vac_s = await vacuum_days(conn, day_names(newest_days_ago))
        return None, (
            f"{result.batches} batches, {result.rows['outbox']:,} rows in {took:.1f} s "
            f"= {result.rows['outbox'] / max(took, 1e-9):,.0f} rows/s; then VACUUM {vac_s:.1f} s"
        )

    return work


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


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
        # The filled days and on to next week, as a keeper running all along made them.
        await PartitionKeeper(
            db, OffsetClock(-FIRST_DAY * D), OUTBOX, days_ahead=FIRST_DAY + 7
        ).ensure_ahead()
        started = time.perf_counter()
        await conn.execute(_FILL, 4 * rows)
        took = time.perf_counter() - started
        await conn.execute("VACUUM ANALYZE outbox")
        return took
    finally:
        await conn.close()
        await db.close()


async def old_rows() -> int:
    conn = await benchlib.connect()
    try:
        return int(await conn.fetchval("SELECT count(*) FROM outbox WHERE topic = $1", TOPIC))
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=500_000, help="DONE rows per step (2 days)")
    p.add_argument("--writers", type=int, default=16, help="concurrent emitting connections")
    p.add_argument("--window", type=float, default=10.0, help="min seconds of writers per step")
    p.add_argument("--drop-db", action="store_true", help="drop the database at the end")
    opts = p.parse_args(argv)
    benchlib.stop_cleanly_on_signals()
    print(f"machine: {benchlib.machine()}")
    print(f"reservo code under test: {benchlib.reservo_source()}")
    print(f"when: {time.strftime('%Y-%m-%d %H:%M:%S %z')}")
    took = benchlib.run_async(prepare(opts.rows))
    print(f"outbox: 4 x {opts.rows:,} DONE rows over 8 days, inserted in {took:.1f} s")

    async def nothing(_: Database, __: asyncpg.Connection) -> tuple[int | None, str]:
        return None, ""

    n = opts.rows
    plan: list[tuple[str, int, Work, bool]] = [
        ("writers alone", 0, nothing, True),
        ("drop, alone", n, drop_pair(11, wal=True), False),
        ("drop, with writers", n, drop_pair(9, wal=False), True),
        ("delete + VACUUM, alone", n, delete_pair_explained(7), False),
        ("delete + VACUUM, with writers", n, delete_pair_pruner(5), True),
    ]
    steps = []
    for label, rows, work, with_writers in plan:
        step = benchlib.run_async(measured(label, rows, opts, work, with_writers))
        steps.append(step)
        wal = "-" if step.wal_bytes is None else mib(step.wal_bytes)
        print(
            f"{label}: {step.seconds:.2f} s, WAL {wal}, backend CPU {step.backend_cpu_s:.2f} s; "
            f"{step.extra}",
            flush=True,
        )
    print(f"\nwriters: {opts.writers} connections, one outbox event per transaction")
    print(
        "step                            rows       seconds   WAL (own)    backend CPU  "
        "writes/s  p50 ms  p99 ms  max ms"
    )
    for s in steps:
        wal = "-" if s.wal_bytes is None else mib(s.wal_bytes)
        w = s.writes
        writes = (
            f"{w.rate:>8,.0f}  {w.pct(0.5):>6.1f}  {w.pct(0.99):>6.1f}  "
            f"{max(w.latencies_ms, default=0):>6.0f}"
            if w is not None
            else f"{'-':>8}  {'-':>6}  {'-':>6}  {'-':>6}"
        )
        print(
            f"{s.label:<30} {s.rows:>10,}  {s.seconds:>8.2f}  {wal:>11}  "
            f"{s.backend_cpu_s:>9.2f} s  {writes}"
        )
    left = benchlib.run_async(old_rows())
    failures = [] if left == 0 else [f"{left:,} old rows left"]
    return benchlib.finish(failures, opts.drop_db, "every old row gone, every write committed")


if __name__ == "__main__":
    sys.exit(main())
