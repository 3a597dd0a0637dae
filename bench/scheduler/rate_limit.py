"""A category's rate limit across worker processes: N worker processes (default
3) drain a backlog of no-op jobs of one category limited to R jobs/s (default
50); the observed rate, over S seconds (default 30) after a warm-up, must be
within 5 % of R. Uses its own database and its own redis-server, like bench.py.

    python bench/scheduler/rate_limit.py --pg postgresql://postgres@127.0.0.1:5432/postgres
    python bench/scheduler/rate_limit.py --workers 3 --rate 50 --seconds 30

The backlog waits behind a pause until every worker is up; then the limit is
set and the category resumed (the same use cases as PUT .../rate-limit and POST
.../resume). The rate is read from job_execution.started_at (the claim time,
one row per job started), so it counts what the workers started, in every
process, with nothing on the hot path to measure it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from reservo.core.db.migrate import migrate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import CAT, OwnRedis, _scheduler, start_workers, stop_workers


async def measure(db_url: str, redis_url: str, args: argparse.Namespace) -> None:
    ns = f"rate-{uuid.uuid4().hex[:6]}"
    s = _scheduler(db_url, redis_url, ns)
    conn = await asyncpg.connect(db_url)
    try:
        await s.pause(CAT, True)
        backlog = int(args.rate * (args.warmup + args.seconds) * 1.5)
        now = datetime.now(UTC)
        await s.enqueue_bulk(CAT, [now] * backlog, [{}] * backlog, [5] * backlog)
        procs = start_workers(args.workers, db_url, redis_url, ns)
        try:
            while True:  # every executor of every worker heartbeats
                workers = await s.redis.smembers(s.keys.workers)
                if len({w.decode().split("-")[-2] for w in workers}) >= args.workers:
                    break
                await asyncio.sleep(0.2)
            await s.set_rate(CAT, args.rate)
            await s.pause(CAT, False)
            await asyncio.sleep(args.warmup + args.seconds + 2)
        finally:
            stop_workers(procs)
        rows = await conn.fetch("SELECT started_at, worker FROM job_execution ORDER BY started_at")
    finally:
        await conn.close()
        await s.close()
    first = rows[0]["started_at"]
    offsets = [((r["started_at"] - first).total_seconds(), r["worker"]) for r in rows]
    window = [(t, w) for t, w in offsets if args.warmup <= t < args.warmup + args.seconds]
    observed = len(window) / args.seconds
    per_second = Counter(int(t) for t, _ in window)
    per_process = Counter(w.split("-")[-2] for _, w in window)
    print(f"workers {args.workers}, limit {args.rate}/s, measured over {args.seconds} s")
    print(f"jobs started in the window: {len(window)} (backlog {len(rows)} started in all)")
    print(f"observed rate: {observed:.2f}/s ({(observed / args.rate - 1) * 100:+.2f} %)")
    print(f"per second: min {min(per_second.values())}, max {max(per_second.values())}")
    print(f"per process: {dict(per_process)}")
    within = abs(observed / args.rate - 1) <= 0.05
    print("within 5 %:", "yes" if within else "NO")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--rate", type=float, default=50)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    name = f"reservo_bench_rate_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(args.pg)
    await admin.execute(f'CREATE DATABASE "{name}"')
    db_url = args.pg.rpartition("/")[0] + "/" + name
    rd = OwnRedis()
    rd.start()
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    try:
        await migrate(db_url)
        await measure(db_url, rd.url, args)
    finally:
        print(f"load average at end: {os.getloadavg()[0]:.1f}")
        rd.cleanup()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
