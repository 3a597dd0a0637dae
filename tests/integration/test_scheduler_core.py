"""The scheduler against real PostgreSQL and Redis: timing, exactly-once
completion, parallel movers/loaders, cancellation, retries, the window. Each
test runs on a single Redis and on a Redis Cluster."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
import redis.exceptions

from reservo.scheduler import Scheduler
from reservo.scheduler.domain import PENDING
from reservo.scheduler.workers import Loader, Mover, handler_failed
from tests.helpers.scheduler import (
    Recorder,
    category,
    done_log_duplicates,
    drop_namespace,
    make,
    running,
    statuses,
)
from tests.helpers.waiting import wait_until
from tests.redis_cluster import RedisTarget

pytestmark = pytest.mark.redis_cluster


@pytest.fixture
def ns() -> str:
    return f"sched-test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def sched(database_url: str, redis_target: RedisTarget, ns: str) -> AsyncIterator[Scheduler]:
    s = make(database_url, redis_target, ns)
    yield s
    await s.close()
    await drop_namespace(redis_target, ns)


def now() -> datetime:
    return datetime.now(UTC)


async def test_jobs_fire_at_run_at_not_before_and_complete_once(
    sched: Scheduler, db: asyncpg.Connection
) -> None:
    cat, rec = category(), Recorder()
    sched.register(cat, rec)
    base = now()
    jobs = [
        await sched.enqueue(cat, {"n": i}, run_at=base + timedelta(milliseconds=800 + 20 * i))
        for i in range(50)
    ]
    async with running(sched):
        await wait_until(lambda: _all(db, cat, "DONE", 50), 20)
        await asyncio.sleep(0.3)  # a duplicate would show up here
    for job in jobs:
        assert rec.calls[job.id] == 1
        started = rec.starts[job.id][0]
        assert started >= job.run_at.timestamp(), "ran before run_at"
        assert started - job.run_at.timestamp() < 1.0
    assert await done_log_duplicates(db, cat) == 0
    assert (
        await db.fetchval(
            "SELECT count(*) FROM job_execution e JOIN scheduled_job j ON j.id = e.job_id "
            "WHERE j.category = $1 AND e.outcome = 'DONE'",
            cat,
        )
        == 50
    )


async def _all(db: asyncpg.Connection, cat: str, status: str, n: int) -> bool:
    return (await statuses(db, cat))[status] == n


# A fire-ahead long enough to watch the claim happen before run_at.
AHEAD_S = 1.0


@pytest.mark.parametrize(
    "due_in_s",
    [
        pytest.param(0.7, id="pushed-within-the-fire-ahead"),
        pytest.param(2.5, id="moved-once-within-the-fire-ahead"),
    ],
)
async def test_a_job_is_claimed_within_the_fire_ahead_and_starts_at_run_at(
    database_url: str, redis_target: RedisTarget, ns: str, db: asyncpg.Connection, due_in_s: float
) -> None:
    # The hand-off from Redis and the claim happen before run_at (the row is
    # RUNNING while run_at is still ahead), the handler starts at run_at and
    # not before, and started_at says run_at: when the handler started.
    s = make(database_url, redis_target, ns, fire_ahead_s=AHEAD_S)
    cat, rec = category(), Recorder()
    s.register(cat, rec)
    try:
        job = await s.enqueue(cat, {}, run_at=now() + timedelta(seconds=due_in_s))
        if due_in_s < AHEAD_S:  # the push put it straight into the queue
            assert await s.redis.llen(s.keys.queue(cat, job.urgency)) == 1
        else:
            assert await s.redis.zcard(s.keys.future(cat, job.urgency)) == 1
        async with running(s):
            await wait_until(lambda: _all(db, cat, "RUNNING", 1), due_in_s + 5, step_s=0.01)
            seen_running_at = time.time()
            await wait_until(lambda: _all(db, cat, "DONE", 1), 10)
    finally:
        await s.close()
        await drop_namespace(redis_target, ns)
    assert seen_running_at < job.run_at.timestamp(), "not claimed before run_at"
    assert rec.calls[job.id] == 1
    assert rec.starts[job.id][0] >= job.run_at.timestamp(), "ran before run_at"
    started_at = await db.fetchval("SELECT started_at FROM scheduled_job WHERE id = $1", job.id)
    assert started_at == job.run_at


async def test_without_a_fire_ahead_a_job_is_not_claimed_before_run_at(
    database_url: str, redis_target: RedisTarget, ns: str, db: asyncpg.Connection
) -> None:
    s = make(database_url, redis_target, ns, fire_ahead_s=0)
    cat, rec = category(), Recorder()
    s.register(cat, rec)
    try:
        job = await s.enqueue(cat, {}, run_at=now() + timedelta(seconds=1.5))
        async with running(s):
            seen: set[str] = set()
            while time.time() < job.run_at.timestamp() - 0.01:
                seen.add((await s.get(job.id)).status)
                await asyncio.sleep(0.01)
            await wait_until(lambda: _all(db, cat, "DONE", 1), 10)
    finally:
        await s.close()
        await drop_namespace(redis_target, ns)
    assert seen <= set(PENDING), f"before run_at the job was {seen}"
    assert rec.starts[job.id][0] >= job.run_at.timestamp()


async def test_ten_thousand_jobs_over_a_few_seconds_all_complete(
    sched: Scheduler, db: asyncpg.Connection
) -> None:
    cat, rec = category(), Recorder()
    sched.register(cat, rec)
    base = now() + timedelta(seconds=1)
    n = 10_000
    run_ats = [base + timedelta(milliseconds=3000 * i / n) for i in range(n)]
    await sched.enqueue_bulk(cat, run_ats, [{"i": i} for i in range(n)], [i % 10 for i in range(n)])
    async with running(sched):
        await wait_until(lambda: _all(db, cat, "DONE", n), 90, step_s=0.2)
    assert len(rec.calls) == n
    assert max(rec.calls.values()) == 1
    assert await done_log_duplicates(db, cat) == 0
    late = await db.fetchval(
        "SELECT count(*) FROM scheduled_job WHERE category = $1 AND started_at < run_at", cat
    )
    assert late == 0


async def test_two_movers_and_two_loaders_in_parallel_run_each_job_once(
    database_url: str, redis_target: RedisTarget, ns: str, db: asyncpg.Connection
) -> None:
    # Same namespace, two independent schedulers, each with 2 loaders and a mover,
    # and the mover lock off: correctness must not depend on it.
    cat, rec = category(), Recorder()
    a = make(database_url, redis_target, ns, mover_lock=False, loaders=2, loader_period_s=0.05)
    b = make(database_url, redis_target, ns, mover_lock=False, loaders=2, loader_period_s=0.05)
    for s in (a, b):
        s.register(cat, rec)
    try:
        base = now() + timedelta(milliseconds=500)
        n = 3000
        # Rows only: both schedulers' loaders race to push them.
        await a.enqueue_bulk(
            cat,
            [base + timedelta(milliseconds=2000 * i / n) for i in range(n)],
            [{} for _ in range(n)],
            [i % 3 for i in range(n)],
        )
        async with running(a, b):
            await wait_until(lambda: _all(db, cat, "DONE", n), 60, step_s=0.1)
            await asyncio.sleep(0.5)
        assert len(rec.calls) == n
        assert max(rec.calls.values()) == 1, "a job ran twice"
        assert await done_log_duplicates(db, cat) == 0
    finally:
        await a.close()
        await b.close()
        await drop_namespace(redis_target, ns)


async def test_cancelled_before_run_never_runs(sched: Scheduler, db: asyncpg.Connection) -> None:
    cat, rec = category(), Recorder()
    sched.register(cat, rec)
    keep = await sched.enqueue(cat, {}, delay=timedelta(milliseconds=700))
    # Already in Redis (inside the window): cancellation must still win.
    doomed = await sched.enqueue(cat, {}, delay=timedelta(milliseconds=700))
    assert doomed.status == "SCHEDULED"
    assert await sched.cancel(doomed.id) is True
    assert await sched.cancel(doomed.id) is False  # already cancelled
    async with running(sched):
        await wait_until(lambda: _all(db, cat, "DONE", 1), 10)
        await asyncio.sleep(0.5)
    assert rec.calls[keep.id] == 1
    assert rec.calls[doomed.id] == 0
    assert (await sched.get(doomed.id)).status == "CANCELLED"


async def test_failing_handler_retries_with_growing_delays_then_dead(
    database_url: str, redis_target: RedisTarget, ns: str, db: asyncpg.Connection
) -> None:
    s = make(database_url, redis_target, ns, max_attempts=4, backoff_base_s=0.3, backoff_max_s=10)
    cat, rec = category(), Recorder(fail=True)
    s.register(cat, rec)
    try:
        job = await s.enqueue(cat, {})
        async with running(s):
            await wait_until(lambda: _all(db, cat, "DEAD", 1), 30)
            await asyncio.sleep(0.5)
        starts = rec.starts[job.id]
        assert len(starts) == 4, "max attempts, then no more runs"
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        # Equal jitter: delay n lies in [base*2^(n-2), base*2^(n-1)], so gaps grow.
        assert gaps[0] >= 0.15 - 0.05
        assert gaps[1] >= 0.3 - 0.05
        assert gaps[2] >= 0.6 - 0.05
        assert gaps[2] > gaps[0]
        dead = await s.get(job.id)
        assert dead.status == "DEAD" and dead.attempts == 4
        # What the API shows is generic; the exception is in the execution log.
        assert dead.last_error == handler_failed(4)
        log = await s.executions(job.id)
        assert all("handler refuses" in e["error"] for e in log)
        assert [e["outcome"] for e in log] == ["FAILED", "FAILED", "FAILED", "DEAD"]
        assert [e["attempt"] for e in log] == [1, 2, 3, 4]
    finally:
        await s.close()
        await drop_namespace(redis_target, ns)


async def test_far_future_jobs_stay_out_of_redis_until_their_window(
    database_url: str, redis_target: RedisTarget, ns: str, db: asyncpg.Connection
) -> None:
    s = make(database_url, redis_target, ns, window_s=2.0, loader_period_s=0.1)
    cat, rec = category(), Recorder()
    s.register(cat, rec)
    try:
        job = await s.enqueue(cat, {}, delay=timedelta(seconds=4))
        far = await s.enqueue(cat, {}, delay=timedelta(days=2))
        known = s.keys.known(cat, 5)
        future = s.keys.future(cat, 5)
        async with running(s):
            await asyncio.sleep(0.8)
            assert not await s.redis.sismember(known, str(job.id)), "loaded before its window"
            assert await s.redis.zscore(future, str(job.id)) is None
            assert (await s.get(job.id)).status == "SCHEDULED"
            await wait_until(lambda: _in(s, future, job.id), 4)
            # Redis first, then the row's flag (QUEUED) a moment later.
            await wait_until(lambda: _status(s, job.id, "QUEUED"), 1)
            await wait_until(lambda: _done(s, job.id), 5)
            assert rec.starts[job.id][0] >= job.run_at.timestamp()
            assert await s.redis.zscore(future, str(far.id)) is None
            assert not await s.redis.sismember(known, str(far.id))
        assert (await s.get(far.id)).status == "SCHEDULED"
        assert await s.cancel(far.id)
    finally:
        await s.close()
        await drop_namespace(redis_target, ns)


async def _in(s: Scheduler, key: str, job_id: int) -> bool:
    return await s.redis.zscore(key, str(job_id)) is not None


async def _done(s: Scheduler, job_id: int) -> bool:
    return (await s.get(job_id)).status == "DONE"


async def _status(s: Scheduler, job_id: int, status: str) -> bool:
    return (await s.get(job_id)).status == status


async def test_job_enqueued_in_callers_transaction_commits_with_it_and_is_loaded(
    sched: Scheduler, db: asyncpg.Connection
) -> None:
    cat, rec = category(), Recorder()
    sched.register(cat, rec)
    # Rolled back with the caller: no job at all.
    with pytest.raises(RuntimeError):
        async with sched.db.transaction() as conn:
            await sched.enqueue(cat, {"v": "rolled back"}, conn=conn)
            raise RuntimeError("caller fails")
    # Committed, never dispatched by the caller: the loader must pick it up.
    async with sched.db.transaction() as conn:
        job = await sched.enqueue(cat, {"v": "kept"}, delay=timedelta(milliseconds=200), conn=conn)
    async with running(sched):
        await wait_until(lambda: _done(sched, job.id), 10)
    assert (await statuses(db, cat)) == {"DONE": 1}
    assert rec.calls[job.id] == 1


async def test_same_idempotency_key_enqueues_once(sched: Scheduler) -> None:
    cat = category()
    first = await sched.enqueue(cat, {"a": 1}, delay=timedelta(hours=1), idempotency_key="k1")
    again = await sched.enqueue(cat, {"a": 1}, delay=timedelta(hours=1), idempotency_key="k1")
    other = await sched.enqueue(cat, {"a": 1}, delay=timedelta(hours=1), idempotency_key="k2")
    assert first.id == again.id != other.id
    for j in (first, other):
        await sched.cancel(j.id)


async def test_job_of_a_dead_worker_is_reaped_and_completes_once(
    sched: Scheduler, db: asyncpg.Connection
) -> None:
    # A worker claimed the job and vanished (no heartbeat, nothing settled).
    cat, rec = category(), Recorder()
    sched.register(cat, rec)
    job = await sched.enqueue(cat, {}, delay=timedelta(hours=1))
    await db.execute(
        "UPDATE scheduled_job SET status = 'RUNNING', attempts = 1, revision = revision + 1, "
        "worker = 'ghost', heartbeat_at = now() - interval '1 minute', started_at = now(), "
        "run_at = now() WHERE id = $1",
        job.id,
    )
    async with running(sched):
        await wait_until(lambda: _done(sched, job.id), 10)
    assert rec.calls[job.id] == 1
    log = await sched.executions(job.id)
    assert [e["outcome"] for e in log] == ["LOST", "DONE"]


async def test_ids_whose_take_reply_was_lost_are_given_back_and_run_once(
    sched: Scheduler, db: asyncpg.Connection
) -> None:
    """A take that ran in Redis but whose reply never arrived (the connection died
    with a cluster master) leaves ids in the live executor's processing list,
    where nothing else looks while it lives, and the loader skips ids Redis still
    knows: the executor's next step hands them back, so they run, once."""
    cat, rec = category(), Recorder()
    sched.register(cat, rec)
    real_take, lost = sched.dispatcher.take, []

    async def take_then_lose_the_reply(
        pairs: Sequence[tuple[str, int]], worker: str, n: int
    ) -> list[tuple[tuple[str, int], list[int]]]:
        got = await real_take(pairs, worker, n)
        if got and not lost:
            lost.extend(i for _, ids in got for i in ids)
            raise redis.exceptions.ConnectionError("the reply was lost")
        return got

    sched.dispatcher.take = take_then_lose_the_reply  # type: ignore[method-assign]
    jobs = [await sched.enqueue(cat, {}) for _ in range(20)]

    async def all_done() -> bool:
        return (await statuses(db, cat))["DONE"] == len(jobs)

    async with running(sched):
        await wait_until(all_done, 10)
    assert lost, "the first take should have lost its reply"
    assert sorted(rec.calls) == sorted(j.id for j in jobs)
    assert max(rec.calls.values()) == 1
    assert await done_log_duplicates(db, cat) == 0


