"""Retention: pruning while the booking storm runs.

The outbox gets N DONE events published 4 days ago (older than the 72 h
retention) in one `INSERT ... SELECT generate_series`. Then the booking storm
(bench/booking_storm: 30 hot slots, 20,000 patients, `reservo api` + `reservo
worker` as real processes, wrk) runs twice for the same time: once alone, once
while the retention pruner (reservo.core.maintenance.retention with the default rules,
batch size and pause) deletes those rows. Printed: the storm's attempts/s and
latency with and without pruning, and the prune rate (rows/s) during the storm
and, for what it left, afterwards without the storm.

    python bench/retention/run.py                      # 10,000,000 rows
    python bench/retention/run.py --rows 2000000 --duration 30

The service's own `maintenance` role is started with pruning off in both runs
(RESERVO_RETENTION_ENABLED=false), so the only pruner is the one this runner
starts with the storm's first request and stops with its last. It runs in this
runner's process (same code, same statements); its PostgreSQL backend is
counted in the PostgreSQL CPU figures.

Own database (BENCH_DB, default reservo_bench_retention) and Redis namespace
(bench-retention), so it can run beside the other benchmarks. Exits 1 on any
5xx, overbooking, counter mismatch, or a pending/DEAD outbox row pruned.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil

from reservo.bootstrap import declared_retention
from reservo.core.db.database import Database
from reservo.core.kernel.clock import SystemClock
from reservo.core.maintenance.retention import Pruner
from reservo.settings import Settings

# Before benchlib reads it: a database of its own, beside the other benchmarks'.
os.environ.setdefault("BENCH_DB", "reservo_bench_retention")
BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))
import benchlib  # noqa: E402 (after BENCH_DB is set)

benchlib.NAMESPACE = "bench-retention"
OLD_TOPIC = "bench.retention.old.v1"


def _load_storm() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "booking_storm_run", BENCH / "booking_storm/run.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


storm = _load_storm()

# Booking-event-sized payloads, published 4 days (+ up to N ms) ago: all past 72 h.
_FILL = f"""
INSERT INTO outbox (event_id, topic, key, payload, created_at, available_at, status,
                    attempts, published_at)
SELECT gen_random_uuid(), '{OLD_TOPIC}', 'appointment:' || g,
       jsonb_build_object('appointmentId', g, 'slotId', g, 'patientId', g,
                          'startAt', now() + interval '1 day', 'status', 'BOOKED'),
       now() - interval '4 days' - g * interval '1 ms',
       now() - interval '4 days' - g * interval '1 ms', 'DONE', 1,
       now() - interval '4 days' - g * interval '1 ms'
  FROM generate_series(1, $1) AS g
"""
# Rows the pruner must never take, however old: a pending event and a dead one.
_NEEDED = f"""
INSERT INTO outbox (event_id, topic, payload, created_at, available_at, status, published_at)
VALUES (gen_random_uuid(), '{OLD_TOPIC}.keep', '{{}}', now() - interval '30 days',
        now() + interval '1 year', 'PENDING', NULL),
       (gen_random_uuid(), '{OLD_TOPIC}.keep', '{{}}', now() - interval '30 days',
        now() - interval '30 days', 'DEAD', NULL)
