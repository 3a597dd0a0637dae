"""PostgreSQL's share of a job, without workers or Redis: what a claim and a
completion cost PostgreSQL per job when two connections (as two workers) drive
batches of ids through them as fast as they can, on a due backlog.

Six variants, the same driver, rounds interleaved:

- ``reservo``: scheduled_job through the scheduler's own claim and complete
  statements (queries.sql): the lock in id order, the paused-category test,
  the revision test, the execution log.
- ``indexed``: a copy of scheduled_job with all its indexes, claimed and
  completed by two plain conditional updates (no lock pass, no log): what the
  statements' shape costs beside the indexes.
- ``lease``: the same table, but the claim leaves the job's row as it is: it
  locks the row and inserts a lease row (job id, worker, times) into a small
  table of its own; the completion deletes the lease and writes DONE. The
  layout that keeps a claim from rewriting the job's row and its indexes.
- ``lists``: the ``indexed`` table with the primary key and the job lists' two indexes
  ((status, id), (category, id)) only.
- ``bare``: the primary key only: the least any design pays that records the
  claim and the completion in PostgreSQL (the claim is what keeps two
  workers from running one job).
- ``bare-hot``: the same with room on every page (fillfactor 50), so that the
  updates can be HOT (no index entry): PostgreSQL's floor for two row writes
  per job.

    PYTHONPATH=src:. python bench/scheduler/floor.py --rounds 3 --backlog 100000

Prints PostgreSQL CPU per job (all its processes, as bench.py measures it) and
statements' wall time, per round and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from reservo.core.db.migrate import migrate
from reservo.scheduler.repo import Q

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import benchlib

# The most an executor claims at once in the drain (bench.py's executor_concurrency).
BATCH = 500
CONNECTIONS = 2
WORKER = "floor"

FLOOR_FILL = """
INSERT INTO floor_job (id, category, urgency, run_at, status, max_attempts, created_at)
SELECT i, 'bench.noop', 5, $2, 'QUEUED', 5, $2 FROM generate_series(1, $1) AS i"""
RESERVO_FILL = """
INSERT INTO scheduled_job (category, urgency, run_at, status, max_attempts, pushed, created_at)
SELECT 'bench.noop', 5, $2, 'QUEUED', 5, true, $2 FROM generate_series(1, $1)"""
PLAIN_CLAIM = """
UPDATE floor_job
   SET status = 'RUNNING', attempts = attempts + 1, revision = revision + 1,
       worker = $3, heartbeat_at = $2, started_at = $2
 WHERE id = ANY($1::bigint[]) AND status = 'QUEUED' AND run_at <= $2
RETURNING id, category, urgency, run_at, payload, status, attempts, max_attempts, revision"""
PLAIN_COMPLETE = """
UPDATE floor_job SET status = 'DONE', revision = revision + 1, finished_at = $2
 WHERE id = ANY($1::bigint[]) AND status = 'RUNNING'
RETURNING id"""
LEASE_CLAIM = """
WITH due AS (
    SELECT id FROM floor_job
     WHERE id = ANY($1::bigint[]) AND status = 'QUEUED' AND run_at <= $2
     ORDER BY id FOR UPDATE
)
INSERT INTO floor_lease (job_id, worker, started_at, heartbeat_at)
SELECT id, $3, $2, $2 FROM due
ON CONFLICT (job_id) DO NOTHING
RETURNING job_id AS id"""
LEASE_COMPLETE = """
WITH ended AS (DELETE FROM floor_lease WHERE job_id = ANY($1::bigint[]) RETURNING job_id)
UPDATE floor_job
   SET status = 'DONE', attempts = attempts + 1, revision = revision + 1, finished_at = $2
 WHERE id IN (SELECT job_id FROM ended)
