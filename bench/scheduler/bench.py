"""Scheduler benchmark: enqueue rate, drain rate, lateness at a fire rate,
memory of a 24 h spread, and loss/duplicates with Redis restarted and a worker
killed. Uses its own database and its own redis-server (self-contained).

    python bench/scheduler/bench.py --pg postgresql://postgres@127.0.0.1:5432/postgres
    python bench/scheduler/bench.py --phases drain,fire --backlog 100000 --seconds 30

Lateness is taken where it happens: the no-op handler records, in the worker
process, its own start time minus the job's run_at. Only jobs whose run_at is
after the warm-up count, so start-up (pool connects, spawn) is not measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import uvloop

from reservo.core.db.database import Database
from reservo.core.db.migrate import migrate
from reservo.core.kernel.clock import SystemClock
from reservo.core.redis.client import make_client
from reservo.scheduler import Job, Scheduler, SchedulerSettings, repo
from reservo.scheduler.workers import Loader, run

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib

CAT = "bench.noop"


class OwnRedis:
    """A private redis-server (no persistence) the benchmark may flush and restart."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.dir = tempfile.mkdtemp(prefix="bench-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        self.proc = subprocess.Popen(
            ["redis-server", *args, "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.2),
            ):
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _config(**kw: Any) -> SchedulerSettings:
    base: dict[str, Any] = {
        "loader_period_s": 0.5,
        "mover_idle_s": 0.005,
        "executor_idle_s": 0.02,
        "heartbeat_s": 0.5,
        "reaper_timeout_s": 3.0,
        "reaper_period_s": 0.5,
        "executors": 2,
        "executor_concurrency": 500,
        "loader_batch": 20_000,
        "mover_batch": 2000,
    }
    base.update(kw)
    # Only the fields this version of SchedulerSettings has: the same script
    # measures the code before and after a change.
    names = set(SchedulerSettings.model_fields)
    return SchedulerSettings(**{k: v for k, v in base.items() if k in names})


def _scheduler(
    db_url: str,
    redis_url: str,
    ns: str,
    samples: list[tuple[float, float]] | None = None,
    handler_ms: float = 0.0,
    **kw: Any,
) -> Scheduler:
    # The pool `reservo worker` opens by default (RESERVO_DB_POOL_MIN/MAX).
    db = Database(db_url, min_size=2, max_size=20)
    s = Scheduler(db, SystemClock(), make_client(redis_url, 10.0), ns, _config(**kw))

    async def noop(job: Job) -> None:
        if samples is not None:  # (run_at, lateness ms): handler start minus run_at
            at = job.run_at.timestamp()
            samples.append((at, (time.time() - at) * 1000))
        if handler_ms:  # a job that takes time: a killed worker has some in flight
            await asyncio.sleep(handler_ms / 1000)

    s.register(CAT, noop)

    async def close_db() -> None:
        await db.close()

    s.on_close(close_db)
    return s


def worker_main(db_url: str, redis_url: str, ns: str, out: str, kw: dict[str, Any]) -> None:
    samples: list[tuple[float, float]] = []

    async def main() -> None:
        s = _scheduler(db_url, redis_url, ns, samples, **kw)
        # As `reservo worker` runs (cli.py): what start-up built, out of the
        # collector's reach, and the loop below on uvloop.
        gc.collect()
        gc.freeze()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await run(s, stop)
        await s.close()

    import logging

    logging.disable(logging.WARNING)
    uvloop.run(main())
    with open(out, "w") as f:
        json.dump(samples, f)


def start_workers(n: int, db_url: str, redis_url: str, ns: str, **kw: Any) -> list[Any]:
    ctx = mp.get_context("spawn")
    procs = []
    for _ in range(n):
        out = os.path.join(tempfile.gettempdir(), f"bench-sched-{uuid.uuid4().hex}.json")
        p = ctx.Process(target=worker_main, args=(db_url, redis_url, ns, out, kw))
        p.out = out  # type: ignore[attr-defined]
        p.start()
        procs.append(p)
    return procs


def stop_workers(procs: list[Any]) -> list[list[float]]:
    """Stops the workers; returns the (run_at, lateness) samples of clean exits."""
    for p in procs:
        if p.is_alive():
            os.kill(p.pid, signal.SIGTERM)
    samples: list[list[float]] = []
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
        with contextlib.suppress(OSError, ValueError):
            with open(p.out) as f:
                samples += json.load(f)
            os.unlink(p.out)
    return samples


async def bulk(s: Scheduler, run_ats: list[datetime], chunk: int = 20_000) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(run_ats), chunk):
        part = run_ats[i : i + chunk]
        await s.enqueue_bulk(CAT, part, [{}] * len(part), [5] * len(part))
    return len(run_ats) / (time.perf_counter() - t0)