async def test_loader_reload_is_a_no_op(sched: Scheduler) -> None:
    cat = category()
    job = await sched.enqueue(cat, {}, delay=timedelta(seconds=60))
    loader = Loader(sched)
    await loader.run_once()  # first run: full resync of the window
    await loader.run_once()
    assert await sched.redis.zcard(sched.keys.future(cat, 5)) == 1
    assert await sched.redis.llen(sched.keys.queue(cat, 5)) == 0
    await sched.cancel(job.id)


async def test_elapsed_check(sched: Scheduler) -> None:
    # Redis TIME and our clock agree closely enough for "not before" to hold.
    t = await sched.redis.time()
    assert abs(t[0] + t[1] / 1e6 - time.time()) < 0.5


async def test_a_full_resync_leaves_rows_already_pushed_untouched(
    sched: Scheduler, db: asyncpg.Connection
) -> None:
    # The next full resync of the window reads every pending row again, but
    # the ones marked pushed are neither updated nor locked (a lock writes its
    # transaction id into the row's xmax, and a WAL record, per row and per
    # resync).
    cat, n = category(), 300
    await sched.enqueue_bulk(cat, [now() + timedelta(seconds=60)] * n, [{}] * n, [5] * n)
    # At least these n: the window may hold other tests' pending rows, which a
    # Redis that has not seen them (the other parametrisation's) loads too.
    assert await Loader(sched).run_once() >= n
    versions = (
        "SELECT id, xmin::text AS xmin, xmax::text AS xmax FROM scheduled_job "
        "WHERE category = $1 AND pushed"
    )
    before = {tuple(r) for r in await db.fetch(versions, cat)}
    assert len(before) == n

    await sched.redis.delete(sched.keys.synced)  # the resync period is over
    await Loader(sched).run_once()

    # Same row versions (xmin), and no new locker in xmax.
    assert {tuple(r) for r in await db.fetch(versions, cat)} == before


