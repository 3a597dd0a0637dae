"""The scheduler's background roles. Each one is safe to run in several
processes at once: correctness lives in PostgreSQL's conditional updates and in
the idempotent Lua scripts, never in "only one of me is running"."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial

import asyncpg
import structlog
from pydantic import ValidationError

from reservo.core.aio.backoff import backoff_delay
from reservo.core.aio.loops import run_paced
from reservo.core.kernel.clock import Clock
from reservo.core.messaging.poison import ROW_ERRORS, isolate, report
from reservo.scheduler import domain, repo
from reservo.scheduler.categories import Rules
from reservo.scheduler.domain import Job, JobDeferred, JobFailure
from reservo.scheduler.service import RECURRING_BATCH, Scheduler

log = structlog.get_logger(__name__)
# A role whose step failed (Redis or PostgreSQL away) tries again after this long.
RETRY_S = 0.5
# A lock's time to live, in periods of its holder's loop: a holder that misses two
# steps in a row (a pause, a slow Redis) still keeps it; a dead one frees it soon.
LOCK_PERIODS = 3
# A mover that did not get the lock tries again after this fraction of its TTL, so
# it takes over within a third of the TTL after the holder dies.
LOCK_RETRY_FRACTION = 1 / LOCK_PERIODS
# Stale RUNNING rows a reaper pass reads at most (the rest wait for the next pass).
REAP_BATCH = 1000
# How long an executor trusts its list of (category, urgency) queues before asking
# Redis again: queues appear rarely, and asking on every step costs a round trip.
QUEUES_REFRESH_S = 0.5
# The longest error text stored on a job row (the public and the detailed one).
ERROR_TEXT_MAX = 2000
# What GET /api/jobs/{jobId} shows of a failure the handler did not word itself
# (JobFailure.public): an exception's text may carry SQL, addresses or other
# people's data. The exception goes to the log and to job_execution.error.
BAD_PAYLOAD = "the job's payload is not valid for its category"

MS_PER_S = 1000
# The shortest sleep in Redis (BLMOVE): its timeout 0 would mean forever.
MIN_WAIT_S = 0.005
# After the first job of a batch ends, how long the executor waits for more to
# end before settling them together: one settle for a batch of quick jobs, and a
# slow job's batch-mates never wait for it.
WAVE_S = 0.005
# How long an executor waits for the batch it just started before it takes the
# next. Quick jobs end within it, so what fell due meanwhile comes back as one
# batch (one claim, one settle, one acknowledgement) instead of a stream of
# batches of a job or two, each paying those round trips: at 2,000 jobs/s that
# stream took both cores and tripled the lateness it meant to cut. A batch held
# longer (a slow call) keeps its executor no longer than this.
HOLD_S = 0.02
# job_push rows the loader's recovery reads per page (each names the jobs of one
# POST /api/jobs batch: at most core.http.batching's 128).
PUSHES_PAGE = 50
Groups = dict[tuple[str, int], list[int]]
# Ids taken from Redis, by the (category, urgency) queue they came from.
Taken = list[tuple[tuple[str, int], list[int]]]
# The `loop` label of reservo_poison_rows_total.
LOADER, EXECUTOR, REAPER = "scheduler.loader", "scheduler.executor", "scheduler.reaper"
Fetch = Callable[[asyncpg.Connection], Awaitable[list[repo.Row]]]
FetchIds = Callable[[asyncpg.Connection], Awaitable[list[int]]]


def handler_failed(attempt: int) -> str:
    return f"the job's handler failed (attempt {attempt})"


async def _park(scheduler: Scheduler, loop: str, job_id: int, exc: BaseException) -> None:
    """Poison: DEAD by id, with a statement that reads none of the row's values."""
    reason = f"parked by the {loop}: this row could not be processed ({exc!r})"
    async with scheduler.db.connection() as conn:
        await repo.park(conn, job_id, reason, scheduler.clock.now())


