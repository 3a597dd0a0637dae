"""The only place that runs the scheduler's SQL."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeAlias

import asyncpg

from reservo.core.db.database import Queries
from reservo.core.http.schemas import MAX_ID
from reservo.scheduler.domain import (
    DEAD,
    JOB_FIELDS,
    NO_EXTRAS,
    Category,
    Extras,
    Job,
    Recurring,
)

Q = Queries.load("reservo.scheduler")

Row: TypeAlias = asyncpg.Record


def to_job(row: Row) -> Job:
    return Job(**{f: row[f] for f in JOB_FIELDS})


async def insert_job(
    conn: asyncpg.Connection,
    category: str,
    urgency: int,
    run_at: datetime,
    payload: dict[str, Any],
    max_attempts: int,
    idempotency_key: str | None,
    now: datetime,
) -> Job | None:
    row = await conn.fetchrow(
        Q.insert_job, category, urgency, run_at, payload, max_attempts, idempotency_key, now
    )
    return None if row is None else to_job(row)


async def insert_jobs(
    conn: asyncpg.Connection,
    jobs: Sequence[tuple[str, int, datetime, dict[str, Any]]],
    push: Sequence[bool],
    max_attempts: int,
    now: datetime,
    pushes_done: Sequence[int],
    extras: Sequence[Extras] = (),
) -> tuple[list[tuple[Job, bool]], int | None]:
    """Jobs (category, urgency, run_at, payload) without idempotency keys, in
    the order given, each with whether this call created it (False: an
    unfinished job held its unique key, and that job is the one given); those
    with ``push`` written QUEUED under one job_push row, whose id comes back
    (None when no job is pushed). ``extras``: each job's unique key (unique
    within the call) and parents. Deletes the job_push rows ``pushes_done`` in
    the same statement."""
    extras = list(extras) or [NO_EXTRAS] * len(jobs)
    edges = [(n, parent) for n, e in enumerate(extras, 1) for parent in e.after]
    rows = await conn.fetch(
        Q.insert_jobs,
        [j[0] for j in jobs],
        [j[1] for j in jobs],
        [j[2] for j in jobs],
        [j[3] for j in jobs],
        max_attempts,
        now,
        list(push),
        list(pushes_done),
        [e.unique_key for e in extras],
        [n for n, _ in edges],
        [parent for _, parent in edges],
    )
    made = [(to_job(r), bool(r["created"])) for r in rows]
    return made, (rows[0]["push_id"] if rows else None)


async def existing_jobs(conn: asyncpg.Connection, ids: Sequence[int]) -> set[int]:
    return {r["id"] for r in await conn.fetch(Q.existing_jobs, list(ids))}


async def cancel_dependents(conn: asyncpg.Connection, ids: Sequence[int], now: datetime) -> None:
    """The jobs waiting (directly or not) on the jobs ``ids`` that ended DEAD or
    CANCELLED in the caller's transaction are CANCELLED (dependency_failed)."""
    if ids:
        await conn.execute(Q.cancel_dependents, list(ids), now)


async def dependencies_of(conn: asyncpg.Connection, job_id: int, limit: int) -> list[Row]:
    return list(await conn.fetch(Q.dependencies_of, job_id, limit))


async def unique_key_of(conn: asyncpg.Connection, job_id: int) -> str | None:
    key: str | None = await conn.fetchval(Q.unique_key_of, job_id)
    return key


async def drop_new_jobs(conn: asyncpg.Connection, ids: Sequence[int]) -> None:
    await conn.execute(Q.drop_new_jobs, list(ids))


async def insert_bulk(
    conn: asyncpg.Connection,
    category: str,
    urgencies: list[int],
    run_ats: list[datetime],
    payloads: list[dict[str, Any]],
    max_attempts: int,
    now: datetime,
) -> int:
    status = await conn.execute(
        Q.insert_jobs_bulk, category, urgencies, run_ats, payloads, max_attempts, now
    )
    return int(status.split()[-1])