async def test_a_job_running_past_the_reaper_timeout_is_not_reaped(
    sched: Scheduler, db: asyncpg.Connection
) -> None:
    # Heartbeats keep a long job's lease: it runs once, is never reaped.
    cat, rec = category(), Recorder(delay_s=2 * sched.config.reaper_timeout_s)
    sched.register(cat, rec)
    job = await sched.enqueue(cat, {}, delay=timedelta(0))
    async with running(sched):
        await wait_until(lambda: _all(db, cat, "DONE", 1), 30, 0.1)
    assert rec.calls[job.id] == 1
    outcomes = await db.fetch("SELECT outcome FROM job_execution WHERE job_id = $1", job.id)
    assert [r["outcome"] for r in outcomes] == ["DONE"]


async def test_the_mover_renews_its_lock_a_third_of_a_ttl_apart_not_on_every_step(
    sched: Scheduler,
) -> None:
    # At a steady flow of due jobs the mover steps hundreds of times a second:
    # a lock round trip on each step made every step, and so the lateness of
    # every job, several times as long.
    cat = category()
    sched.register(cat, Recorder())
    base = now()
    for i in range(200):
        await sched.enqueue(cat, {"n": i}, run_at=base + timedelta(milliseconds=5 * i))
    await Loader(sched).run_once()
    asks = 0
    acquire = sched.dispatcher.acquire

    async def counted(token: str, ttl_ms: int, key: str | None = None) -> bool:
        nonlocal asks
        asks += 1
        return await acquire(token, ttl_ms, key)

    sched.dispatcher.acquire = counted  # type: ignore[method-assign]
    mover, rival = Mover(sched), Mover(sched)
    steps, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < 0.5:
        await asyncio.sleep(await mover.step())
        steps += 1
    assert mover.owner and steps >= 20, steps
    assert asks == 1
    await rival.step()
    assert not rival.owner  # the lock is held all along
    # Another holder takes the lock over (ours expired during a pause): we
    # learn it at the next renewal and stop moving.
    await sched.redis.set(sched.keys.lock, "someone else", px=sched.config.lock_ttl_ms)
    mover.renew_at = 0.0
    await mover.step()
    assert not mover.owner and asks == 3


