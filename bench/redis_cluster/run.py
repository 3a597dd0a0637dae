"""Redis Cluster against a single Redis: the booking gate's Redis call, the
scheduler's drain rate, and the drain with one master SIGKILLed halfway. Starts
its own redis-server and its own cluster (three masters, three replicas), and
uses its own database; prints its figures.

    python bench/redis_cluster/run.py
    python bench/redis_cluster/run.py --phases gate --calls 50000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from reservo.core.db.database import Database
from reservo.core.db.migrate import migrate
from reservo.core.kernel.clock import SystemClock
from reservo.core.redis.cache import Cache
from reservo.core.redis.client import RedisGate
from reservo.core.redis.ratelimit import RateLimiter
from reservo.scheduler import Job, Scheduler, SchedulerSettings
from reservo.scheduler.workers import run

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.redis_cluster import LocalCluster, RedisTarget, binaries


def pairs(prefix: str) -> list[tuple[str, int]]:
    """Eight (category, urgency) pairs: eight hash tags, spread over the masters."""
    return [(f"{prefix}.c{i}", u) for i in range(4) for u in (0, 1)]


@contextlib.contextmanager
def single_redis(root: Path) -> Iterator[RedisTarget]:
    """A plain redis-server (no persistence) on a free port, same binary as the cluster's."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    root.mkdir(parents=True)
    proc = subprocess.Popen(
        [
            *(binaries()[0], "--port", str(port), "--bind", "127.0.0.1", "--dir", str(root)),
            *("--save", "", "--appendonly", "no"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        yield RedisTarget(f"redis://127.0.0.1:{port}/0")
    finally:
        proc.kill()
        proc.wait()


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


async def phase_gate(target: RedisTarget, calls: int, concurrency: int) -> str:
    """``hit_and_check`` as the booking gate calls it: a rate key and two marks."""
    client = target.client(1.0)
    cache = Cache(RedisGate(client), f"bench-{uuid.uuid4().hex[:6]}")
    limiter = RateLimiter(cache.gate, cache.namespace)
    per = calls // concurrency

    async def one(worker: int) -> None:
        for i in range(per):
            slot = (worker * per + i) % 5000
            await cache.hit_and_check(
                limiter, "book", worker, 10**9, 60, f"full:{{slot:{slot}}}", f"seen:{i}"
            )

    await one(0)  # scripts loaded, connections open
    c0, t0 = _cpu(), time.perf_counter()
    await asyncio.gather(*(one(w) for w in range(concurrency)))
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    await client.aclose()
    n = per * concurrency
    return (
        f"gate {target.kind:10}: {n / wall:8,.0f} calls/s with {concurrency} concurrent, "
        f"client CPU {1e6 * cpu / n:5.0f} us/call"
    )


def _scheduler(
    db_url: str, target: RedisTarget, ns: str, calls: Counter[int], prefix: str
) -> Scheduler:
    cfg = SchedulerSettings(
        loader_period_s=0.2,
        resync_period_s=2.0,
        mover_idle_s=0.005,
        executor_idle_s=0.02,
        heartbeat_s=0.5,
        reaper_timeout_s=5.0,
        reaper_period_s=0.5,
        executors=2,
        executor_concurrency=500,
        loader_batch=20_000,
        mover_batch=2000,
    )
    db = Database(db_url, min_size=1, max_size=8)
    s = Scheduler(db, SystemClock(), target.client(10.0), ns, cfg)

    async def noop(job: Job) -> None:
        calls[job.id] += 1

    for c, _ in pairs(prefix):
        s.register(c, noop)

    async def close_db() -> None:
        await db.close()

    s.on_close(close_db)
    return s


async def phase_drain(
    db_url: str, target: RedisTarget, backlog: int, kill: LocalCluster | None = None
) -> str:
    """``backlog`` jobs due now over 8 (category, urgency) pairs; with ``kill``,
    the master of the busiest keys is SIGKILLed once half have run."""
    ns = prefix = f"bench{uuid.uuid4().hex[:6]}"
    calls: Counter[int] = Counter()
    s = _scheduler(db_url, target, ns, calls, prefix)
    conn = await asyncpg.connect(db_url)
    try:
        now, mine = datetime.now(UTC), pairs(prefix)
        per = backlog // len(mine)
        for c, u in mine:
            await s.enqueue_bulk(c, [now] * per, [{} for _ in range(per)], [u] * per)
        total, stop = per * len(mine), asyncio.Event()
        t0 = time.perf_counter()
        task = asyncio.create_task(run(s, stop))
        note = ""
        killed = False
        while len(calls) < total:
            await asyncio.sleep(0.05)
            if kill is not None and not killed and len(calls) >= total // 2:
                victim = kill.master_of(s.keys.registry)
                kill.kill(victim.port)
                k0, killed = time.perf_counter(), True
                await asyncio.to_thread(kill.wait_failover, victim.port, 60)
                note = f"; replica promoted {time.perf_counter() - k0:.1f} s after the kill"
            if time.perf_counter() - t0 > 600:
                raise RuntimeError(f"only {len(calls)} of {total} ran in 600 s")
        wall = time.perf_counter() - t0
        stop.set()
        await task
        dup = await conn.fetchval(
            "SELECT count(*) FROM (SELECT e.job_id FROM job_execution e"
            " JOIN scheduled_job j ON j.id = e.job_id"
            " WHERE j.category LIKE $1 AND e.outcome = 'DONE'"
            " GROUP BY e.job_id HAVING count(*) > 1) d",
            f"{prefix}.%",
        )
        done = await conn.fetchval(
            "SELECT count(*) FROM scheduled_job WHERE category LIKE $1 AND status = 'DONE'",
            f"{prefix}.%",
        )
        twice = sum(1 for n in calls.values() if n > 1)
        what = "drain+kill" if kill is not None else "drain"
        return (
            f"{what:10} {target.kind:10}: {total:,} jobs in {wall:5.1f} s = {total / wall:7,.0f}/s;"
            f" DONE {done:,}, run twice {twice}, duplicate DONE rows {dup}{note}"
        )
    finally:
        await conn.close()
        await s.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    pg = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--pg", default=pg)
    ap.add_argument("--phases", default="gate,drain,failover")
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--backlog", type=int, default=40_000)
    args = ap.parse_args()
    phases = {p.strip() for p in args.phases.split(",")}
    load = os.getloadavg()[0]
    print(f"redis-server {binaries()[0]}; load average {load:.1f} ({os.cpu_count()} cores)")

    name = f"reservo_bench_cluster_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(args.pg)
    await admin.execute(f'CREATE DATABASE "{name}"')
    db_url = args.pg.rpartition("/")[0] + "/" + name
    root = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    try:
        await migrate(db_url)
        with (
            single_redis(root / "single") as single,
            LocalCluster(root / "cluster", node_timeout_ms=2000) as cluster,
        ):
            targets = [single, cluster.target]
            if "gate" in phases:
                for t in targets:
                    print(await phase_gate(t, args.calls, args.concurrency), flush=True)
            if "drain" in phases:
                for t in targets:
                    print(await phase_drain(db_url, t, args.backlog), flush=True)
            if "failover" in phases:
                print(await phase_drain(db_url, cluster.target, args.backlog, cluster), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
        print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    asyncio.run(main())