async def job_by_key(conn: asyncpg.Connection, category: str, key: str) -> Job | None:
    row = await conn.fetchrow(Q.job_by_key, category, key)
    return None if row is None else to_job(row)


async def get_job(conn: asyncpg.Connection, job_id: int) -> Job | None:
    row = await conn.fetchrow(Q.get_job, job_id)
    return None if row is None else to_job(row)


async def status_of(conn: asyncpg.Connection, ids: Sequence[int]) -> list[Row]:
    return list(await conn.fetch(Q.status_of, list(ids)))


async def mark_pushed(conn: asyncpg.Connection, ids: list[int], revisions: list[int]) -> None:
    await conn.execute(Q.mark_pushed, ids, revisions)


async def stale_pushes(
    conn: asyncpg.Connection, before: datetime, limit: int
) -> list[tuple[int, list[int]]]:
    return [(r["id"], list(r["job_ids"])) for r in await conn.fetch(Q.stale_pushes, before, limit)]


async def delete_pushes(conn: asyncpg.Connection, ids: Sequence[int]) -> None:
    await conn.execute(Q.delete_pushes, list(ids))


async def unpushed(conn: asyncpg.Connection, horizon: datetime, limit: int) -> list[Row]:
    return list(await conn.fetch(Q.unpushed, horizon, limit))


async def unpushed_ids(conn: asyncpg.Connection, horizon: datetime, limit: int) -> list[int]:
    return [r["id"] for r in await conn.fetch(Q.unpushed_ids, horizon, limit)]


async def pending_page(
    conn: asyncpg.Connection, horizon: datetime, after: tuple[datetime, int], limit: int
) -> list[Row]:
    return list(await conn.fetch(Q.pending_page, horizon, after[0], after[1], limit))


async def pending_page_ids(
    conn: asyncpg.Connection, horizon: datetime, after: tuple[datetime, int], limit: int
) -> list[int]:
    return [r["id"] for r in await conn.fetch(Q.pending_page_ids, horizon, *after, limit)]


async def loadable_rows(conn: asyncpg.Connection, ids: Sequence[int]) -> list[Row]:
    return list(await conn.fetch(Q.loadable_rows, list(ids)))


async def park(conn: asyncpg.Connection, job_id: int, reason: str, now: datetime) -> None:
    async with conn.transaction():
        await conn.execute(Q.park, job_id, reason[:2000], now)
        await cancel_dependents(conn, [job_id], now)


async def claim(
    conn: asyncpg.Connection, ids: list[int], now: datetime, worker: str, due_by: datetime
) -> list[Job]:
    """Claims the ids pending and due by ``due_by`` (now plus the fire-ahead)."""
    # The claim returns Job's fields in order: built from the values in order,
    # the cheap path on the executor's hot loop.
    return [Job.of_values(r) for r in await conn.fetch(Q.claim, ids, now, worker, due_by)]


async def claimed_by(conn: asyncpg.Connection, job_id: int, worker: str) -> Job | None:
    row = await conn.fetchrow(Q.claimed_by, job_id, worker)
    return None if row is None else Job.of_values(row)


async def heartbeat(conn: asyncpg.Connection, ids: list[int], now: datetime, worker: str) -> None:
    await conn.execute(Q.heartbeat, ids, now, worker)


async def complete(
    conn: asyncpg.Connection, ids: list[int], revisions: list[int], now: datetime, worker: str
) -> list[Row]:
    """Marks the jobs DONE and, in the same transaction, counts down the jobs
    waiting on them; returns those now due (id, category, urgency, run_at,
    revision, status) for the caller to hand to Redis."""
    async with conn.transaction():
        done = [r["id"] for r in await conn.fetch(Q.complete, ids, revisions, now, worker)]
        return list(await conn.fetch(Q.release_dependents, done, now)) if done else []