async def as_api(s: Scheduler, run_ats: list[datetime], chunk: int = 128) -> float:
    """Enqueues as POST /api/jobs writes (scheduler/batch.py): batches of at
    most 128 jobs (core.http.batching's largest), one statement each, the jobs due
    within the window written QUEUED under a job_push row and pushed to Redis
    after the commit, so each is written once. enqueue_bulk writes rows only,
    and the loader then pushes them and marks them pushed: a second write of
    every job, inside the drain."""
    t0 = time.perf_counter()
    now = datetime.now(UTC)
    for i in range(0, len(run_ats), chunk):
        jobs = [(CAT, 5, at, {}) for at in run_ats[i : i + chunk]]
        async with s.db.transaction() as conn:
            made, push_id = await s.create_many(conn, jobs, now, s.take_pushes_done())
        if push_id is not None:
            await asyncio.shield(s.push_soon([job for job, _ in made], push_id))
    async with s.db.connection() as conn:  # the last batch's row: nothing deletes it later
        await repo.delete_pushes(conn, s.take_pushes_done())
    return len(run_ats) / (time.perf_counter() - t0)


async def _print_table_stats(conn: asyncpg.Connection) -> None:
    """Where PostgreSQL's work went: rows read by scans of each index and table,
    updates (HOT or not), autovacuum runs. A figure that grows with the backlog
    per job is the one to fix."""
    await asyncio.sleep(0.6)  # the statistics collector flushes every 500 ms
    tables = await conn.fetch(
        "SELECT relname, seq_scan, seq_tup_read, n_tup_upd, n_tup_hot_upd, n_tup_ins, "
        "autovacuum_count, autoanalyze_count FROM pg_stat_user_tables "
        "WHERE relname IN ('scheduled_job', 'job_execution') ORDER BY relname"
    )
    for t in tables:
        print("  table " + ", ".join(f"{k} {v}" for k, v in t.items()))
    for i in await conn.fetch(
        "SELECT indexrelname, idx_scan, idx_tup_read FROM pg_stat_user_indexes "
        "WHERE relname IN ('scheduled_job', 'job_execution') ORDER BY idx_tup_read DESC"
    ):
        print(
            f"  index {i['indexrelname']}: scans {i['idx_scan']}, tuples read {i['idx_tup_read']}"
        )


async def _unfinished(conn: asyncpg.Connection) -> bool:
    """Any job still pending or running? Read through the partial indexes, so a
    poll costs little even with a million finished rows beside them."""
    return bool(
        await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM scheduled_job "
            "               WHERE status IN ('SCHEDULED', 'QUEUED', 'FAILED')) "
            "    OR EXISTS (SELECT 1 FROM scheduled_job WHERE status = 'RUNNING')"
        )
    )


async def analyze(conn: asyncpg.Connection, table: str = "scheduled_job") -> None:
    """Gives the table just filled its planner statistics before the workers
    start, as a running system's table has them (autovacuum analyzes a table
    as it grows). A phase truncates and refills it, and a table without
    statistics is planned as if nearly empty: the first claims and completions
    of a batch of ids ran as sequential scans of the whole backlog, and
    pgqueuer's dequeue, measured the same way, spent twice its PostgreSQL time
    per job. peer.py analyzes pgqueuer's table the same way.

    The drain only. The fire phase's table holds jobs due in the future, and
    statistics taken then misled pgqueuer's dequeue as the jobs fell due: its
    p99 lateness was 83-94 ms in 6 of 8 rounds, against 11-13 ms unanalyzed.
    Neither contender's table is analyzed there: the condition that suits
    pgqueuer."""
    await conn.execute(f"ANALYZE {table}")