async def test_a_loader_that_starts_within_the_resync_period_does_not_reload_the_window(
    database_url: str, redis_target: RedisTarget, ns: str
) -> None:
    # A deploy restarts every worker: the new loader trusts the full pass made
    # under the same epoch within the period, and does its own once the period
    # is over or Redis lost its epoch. A job Redis dropped without losing the
    # epoch (a failover's last writes) comes back at that pass.
    s = make(database_url, redis_target, ns, resync_period_s=1.0)
    try:
        cat = category()
        jobs = [await s.enqueue(cat, {}, delay=timedelta(seconds=60)) for _ in range(3)]
        await Loader(s).run_once()
        dropped = jobs[0].id
        future, known = s.keys.future(cat, 5), s.keys.known(cat, 5)

        async def drop() -> None:
            await s.redis.zrem(future, dropped)
            await s.redis.srem(known, dropped)

        async def in_redis() -> bool:
            return await s.redis.zscore(future, dropped) is not None

        assert await in_redis()
        await drop()
        await Loader(s).run_once()  # a restart within the period
        assert not await in_redis()
        await asyncio.sleep(1.1)  # the period is over
        await Loader(s).run_once()
        assert await in_redis()
        await drop()
        await s.redis.delete(s.keys.epoch)  # Redis restarted
        await Loader(s).run_once()
        assert await in_redis()
    finally:
        await s.close()
        await drop_namespace(redis_target, ns)