async def fail(
    conn: asyncpg.Connection,
    ids: list[int],
    revisions: list[int],
    errors: list[str],
    retry_ats: list[datetime],
    now: datetime,
    worker: str,
    details: list[str],
    permanent: list[bool],
) -> list[Row]:
    """``errors`` become last_error (shown by the API); ``details`` go to the
    execution log only; a ``permanent`` failure is DEAD at once."""
    async with conn.transaction():
        rows = await conn.fetch(
            Q.fail, ids, revisions, errors, retry_ats, now, worker, details, permanent
        )
        await cancel_dependents(conn, [r["id"] for r in rows if r["status"] == DEAD], now)
    return list(rows)


async def defer(
    conn: asyncpg.Connection, ids: list[int], revisions: list[int], run_ats: list[datetime]
) -> list[Row]:
    """Claimed jobs put back unrun, due at ``run_ats``; the claim is no attempt."""
    return list(await conn.fetch(Q.defer, ids, revisions, run_ats))


async def stale_running(conn: asyncpg.Connection, stale_before: datetime, limit: int) -> list[int]:
    return [r["id"] for r in await conn.fetch(Q.stale_running, stale_before, limit)]


async def reap(
    conn: asyncpg.Connection, ids: Sequence[int], stale_before: datetime, now: datetime
) -> list[Row]:
    async with conn.transaction():
        rows = await conn.fetch(Q.reap, list(ids), stale_before, now)
        await cancel_dependents(conn, [r["id"] for r in rows if r["status"] == DEAD], now)
    return list(rows)


async def cancel(conn: asyncpg.Connection, job_id: int, now: datetime) -> Job | None:
    async with conn.transaction():
        row = await conn.fetchrow(Q.cancel, job_id, now)
        if row is not None:
            await cancel_dependents(conn, [job_id], now)
    return None if row is None else to_job(row)


async def cancel_by_key(conn: asyncpg.Connection, category: str, key: str, now: datetime) -> bool:
    async with conn.transaction():
        job_id = await conn.fetchval(Q.cancel_by_key, category, key, now)
        if job_id is not None:
            await cancel_dependents(conn, [job_id], now)
    return job_id is not None


async def executions(conn: asyncpg.Connection, job_id: int) -> list[Row]:
    return list(await conn.fetch(Q.executions, job_id))


# -- lists, retry, reschedule -------------------------------------------------------

# The first page's cursor: every id is below it.
_NO_CURSOR = MAX_ID


async def jobs_page(
    conn: asyncpg.Connection,
    status: str | None,
    category: str | None,
    before: int | None,
    limit: int,
) -> list[Job]:
    """Newest first. One statement per filter combination, so each plan is the
    range scan of the index made for it (a generic `$x IS NULL OR ...` plan
    could not use them). A filtered page is planned for its own values
    (queries.sql, custom_plans): the generic plan PostgreSQL switches a
    prepared statement to after five runs walks the primary key and filters,
    which reads the whole table when the filter matches nothing."""
    cursor = before if before is not None else _NO_CURSOR
    if status is None and category is None:
        rows = await conn.fetch(Q.jobs_page, cursor, limit)
        return [to_job(r) for r in rows]
    async with conn.transaction():
        await conn.execute(Q.custom_plans)
        if status is not None and category is not None:
            rows = await conn.fetch(Q.jobs_page_status_category, cursor, limit, status, category)
        elif status is not None:
            rows = await conn.fetch(Q.jobs_page_status, cursor, limit, status)
        else:
            rows = await conn.fetch(Q.jobs_page_category, cursor, limit, category)
    return [to_job(r) for r in rows]


async def retry(conn: asyncpg.Connection, job_id: int, now: datetime, budget: int) -> Job | None:
    row = await conn.fetchrow(Q.retry, job_id, now, budget)
    return None if row is None else to_job(row)


