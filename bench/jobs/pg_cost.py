"""PostgreSQL's own work per enqueue of POST /api/jobs' batch path, without HTTP.

Runs the statements of one batch (``scheduler/batch.py``) the way a batch runs
them, on one connection, in a scratch database: read the keys
(``idem_known_many``), insert the jobs (``insert_jobs``: QUEUED, with one
job_push row; the previous batch's row deleted on the way), store the answers
once (``idem_store_many``), COMMIT. Reports the backend's CPU per job (read from
the process table, so the server must run on this machine), which other work on the machine
barely moves, unlike a rate. ``--no-keys``: enqueues without Idempotency-Key.

    python bench/jobs/pg_cost.py --batch 32 --batches 300 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib
from reservo.core.db.database import Queries
from reservo.core.db.migrate import migrate

DB = "reservo_bench_jobs_pg_cost"
ENDPOINT = "POST /api/jobs"
CORE = Queries.load("reservo.core.http")
JOBS = Queries.load("reservo.scheduler")
# A stored 201 of the size the API stores.
BODY = (
    '{"jobId":123456,"category":"http","urgency":5,"status":"QUEUED",'
    '"runAt":"2026-12-04T01:06:00.123456Z","attempts":0,"startedAt":null,'
    '"finishedAt":null,"lastError":null}'
)
PAYLOAD = '{"url": "https://callbacks.example.com/hook", "body": {"m": "x"}}'


async def batches(conn: asyncpg.Connection, n: int, size: int, keyed: bool) -> float:
    """Runs n batches of size jobs; the backend's CPU seconds they took."""
    pid = await conn.fetchval("SELECT pg_backend_pid()")
    now = datetime.now(UTC)
    run_at = [now + timedelta(seconds=240)] * size
    done: list[int] = []
    start = benchlib.cpu_s([pid])
    for _ in range(n):
        callers, keys = ["service:1"] * size, [str(uuid.uuid4()) for _ in range(size)]
        async with conn.transaction():
            if keyed:
                await conn.fetch(CORE.idem_known_many, callers, keys, ENDPOINT)
            rows = await conn.fetch(
                JOBS.insert_jobs,
                ["http"] * size,
                [5] * size,
                run_at,
                [PAYLOAD] * size,
                5,
                now,
                [True] * size,
                done,
                [None] * size,  # no unique keys
                [],  # no dependencies
                [],
            )
            if keyed:
                await conn.fetch(
                    CORE.idem_store_many,
                    ENDPOINT,
                    callers,
                    keys,
                    [b"\0" * 32] * size,
                    [201] * size,
                    [BODY] * size,
                    now,
                )
        done = [rows[0]["push_id"]]
    return benchlib.cpu_s([pid]) - start


async def main(opts: argparse.Namespace) -> None:
    admin = await benchlib.connect(benchlib.PG_ADMIN_URL)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {DB}")
        await admin.execute(f"CREATE DATABASE {DB}")
    finally:
        await admin.close()
    dsn = benchlib.db_url(DB)
    await migrate(dsn)
    conn = await asyncpg.connect(dsn)
    await conn.set_type_codec(
        "jsonb", encoder=lambda x: x, decoder=lambda x: x, schema="pg_catalog"
    )
    try:
        figures = []
        for _ in range(opts.rounds):
            await conn.execute("TRUNCATE scheduled_job, job_push, idempotency_key CASCADE")
            await batches(conn, 20, opts.batch, opts.keys)  # plans cached, pages warm
            spent = await batches(conn, opts.batches, opts.batch, opts.keys)
            figures.append(1e6 * spent / (opts.batches * opts.batch))
            print(f"PostgreSQL backend CPU per job: {figures[-1]:.0f} us")
        figures.sort()
        print(
            f"median of {opts.rounds}: {figures[len(figures) // 2]:.0f} us per job "
            f"({opts.batch} jobs a batch, {'with' if opts.keys else 'without'} keys)"
        )
    finally:
        await conn.close()
        admin = await benchlib.connect(benchlib.PG_ADMIN_URL)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {DB}")
        finally:
            await admin.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch", type=int, default=32, help="jobs per batch")
    p.add_argument("--batches", type=int, default=300, help="batches per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds (median)")
    p.add_argument("--no-keys", dest="keys", action="store_false", help="no Idempotency-Key")
    asyncio.run(main(p.parse_args()))
