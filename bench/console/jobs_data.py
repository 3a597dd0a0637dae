"""A scratch database for the console's jobs and dead-letters pages.

    .venv/bin/python bench/console/jobs_data.py [--db reservo_bench_console_jobs] [--jobs 1000000]
        [--flood 0]

Creates (or reloads) the database with ``--jobs`` jobs in 20 categories and all
10 urgencies: 60 % DONE (each with an execution), 30 % SCHEDULED in the next
days, 9 % SCHEDULED and already due (a backlog), and DEAD, FAILED, RUNNING and
CANCELLED ones; 50 recurring jobs and 2,000 dead letters of 4 consumers (plus
``--flood`` more of one consumer, ``bench-flood``, none replayed). Then
hands a sample of due ids to Redis (every category and urgency in the bench
namespace), as the loader would, so the queues table has its 200 rows. Time the
pages afterwards with ``bench/console/run.py --db <the same>``."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import NAMESPACE, PG_ADMIN_URL, REDIS_URL, connect, db_url
from reservo.core.db.migrate import migrate
from reservo.core.redis.client import make_client
from reservo.scheduler.dispatch import Dispatch
from reservo.scheduler.domain import Keys, ms

# status by the job's position g in 0..N-1, per mille of N.
_JOBS = """
INSERT INTO scheduled_job (category, urgency, run_at, payload, status, attempts, max_attempts,
                           pushed, started_at, finished_at, heartbeat_at, last_error, created_at)
SELECT 'bench.c' || (g % 20), g % 10,
       CASE WHEN s.status = 'SCHEDULED' AND g % 4 = 0 THEN now() - (g % 3600) * interval '1 s'
            WHEN s.status = 'SCHEDULED' THEN now() + (g % 300000) * interval '1 s'
            ELSE now() - (g % 86400) * interval '1 s' END,
       jsonb_build_object('n', g), s.status,
       CASE WHEN s.status IN ('SCHEDULED', 'CANCELLED') THEN 0 ELSE 1 END, 5, false,
       CASE WHEN s.status IN ('DONE', 'DEAD', 'FAILED', 'RUNNING') THEN now() END,
       CASE WHEN s.status IN ('DONE', 'DEAD', 'CANCELLED') THEN now() END,
       CASE WHEN s.status = 'RUNNING' THEN now() END,
       CASE WHEN s.status IN ('DEAD', 'FAILED') THEN 'bench failure' END,
       now()
  FROM generate_series(0, $1 - 1) AS g
 CROSS JOIN LATERAL (SELECT CASE
        WHEN g % 1000 < 600 THEN 'DONE'
        WHEN g % 1000 < 990 THEN 'SCHEDULED'
        WHEN g % 1000 < 994 THEN 'DEAD'
        WHEN g % 1000 < 996 THEN 'FAILED'
        WHEN g % 1000 < 998 THEN 'RUNNING'
        ELSE 'CANCELLED' END AS status) AS s
"""
_EXECUTIONS = """
INSERT INTO job_execution (job_id, attempt, worker, started_at, finished_at, outcome, error)
SELECT id, 1, 'bench', started_at, coalesce(finished_at, now()),
       CASE WHEN status = 'DONE' THEN 'DONE' WHEN status = 'DEAD' THEN 'DEAD' ELSE 'FAILED' END,
       last_error
  FROM scheduled_job WHERE status IN ('DONE', 'DEAD', 'FAILED')
"""
_RECURRING = """
INSERT INTO recurring_job (category, cron, timezone, payload, urgency, next_at, created_at)
SELECT 'bench.c' || (g % 20), '*/5 * * * *', 'UTC', '{}', g % 10, now() + interval '5 min', now()
  FROM generate_series(1, 50) AS g
"""
_DEAD_LETTERS = """
INSERT INTO dead_letter (consumer, topic, event_id, key, value, error, attempts, parked_at)
SELECT 'bench-consumer-' || (g % 4), 'bench.topic.v1', gen_random_uuid(), 'k' || g,
       convert_to('{"specversion": "1.0", "id": "' || gen_random_uuid() || '", "n": ' || g || '}',
                  'UTF8'),
       'Rejected(''bench ' || g || ''')', 1, now()
  FROM generate_series(1, 2000) AS g
"""
_FLOOD = """
INSERT INTO dead_letter (consumer, topic, event_id, key, value, error, attempts, parked_at)
SELECT 'bench-flood', 'bench.topic.v1', gen_random_uuid(), 'k', convert_to('{}', 'UTF8'),
       'Rejected()', 1, now()
  FROM generate_series(1, $1) AS g
"""
_DUE_SAMPLE = """
SELECT id, category, urgency, run_at FROM scheduled_job
 WHERE status = 'SCHEDULED' AND id % 50 = 0
 LIMIT 20000
"""


async def main(db: str, jobs: int, flood: int) -> None:
    admin = await connect(PG_ADMIN_URL)
    await admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{db}"')
    await admin.close()
    await migrate(db_url(db))
    conn = await connect(db_url(db))
    t = time.perf_counter()
    for name, sql, args in (
        ("jobs", _JOBS, (jobs,)),
        ("executions", _EXECUTIONS, ()),
        ("recurring jobs", _RECURRING, ()),
        ("dead letters", _DEAD_LETTERS, ()),
        ("flood", _FLOOD, (flood,)),
    ):
        status = await conn.execute(sql, *args)
        print(f"{name}: {status} ({time.perf_counter() - t:.0f} s)")
    await conn.execute("VACUUM ANALYZE scheduled_job")
    await conn.execute("VACUUM ANALYZE job_execution")
    await conn.execute("VACUUM ANALYZE dead_letter")
    sample = await conn.fetch(_DUE_SAMPLE)
    await conn.close()
    client = make_client(REDIS_URL, 10.0)
    keys = Keys(f"{NAMESPACE}:console")
    stale = [k async for k in client.scan_iter(match=f"{keys.ns}:*sched*")]
    if stale:
        await client.delete(*stale)
    loaded = await Dispatch(client, keys).load(
        (r["id"], r["category"], r["urgency"], ms(r["run_at"])) for r in sample
    )
    await client.aclose()
    print(f"redis: {loaded} ids in {keys.ns}; done in {time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="reservo_bench_console_jobs")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--flood", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(main(args.db, args.jobs, args.flood))