"""


@dataclass
class StormRun:
    label: str
    attempts_per_s: float
    requests: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    statuses: dict[str, int]
    pruned: int
    prune_s: float
    prune_cpu_pg_s: float
    prune_cpu_py_s: float
    facts: dict[str, int]
    cpu: dict[str, float]
    errors_logged: int

    @property
    def prune_rate(self) -> float:
        return self.pruned / self.prune_s if self.prune_s else 0.0

    @property
    def failures(self) -> list[str]:
        bad = []
        n5xx = sum(n for k, n in self.statuses.items() if k.startswith("5"))
        if n5xx:
            bad.append(f"{n5xx} responses were 5xx")
        if self.facts["overbooked_slots"] or self.facts["mismatched_slots"]:
            bad.append(f"slot counters wrong: {self.facts}")
        if self.facts["outbox_events"] != self.facts["appointments_total"]:
            bad.append(f"bookings and outbox events differ: {self.facts}")
        return bad


async def fill_outbox(rows: int) -> float:
    conn = await benchlib.connect()
    try:
        await benchlib.reset_state(conn)
        started = time.perf_counter()
        await conn.execute(_FILL, rows)
        await conn.execute(_NEEDED)
        took = time.perf_counter() - started
        # Old rows are all-visible pages with statistics, as they would be in production.
        await conn.execute("VACUUM ANALYZE outbox")
        return took
    finally:
        await conn.close()


async def prepare(ds: benchlib.Dataset) -> tuple[list[int], list[int]]:
    """booking_storm's slot preparation, without truncating the filled outbox."""
    conn = await benchlib.connect()
    try:
        await conn.execute("TRUNCATE appointment, idempotency_key, inbox, notification")
        await conn.execute("DELETE FROM outbox WHERE topic NOT LIKE $1", f"{OLD_TOPIC}%")
        await conn.execute("UPDATE time_slot SET booked_count = 0 WHERE booked_count <> 0")
        benchlib.clear_redis_namespace()
        hot = [r["id"] for r in await conn.fetch(storm._HOT, 1, storm.HOT_SLOTS, ds.last_day)]
        caps = [storm.HOT_CAPACITIES[i % len(storm.HOT_CAPACITIES)] for i in range(len(hot))]
        await conn.executemany(
            "UPDATE time_slot SET capacity = $2 WHERE id = $1", list(zip(hot, caps, strict=True))
        )
        warm = [
            r["id"] for r in await conn.fetch(storm._WARM, storm.HOT_SLOTS + 1, ds.last_day, 30)
        ]
        await conn.execute(
            "UPDATE time_slot SET capacity = $2 WHERE id = ANY($1::bigint[])",
            warm,
            storm.WARM_CAPACITY,
        )
        return hot, warm
    finally:
        await conn.close()


async def check(hot: list[int]) -> dict[str, int]:
    """booking_storm's checks; the outbox's pending count leaves out the PENDING row
    kept on purpose (due in a year)."""
    conn = await benchlib.connect()
    try:
        pending = -1
        for _ in range(50):  # the relay should drain the storm's events within seconds
            pending = await conn.fetchval(
                "SELECT count(*) FROM outbox WHERE status = 'PENDING' AND topic NOT LIKE $1",
                f"{OLD_TOPIC}%",
            )
            if pending == 0:
                break
            await asyncio.sleep(0.2)
        return {
            "booked_hot": await conn.fetchval(
                "SELECT count(*) FROM appointment WHERE status = 'BOOKED' AND slot_id = ANY($1)",
                hot,
            ),
            "overbooked_slots": await conn.fetchval(storm._OVERBOOKED),
            "mismatched_slots": await conn.fetchval(storm._MISMATCHED),
            "outbox_events": await conn.fetchval(
                "SELECT count(*) FROM outbox WHERE topic = 'appointments.appointment.booked.v1'"
            ),
            "appointments_total": await conn.fetchval("SELECT count(*) FROM appointment"),
            "outbox_pending_after_10s": pending,
        }
    finally:
        await conn.close()


async def old_rows() -> tuple[int, int]:
    conn = await benchlib.connect()
    try:
        row = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE topic = $1), count(*) FILTER (WHERE topic = $2)"
            "  FROM outbox",
            OLD_TOPIC,
            f"{OLD_TOPIC}.keep",
        )
        return int(row[0]), int(row[1])
    finally:
        await conn.close()