async def reschedule(conn: asyncpg.Connection, job_id: int, run_at: datetime) -> Job | None:
    row = await conn.fetchrow(Q.reschedule, job_id, run_at)
    return None if row is None else to_job(row)


async def retry_dead(
    conn: asyncpg.Connection,
    now: datetime,
    budget: int,
    after: int,
    limit: int,
    category: str | None,
) -> list[Job]:
    """Up to ``limit`` DEAD jobs with ids above ``after`` (of ``category``
    when given) retried like ``retry``; rows another request holds are skipped."""
    rows = await conn.fetch(Q.retry_dead, now, budget, after, limit, category)
    return [to_job(r) for r in rows]


# -- categories: pause, rate limit, overview ---------------------------------------------


async def set_paused(
    conn: asyncpg.Connection, category: str, paused: bool, now: datetime
) -> Category:
    return Category.from_row(await conn.fetchrow(Q.set_paused, category, paused, now))


async def set_rate(
    conn: asyncpg.Connection, category: str, per_second: float | None, now: datetime
) -> Category:
    return Category.from_row(await conn.fetchrow(Q.set_rate, category, per_second, now))


async def category_rules(conn: asyncpg.Connection) -> list[Category]:
    return [Category.from_row(r) for r in await conn.fetch(Q.category_rules)]


async def category_overview(
    conn: asyncpg.Connection, declared: Sequence[str], now: datetime
) -> list[Category]:
    return [
        Category.from_row(r) for r in await conn.fetch(Q.category_overview, list(declared), now)
    ]


# -- recurring jobs -------------------------------------------------------------------


async def insert_recurring(conn: asyncpg.Connection, r: Recurring, now: datetime) -> Recurring:
    row = await conn.fetchrow(
        Q.insert_recurring, r.category, r.cron, r.timezone, r.payload, r.urgency, r.next_at, now
    )
    return Recurring.from_row(row)


async def recurring_page(
    conn: asyncpg.Connection, before: int | None, limit: int
) -> list[Recurring]:
    cursor = before if before is not None else _NO_CURSOR
    return [Recurring.from_row(r) for r in await conn.fetch(Q.recurring_page, cursor, limit)]


async def delete_recurring(conn: asyncpg.Connection, recurring_id: int) -> bool:
    return await conn.fetchval(Q.delete_recurring, recurring_id) is not None


async def cancel_occurrences(conn: asyncpg.Connection, recurring_id: int, now: datetime) -> int:
    async with conn.transaction():
        ids = [r["id"] for r in await conn.fetch(Q.cancel_occurrences, recurring_id, now)]
        await cancel_dependents(conn, ids, now)
    return len(ids)


async def due_recurring_ids(conn: asyncpg.Connection, horizon: datetime, limit: int) -> list[int]:
    return [r["id"] for r in await conn.fetch(Q.due_recurring_ids, horizon, limit)]


async def recurring_by_id(conn: asyncpg.Connection, ids: Sequence[int]) -> list[Recurring]:
    return [Recurring.from_row(r) for r in await conn.fetch(Q.recurring_by_id, list(ids))]


async def park_recurring(
    conn: asyncpg.Connection, recurring_id: int, now: datetime, reason: str
) -> None:
    await conn.execute(Q.park_recurring, recurring_id, now, reason)


async def insert_occurrences(
    conn: asyncpg.Connection,
    r: Recurring,
    instants: Sequence[datetime],
    max_attempts: int,
    now: datetime,
) -> list[Job]:
    rows = await conn.fetch(
        Q.insert_occurrences,
        r.id,
        r.category,
        r.urgency,
        r.payload,
        max_attempts,
        now,
        list(instants),
    )
    return [to_job(row) for row in rows]


async def advance_recurring(
    conn: asyncpg.Connection, recurring_id: int, old: datetime, new: datetime | None
) -> bool:
    status = await conn.execute(Q.advance_recurring, recurring_id, old, new)
    return status.split()[-1] == "1"