RETURNING id"""

Cycle = Callable[[asyncpg.Connection, list[int]], Awaitable[None]]


async def reservo_cycle(conn: asyncpg.Connection, ids: list[int]) -> None:
    now = datetime.now(UTC)
    claimed = await conn.fetch(Q.claim, ids, now, WORKER, now)
    assert len(claimed) == len(ids), "a claim missed a due job"
    done = await conn.fetch(
        Q.complete, [r["id"] for r in claimed], [r["revision"] for r in claimed], now, WORKER
    )
    assert len(done) == len(ids), "a completion missed a claimed job"


def plain_cycle(claim: str, complete: str) -> Cycle:
    async def cycle(conn: asyncpg.Connection, ids: list[int]) -> None:
        now = datetime.now(UTC)
        claimed = await conn.fetch(claim, ids, now, WORKER)
        assert len(claimed) == len(ids), "a claim missed a due job"
        done = await conn.fetch(complete, [r["id"] for r in claimed], now)
        assert len(done) == len(ids), "a completion missed a claimed job"

    return cycle


@dataclass(frozen=True)
class Variant:
    """A table (``create`` makes it empty; ``fill`` writes ids 1..$1, due at $2)
    and the claim and completion driven through it."""

    table: str
    create: str
    fill: str
    cycle: Cycle


def floor_table(create: str, cycle: Cycle = plain_cycle(PLAIN_CLAIM, PLAIN_COMPLETE)) -> Variant:
    drop = "DROP TABLE IF EXISTS floor_job, floor_lease; "
    return Variant("floor_job", drop + create, FLOOR_FILL, cycle)


# scheduled_job's columns, and which of its indexes.
VARIANTS = {
    "reservo": Variant(
        "scheduled_job",
        "TRUNCATE scheduled_job, job_execution RESTART IDENTITY CASCADE",
        RESERVO_FILL,
        reservo_cycle,
    ),
    "indexed": floor_table("CREATE TABLE floor_job (LIKE scheduled_job INCLUDING ALL)"),
    "lease": floor_table(
        "CREATE TABLE floor_job (LIKE scheduled_job INCLUDING ALL);"
        " CREATE TABLE floor_lease (job_id bigint PRIMARY KEY, worker text NOT NULL,"
        " started_at timestamptz NOT NULL, heartbeat_at timestamptz NOT NULL)",
        plain_cycle(LEASE_CLAIM, LEASE_COMPLETE),
    ),
    "lists": floor_table(
        "CREATE TABLE floor_job (LIKE scheduled_job INCLUDING DEFAULTS);"
        " ALTER TABLE floor_job ADD PRIMARY KEY (id);"
        " CREATE INDEX ON floor_job (status, id); CREATE INDEX ON floor_job (category, id)"
    ),
    "bare": floor_table(
        "CREATE TABLE floor_job (LIKE scheduled_job INCLUDING DEFAULTS);"
        " ALTER TABLE floor_job ADD PRIMARY KEY (id)"
    ),
    "bare-hot": floor_table(
        "CREATE TABLE floor_job (LIKE scheduled_job INCLUDING DEFAULTS) WITH (fillfactor = 50);"
        " ALTER TABLE floor_job ADD PRIMARY KEY (id)"
    ),
}


async def hot_share(conn: asyncpg.Connection, table: str) -> float:
    await asyncio.sleep(1.2)
    upd, hot = await conn.fetchrow(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = $1", table
    )
    return hot / upd if upd else 0.0


async def one_round(url: str, variant: Variant, backlog: int) -> dict[str, float]:
    admin = await asyncpg.connect(url)
    await admin.execute(variant.create)
    await admin.execute(variant.fill, backlog, datetime.now(UTC) - timedelta(seconds=1))
    await admin.execute(f"ANALYZE {variant.table}")
    conns = [await asyncpg.connect(url) for _ in range(CONNECTIONS)]
    await variant.cycle(conns[0], [1])  # warms the plans; job 1 is not measured
    ids = list(range(2, backlog + 1))
    batches = [ids[i : i + BATCH] for i in range(0, len(ids), BATCH)]

    async def drive(conn: asyncpg.Connection, mine: list[list[int]]) -> None:
        for batch in mine:
            await variant.cycle(conn, batch)

    pg0, t0 = benchlib.postgres_cpu_s(), time.perf_counter()
    await asyncio.gather(*(drive(c, batches[k::CONNECTIONS]) for k, c in enumerate(conns)))
    wall, pg = time.perf_counter() - t0, benchlib.postgres_cpu_s() - pg0
    for c in conns:
        await c.close()  # a backend reports its table statistics by its exit at the latest
    hot = await hot_share(admin, variant.table)
    await admin.close()
    return {"pg_us": 1e6 * pg / len(ids), "rate": len(ids) / wall, "hot": hot}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backlog", type=int, default=100_000)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    variants = [v.strip() for v in args.variants.split(",")]

    name = f"reservo_bench_floor_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(args.pg)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = args.pg.rpartition("/")[0] + "/" + name
    print(f"{benchlib.machine()}; {args.backlog} due jobs, {CONNECTIONS} connections, "
          f"batches of {BATCH}")  # fmt: skip
    results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    try:
        await migrate(url)
        for r in range(args.rounds):
            order = variants if r % 2 == 0 else variants[::-1]
            for v in order:
                fig = await one_round(url, VARIANTS[v], args.backlog)
                results[v].append(fig)
                print(
                    f"round {r + 1} {v}: PostgreSQL {fig['pg_us']:.1f} us per job, "
                    f"{fig['rate']:,.0f} jobs/s, HOT updates {100 * fig['hot']:.0f} %"
                )
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    print(f"=== medians of {args.rounds} interleaved rounds")
    for v, figs in results.items():
        print(
            f"{v}: PostgreSQL {statistics.median(f['pg_us'] for f in figs):.1f} us per job, "
            f"{statistics.median(f['rate'] for f in figs):,.0f} jobs/s "
            f"(claim and completion only, no worker)"
        )


if __name__ == "__main__":
    asyncio.run(main())
