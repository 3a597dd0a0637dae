"""POST /api/jobs over HTTP: how fast a service can enqueue delayed jobs through a
real `reservo api --workers N` (wrk, one Idempotency-Key per request by default).

Each request enqueues an `http` job due in a day, so no executor runs during the
measurement (the `reservo worker` beside it runs the default relay and
maintenance roles only). Afterwards PostgreSQL is asked whether every 201 left
its job.

    python bench/jobs_http/run.py --duration 10
    python bench/jobs_http/run.py --duration 10 --no-key --profile /tmp/jobs.raw

Exits 1 on any answer but 201, a socket error, or fewer jobs than 201s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

# A database of its own: other benchmarks truncate theirs.
os.environ.setdefault("BENCH_DB", "reservo_bench_jobs")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib
from reservo.core.auth import mint_token

HERE = Path(__file__).resolve().parent


async def reset() -> None:
    await benchlib._ensure_database()
    conn = await benchlib.connect()
    try:
        await conn.execute(
            "TRUNCATE scheduled_job, job_execution, idempotency_key, outbox"
            " RESTART IDENTITY CASCADE"
        )
    finally:
        await conn.close()
    benchlib.clear_redis_namespace()


async def jobs_stored() -> int:
    conn = await benchlib.connect()
    try:
        return int(await conn.fetchval("SELECT count(*) FROM scheduled_job"))
    finally:
        await conn.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--warmup", type=float, default=3, help="seconds of warm-up requests")
    ap.add_argument("--no-key", action="store_true", help="send no Idempotency-Key")
    ap.add_argument("--profile", type=Path, help="py-spy raw profile of one API worker")
    benchlib.add_ceiling_option(ap)
    a = ap.parse_args()
    benchlib.stop_cleanly_on_signals()
    print(f"machine: {benchlib.machine()}")
    print(f"reservo code under test: {benchlib.reservo_source()}")
    benchlib.run_async(reset())
    token = mint_token(benchlib.JWT_SECRET, "service", 1, timedelta(hours=2), datetime.now(UTC))
    key = "nokey" if a.no_key else "key"
    # The jobs call 127.0.0.1 (never, in a day): loopback must be an allowed target.
    with benchlib.Reservo(a.workers, {"RESERVO_JOBS_HTTP_ALLOW": "127.0.0.1"}) as rv:
        if a.warmup > 0:
            benchlib.run_wrk(
                HERE / "jobs.lua", rv.base, a.threads, 16, a.warmup, [token, "warm", key]
            )
        before = benchlib.run_async(jobs_stored())
        args = [token, f"r{time.time_ns()}", key]
        with benchlib.CpuMeter(rv) as cpu:
            if a.profile is not None:
                pid = rv.api_workers()[0].pid
                with benchlib.profiled(pid, max(1.0, a.duration - 2), a.profile):
                    res = benchlib.run_wrk(
                        HERE / "jobs.lua", rv.base, a.threads, a.connections, a.duration, args
                    )
            else:
                res = benchlib.run_wrk(
                    HERE / "jobs.lua", rv.base, a.threads, a.connections, a.duration, args
                )
        errors = rv.error_lines()
    stored = benchlib.run_async(jobs_stored()) - before
    figures = cpu.figures(res.requests, res.wrk_cpu_s)
    print(
        f"POST /api/jobs ({'no key' if a.no_key else 'Idempotency-Key each'}), "
        f"workers={a.workers} wrk -t{a.threads} -c{a.connections}: {res.rate:,.0f} req/s "
        f"({res.requests:,}), p50 {res.p50_ms:.1f} ms, p99 {res.p99_ms:.1f} ms, "
        f"max {res.max_ms:.0f} ms\n  statuses {res.statuses}; jobs stored {stored:,}\n"
        f"  {benchlib.describe_cpu(figures)}"
    )
    for line in errors[:5]:
        print(f"  logged: {line[:200]}", file=sys.stderr)
    if a.ceiling_duration > 0:
        ceiling = benchlib.hello_ceiling(a.workers, a.threads, a.connections, a.ceiling_duration)
        print(f"  {ceiling.describe(res.rate, 'enqueue')}")
    if a.profile is not None and a.profile.exists():
        print(f"\npy-spy profile of one API worker ({a.profile}):")
        print(benchlib.summarize_profile(a.profile))
    failures = []
    n5xx = res.count("5")
    if n5xx:
        failures.append(f"{n5xx} responses were 5xx")
    if res.socket_errors:
        failures.append(f"socket errors {res.socket_errors}")
    if res.count("201") != res.requests:
        failures.append(f"only {res.count('201')} of {res.requests} requests were 201")
    # Requests still in flight when wrk stops are finished by the server but not
    # counted by wrk: more jobs than 201s is expected, fewer is a lost job.
    if stored < res.count("201"):
        failures.append(f"{res.count('201')} answered 201 but only {stored} jobs were stored")
    return benchlib.finish(failures, False, "every request 201, a stored job for each")


if __name__ == "__main__":
    sys.exit(main())