async def storm_with(
    url: str, opts: argparse.Namespace, args: list[str], prune: bool
) -> tuple[Any, int, float, tuple[float, float]]:
    """wrk for opts.duration; with ``prune``, the pruner runs from its first request
    to its last. Returns wrk's result, rows pruned, the pruning time and the CPU
    seconds of the pruner's PostgreSQL backend and of this process (the pruner's
    Python side; wrk is a child and not in it)."""
    # One connection: the pruner uses one at a time, and its backend's CPU is measured.
    db = Database(benchlib.db_url(), min_size=1, max_size=1)
    settings = Settings()
    pruner = Pruner(
        db,
        SystemClock(),
        declared_retention(settings),
        batch=settings.retention_batch_size,
        pause_s=settings.retention_pause_s,
    )
    async with db.connection() as conn:
        backend = psutil.Process(await conn.fetchval("SELECT pg_backend_pid()"))
    pg0, py0 = benchlib.cpu_s([backend.pid]), time.process_time()
    stop = asyncio.Event()
    started = time.perf_counter()
    finished: list[float] = []

    async def prune_all() -> list[Any]:
        results = await pruner.run(stop)
        finished.append(time.perf_counter())  # all pruned, or stopped with the storm
        return results

    task = asyncio.create_task(prune_all()) if prune else None
    try:
        res = await asyncio.to_thread(
            benchlib.run_wrk,
            storm.HERE / "storm.lua",
            url,
            opts.threads,
            opts.connections,
            opts.duration,
            args,
        )
    finally:
        stop.set()
    pruned, took = 0, 0.0
    if task is not None:
        results = await task
        took = finished[0] - started
        pruned = sum(r.rows.get("outbox", 0) for r in results)
    cpu = (benchlib.cpu_s([backend.pid]) - pg0, time.process_time() - py0)
    await db.close()
    return res, pruned, took, cpu


def one_run(
    ds: benchlib.Dataset, opts: argparse.Namespace, files: dict[str, Path], prune: bool
) -> StormRun:
    hot, warm = benchlib.run_async(prepare(ds))
    env = {"RESERVO_DB_POOL_MAX": str(opts.pool_max), "RESERVO_RETENTION_ENABLED": "false"}
    with benchlib.Reservo(opts.workers, env) as rv:
        if opts.warmup > 0:
            benchlib.run_wrk(
                storm.HERE / "storm.lua",
                rv.base,
                opts.threads,
                opts.connections,
                opts.warmup,
                [str(files["warm"]), ",".join(map(str, warm)), f"warm{time.time_ns()}"],
            )
            time.sleep(1.0)
        args = [str(files["storm"]), ",".join(map(str, hot)), f"storm{time.time_ns()}"]
        with benchlib.CpuMeter(rv) as cpu:
            res, pruned, took, prune_cpu = benchlib.run_async(
                storm_with(rv.base, opts, args, prune)
            )
        facts = benchlib.run_async(check(hot))
        errors = rv.error_lines()
        for line in errors[:5]:
            print(f"  logged: {line[:200]}", file=sys.stderr)
    return StormRun(
        label="storm + pruning" if prune else "storm alone",
        attempts_per_s=res.rate,
        requests=res.requests,
        p50_ms=res.p50_ms,
        p90_ms=res.p90_ms,
        p99_ms=res.p99_ms,
        max_ms=res.max_ms,
        statuses=dict(sorted(res.statuses.items())),
        pruned=pruned,
        prune_s=took,
        prune_cpu_pg_s=prune_cpu[0],
        prune_cpu_py_s=prune_cpu[1],
        facts=facts,
        cpu=cpu.figures(res.requests, res.wrk_cpu_s),
        errors_logged=len(errors),
    )


async def finish_pruning() -> tuple[int, float]:
    """Prune what the storm run left, without the storm (same pruner)."""
    db = Database(benchlib.db_url(), min_size=1, max_size=2)
    settings = Settings()
    pruner = Pruner(
        db,
        SystemClock(),
        declared_retention(settings),
        batch=settings.retention_batch_size,
        pause_s=settings.retention_pause_s,
    )
    started = time.perf_counter()
    results = await pruner.run()
    took = time.perf_counter() - started
    await db.close()
    return sum(r.rows.get("outbox", 0) for r in results), took