class Loader:
    """Hands jobs due within the window from PostgreSQL to Redis. Incremental
    (rows not pushed yet, and the jobs of job_push rows older than the grace:
    a POST /api/jobs batch whose push after commit did not finish) every
    period; a full resync of the window when Redis lost its epoch key
    (FLUSHALL, restart) and once every resync period, whichever loader holds
    the lock then."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.token = uuid.uuid4().hex
        self.owner = False

    async def step(self) -> float:
        cfg = self.scheduler.config
        # Like the mover's: only saves the work of N loaders pushing the same
        # rows; two loaders at once are still correct (loading is idempotent).
        ttl = max(cfg.lock_ttl_ms, int(cfg.loader_period_s * LOCK_PERIODS * MS_PER_S))
        key = self.scheduler.keys.loader_lock
        self.owner = await self.scheduler.dispatcher.acquire(self.token, ttl, key)
        if not self.owner:
            return cfg.loader_period_s
        await self.run_once()
        return cfg.loader_period_s

    async def release(self) -> None:
        if self.owner:
            with contextlib.suppress(Exception):
                await self.scheduler.dispatcher.release(self.token, self.scheduler.keys.loader_lock)

    async def run_once(self) -> int:
        cfg, dispatcher = self.scheduler.config, self.scheduler.dispatcher
        token = await dispatcher.epoch(uuid.uuid4().hex)
        horizon = self.scheduler.clock.now() + timedelta(seconds=cfg.window_s)
        loaded = 0
        # The period is kept in Redis, not in this process: a loader that just
        # started (a deploy restarting every worker) or took the lock over
        # trusts a full pass made under the same epoch within the period. Each
        # new loader used to push the whole window again: on a due backlog of
        # 200,000 jobs that was 40 % of the CPU of the process draining it.
        if not await dispatcher.synced(token):
            loaded += await self._full(horizon)
            await dispatcher.mark_synced(token, int(cfg.resync_period_s * MS_PER_S))
        while True:
            rows, seen = await self._page(
                lambda conn: repo.unpushed(conn, horizon, cfg.loader_batch),
                lambda conn: repo.unpushed_ids(conn, horizon, cfg.loader_batch),
            )
            if not seen:
                break
            loaded += await self._push(rows)
            if seen < cfg.loader_batch:
                break
        return loaded + await self.unfinished_pushes()

    async def unfinished_pushes(self) -> int:
        """Pushes the jobs of every job_push row older than the grace, then
        deletes the row: its batch committed them QUEUED, but the process died
        (or Redis failed) before they reached Redis. Loading is idempotent, so a
        push that was only slow costs a no-op. No lock on the rows: two loaders
        doing the same rows push the same ids twice, harmlessly."""
        cfg = self.scheduler.config
        before = self.scheduler.clock.now() - timedelta(seconds=cfg.push_grace_s)
        loaded = 0
        while True:
            async with self.scheduler.db.connection() as conn:
                pushes = await repo.stale_pushes(conn, before, PUSHES_PAGE)
            if not pushes:
                return loaded
            ids = sorted({job_id for _, job_ids in pushes for job_id in job_ids})

            async def same_ids(conn: asyncpg.Connection, ids: list[int] = ids) -> list[int]:
                return ids

            # Only the jobs still pending; a row that cannot be decoded is parked.
            rows, _ = await self._page(partial(repo.loadable_rows, ids=ids), same_ids)
            loaded += await self._push(rows)
            async with self.scheduler.db.connection() as conn:
                await repo.delete_pushes(conn, [push_id for push_id, _ in pushes])
            if len(pushes) < PUSHES_PAGE:
                return loaded

    async def _full(self, horizon: datetime) -> int:
        # datetime.min is sent as -infinity: the first page starts before any row.
        after: tuple[datetime, int] = (datetime.min.replace(tzinfo=horizon.tzinfo), 0)
        batch = self.scheduler.config.loader_batch
        loaded = 0
        while True:
            rows, seen = await self._page(
                partial(repo.pending_page, horizon=horizon, after=after, limit=batch),
                partial(repo.pending_page_ids, horizon=horizon, after=after, limit=batch),
            )
            if not seen:
                return loaded
            loaded += await self._push(rows)
            # A page whose rows were all parked keeps the cursor: they are no
            # longer pending, so the same query now returns the rows after them.
            if rows:
                after = max((row["run_at"], row["id"]) for row in rows)

    async def _page(self, fetch: Fetch, fetch_ids: FetchIds) -> tuple[list[repo.Row], int]:
        """A page of rows and how many rows it had. A page that cannot be decoded
        (a timestamp Python cannot represent) is read again as ids, then row by
        row, and the rows that fail alone are parked: one bad row must not hold
        back every row after it in run_at order."""
        async with self.scheduler.db.connection() as conn:
            try:
                rows = await fetch(conn)
                return rows, len(rows)
            except ROW_ERRORS as exc:
                log.warning("scheduler_page_undecodable", error=repr(exc))
                ids = await fetch_ids(conn)
        rows = await isolate(ids, self._rows, self._park_id, loop=LOADER)
        return rows, len(ids)

    async def _rows(self, ids: Sequence[int]) -> list[repo.Row]:
        async with self.scheduler.db.connection() as conn:
            return await repo.loadable_rows(conn, ids)

    async def _park_id(self, job_id: int, exc: BaseException) -> None:
        await _park(self.scheduler, LOADER, job_id, exc)

    async def _push(self, rows: list[repo.Row]) -> int:
        good = []
        for row in rows:
            try:
                domain.check_run_at(row["run_at"])
                good.append(row)
            except ValueError as exc:  # written before the rule: never run it
                await report(LOADER, row["id"], exc, self._park_id(row["id"], exc))
        added = await isolate(
            good,
            self._push_batch,
            lambda row, exc: self._park_id(row["id"], exc),
            loop=LOADER,
            key=lambda row: row["id"],
        )
        return sum(added)

    async def _push_batch(self, rows: Sequence[repo.Row]) -> list[int]:
        # Redis first, then the flag: a crash in between only means a no-op reload.
        added = await self.scheduler.dispatcher.load(
            (row["id"], row["category"], row["urgency"], domain.ms(row["run_at"])) for row in rows
        )
        # Only the rows not marked yet: a full resync reads every pending row
        # of the window, nearly all of them pushed long ago, and marking those
        # again changed nothing but still locked each one (a WAL record per
        # row, per resync). A row reset to unpushed since this read (retried,
        # rescheduled) has a new revision, which mark_pushed would refuse anyway.
        fresh = [row for row in rows if not row["pushed"]]
        if fresh:
            async with self.scheduler.db.connection() as conn:
                await repo.mark_pushed(
                    conn, [row["id"] for row in fresh], [row["revision"] for row in fresh]
                )
        return [added]


class Mover:
    """Promotes due ids from each ZSET to its LIST, continuously, by Redis' TIME.
    The lock only saves work; two movers running together are still correct."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.token = uuid.uuid4().hex
        self.owner = False
        self.renew_at = 0.0
        self.queues = KnownQueues(scheduler)

    async def step(self) -> float:
        cfg = self.scheduler.config
        # The owner renews its lock every third of the TTL, not on every step:
        # at a steady flow of due jobs the mover steps hundreds of times a
        # second, and the lock's two round trips and the queue list's one made
        # each step four round trips instead of one, which is lateness.
        if self.scheduler.mover_lock and (not self.owner or time.monotonic() >= self.renew_at):
            third_s = cfg.lock_ttl_ms * LOCK_RETRY_FRACTION / MS_PER_S
            self.owner = await self.scheduler.dispatcher.acquire(self.token, cfg.lock_ttl_ms)
            if not self.owner:
                return third_s
            self.renew_at = time.monotonic() + third_s
        return await self.move_once()

    async def move_once(self) -> float:
        cfg = self.scheduler.config
        pairs = await self.queues.get()
        if not pairs:
            return cfg.mover_idle_s
        results = await self.scheduler.dispatcher.move(pairs, cfg.mover_batch)
        if any(moved >= cfg.mover_batch for moved, _, _ in results):
            return 0.0  # more is due right now
        # Until the next id comes within the fire-ahead (bound: Redis' now plus it).
        nexts = [(nxt - bound) / MS_PER_S for _, nxt, bound in results if nxt >= 0]
        return min([cfg.mover_idle_s, *nexts]) if nexts else cfg.mover_idle_s

    async def release(self) -> None:
        if self.owner:
            with contextlib.suppress(Exception):
                await self.scheduler.dispatcher.release(self.token)


