"""Redis is never the truth: a FLUSHALL or a restart mid-run is rebuilt from
PostgreSQL by the loader, and every job still completes exactly once. Uses a
private redis-server (the machine's Redis is shared with other test runs)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg

from reservo.scheduler import Job
from tests.helpers.scheduler import (
    Recorder,
    category,
    done_log_duplicates,
    make,
    own_redis,
    running,
    statuses,
)
from tests.helpers.waiting import wait_until

N = 3000


async def _run_with_loss(database_url: str, db: asyncpg.Connection, restart: bool) -> None:
    with own_redis() as rd:
        s = make(database_url, rd.url, f"loss-{uuid.uuid4().hex[:8]}", loader_period_s=0.1)
        cat, rec = category(), Recorder()
        s.register(cat, rec)
        try:
            base = datetime.now(UTC) + timedelta(milliseconds=300)
            run_ats = [base + timedelta(milliseconds=3000 * i / N) for i in range(N)]
            await s.enqueue_bulk(cat, run_ats, [{} for _ in range(N)], [i % 2 for i in range(N)])
            async with running(s):
                await asyncio.sleep(1.5)  # mid-run: some done, some queued, some future
                before = (await statuses(db, cat))["DONE"]
                assert 0 < before < N
                if restart:
                    rd.stop()
                    await asyncio.sleep(0.5)
                    rd.start()
                else:
                    await s.redis.flushall()

                async def all_done() -> bool:
                    return (await statuses(db, cat))["DONE"] == N

                await wait_until(all_done, 60, step_s=0.2)
                await asyncio.sleep(0.5)
            assert len(rec.calls) == N
            # A job running while Redis went away may be re-popped, but the claim
            # refuses it: the handler ran once per job, one DONE per job.
            assert max(rec.calls.values()) == 1
            assert await done_log_duplicates(db, cat) == 0
        finally:
            await s.close()


async def test_flushall_mid_run_every_job_completes_exactly_once(
    database_url: str, db: asyncpg.Connection
) -> None:
    await _run_with_loss(database_url, db, restart=False)


async def test_redis_restart_mid_run_every_job_completes_exactly_once(
    database_url: str, db: asyncpg.Connection
) -> None:
    await _run_with_loss(database_url, db, restart=True)


async def test_redis_lost_while_a_batch_runs_its_other_jobs_still_settle_once(
    database_url: str, db: asyncpg.Connection
) -> None:
    # One batch of two due jobs: the first to start stops Redis and takes a
    # while; the second ends first, so its acknowledgement meets no Redis. The
    # first must still be settled when it ends: cancelled unsettled, it would be
    # reaped and run a second time.
    with own_redis() as rd:
        s = make(database_url, rd.url, f"loss-{uuid.uuid4().hex[:8]}", executors=1)
        cat, slow_cat = category(), category()
        quick = Recorder(delay_s=0.05)
        calls: list[int] = []

        async def slow(job: Job) -> None:
            calls.append(job.id)
            if len(calls) == 1:
                rd.stop()
            await asyncio.sleep(0.3)

        s.register(cat, quick)
        s.register(slow_cat, slow)
        try:
            due = datetime.now(UTC) - timedelta(seconds=1)
            # Both pushed to Redis now, due already: one take, one claim.
            first = await s.enqueue(slow_cat, {}, run_at=due)
            second = await s.enqueue(cat, {}, run_at=due + timedelta(milliseconds=1))
            async with running(s):
                await wait_until(lambda: calls == [first.id], 10, "the slow job to start")
                await asyncio.sleep(1.0)  # the quick job's acknowledgement has failed
                rd.start()

                async def both_done() -> bool:
                    done = await db.fetchval(
                        "SELECT count(*) FROM scheduled_job "
                        "WHERE id = ANY($1::bigint[]) AND status = 'DONE'",
                        [first.id, second.id],
                    )
                    return bool(done == 2)

                await wait_until(both_done, 20)
                # Past the reaper's timeout: a job left RUNNING would be reaped and rerun.
                await asyncio.sleep(s.config.reaper_timeout_s + 1.0)
        finally:
            await s.close()
    assert calls == [first.id], "the slow job ran again"
    assert quick.calls == {second.id: 1}
    lost = await db.fetchval(
        "SELECT count(*) FROM job_execution WHERE job_id = ANY($1::bigint[]) AND outcome = 'LOST'",
        [first.id, second.id],
    )
    assert lost == 0