def describe(r: StormRun) -> str:
    total = max(1, r.requests)
    split = ", ".join(f"{k}: {n} ({100 * n / total:.1f}%)" for k, n in r.statuses.items())
    prune = (
        f"; pruned {r.pruned:,} outbox rows in {r.prune_s:.1f} s = {r.prune_rate:,.0f} rows/s "
        f"(pruner CPU: PostgreSQL backend {r.prune_cpu_pg_s:.1f} s, Python "
        f"{r.prune_cpu_py_s:.1f} s = {1e6 * r.prune_cpu_pg_s / r.pruned:.1f} + "
        f"{1e6 * r.prune_cpu_py_s / r.pruned:.1f} us per row)"
        if r.pruned
        else ""
    )
    return (
        f"{r.label}: {r.attempts_per_s:,.0f} attempts/s ({r.requests:,}), p50 {r.p50_ms:.1f} ms, "
        f"p90 {r.p90_ms:.1f} ms, p99 {r.p99_ms:.1f} ms, max {r.max_ms:.0f} ms{prune}\n"
        f"  statuses: {split}\n  checks: {r.facts}\n  {benchlib.describe_cpu(r.cpu)}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=10_000_000, help="old DONE outbox rows")
    p.add_argument("--duration", type=float, default=30, help="seconds of storm per run")
    p.add_argument("--workers", type=int, default=2, help="API worker processes")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--connections", type=int, default=128)
    p.add_argument("--patients", type=int, default=20_000)
    p.add_argument("--warmup", type=float, default=3)
    p.add_argument("--pool-max", type=int, default=10)
    p.add_argument("--doctors", type=int, default=2000)
    p.add_argument("--days", type=int, default=14)
    p.add_argument("--no-finish", action="store_true", help="leave the unpruned rest")
    p.add_argument("--drop-db", action="store_true", help="drop the database at the end")
    opts = p.parse_args(argv)
    benchlib.stop_cleanly_on_signals()

    print(f"machine: {benchlib.machine()}")
    print(f"reservo code under test: {benchlib.reservo_source()}")
    print(f"when: {time.strftime('%Y-%m-%d %H:%M:%S %z')}")
    ds = benchlib.run_async(benchlib.ensure_dataset(opts.doctors, opts.days, 40, False))
    how = f"loaded in {ds.loaded_in_s:.1f} s" if ds.loaded_in_s else "reused"
    print(f"data set: {ds.slots:,} slots ({how}); agenda opening {ds.last_day}")
    took = benchlib.run_async(fill_outbox(opts.rows))
    print(f"outbox: {opts.rows:,} DONE rows published 4 days ago, inserted in {took:.1f} s")
    tmp = Path(tempfile.mkdtemp(prefix="reservo-retention-"))
    files = {
        "storm": benchlib.mint_patients(tmp / "patients.txt", 1_000_000, opts.patients),
        "warm": benchlib.mint_patients(tmp / "warm.txt", 2_000_000, opts.patients),
    }

    runs = []
    for prune in (False, True):
        r = one_run(ds, opts, files, prune)
        runs.append(r)
        print(describe(r), flush=True)
    left, kept = benchlib.run_async(old_rows())
    quiet = (0, 0.0)
    if left and not opts.no_finish:
        quiet = benchlib.run_async(finish_pruning())
        left, kept = benchlib.run_async(old_rows())

    alone, pruning = runs
    print(
        f"\nstorm {opts.duration:.0f} s, {opts.workers} API workers, wrk -t{opts.threads} "
        f"-c{opts.connections}, {opts.rows:,} old outbox rows:"
    )
    print("run               attempts/s  p50 ms  p99 ms  max ms  5xx  pruned rows  prune rows/s")
    for r in runs:
        n5xx = sum(n for k, n in r.statuses.items() if k.startswith("5"))
        print(
            f"{r.label:<16} {r.attempts_per_s:>11,.0f}  {r.p50_ms:>6.1f}  {r.p99_ms:>6.1f}  "
            f"{r.max_ms:>6.0f}  {n5xx:>3}  {r.pruned:>11,}  {r.prune_rate:>12,.0f}"
        )
    change = 100 * (pruning.attempts_per_s / max(1e-9, alone.attempts_per_s) - 1)
    print(
        f"attempts/s with pruning: {change:+.1f}%; p99 {alone.p99_ms:.1f} -> "
        f"{pruning.p99_ms:.1f} ms"
    )
    if quiet[0]:
        print(
            f"the rest, without the storm: {quiet[0]:,} rows in {quiet[1]:.1f} s = "
            f"{quiet[0] / max(1e-9, quiet[1]):,.0f} rows/s"
        )
    print(f"old rows left: {left:,}; needed rows (PENDING, DEAD) kept: {kept}/2")

    failures = [f"{r.label}: {f}" for r in runs for f in r.failures]
    if kept != 2:
        failures.append("a PENDING or DEAD outbox row was pruned")
    return benchlib.finish(
        failures, opts.drop_db, "zero 5xx, zero overbooking, needed outbox rows kept"
    )


if __name__ == "__main__":
    sys.exit(main())
