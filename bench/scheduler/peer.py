"""The scheduler against a peer, side by side in one run: reservo and pgqueuer
(PyPI, the `bench` extra) drain the same due backlog of no-op jobs with the
same number of worker processes on the same PostgreSQL, then fire jobs at the
same rate; rounds are interleaved (the order flips every round) so a noisy
neighbour weighs on both alike. Prints every round, then the medians and the
ratios.

reservo's backlog is written two ways, each a contender of its own: rows only
(``enqueue_bulk``; the loader pushes them to Redis and marks them pushed, a
second write of every job, inside the drain) and as POST /api/jobs writes it
(pushed at the commit, each job written once). pgqueuer's is its own batch
``enqueue``, due at once.

    PYTHONPATH=src:. python bench/scheduler/peer.py --rounds 3 --backlog 100000

Both run their workers on uvloop, as their own command lines do (`reservo worker`,
`pgq run`), and both are measured the same way. Drain: jobs/s from the workers' start to the
last completion as PostgreSQL recorded it (reservo: finished_at; pgqueuer: its
log row of the completion). Lateness: the no-op handler's start, in the worker
process, minus the time the job was due (reservo: run_at; pgqueuer:
execute_after), over the jobs due after the warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import bench

import benchlib
from reservo.core.db.migrate import migrate
from reservo.scheduler import SchedulerSettings

ENTRYPOINT = "bench_noop"
DEFAULT_AHEAD_MS = SchedulerSettings().fire_ahead_s * 1000
PGQ_WORKER = Path(__file__).with_name("pgq_worker.py")
# pgqueuer's dequeue batch, as in the measurement (its default is 10).
PGQ_BATCH = 500
# What pgqueuer's rows are enqueued by per statement.
ENQUEUE_CHUNK = 10_000


class Worker:
    """A pgqueuer worker (pgq_worker.py) as a plain process, with the part of
    multiprocessing.Process that bench.stop_workers and benchlib.cpu_s use."""

    def __init__(self, db_url: str, batch: int) -> None:
        self.out = os.path.join(tempfile.gettempdir(), f"bench-pgq-{uuid.uuid4().hex}.json")
        self.popen = subprocess.Popen(
            [sys.executable, str(PGQ_WORKER), db_url, self.out, str(batch), ENTRYPOINT]
        )
        self.pid = self.popen.pid

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def join(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)

    def kill(self) -> None:
        self.popen.kill()


def start_pgq(n: int, db_url: str, batch: int) -> list[Worker]:
    return [Worker(db_url, batch) for _ in range(n)]


async def pgq_reset(conn: asyncpg.Connection) -> None:
    await conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")


async def pgq_enqueue(conn: asyncpg.Connection, afters: list[timedelta | None]) -> None:
    from pgqueuer import AsyncpgDriver
    from pgqueuer.queries import Queries

    q = Queries(AsyncpgDriver(conn))
    for i in range(0, len(afters), ENQUEUE_CHUNK):
        part = afters[i : i + ENQUEUE_CHUNK]
        await q.enqueue([ENTRYPOINT] * len(part), [None] * len(part), [0] * len(part), part)


async def pgq_drain(conn: asyncpg.Connection, args: Any) -> dict[str, float]:
    await pgq_enqueue(conn, [None] * args.backlog)
    await bench.analyze(conn, "pgqueuer")
    work0 = await bench.pg_work(conn)
    pg0 = benchlib.postgres_cpu_s()
    procs = start_pgq(args.workers, args.db_url, args.pgq_batch)
    t0 = time.time()
    while await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pgqueuer)"):  # noqa: ASYNC110
        await asyncio.sleep(0.5)
    workers_cpu = benchlib.cpu_s([p.pid for p in procs])
    pg = benchlib.postgres_cpu_s() - pg0
    bench.stop_workers(procs)
    work = [b - a for a, b in zip(work0, await bench.pg_work(conn), strict=True)]
    done, first_at, last_at = await conn.fetchrow(
        "SELECT count(*), min(created), max(created) FROM pgqueuer_log WHERE status = 'successful'"
    )
    assert done == args.backlog, f"pgqueuer completed {done} of {args.backlog}"
    wall = last_at.timestamp() - t0
    out = {
        "rate": args.backlog / wall,
        "steady": (args.backlog - 1) / (last_at - first_at).total_seconds(),
        "workers_us": 1e6 * workers_cpu / args.backlog,
        "postgres_us": 1e6 * pg / args.backlog,
        "redis_us": 0.0,
        "statements": work[0] / args.backlog,
        "rows": work[1] / args.backlog,
    }
    print(
        f"pgqueuer drain: {args.backlog} due jobs, {args.workers} worker processes, batch "
        f"{args.pgq_batch}: {out['rate']:,.0f} jobs/s (from the workers' start), "
        f"{out['steady']:,.0f} from the first completion; per job: workers "
        f"{out['workers_us']:.0f} us, postgres {out['postgres_us']:.0f} us; PostgreSQL "
        f"statements per job {out['statements']:.3f}, rows written per job {out['rows']:.2f}"
    )
    await pgq_reset(conn)
    return out


async def pgq_fire(conn: asyncpg.Connection, args: Any) -> dict[str, float]:
    total_s = args.warmup + args.seconds
    n = args.rate * total_s
    lead = 5.0  # as reservo's phase: workers spawn and connect before the first job is due
    start = time.time() + lead
    # execute_after is relative to the database's now() at the insert: the
    # offsets are taken just before each chunk goes in.
    for i in range(0, n, ENQUEUE_CHUNK):
        now = time.time()
        offsets = [
            timedelta(seconds=start + k / args.rate - now)
            for k in range(i, min(n, i + ENQUEUE_CHUNK))
        ]
        await pgq_enqueue(conn, list(offsets))
    procs = start_pgq(args.workers, args.db_url, args.pgq_batch)
    deadline = time.monotonic() + lead + total_s + 60
    while time.monotonic() < deadline and await conn.fetchval(  # noqa: ASYNC110
        "SELECT EXISTS (SELECT 1 FROM pgqueuer)"
    ):
        await asyncio.sleep(0.5)
    await asyncio.sleep(2)
    recorded = bench.stop_workers(procs)
    done = await conn.fetchval("SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")
    after = start + args.warmup
    lat = bench.quantiles([ms for at, ms in recorded if at >= after])
    print(
        f"pgqueuer fire {args.rate}/s for {total_s}s ({args.warmup}s warm-up): done {done}/{n}; "
        f"lateness (handler start) ms over {lat['n']} jobs: min {lat['min']:.2f} "
        f"p50 {lat['p50']:.1f} p99 {lat['p99']:.1f} max {lat['max']:.1f}"
    )
    await pgq_reset(conn)
    return lat


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backlog", type=int, default=100_000)
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--pgq-batch", type=int, default=PGQ_BATCH)
    ap.add_argument("--phases", default="drain,fire")
    ap.add_argument(
        "--reservo-enqueue",
        default="bulk,api",
        help="how reservo's drain backlog is written (bench.py --enqueue), one contender each",
    )
    ap.add_argument(
        "--reservo-fire-ahead-ms",
        default=f"{DEFAULT_AHEAD_MS:g},0",
        help="reservo's fire-ahead in the fire phase (RESERVO_SCHEDULER_FIRE_AHEAD_S, in ms), "
        "one contender each: the product's default, and 0 (handed out only once due)",
    )
    args = ap.parse_args()
    args.profile = 0
    phases = {p.strip() for p in args.phases.split(",")}
    from pgqueuer import AsyncpgDriver
    from pgqueuer.queries import Queries

    name = f"reservo_bench_peer_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(args.pg)
    await admin.execute(f'CREATE DATABASE "{name}"')
    args.db_url = args.pg.rpartition("/")[0] + "/" + name
    await migrate(args.db_url)
    conn = await asyncpg.connect(args.db_url)
    await Queries(AsyncpgDriver(conn)).install()
    rd = bench.OwnRedis()
    rd.start()
    ns = "bench"
    s = bench._scheduler(args.db_url, rd.url, ns)
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    figures: dict[str, list[dict[str, float]]] = {}

    def reservo_drain(enqueue: str) -> Callable[[], Awaitable[dict[str, float]]]:
        return lambda: bench.phase_drain(
            s, conn, args.db_url, rd, ns, argparse.Namespace(**{**vars(args), "enqueue": enqueue})
        )

    def reservo_fire(ahead_ms: float) -> Callable[[], Awaitable[dict[str, float]]]:
        fire_args = argparse.Namespace(**{**vars(args), "fire_ahead_ms": ahead_ms})
        return lambda: bench.phase_fire(s, conn, args.db_url, rd, ns, fire_args, fault=False)

    drains = {f"reservo ({how})": reservo_drain(how) for how in args.reservo_enqueue.split(",")}
    drains["pgqueuer"] = lambda: pgq_drain(conn, args)
    fires = {
        f"reservo (fire-ahead {ms} ms)": reservo_fire(float(ms))
        for ms in args.reservo_fire_ahead_ms.split(",")
    }
    fires["pgqueuer"] = lambda: pgq_fire(conn, args)
    try:
        for r in range(args.rounds):
            print(f"--- round {r + 1}, {datetime.now(UTC):%H:%M:%S}")
            for phase, runs in (("drain", drains), ("fire", fires)):
                if phase not in phases:
                    continue
                # Every round starts with the next contender: each goes first once.
                order = list(runs)[r % len(runs) :] + list(runs)[: r % len(runs)]
                for who in order:
                    print(f"[{phase} {who}]")
                    figures.setdefault(f"{phase} {who}", []).append(await runs[who]())
    finally:
        print(f"load average at end: {os.getloadavg()[0]:.1f}")
        await s.close()
        await conn.close()
        rd.cleanup()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    summary(figures, args)


def summary(figures: dict[str, list[dict[str, float]]], args: Any) -> None:
    def med(key: str, field: str) -> float:
        return statistics.median(f[field] for f in figures[key])

    def each(key: str, field: str) -> str:
        return " / ".join(f"{f[field]:,.1f}" for f in figures[key])

    def ratios(phase: str, field: str, line: str, higher_wins: bool) -> None:
        """Each reservo contender's median of ``field`` against pgqueuer's, as
        the factor by which reservo is ahead (``line`` names it)."""
        peer = f"{phase} pgqueuer"
        if peer not in figures:
            return
        for key in figures:
            if key.startswith(f"{phase} ") and key != peer:
                ours, theirs = med(key, field), med(peer, field)
                ratio = ours / theirs if higher_wins else theirs / ours
                print(line.format(who=key[len(phase) + 1 :], ratio=ratio))

    print(f"=== medians of {args.rounds} interleaved rounds, {args.workers} worker processes")
    drains = [key for key in figures if key.startswith("drain ")]
    for key in drains:
        print(
            f"{key} ({args.backlog} due no-op jobs): {med(key, 'rate'):,.0f} jobs/s "
            f"(rounds {each(key, 'rate')}; from the first completion "
            f"{med(key, 'steady'):,.0f}); per job: workers {med(key, 'workers_us'):.0f} us, "
            f"postgres {med(key, 'postgres_us'):.0f} us, redis {med(key, 'redis_us'):.0f} us; "
            f"statements {med(key, 'statements'):.3f}, rows written {med(key, 'rows'):.2f}"
        )
    ratios("drain", "rate", "drain ratio {who} / pgqueuer: {ratio:.2f}x (target >= 2x)", True)
    for key in (key for key in figures if key.startswith("fire ")):
        print(
            f"lateness at {args.rate} jobs/s, {key[5:]}: p99 {med(key, 'p99'):.1f} ms "
            f"(rounds {each(key, 'p99')}), p50 {med(key, 'p50'):.1f} ms, "
            f"earliest {min(f['min'] for f in figures[key]):.2f} ms"
        )
    ratios("fire", "p99", "p99 lateness ratio pgqueuer / {who}: {ratio:.2f}x (target >= 2x)", False)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