class KnownQueues:
    """The (category, urgency) queues Redis knows, of the categories ``wanted``,
    asked again at most every QUEUES_REFRESH_S: queues appear rarely, and asking
    on every step costs a round trip. An empty answer is asked again at once."""

    def __init__(
        self, scheduler: Scheduler, wanted: Callable[[str], bool] = lambda _category: True
    ) -> None:
        self.scheduler, self.wanted = scheduler, wanted
        self.pairs: list[tuple[str, int]] = []
        self.read_at = 0.0

    async def get(self) -> list[tuple[str, int]]:
        if not self.pairs or time.monotonic() - self.read_at > QUEUES_REFRESH_S:
            found = await self.scheduler.dispatcher.pairs()
            self.pairs = [pair for pair in found if self.wanted(pair[0])]
            self.read_at = time.monotonic()
        return self.pairs


class Reaper:
    """Returns the jobs of dead workers: RUNNING rows without a recent heartbeat
    go back to QUEUED (PostgreSQL), and processing lists of workers whose live
    key expired go back to their queues (Redis)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    async def step(self) -> float:
        await self.run_once()
        return self.scheduler.config.reaper_period_s

    async def run_once(self) -> int:
        cfg = self.scheduler.config
        now = self.scheduler.clock.now()
        stale = now - timedelta(seconds=cfg.reaper_timeout_s)
        async with self.scheduler.db.connection() as conn:
            ids = await repo.stale_running(conn, stale, REAP_BATCH)

        async def reap(batch: Sequence[int]) -> list[repo.Row]:
            async with self.scheduler.db.transaction() as conn:
                rows = await repo.reap(conn, batch, stale, now)
                for row in rows:  # a row written before the rule: parked, not requeued
                    domain.check_run_at(row["run_at"])
            return rows

        async def park(job_id: int, exc: BaseException) -> None:
            await _park(self.scheduler, REAPER, job_id, exc)

        rows = await isolate(ids, reap, park, loop=REAPER)
        for row in rows:
            log.warning("scheduler_job_reaped", job_id=row["id"], status=row["status"])
        back = [row for row in rows if row["status"] in domain.PENDING]
        if back:
            await self.scheduler.dispatcher.load(
                (row["id"], row["category"], row["urgency"], domain.ms(row["run_at"]))
                for row in back
            )
        await self.scheduler.dispatcher.requeue_dead()
        return len(rows)


Outcome = JobFailure | JobDeferred | None


@dataclass
class Claim:
    """What a batch claim made of the ids taken: the jobs now RUNNING here, and
    of the ids it refused (``missed``) the still pending ones, not due yet by
    our clock (``early``) or of a paused category (``held``)."""

    jobs: list[Job]
    missed: list[int]
    early: list[repo.Row] = field(default_factory=list)
    held: list[repo.Row] = field(default_factory=list)


class Executor:
    """Takes due ids with a reliable pop into its own processing list, claims
    them in PostgreSQL, runs the handlers, settles, then acknowledges in Redis.

    Each batch runs in a task of its own, and the executor goes on taking jobs
    while up to ``executor_concurrency`` of them are in flight: a batch held by one
    slow call (up to its deadline) never keeps the jobs that fall due meanwhile
    waiting behind it.

    The steps, in the order a job meets them (each a method below; a job's
    lateness is the sum of the waits named here)::

        step                     one turn of the loop (_forever runs it)
          _free_slots            waits while executor_concurrency jobs are in flight
          _takeable_queues       known queues, less paused categories
          _fetch                 _take (reliable pop, rate limits' tokens), or
                                 _wait_for_one (BLMOVE, at most executor_idle_s)
          _start_and_hold        _start -> a task running process; waits HOLD_S
        process                  one batch, in its task
          _claim                 PostgreSQL: RUNNING here (up to the fire-ahead early)
          _requeue               what the claim refused: put back, acked, reloaded
          _run_and_settle        _run each job (its handler starts at run_at), then
                                 per wave of jobs ending within WAVE_S:
            _finish              _settle (PostgreSQL), _acknowledge (Redis), release
    """

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.worker = scheduler.new_worker_id("exec")
        self.running: set[int] = set()
        # Ids taken and not yet acknowledged, and the tasks working on them.
        self.in_flight = 0
        self.batches: set[asyncio.Task[None]] = set()
        self._freed = asyncio.Event()  # set whenever a slot is given back
        self.queues = KnownQueues(scheduler, lambda category: category in scheduler.handlers)
        # False while a step is under way, and after one that failed part-way.
        self._clean = True
        # Set when a batch could not acknowledge settled jobs (Redis away): their
        # ids are still in our processing lists.
        self._unacked = False

    @property
    def ttl_ms(self) -> int:
        return int(self.scheduler.config.reaper_timeout_s * MS_PER_S)

    async def heartbeat(self) -> float:
        # PostgreSQL first: the reaper judges RUNNING rows by this heartbeat, so a
        # Redis outage (a cluster failing over) must not make the jobs this worker
        # is running look abandoned, and run them a second time.
        if self.running:
            async with self.scheduler.db.connection() as conn:
                await repo.heartbeat(
                    conn, list(self.running), self.scheduler.clock.now(), self.worker
                )
        await self.scheduler.dispatcher.alive(self.worker, self.ttl_ms)
        return self.scheduler.config.heartbeat_s

    async def step(self) -> float:
        """One turn: wait for a free slot, take what is due from the queues
        this process may take, and start it as a batch. Returns how long to
        sleep before the next turn."""
        free = await self._free_slots()
        if not free:
            return 0.0
        pairs, rules = await self._takeable_queues()
        if not pairs:
            return self.scheduler.config.executor_idle_s
        got, sleep_s = await self._fetch(pairs, rules, free)
        if got:
            await self._start_and_hold(got)
        return sleep_s

    async def _free_slots(self) -> int:
        """The slots free now; when none is, waits until a job ends (and says 0)."""
        free = self.scheduler.config.executor_concurrency - self.in_flight
        if free <= 0:
            self._freed.clear()
            await self._freed.wait()
            return 0
        return free

    async def _takeable_queues(self) -> tuple[list[tuple[str, int]], Rules]:
        """The queues of this process' categories, less the paused ones (their
        due jobs wait there, in due order), and the category rules read."""
        every = await self.queues.get()
        if not every:
            return [], Rules()
        if not self._clean or self._unacked:
            # The last step failed part-way (Redis or PostgreSQL away), or a
            # batch could not acknowledge: ids may still sit in our processing
            # lists, for instance a take that ran in Redis but whose reply was
            # lost with the connection (a cluster master killed). Nothing else
            # hands back a live worker's list, and the loader skips ids Redis
            # still knows: give them back. (Ids of batches still in flight go
            # back too: they are RUNNING, so whoever takes them skips them, as
            # it skips settled ones.)
            await self.scheduler.dispatcher.give_back(self.worker, every)
            self._unacked = False
        rules = await self.scheduler.categories.current()
        return [p for p in every if p[0] not in rules.paused], rules

    async def _fetch(
        self, pairs: list[tuple[str, int]], rules: Rules, free: int
    ) -> tuple[Taken, float]:
        """Takes up to ``free`` due ids at once; when none is due, sleeps in
        Redis until one is (``_wait_for_one``). Returns the ids and how long
        the executor sleeps after starting them. A failure part-way leaves
        ``_clean`` False: the next turn gives back what it may have taken."""
        self._clean = False
        got, wait_s = await self._take(pairs, rules, free)
        if not got:
            got, sleep_s = await self._wait_for_one(pairs, rules, free, wait_s)
            if not got:
                self._clean = True
                return [], sleep_s
        self._clean = True
        return got, 0.0

    async def _wait_for_one(
        self, pairs: list[tuple[str, int]], rules: Rules, free: int, wait_s: float
    ) -> tuple[Taken, float]:
        """Nothing was due: sleeps in Redis on the most urgent unlimited queue,
        no longer than until a rate-limited one has a token again (BLMOVE's 0
        would be forever), then takes whatever else fell due with it."""
        cfg = self.scheduler.config
        free_pairs = [p for p in pairs if p[0] not in rules.limits]
        if not free_pairs:  # only rate-limited queues: back at their next token
            return [], min(cfg.executor_idle_s, wait_s)
        category, urgency = free_pairs[0]
        got = await self.scheduler.dispatcher.wait_one(
            category, urgency, self.worker, max(MIN_WAIT_S, min(cfg.executor_idle_s, wait_s))
        )
        if not got:
            return [], 0.0
        # The mover pushes what fell due together: take the rest in the same
        # batch rather than paying a claim and a settle for one job.
        more, _ = await self._take(pairs, rules, free - 1)
        return got + more, 0.0

    async def _start_and_hold(self, got: Taken) -> None:
        """Starts the batch in a task of its own and waits for it at most
        HOLD_S before the next turn (see HOLD_S)."""
        await asyncio.wait({self._start(got)}, timeout=HOLD_S)

    async def _take(
        self, pairs: list[tuple[str, int]], rules: Rules, free: int
    ) -> tuple[Taken, float]:
        """Reliable pop of up to ``free`` ids, most urgent queues first; from a
        rate-limited category only as many as its bucket grants (tokens taken
        first, those the queue had no job for given back at once: a job never
        starts without one). Returns the ids and, when a bucket ran dry, how
        long until it has a token again (else infinity)."""
        d, out, wait_s = self.scheduler.dispatcher, [], math.inf
        for c, u in pairs:
            if free <= 0:
                break
            rate, n = rules.limits.get(c), free
            if rate is not None:
                burst = self.scheduler.burst(rate)
                n, wait = await d.tokens(c, rate, burst, min(free, math.ceil(burst)))
                if n == 0:
                    wait_s = min(wait_s, wait)
                    continue
            got = await d.take([(c, u)], self.worker, n)
            ids = got[0][1] if got else []
            if rate is not None and len(ids) < n:
                await d.tokens(c, rate, self.scheduler.burst(rate), 0, n - len(ids))
            if ids:
                out.append(((c, u), ids))
                free -= len(ids)
        return out, wait_s

    def _start(self, got: Taken) -> asyncio.Task[None]:
        taken = sum(len(ids) for _, ids in got)
        self.in_flight += taken
        task = asyncio.create_task(self._batch(got, taken))
        self.batches.add(task)
        task.add_done_callback(self.batches.discard)
        return task

    async def _batch(self, got: Taken, taken: int) -> None:
        left = [taken]

        def release(n: int) -> None:
            self.in_flight -= n
            left[0] -= n
            self._freed.set()

        try:
            await self.process(got, release)
        except Exception as exc:
            # A failed claim or settle (PostgreSQL away, a serialization error)
            # left the batch in our processing list, where nothing would look at
            # it while we are alive: hand it back to the queue. Claimed rows are
            # skipped there (RUNNING) and come back through the reaper.
            log.warning("scheduler_error", role="executor", error=repr(exc))
            with contextlib.suppress(Exception):
                await self.scheduler.dispatcher.give_back(self.worker, [pair for pair, _ in got])
        finally:
            self.in_flight -= left[0]
            self._freed.set()

    async def drain(self) -> None:
        """Waits for the batches in flight (a clean stop lets them settle)."""
        while self.batches:
            await asyncio.gather(*self.batches, return_exceptions=True)

    async def process(self, got: Taken, release: Callable[[int], None]) -> None:
        """Claims the batch, hands back what it could not claim, runs the
        claimed jobs and settles them in waves as they end: a job that ends
        early is settled, acknowledged and its slot freed (``release``) without
        waiting for the slowest job of its batch."""
        where: dict[int, tuple[str, int]] = {job_id: pair for pair, ids in got for job_id in ids}
        claim = await self._claim(where)
        await self._requeue(claim, where)
        release(len(claim.missed))
        await self._run_and_settle(claim.jobs, where, release)

    async def _claim(self, where: dict[int, tuple[str, int]]) -> Claim:
        """Claims the ids in PostgreSQL (a row that cannot be claimed even alone
        is parked) and sorts out the ones it could not claim."""
        scheduler = self.scheduler
        now = scheduler.clock.now()
        due_by = now + timedelta(seconds=scheduler.config.fire_ahead_s)
        async with scheduler.db.connection() as conn:

            async def claim(ids: Sequence[int]) -> list[Job]:
                jobs = await repo.claim(conn, list(ids), now, self.worker, due_by)
                for job in jobs:  # a row written before the rule: parked, not run
                    domain.check_run_at(job.run_at)
                return jobs

            async def claim_one(job_id: int) -> list[Job]:
                # The failed batch claim may have committed (only its result
                # failed to decode): this worker's RUNNING row is then ours.
                jobs = await repo.claim(conn, [job_id], now, self.worker, due_by)
                if not jobs:
                    mine = await repo.claimed_by(conn, job_id, self.worker)
                    jobs = [mine] if mine is not None else []
                for job in jobs:
                    domain.check_run_at(job.run_at)
                return jobs

            async def status_of(ids: Sequence[int]) -> list[repo.Row]:
                return await repo.status_of(conn, ids)

            jobs = await isolate(list(where), claim, self._park, loop=EXECUTOR, one=claim_one)
            claimed = {job.id for job in jobs}
            result = Claim(jobs, [job_id for job_id in where if job_id not in claimed])
            if result.missed:
                # Not claimable: settled, cancelled, running elsewhere, parked
                # (skip them), not due yet by our clock (a stale copy: load it
                # again) or of a paused category (back to its queue, to wait;
                # so is one resumed since the claim, which read it paused).
                for row in await isolate(result.missed, status_of, self._park, loop=EXECUTOR):
                    if row["status"] not in domain.PENDING:
                        continue
                    (result.early if row["run_at"] > due_by else result.held).append(row)
        return result

    async def _requeue(self, claim: Claim, where: dict[int, tuple[str, int]]) -> None:
        """The ids the claim refused: a paused category's back to their queue,
        the others acknowledged (and a stale copy of a job not due yet loaded
        again at its run_at)."""
        await self._hold(claim.held, where)
        gone = {row["id"] for row in claim.held}
        await self._ack_and_reload([i for i in claim.missed if i not in gone], where, claim.early)

    async def _run_and_settle(
        self, jobs: list[Job], where: dict[int, tuple[str, int]], release: Callable[[int], None]
    ) -> None:
        """Runs the claimed jobs (each handler starts at its run_at) and
        finishes each wave of jobs that end together."""
        # Started most urgent first, then in due order: a batch that took a
        # backlog of several urgencies (the take goes most urgent queue first)
        # starts urgency 0 before 9, and after a pause each runs oldest first.
        jobs.sort(key=lambda job: (job.urgency, job.run_at, job.id))
        self.running.update(job.id for job in jobs)
        runs = {asyncio.create_task(self._run(job)): job for job in jobs}
        try:
            async with contextlib.aclosing(_waves(runs)) as waves:
                async for wave in waves:
                    await self._finish(wave, where, release)
        finally:
            for task in runs:
                task.cancel()
            self.running.difference_update(job.id for job in jobs)

    async def _finish(
        self,
        wave: list[tuple[Job, Outcome]],
        where: dict[int, tuple[str, int]],
        release: Callable[[int], None],
    ) -> None:
        """Settles a wave in PostgreSQL, acknowledges it in Redis (handing it
        the jobs due again) and frees its slots."""
        retried = await self._settle(wave)
        ids = [job.id for job, _ in wave]
        self.running.difference_update(ids)
        await self._acknowledge(ids, where, retried)
        release(len(ids))

    async def _settle(self, ran: list[tuple[Job, Outcome]]) -> list[repo.Row]:
        """Marks the jobs that ran DONE, FAILED/DEAD or put back; returns the
        rows due again (to hand to Redis)."""
        done = [(job.id, job.revision) for job, err in ran if err is None]
        failed = [(job, err) for job, err in ran if isinstance(err, JobFailure)]
        deferred = [(job, err) for job, err in ran if isinstance(err, JobDeferred)]
        now = self.scheduler.clock.now()
        # Each settle statement is atomic on its own (UPDATE + log in one
        # statement), and jobs are independent: no BEGIN/COMMIT round trips.
        # A job whose settle fails alone (a constraint its row breaks) is
        # parked rather than left RUNNING for the reaper to rerun forever.
        async with self.scheduler.db.connection() as conn:
            # Completing a job releases the jobs waiting on it: due now.
            back = await isolate(
                done,
                partial(self._complete, conn, now),
                lambda item, exc: self._park(item[0], exc),
                loop=EXECUTOR,
                key=lambda item: item[0],
            )
            rows = await isolate(
                failed,
                partial(self._fail, conn, now),
                lambda item, exc: self._park(item[0].id, exc),
                loop=EXECUTOR,
                key=lambda item: item[0].id,
            )
            back += [row for row in rows if row["status"] == domain.FAILED]
            back += await isolate(
                deferred,
                partial(self._defer, conn, now),
                lambda item, exc: self._park(item[0].id, exc),
                loop=EXECUTOR,
                key=lambda item: item[0].id,
            )
        return back

    async def _complete(
        self, conn: asyncpg.Connection, now: datetime, batch: Sequence[tuple[int, int]]
    ) -> list[repo.Row]:
        return await repo.complete(
            conn,
            [job_id for job_id, _ in batch],
            [revision for _, revision in batch],
            now,
            self.worker,
        )

    async def _fail(
        self, conn: asyncpg.Connection, now: datetime, batch: Sequence[tuple[Job, JobFailure]]
    ) -> list[repo.Row]:
        cfg = self.scheduler.config
        retry_ats = [
            now
            + timedelta(seconds=backoff_delay(job.attempts, cfg.backoff_base_s, cfg.backoff_max_s))
            for job, _ in batch
        ]
        return await repo.fail(
            conn,
            [job.id for job, _ in batch],
            [job.revision for job, _ in batch],
            [failure.public[:ERROR_TEXT_MAX] for _, failure in batch],
            retry_ats,
            now,
            self.worker,
            [failure.detail[:ERROR_TEXT_MAX] for _, failure in batch],
            [failure.permanent for _, failure in batch],
        )

    async def _defer(
        self, conn: asyncpg.Connection, now: datetime, batch: Sequence[tuple[Job, JobDeferred]]
    ) -> list[repo.Row]:
        return await repo.defer(
            conn,
            [job.id for job, _ in batch],
            [job.revision for job, _ in batch],
            [now + timedelta(seconds=why.delay_s) for _, why in batch],
        )

    async def _acknowledge(
        self, ids: list[int], where: dict[int, tuple[str, int]], back: list[repo.Row]
    ) -> None:
        """_ack_and_reload for a wave just settled. Redis away must not end the
        batch: its other jobs are running or waiting for their run_at, and one
        cancelled before it settles would be reaped and run a second time. The
        ids stay in our processing list until the next step gives them back
        (whoever takes them then skips them: they are settled), and the rows
        due again reach Redis through the loader (they are unpushed)."""
        try:
            await self._ack_and_reload(ids, where, back)
        except Exception as exc:
            log.warning("scheduler_error", role="executor", error=repr(exc))
            self._unacked = True

    async def _ack_and_reload(
        self, ids: list[int], where: dict[int, tuple[str, int]], back: list[repo.Row]
    ) -> None:
        """Acknowledges ``ids`` in Redis, then hands it the rows due again."""
        groups: Groups = defaultdict(list)
        for job_id in ids:
            groups[where[job_id]].append(job_id)
        if groups:
            await self.scheduler.dispatcher.ack(self.worker, groups)
        if back:
            horizon = self.scheduler.clock.now() + timedelta(seconds=self.scheduler.config.window_s)
            await self.scheduler.dispatcher.load(
                (row["id"], row["category"], row["urgency"], domain.ms(row["run_at"]))
                for row in back
                if row["run_at"] < horizon
            )

    async def _hold(self, held: list[repo.Row], where: dict[int, tuple[str, int]]) -> None:
        """Jobs the claim refused because their category is paused go back to
        the consumer end of their queues (still known to Redis), first due
        first, and this process stops taking that category at once."""
        if not held:
            return
        groups: Groups = defaultdict(list)
        for row in sorted(held, key=lambda r: (r["run_at"], r["id"])):
            groups[where[row["id"]]].append(row["id"])
        await self.scheduler.dispatcher.put_back(self.worker, groups)
        self.scheduler.categories.paused_seen({row["category"] for row in held if row["paused"]})

    async def _park(self, job_id: int, exc: BaseException) -> None:
        await _park(self.scheduler, EXECUTOR, job_id, exc)

    async def _run(self, job: Job) -> Outcome:
        # Claimed within the fire-ahead: the handler starts at run_at, not before.
        await _until(self.scheduler.clock, job.run_at)
        handler = self.scheduler.handlers.get(job.category)
        if handler is None:
            text = f"no handler for category {job.category!r}"
            return JobFailure(text, text)
        try:
            await handler(job)
        except JobDeferred as exc:
            log.debug("scheduler_job_deferred", job_id=job.id, reason=str(exc))
            return exc
        except JobFailure as exc:
            return _failed(job, exc)
        except ValidationError as exc:
            # A payload its category's model refuses (written before the jobs
            # API checked it): no attempt can read it, so no retry.
            return _failed(job, JobFailure(BAD_PAYLOAD, repr(exc), permanent=True))
        except Exception as exc:
            return _failed(job, JobFailure(handler_failed(job.attempts), repr(exc)))
        return None


async def _waves(
    runs: dict[asyncio.Task[Outcome], Job],
) -> AsyncGenerator[list[tuple[Job, Outcome]], None]:
    """The jobs of ``runs`` with their outcomes, in waves: after the first job
    of a wave ends, the ones that end within WAVE_S join it."""
    pending = set(runs)
    # Every job takes its first step before this task resumes, and one that
    # does no I/O ends there: a batch of them is settled without hanging a
    # wake-up on each of its tasks (asyncio.wait).
    await asyncio.sleep(0)
    while pending:
        ended = {task for task in pending if task.done()}
        if not ended:
            ended, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        pending -= ended
        if pending:  # what ends with it is settled with it
            more, pending = await asyncio.wait(pending, timeout=WAVE_S)
            ended |= more
        yield [(runs[task], task.result()) for task in ended]


async def _until(clock: Clock, at: datetime) -> None:
    """Returns once ``clock`` reads ``at`` or later. It is read again after
    each sleep: the event loop's timers count whole milliseconds from the start
    of its current pass, so a sleep can end a fraction of a millisecond early."""
    while (left_s := (at - clock.now()).total_seconds()) > 0:  # noqa: ASYNC110
        await asyncio.sleep(left_s)


def _failed(job: Job, failure: JobFailure) -> JobFailure:
    log.info(
        "scheduler_job_failed",
        job_id=job.id,
        attempt=job.attempts,
        error=failure.detail,
        permanent=failure.permanent,
    )
    return failure


class Materialiser:
    """Creates the jobs of recurring jobs' occurrences ahead of time (within the
    window), every loader period. Any number may run: see Scheduler.materialise."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    async def step(self) -> float:
        handled, _ = await self.scheduler.materialise()
        if handled >= RECURRING_BATCH:
            return 0.0  # more may be due right now
        return self.scheduler.config.loader_period_s


