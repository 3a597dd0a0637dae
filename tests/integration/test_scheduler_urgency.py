"""Urgency order: of a backlog of due jobs, the more urgent (urgency 0) start
before the less urgent (urgency 9), whatever their run_at, whether one batch
holds the whole backlog or the executor takes it in many small ones. A real
worker (loader, mover, executor) drains the backlog; the handler records the
order the jobs start in."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from reservo.scheduler import Job
from tests.helpers.scheduler import category, drop_namespace, make, running, statuses
from tests.helpers.waiting import wait_until
from tests.redis_cluster import RedisTarget

PER_URGENCY = 30


@pytest.fixture
async def ns(redis_target: RedisTarget) -> AsyncIterator[str]:
    name = f"sched-urgency-{uuid.uuid4().hex[:8]}"
    yield name
    await drop_namespace(redis_target, name)


@pytest.mark.parametrize(
    "concurrency",
    [
        pytest.param(200, id="the-backlog-in-one-batch"),
        pytest.param(4, id="the-backlog-in-batches-of-4"),
    ],
)
async def test_a_backlog_of_due_jobs_runs_urgency_0_before_urgency_9(
    database_url: str, redis_target: RedisTarget, ns: str, db: asyncpg.Connection, concurrency: int
) -> None:
    # One executor, so that the start order is the order it chose; the less
    # urgent jobs are the older ones, so due order alone would run them first.
    s = make(database_url, redis_target, ns, executors=1, executor_concurrency=concurrency)
    cat, started = category(), []

    async def record(job: Job) -> None:
        started.append(job.urgency)
        await asyncio.sleep(0.01)

    s.register(cat, record)
    try:
        base = datetime.now(UTC)
        for i in range(PER_URGENCY):
            when = base + timedelta(milliseconds=200 + i)
            await s.enqueue(cat, {"n": i}, run_at=when, urgency=9)
        for i in range(PER_URGENCY):
            when = base + timedelta(milliseconds=400 + i)
            await s.enqueue(cat, {"n": i}, run_at=when, urgency=0)
        # Every job is due before any worker runs: a backlog.
        await asyncio.sleep(max(0.0, (base - datetime.now(UTC)).total_seconds() + 0.6))

        async def drained() -> bool:
            return (await statuses(db, cat))["DONE"] == 2 * PER_URGENCY

        async with running(s):
            await wait_until(drained, 30)
    finally:
        await s.close()
    assert started == [0] * PER_URGENCY + [9] * PER_URGENCY, started
