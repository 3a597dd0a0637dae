"""POST /api/jobs over HTTP (issue 11), on real processes.

wrk drives ``POST /api/jobs`` against ``reservo api --workers W`` (plus a
``reservo worker``) as a service, each request a fresh Idempotency-Key, category
``http`` with a small payload, due in ``--delay-ms`` (default 240 s: inside the
scheduler's 300 s window, so each enqueue also takes the fast path into Redis; a
delay beyond the window measures the row alone). Jobs are never due during a
run. Afterwards PostgreSQL is asked whether every job is there exactly once:

- every stored 201 under an Idempotency-Key names a job that exists, no two keys
  name the same job, and there are as many such keys as jobs (at least as many as
  the 201s wrk saw);
- every job is SCHEDULED or QUEUED (nothing ran, nothing was lost), and the ones
  pushed to Redis (QUEUED) are in its future sets.

    python bench/jobs/run.py --duration 10 --runs 3
    python bench/jobs/run.py --duration 10 --profile /tmp/jobs.raw

Exits 1 on any 5xx or broken check.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# A database and Redis namespace of its own: other benchmarks truncate theirs.
os.environ.setdefault("BENCH_DB", "reservo_bench_jobs")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import redis

import benchlib
from reservo.core.http.auth import mint_token
from reservo.scheduler.domain import Keys

benchlib.NAMESPACE = "bench-jobs"
HERE = Path(__file__).resolve().parent
ENDPOINT = "POST /api/jobs"

_CHECKS = {
    "jobs": "SELECT count(*) FROM scheduled_job",
    "not_pending": "SELECT count(*) FROM scheduled_job WHERE status NOT IN ('SCHEDULED', 'QUEUED')",
    "queued": "SELECT count(*) FROM scheduled_job WHERE status = 'QUEUED'",
    "keys_201": f"""SELECT count(*) FROM idempotency_key
                     WHERE endpoint = '{ENDPOINT}' AND response_status = 201""",
    "keys_dangling": f"""
        SELECT count(*) FROM idempotency_key k
          LEFT JOIN scheduled_job j ON j.id = (k.response_body->>'jobId')::bigint
         WHERE k.endpoint = '{ENDPOINT}' AND k.response_status = 201 AND j.id IS NULL""",
    "keys_shared": f"""
        SELECT count(*) - count(DISTINCT response_body->>'jobId') FROM idempotency_key
         WHERE endpoint = '{ENDPOINT}' AND response_status = 201""",
}


@dataclass
class RunResult:
    workers: int
    threads: int
    connections: int
    enqueues_per_s: float
    requests: int
    statuses: dict[str, int]
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    socket_errors: dict[str, int]
    peak_rss_mb: float
    created_201: int
    facts: dict[str, int]
    waits: dict[str, int]
    errors_logged: int
    cpu: dict[str, float]

    @property
    def failures(self) -> list[str]:
        f, bad = self.facts, []
        n5xx = sum(n for k, n in self.statuses.items() if k.startswith("5"))
        if n5xx:
            bad.append(f"{n5xx} responses were 5xx")
        for name in ("not_pending", "keys_dangling", "keys_shared"):
            if f[name]:
                bad.append(f"{name}: {f[name]}")
        if f["keys_201"] != f["jobs"]:
            bad.append(f"{f['jobs']} jobs but {f['keys_201']} stored 201s")
        if f["jobs"] < self.created_201:
            bad.append(f"wrk saw {self.created_201} 201s but {f['jobs']} jobs exist")
        if f["queued"] > f["in_redis"]:
            bad.append(f"{f['queued']} jobs QUEUED but {f['in_redis']} ids in Redis")
        return bad


async def prepare() -> None:
    await benchlib._ensure_database()
    conn = await benchlib.connect()
    try:
        await conn.execute(
            "TRUNCATE scheduled_job, job_execution, idempotency_key, outbox, inbox "
            "RESTART IDENTITY CASCADE"
        )
        if await conn.fetchval("SELECT to_regclass('job_push')"):  # migration 0026 on
            # A run's last pushes, left to the loader: ids the next run reuses.
            await conn.execute("TRUNCATE job_push")
    finally:
        await conn.close()
    benchlib.clear_redis_namespace()


async def check() -> dict[str, int]:
    conn = await benchlib.connect()
    try:
        facts = {name: int(await conn.fetchval(sql)) for name, sql in _CHECKS.items()}
    finally:
        await conn.close()
    client = redis.Redis.from_url(benchlib.REDIS_URL)
    try:
        keys = Keys(benchlib.NAMESPACE)  # jobs.lua: category http, urgency 0-9
        facts["in_redis"] = sum(int(client.zcard(keys.future("http", u))) for u in range(10))
    finally:
        client.close()
    return facts


def one_run(
    opts: argparse.Namespace, workers: int, threads: int, connections: int, prof: Path | None
) -> RunResult:
    benchlib.run_async(prepare())
    token = mint_token(benchlib.JWT_SECRET, "service", 1, timedelta(hours=6), datetime.now(UTC))
    env = {"RESERVO_DB_POOL_MAX": str(opts.pool_max)} if opts.pool_max else {}
    script = HERE / "jobs.lua"
    warm_201 = 0
    with benchlib.Reservo(workers, env) as rv:
        if opts.warmup > 0:
            warm = benchlib.run_wrk(
                script, rv.base, threads, connections, opts.warmup, [token, "warm", opts.delay_ms]
            )
            warm_201 = warm.count("201")
            time.sleep(0.5)
        args = [token, f"run{time.time_ns()}", opts.delay_ms]
        d = benchlib.drive(
            rv, script, threads, connections, opts.duration, args, prof, sample_waits=True
        )
    # Checked once the processes stopped: requests still in flight when wrk
    # stopped have finished (or rolled back) by then.
    facts = benchlib.run_async(check())
    errors = rv.error_lines()
    for line in errors[:5]:
        print(f"  logged: {line[:200]}", file=sys.stderr)
    res = d.wrk
    return RunResult(
        workers=workers,
        threads=threads,
        connections=connections,
        enqueues_per_s=res.count("201") / res.duration_s,
        requests=res.requests,
        statuses=dict(sorted(res.statuses.items())),
        p50_ms=res.p50_ms,
        p90_ms=res.p90_ms,
        p99_ms=res.p99_ms,
        max_ms=res.max_ms,
        socket_errors=res.socket_errors,
        peak_rss_mb=d.mem.peak_rss / 2**20,
        created_201=res.count("201") + warm_201,
        facts=facts,
        waits=dict(d.waits),
        errors_logged=len(errors),
        cpu=d.cpu.figures(res.requests, res.wrk_cpu_s),
    )


def describe(r: RunResult) -> str:
    errs = f"  socket errors {r.socket_errors}" if r.socket_errors else ""
    f = r.facts
    return (
        f"workers={r.workers} wrk -t{r.threads} -c{r.connections}: "
        f"{r.enqueues_per_s:,.0f} enqueues/s ({r.requests:,} requests), "
        f"p50 {r.p50_ms:.1f} ms, p90 {r.p90_ms:.1f} ms, p99 {r.p99_ms:.1f} ms, "
        f"max {r.max_ms:.0f} ms{errs}\n"
        f"  statuses: {r.statuses}\n"
        f"  jobs: {f['jobs']} ({f['queued']} QUEUED, {f['in_redis']} ids in Redis, "
        f"{f['not_pending']} neither SCHEDULED nor QUEUED); keys: {f['keys_201']} stored "
        f"201s, dangling {f['keys_dangling']}, shared {f['keys_shared']}\n"
        f"  PostgreSQL backends (pg_stat_activity samples): "
        f"{benchlib.describe_waits(benchlib.Counter(r.waits))}\n"
        f"  peak RSS of reservo processes {r.peak_rss_mb:.0f} MB; "
        f"{benchlib.describe_cpu(r.cpu)}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=10, help="seconds per run")
    p.add_argument("--delay-ms", default="240000", help="delayMs of every job")
    p.add_argument("--workers", default="2", help="API worker counts to compare, e.g. 1,2,3")
    p.add_argument("--threads", default="2", help="wrk threads, e.g. 1,2")
    p.add_argument("--connections", default="64", help="wrk connections, e.g. 64,128")
    p.add_argument("--runs", type=int, default=1, help="runs per configuration (median)")
    p.add_argument("--warmup", type=float, default=2, help="seconds of warm-up enqueues")
    p.add_argument("--profile", type=Path, help="py-spy raw profile of one API worker, run 1")
    p.add_argument("--pool-max", type=int, default=10, help="RESERVO_DB_POOL_MAX (0: default)")
    benchlib.add_ceiling_option(p)
    p.add_argument("--json", type=Path, help="append every run's figures to this file")
    p.add_argument("--drop-db", action="store_true", help="drop the database at the end")
    opts = p.parse_args(argv)
    if opts.duration + opts.warmup + 5 >= int(opts.delay_ms) / 1000:
        p.error("--delay-ms must leave the jobs not due before the run ends")
    benchlib.stop_cleanly_on_signals()
    print(f"machine: {benchlib.machine()}")
    print(f"reservo code under test: {benchlib.reservo_source()}")

    def rate(r: Any) -> float:
        return float(r.enqueues_per_s)

    configs, results, ceilings = benchlib.sweep(
        opts, "jobs", lambda w, t, c, prof: one_run(opts, w, t, c, prof), describe, rate
    )
    print(f"\nmedians over {opts.runs} run(s) of {opts.duration:.0f} s:")
    print("workers  wrk          enqueues/s  p50 ms  p99 ms  5xx  reservo CPU ms/req")
    med = benchlib.median
    for w, t, c in configs:
        rs = [r for r in results if (r.workers, r.threads, r.connections) == (w, t, c)]
        n5xx = sum(n for r in rs for k, n in r.statuses.items() if k.startswith("5"))
        cpu = med([r.cpu["cpu_ms_per_req_reservo"] for r in rs])
        print(
            f"{w:>7}  -t{t} -c{c:<4} {med([rate(r) for r in rs]):>11,.0f}  "
            f"{med([r.p50_ms for r in rs]):>6.1f}  {med([r.p99_ms for r in rs]):>6.1f}  "
            f"{n5xx:>3}  {cpu:>18.2f}"
        )
    benchlib.ceiling_summary(configs, results, ceilings, rate, "enqueues/s")
    failures = [f"{r.workers}w/-c{r.connections}: {f}" for r in results for f in r.failures]
    return benchlib.finish(
        failures, opts.drop_db, "zero 5xx; every 201 job stored once under its key"
    )


if __name__ == "__main__":
    sys.exit(main())