async def pg_work(conn: asyncpg.Connection) -> tuple[int, int]:
    """Statements committed in this database (each of the workers' statements
    runs in a transaction of its own) and rows written to its tables, so far:
    the figures per job that a faster drain has to cut."""
    await asyncio.sleep(0.6)  # the statistics collector flushes every 500 ms
    row = await conn.fetchrow(
        "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),"
        "       (SELECT sum(n_tup_ins + n_tup_upd + n_tup_del) FROM pg_stat_user_tables)"
    )
    return int(row[0]), int(row[1] or 0)


async def count(conn: asyncpg.Connection, status: str) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM scheduled_job WHERE status=$1", status))


def quantiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=100)
    return {"n": len(xs), "min": xs[0], "p50": q[49], "p99": q[98], "max": xs[-1]}


async def reset(conn: asyncpg.Connection, s: Scheduler) -> None:
    await conn.execute("TRUNCATE scheduled_job, job_execution CASCADE")
    for _ in range(3):  # the pooled connection may have died with a restart
        try:
            await s.redis.flushall()
            return
        except Exception:
            await asyncio.sleep(0.2)


async def phase_memory(s: Scheduler, conn: asyncpg.Connection, jobs: int) -> None:
    now = datetime.now(UTC)
    run_ats = [now + timedelta(seconds=60 + 86_400 * i / jobs) for i in range(jobs)]
    rate = await bulk(s, run_ats)
    print(f"enqueue_bulk: {jobs} jobs at {rate:,.0f} jobs/s")
    t0 = time.perf_counter()
    for i in range(2000):
        await s.enqueue(CAT, {}, run_at=now + timedelta(days=2, seconds=i))
    print(f"enqueue (one by one, own transaction): {2000 / (time.perf_counter() - t0):,.0f}/s")
    before = int((await s.redis.info("memory"))["used_memory"])
    loaded = await Loader(s).run_once()
    mem = int((await s.redis.info("memory"))["used_memory"])
    size = await conn.fetchval("SELECT pg_total_relation_size('scheduled_job')")
    print(
        f"memory: {loaded} ids in the 300 s window; redis used_memory {mem / 2**20:.1f} MB "
        f"(empty {before / 2**20:.1f} MB); scheduled_job {size / 2**20:.0f} MB"
    )
    await reset(conn, s)