def _forever(
    stop: asyncio.Event, name: str, step: Callable[[], Awaitable[float]]
) -> Awaitable[None]:
    """Run ``step`` until stop; it returns how long to sleep. Errors (Redis or
    PostgreSQL away) are logged and retried: the truth is in PostgreSQL anyway."""
    return run_paced(
        stop, name, step, retry_s=RETRY_S, log_as="scheduler", field="role", traceback=False
    )


async def run(scheduler: Scheduler, stop: asyncio.Event) -> None:
    """Loader, mover, reaper, executors and recurring-job materialiser of one
    process, until ``stop``."""
    cfg = scheduler.config
    tasks: list[Awaitable[None]] = []
    movers = [Mover(scheduler) for _ in range(cfg.movers)]
    loaders = [Loader(scheduler) for _ in range(cfg.loaders)]
    executors = [Executor(scheduler) for _ in range(cfg.executors)]
    for loader in loaders:
        tasks.append(_forever(stop, "loader", loader.step))
    for mover in movers:
        tasks.append(_forever(stop, "mover", mover.step))
    for _ in range(cfg.reapers):
        tasks.append(_forever(stop, "reaper", Reaper(scheduler).step))
    for _ in range(cfg.materialisers):
        tasks.append(_forever(stop, "materialiser", Materialiser(scheduler).step))
    for executor in executors:
        tasks.append(_forever(stop, "heartbeat", executor.heartbeat))
        tasks.append(_forever(stop, "executor", executor.step))
    try:
        await asyncio.gather(*tasks)
    finally:
        for executor in executors:
            await executor.drain()
        for mover in movers:
            await mover.release()
        for loader in loaders:
            await loader.release()
        for executor in executors:  # a clean stop hands back what this worker took
            with contextlib.suppress(Exception):
                await scheduler.dispatcher.leave(executor.worker)