async def phase_drain(
    s: Scheduler, conn: asyncpg.Connection, db_url: str, rd: OwnRedis, ns: str, args: Any
) -> dict[str, float]:
    """Drains a due backlog; returns its rates (jobs/s from the workers' start
    and from the first completion) and CPU per job (us)."""
    # A running system, whose workers (re)start on a backlog: its loader has
    # loaded the window (empty here) under Redis' current epoch. Without this
    # pass the workers' loader would find Redis as after a restart (reset()
    # flushed it) and push the whole window again beside the drain.
    await Loader(s).run_once()
    due = datetime.now(UTC) - timedelta(seconds=1)
    enqueue = getattr(args, "enqueue", "bulk")
    rate = await (as_api if enqueue == "api" else bulk)(s, [due] * args.backlog)
    print(f"enqueued {args.backlog} due jobs ({enqueue}) at {rate:,.0f} jobs/s")
    await analyze(conn)
    work0 = await pg_work(conn)
    pg0, redis0 = benchlib.postgres_cpu_s(), benchlib.cpu_s([rd.pid])
    procs = start_workers(args.workers, db_url, rd.url, ns)
    t0 = time.time()
    profile = Path(tempfile.gettempdir()) / f"bench-sched-{uuid.uuid4().hex}.raw"
    spy = None
    # Poll rarely (count(*) scans the table, and that is CPU taken from the
    # drain); the times come from the jobs' own finished_at, not from the poll.
    # The poll must find a pending row through the partial indexes, not by a
    # sequential scan across the rows already done.
    await conn.execute("SET enable_seqscan = off")
    while await _unfinished(conn):
        if spy is None and args.profile and shutil.which("py-spy"):
            spy = subprocess.Popen(  # noqa: ASYNC220 (runs beside the drain)
                ["py-spy", "record", "--pid", str(procs[0].pid), "--duration",
                 str(args.profile), "--rate", "250", "--nonblocking", "--format", "raw",
                 "--output", str(profile)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        await asyncio.sleep(0.5)
    workers_cpu = benchlib.cpu_s([p.pid for p in procs])
    pg, redis_cpu = benchlib.postgres_cpu_s() - pg0, benchlib.cpu_s([rd.pid]) - redis0
    stop_workers(procs)
    work = [b - a for a, b in zip(work0, await pg_work(conn), strict=True)]
    await conn.execute("RESET enable_seqscan")
    assert await count(conn, "DONE") == args.backlog
    first_at, last_at = await conn.fetchrow(
        "SELECT min(finished_at), max(finished_at) FROM scheduled_job WHERE status = 'DONE'"
    )
    wall = last_at.timestamp() - t0
    steady = (last_at - first_at).total_seconds()
    print(
        f"drain: {args.backlog} due jobs in {wall:.1f} s with {args.workers} worker "
        f"processes: {args.backlog / wall:,.0f} jobs/s overall (from the workers' start), "
        f"{(args.backlog - 1) / steady:,.0f} jobs/s from the first completion to the last; "
        f"CPU s: workers {workers_cpu:.1f}, postgres {pg:.1f}, redis {redis_cpu:.1f} "
        f"(2 cores x {wall:.1f} s = {2 * wall:.1f}); "
        f"per job: workers {1e6 * workers_cpu / args.backlog:.0f} us, "
        f"postgres {1e6 * pg / args.backlog:.0f} us, "
        f"redis {1e6 * redis_cpu / args.backlog:.0f} us; "
        f"PostgreSQL statements per job {work[0] / args.backlog:.3f}, "
        f"rows written per job {work[1] / args.backlog:.2f}"
    )
    await _print_table_stats(conn)
    if spy is not None:
        spy.wait()
        print(benchlib.summarize_profile(profile))
        profile.unlink(missing_ok=True)
    await reset(conn, s)
    return {
        "rate": args.backlog / wall,
        "steady": (args.backlog - 1) / steady,
        "workers_us": 1e6 * workers_cpu / args.backlog,
        "postgres_us": 1e6 * pg / args.backlog,
        "redis_us": 1e6 * redis_cpu / args.backlog,
        "statements": work[0] / args.backlog,
        "rows": work[1] / args.backlog,
    }


async def phase_fire(
    s: Scheduler,
    conn: asyncpg.Connection,
    db_url: str,
    rd: OwnRedis,
    ns: str,
    args: Any,
    fault: bool,
) -> dict[str, float]:
    """Fires jobs at a rate; returns the lateness quantiles (ms)."""
    total_s = args.warmup + args.seconds
    n = args.rate * total_s
    lead = 5.0  # workers spawn and connect before the first run_at
    start = datetime.now(UTC) + timedelta(seconds=lead)
    await bulk(s, [start + timedelta(seconds=i / args.rate) for i in range(n)])
    # Not analyzed here: see analyze().
    procs = start_workers(
        args.workers + (1 if fault else 0),
        db_url,
        rd.url,
        ns,
        handler_ms=args.fault_handler_ms if fault else 0.0,
        **fire_ahead(args),
    )
    if fault:
        await asyncio.sleep(lead + total_s / 3)
        rd.stop()
        await asyncio.sleep(0.5)
        rd.start()
        await asyncio.sleep(total_s / 3)
        procs[0].kill()
    deadline = time.monotonic() + lead + total_s + 60
    # As the drain's poll: a pending row found through the partial indexes. A
    # count of the DONE rows cost PostgreSQL 7-30 ms every half second, beside
    # the jobs being measured (pgqueuer's poll is an EXISTS).
    await conn.execute("SET enable_seqscan = off")
    while time.monotonic() < deadline and await _unfinished(conn):  # noqa: ASYNC110
        await asyncio.sleep(0.5)
    await conn.execute("RESET enable_seqscan")
    await asyncio.sleep(2)
    recorded = stop_workers(procs)
    done = await count(conn, "DONE")
    dup = await conn.fetchval(
        "SELECT count(*) FROM (SELECT job_id FROM job_execution WHERE outcome='DONE' "
        "GROUP BY job_id HAVING count(*) > 1) d"
    )
    reaped = await conn.fetchval("SELECT count(*) FROM job_execution WHERE outcome='LOST'")
    # The killed worker's samples are gone: use started_at in PostgreSQL, the
    # claim's time (run_at for a job claimed within the fire-ahead).
    if fault:
        rows = await conn.fetch(
            "SELECT extract(epoch FROM started_at - run_at) * 1000 AS ms FROM scheduled_job "
            "WHERE status = 'DONE' AND run_at >= $1",
            start + timedelta(seconds=args.warmup),
        )
        samples = [float(r["ms"]) for r in rows]
        label = (
            f"fault (redis restart + SIGKILL 1 of 3 workers, {args.fault_handler_ms:g} ms handler)"
        )
        how = "started_at"
    else:
        after = (start + timedelta(seconds=args.warmup)).timestamp()
        samples = [ms for at, ms in recorded if at >= after]
        label, how = "clean", "handler start"
    lat = quantiles(samples)
    print(
        f"fire {args.rate}/s for {total_s}s ({args.warmup}s warm-up) [{label}]: done {done}/{n}, "
        f"lost {n - done}, duplicate completions {dup}, reaped attempts {reaped}; "
        f"lateness ({how}) ms over {lat['n']} jobs: min {lat['min']:.2f} p50 {lat['p50']:.1f} "
        f"p99 {lat['p99']:.1f} max {lat['max']:.1f}"
    )
    await reset(conn, s)
    return lat


def fire_ahead(args: Any) -> dict[str, float]:
    """The workers' fire-ahead: the product's default unless --fire-ahead-ms."""
    ms = getattr(args, "fire_ahead_ms", None)
    return {} if ms is None else {"fire_ahead_s": ms / 1000}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--phases", default="memory,drain,fire,fault")
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--backlog", type=int, default=200_000)
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--enqueue",
        choices=["bulk", "api"],
        default="bulk",
        help="how the drain's backlog is written: enqueue_bulk (rows only, the loader pushes "
        "them) or as POST /api/jobs writes them (pushed at the commit)",
    )
    ap.add_argument(
        "--fault-handler-ms",
        type=float,
        default=50.0,
        help="handler time in the fault phase, so the killed worker dies with jobs in flight",
    )
    ap.add_argument("--profile", type=int, default=0, help="py-spy seconds on worker 1 (drain)")
    ap.add_argument(
        "--fire-ahead-ms",
        type=float,
        default=None,
        help="RESERVO_SCHEDULER_FIRE_AHEAD_S of the workers, in ms (default: the product's)",
    )
    args = ap.parse_args()
    phases = {p.strip() for p in args.phases.split(",")}

    name = f"reservo_bench_sched_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(args.pg)
    await admin.execute(f'CREATE DATABASE "{name}"')
    db_url = args.pg.rpartition("/")[0] + "/" + name
    await migrate(db_url)
    rd = OwnRedis()
    rd.start()
    conn = await asyncpg.connect(db_url)
    ns = "bench"
    s = _scheduler(db_url, rd.url, ns)
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    try:
        if "memory" in phases:
            await phase_memory(s, conn, args.jobs)
        if "drain" in phases:
            await phase_drain(s, conn, db_url, rd, ns, args)
        if "fire" in phases:
            await phase_fire(s, conn, db_url, rd, ns, args, fault=False)
        if "fault" in phases:
            await phase_fire(s, conn, db_url, rd, ns, args, fault=True)
    finally:
        print(f"load average at end: {os.getloadavg()[0]:.1f}")
        await s.close()
        await conn.close()
        rd.cleanup()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
