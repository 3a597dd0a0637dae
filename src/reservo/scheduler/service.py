"""The scheduler's use cases and its public facade, ``Scheduler``.

PostgreSQL holds every job; Redis holds only the ids due within the window.
Enqueue writes the row (in the caller's transaction when given one); the loader
guarantees it reaches Redis; the mover promotes due ids; executors claim them in
PostgreSQL with a conditional update before running the handler."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import asyncpg
import structlog
from pydantic import BaseModel, ValidationError

from reservo.core.db.database import Database
from reservo.core.db.reads import read_one
from reservo.core.http.idempotency import Within
from reservo.core.kernel.clock import Clock
from reservo.core.kernel.errors import DomainError, model_issues, validation_error
from reservo.core.messaging.poison import isolate
from reservo.core.redis.client import Client
from reservo.scheduler import domain, repo
from reservo.scheduler.categories import CategoryRules
from reservo.scheduler.config import SchedulerSettings
from reservo.scheduler.dispatch import Dispatch
from reservo.scheduler.domain import Category, Job, Keys, Recurring

log = structlog.get_logger(__name__)

Handler = Callable[[Job], Awaitable[None]]
# Refuses a payload at enqueue time through the API (raises DomainError), e.g.
# an http job's destination; the handler checks again when it runs.
Check = Callable[[dict[str, Any]], None]
# The `loop` label of reservo_poison_rows_total for the recurring-job materialiser.
MATERIALISER = "scheduler.materialiser"
# The longest reason stored on a parked recurring job.
PARK_REASON_MAX = 2000


# Recurring jobs claimed per materialiser pass, and occurrences of one
# recurring job created per pass; DEAD jobs a bulk retry updates per transaction.
RECURRING_BATCH = 100
RECURRING_PER_PASS = 1000
RETRY_BATCH = 1000
# The jobs on either side of one job the console's page lists.
DEPENDENCIES_SHOWN = 500


@dataclass(frozen=True)
class _Window:
    """The times one materialiser pass works with: occurrences before
    ``horizon`` are created, none older than ``oldest`` (the catch-up)."""

    now: datetime
    horizon: datetime
    oldest: datetime

    @classmethod
    def at(cls, now: datetime, cfg: SchedulerSettings) -> _Window:
        return cls(
            now,
            now + timedelta(seconds=cfg.window_s),
            now - timedelta(seconds=cfg.recurring_catchup_s),
        )


def _check_category(category: str) -> None:
    if not domain.valid_category(category):
        raise validation_error(
            f"{category[:80]!r} is not a category name (a-z, 0-9, '.', '_', '-')",
            at=("body", "category"),
        )


class Scheduler:
    """Public facade. Handlers must be idempotent: a job whose worker died is run again."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        client: Client,
        ns: str,
        config: SchedulerSettings,
        *,
        mover_lock: bool = True,
    ) -> None:
        self.db, self.clock, self.config = db, clock, config
        # Off only in tests that run two movers at once on purpose.
        self.mover_lock = mover_lock
        self.retry_batch = RETRY_BATCH
        self.redis = client
        self.keys = Keys(ns)
        self.dispatcher = Dispatch(client, self.keys, config.fire_ahead_s)
        self.categories = CategoryRules(db, config.category_refresh_s)
        self.handlers: dict[str, Handler] = {}
        self.checks: dict[str, Check] = {}
        self.payloads: dict[str, type[BaseModel]] = {}
        self.internal: set[str] = set()
        self._closers: list[Callable[[], Awaitable[None]]] = []
        # Batches committed and waiting for their push: (jobs, job_push id, done).
        self._soon: list[tuple[Sequence[Job], int, asyncio.Future[None]]] = []
        self._pushing: asyncio.Task[None] | None = None
        # job_push rows whose jobs are in Redis now: the next batch deletes them.
        self._pushes_done: list[int] = []

    # -- facade ------------------------------------------------------------------

    def register(
        self,
        category: str,
        handler: Handler,
        check: Check | None = None,
        *,
        payload: type[BaseModel] | None = None,
        public: bool = True,
    ) -> None:
        """``payload``: the model every payload of the category must fit (the
        handler's own); ``public=False``: only an admin creates such jobs
        through the API (core.module.JobKind says why)."""
        if not domain.valid_category(category):
            raise ValueError(f"bad category name {category!r}")
        self.handlers[category] = handler
        if check is not None:
            self.checks[category] = check
        if payload is not None:
            self.payloads[category] = payload
        if not public:
            self.internal.add(category)

    def check_payload(self, category: str, payload: dict[str, Any]) -> None:
        """What the API refuses of a job before creating it: a category without
        a handler, a payload its model does not accept, what the category's own
        check refuses (DomainError, 422)."""
        if category not in self.handlers:
            raise DomainError("unknown_category", f"no handler for category {category!r}")
        model = self.payloads.get(category)
        if model is not None:
            try:
                model.model_validate(payload)
            except ValidationError as exc:
                errors = model_issues(exc.errors(include_url=False), "body", "payload")
                raise validation_error(f"bad payload for category {category}", errors) from None
        check = self.checks.get(category)
        if check is not None:
            check(payload)

    def on_close(self, closer: Callable[[], Awaitable[None]]) -> None:
        self._closers.append(closer)

    async def enqueue(
        self,
        category: str,
        payload: dict[str, Any],
        *,
        run_at: datetime | None = None,
        delay: timedelta | None = None,
        urgency: int = 5,
        idempotency_key: str | None = None,
        conn: asyncpg.Connection | None = None,
    ) -> Job:
        """With ``conn`` the row commits with the caller's transaction and the loader
        will push it (call ``dispatch`` after commit for the fast path); without,
        it is committed and pushed at once when inside the window."""
        if not domain.valid_category(category):
            raise ValueError(f"bad category name {category!r}")
        if not domain.MIN_URGENCY <= urgency <= domain.MAX_URGENCY:
            raise ValueError("urgency must be 0..9")
        now = self.clock.now()
        when = domain.resolve_run_at(now, run_at, delay)
        insert = partial(self._insert, category, urgency, when, payload, idempotency_key, now)
        if conn is not None:
            return await insert(conn)
        async with self.db.transaction() as own:
            job = await insert(own)
        await self.dispatch([job])
        return job

    async def _insert(
        self,
        category: str,
        urgency: int,
        run_at: datetime,
        payload: dict[str, Any],
        key: str | None,
        now: datetime,
        conn: asyncpg.Connection,
    ) -> Job:
        job = await repo.insert_job(
            conn, category, urgency, run_at, payload, self.config.max_attempts, key, now
        )
        if job is None:  # the idempotency key was used before: that job is the answer
            assert key is not None
            job = await repo.job_by_key(conn, category, key)
            assert job is not None
        return job

    async def enqueue_bulk(
        self,
        category: str,
        run_ats: Sequence[datetime],
        payloads: Sequence[dict[str, Any]],
        urgencies: Sequence[int],
    ) -> int:
        """Bulk load (imports, benchmarks): rows only; the loader pushes them."""
        async with self.db.transaction() as conn:
            return await repo.insert_bulk(
                conn,
                category,
                list(urgencies),
                list(run_ats),
                list(payloads),
                self.config.max_attempts,
                self.clock.now(),
            )

    async def dispatch(self, jobs: Sequence[Job]) -> None:
        """Fast path after commit: push jobs inside the window into Redis now.
        A failure here loses nothing; the loader pushes them later."""
        horizon = self.clock.now() + timedelta(seconds=self.config.window_s)
        due = [j for j in jobs if j.status in domain.PENDING and j.run_at < horizon]
        if not due:
            return
        try:
            await self.dispatcher.load(
                (j.id, j.category, j.urgency, domain.ms(j.run_at)) for j in due
            )
            async with self.db.connection() as conn:
                await repo.mark_pushed(conn, [j.id for j in due], [j.revision for j in due])
        except Exception as exc:
            log.warning("scheduler_dispatch_deferred", error=repr(exc), jobs=len(due))

    def push_soon(self, jobs: Sequence[Job], push_id: int) -> asyncio.Future[None]:
        """Hands the jobs a batch committed QUEUED under the job_push row
        ``push_id`` (``create_many``) to Redis, together with the jobs other
        batches committed meanwhile: one pipelined call instead of a round trip
        each, and no statement after it (the row's deletion rides on the next
        batch's insert). The future is done once these jobs were pushed, or the
        push failed and was left to the loader (it pushes the jobs of a job_push
        row older than ``push_grace_s``); the push goes on whether or not
        anybody awaits it (shield it to wait)."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._soon.append((jobs, push_id, done))
        if self._pushing is None or self._pushing.done():
            self._pushing = loop.create_task(self._push_together())
        return done

    async def _push_together(self) -> None:
        await asyncio.sleep(0)  # let the requests finishing in this loop turn join
        while self._soon:
            batch, self._soon = self._soon, []
            jobs = [job for jobs, _, _ in batch for job in jobs]
            try:
                await self.dispatcher.load(
                    (j.id, j.category, j.urgency, domain.ms(j.run_at)) for j in jobs
                )
                self._pushes_done += [push_id for _, push_id, _ in batch]
            except Exception as exc:
                log.warning("scheduler_dispatch_deferred", error=repr(exc), jobs=len(jobs))
            finally:
                for _, _, done in batch:
                    if not done.done():
                        done.set_result(None)

    def take_pushes_done(self) -> list[int]:
        """The job_push rows whose jobs are in Redis, for the caller's
        ``create_many`` to delete; ``keep_pushes_done`` gives them back when
        that transaction did not commit."""
        done, self._pushes_done = self._pushes_done, []
        return done

    def keep_pushes_done(self, push_ids: Sequence[int]) -> None:
        self._pushes_done[:0] = push_ids

    async def cancel(self, job_id: int, *, conn: asyncpg.Connection | None = None) -> bool:
        """SCHEDULED/QUEUED/FAILED -> CANCELLED. True when this call cancelled it."""
        now = self.clock.now()
        if conn is not None:
            return await repo.cancel(conn, job_id, now) is not None
        async with self.db.transaction() as own:
            return await repo.cancel(own, job_id, now) is not None

    async def cancel_by_key(self, category: str, key: str, *, conn: asyncpg.Connection) -> bool:
        """Cancel the job enqueued with this idempotency key, in the caller's
        transaction. True when this call cancelled it."""
        return await repo.cancel_by_key(conn, category, key, self.clock.now())

    # -- use cases behind the HTTP API -------------------------------------------

    def run_at_of(
        self,
        category: str,
        payload: dict[str, Any],
        run_at: datetime | None,
        delay: timedelta | None,
        now: datetime,
    ) -> datetime:
        """What the API checks of a job before creating it (a handler for the
        category, the handler's own check of the payload, the time) and when it
        runs; a refusal is raised (DomainError)."""
        self.check_payload(category, payload)
        try:
            return domain.resolve_run_at(now, run_at, delay)
        except ValueError as exc:
            where = ("body", "runAt" if run_at is not None else "delayMs")
            raise validation_error(str(exc), at=where) from exc

    async def create_many(
        self,
        conn: asyncpg.Connection,
        jobs: Sequence[tuple[str, int, datetime, dict[str, Any]]],
        now: datetime,
        pushes_done: Sequence[int] = (),
        extras: Sequence[domain.Extras] = (),
    ) -> tuple[list[tuple[Job, bool]], int | None]:
        """Jobs (category, urgency, run_at from ``run_at_of``, payload) checked
        already, in the caller's transaction, in one statement, in the order
        given, each with whether it was created (False: an unfinished job of
        the category held its ``extras`` unique key, and that job is given
        instead; the keys are unique within ``jobs``). A job with parents not
        all DONE (``extras``' after, known to exist) is WAITING, one with a
        DEAD or CANCELLED parent CANCELLED at once. Those due within the window
        are written QUEUED under one job_push row, whose id is returned (None:
        none is due that soon): after its commit the caller hands them to
        Redis with ``push_soon``; if it never does (it died), the loader does
        after ``push_grace_s``. Deletes the job_push rows ``pushes_done``
        (``take_pushes_done``) on the way."""
        if not jobs and not pushes_done:
            return [], None
        horizon = now + timedelta(seconds=self.config.window_s)
        push = [when < horizon for _, _, when, _ in jobs]
        return await repo.insert_jobs(
            conn, jobs, push, self.config.max_attempts, now, pushes_done, extras
        )

    async def unknown_jobs(self, conn: asyncpg.Connection, ids: Sequence[int]) -> set[int]:
        """Which of ``ids`` name no job (POST /api/jobs `after`)."""
        if not ids:
            return set()
        return set(ids) - await repo.existing_jobs(conn, ids)

    async def dependencies(self, job_id: int) -> tuple[str | None, list[dict[str, Any]]]:
        """A job's unique key and the jobs on either side of it (``side``
        parent: it waits for them; child: they wait for it), with their
        statuses; at most ``DEPENDENCIES_SHOWN`` of them."""
        async with self.db.connection() as conn:
            key = await repo.unique_key_of(conn, job_id)
            rows = await repo.dependencies_of(conn, job_id, DEPENDENCIES_SHOWN)
        return key, [dict(r) for r in rows]

    async def drop_new(self, conn: asyncpg.Connection, job_ids: Sequence[int]) -> None:
        """Deletes jobs ``create_many`` inserted in the caller's transaction that
        it must not keep after all (their key was answered by another one)."""
        await repo.drop_new_jobs(conn, job_ids)

    async def get(self, job_id: int) -> Job:
        return await read_one(self.db, repo.get_job, job_id, "job_not_found", f"no job {job_id}")

    async def cancel_job(self, job_id: int) -> Job:
        """Cancelling twice answers the cancelled job both times."""
        async with self.db.transaction() as conn:
            job = await repo.cancel(conn, job_id, self.clock.now())
        if job is not None:
            return job
        current = await self.get(job_id)
        if current.status == domain.CANCELLED:
            return current
        raise DomainError(
            "not_cancellable", f"job {job_id} is {current.status} and can no longer be cancelled"
        )

    async def list_jobs(
        self, status: str | None, category: str | None, before: int | None, limit: int
    ) -> list[Job]:
        async with self.db.connection() as conn:
            jobs = await repo.jobs_page(conn, status, category, before, limit)
            if status != domain.SCHEDULED:
                return jobs
            # The API shows a WAITING job as SCHEDULED: it is listed as one.
            jobs += await repo.jobs_page(conn, domain.WAITING, category, before, limit)
        return sorted(jobs, key=lambda job: job.id, reverse=True)[:limit]

    async def retry(self, job_id: int) -> Job:
        """DEAD/FAILED -> SCHEDULED, due now, with a fresh budget of attempts."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            job = await repo.retry(conn, job_id, now, self.config.max_attempts)
        return await self._dispatch_changed(
            job_id, job, "not_retryable", "only DEAD or FAILED jobs can be retried"
        )

    async def reschedule(self, job_id: int, run_at: datetime) -> Job:
        """A new run_at for a job no worker has claimed (SCHEDULED, QUEUED, or
        FAILED waiting for its retry). A past run_at is due now."""
        now = self.clock.now()
        try:
            when = domain.resolve_run_at(now, run_at, None)
        except ValueError as exc:
            raise validation_error(str(exc), at=("body", "runAt")) from exc
        async with self.db.transaction() as conn:
            job = await repo.reschedule(conn, job_id, when)
        # Re-scores the id if Redis holds it at its old time (LOAD's ZADD XX).
        return await self._dispatch_changed(
            job_id, job, "not_cancellable", "it is running or finished"
        )

    async def _dispatch_changed(self, job_id: int, job: Job | None, code: str, why: str) -> Job:
        """Dispatch the job a manager's change returned, or refuse with ``code``
        (409) naming the status that kept the change from applying."""
        if job is None:
            current = await self.get(job_id)
            raise DomainError(code, f"job {job_id} is {current.status}: {why}")
        await self.dispatch([job])
        return job

    async def retry_dead(self, category: str | None) -> int:
        """Every DEAD job (of ``category`` when given) runs again now, as
        ``retry`` does one; returns how many this call retried. Pages of
        ``retry_batch`` jobs in id order, each its own transaction, each
        dispatched after its commit. Requests running together share the jobs
        (queries.sql, retry_dead): each is retried by exactly one of them."""
        if category is not None:
            _check_category(category)
        after, retried = 0, 0
        while True:
            async with self.db.transaction() as conn:
                jobs = await repo.retry_dead(
                    conn,
                    self.clock.now(),
                    self.config.max_attempts,
                    after,
                    self.retry_batch,
                    category,
                )
            await self.dispatch(jobs)
            retried += len(jobs)
            if len(jobs) < self.retry_batch:
                return retried
            after = max(job.id for job in jobs)

    # -- categories ----------------------------------------------------------------

    def _served(self, category: str) -> None:
        """A category's settings are kept only for one a handler serves (a
        module's, internal ones included, or one registered in code): a typo
        would otherwise create a category that nothing runs and that the
        overview lists for ever. 404 ``category_not_found``."""
        _check_category(category)
        if category not in self.handlers:
            raise DomainError(
                "category_not_found",
                f"no handler serves category {category!r} (GET /api/job-categories lists them)",
            )

    async def pause(self, category: str, paused: bool) -> Category:
        """Pauses (or resumes) a category in every worker process: its jobs
        wait in their due order, none runs and none is failed; on resume they
        run in that order. Jobs already running finish."""
        self._served(category)
        async with self.db.connection() as conn:
            got = await repo.set_paused(conn, category, paused, self.clock.now())
        self.categories.forget()
        return got

    async def set_rate(self, category: str, per_second: float | None) -> Category:
        """At most ``per_second`` jobs of the category start per second, across
        every worker process (None: no limit)."""
        self._served(category)
        if per_second is not None and not domain.MIN_RATE <= per_second <= domain.MAX_RATE:
            raise validation_error(
                f"perSecond must be between {domain.MIN_RATE} and {domain.MAX_RATE:g}, or null",
                at=("body", "perSecond"),
            )
        async with self.db.connection() as conn:
            got = await repo.set_rate(conn, category, per_second, self.clock.now())
        self.categories.forget()
        return got

    async def overview(self) -> list[Category]:
        """Every category with a handler here, with jobs or with settings: its
        pause, rate limit and jobs due, running and dead."""
        async with self.db.connection() as conn:
            return await repo.category_overview(conn, sorted(self.handlers), self.clock.now())

    def burst(self, per_second: float) -> float:
        """A rate limit's bucket size: ``rate_burst_s`` of its rate, one job at least."""
        return max(1.0, per_second * self.config.rate_burst_s)

    # -- recurring jobs ------------------------------------------------------------

    async def create_recurring(
        self,
        category: str,
        cron: str,
        timezone: str,
        payload: dict[str, Any],
        urgency: int,
        within: Within[Recurring] | None = None,
    ) -> Recurring:
        """Validates the expression and the zone and stores the recurring job
        with its first occurrence after now; the materialiser creates the jobs."""
        self.check_payload(category, payload)
        try:
            expr = domain.parse_cron(cron)
        except ValueError as exc:
            raise validation_error(str(exc), at=("body", "cron")) from exc
        try:
            zone = domain.parse_zone(timezone)
        except ValueError as exc:
            raise validation_error(str(exc), at=("body", "timezone")) from exc
        now = self.clock.now()
        _, first = domain.occurrences(expr, zone, now, now, 0)
        if first is None:
            raise validation_error(
                "the cron expression has no occurrence left", at=("body", "cron")
            )
        draft = Recurring(0, category, expr, timezone, payload, urgency, first)
        async with self.db.transaction() as conn:
            rec = await repo.insert_recurring(conn, draft, now)
            if within is not None:
                await within(conn, rec)
        return rec

    async def list_recurring(self, before: int | None, limit: int) -> list[Recurring]:
        """Newest first, ``limit`` at most, ids below ``before``."""
        async with self.db.connection() as conn:
            return await repo.recurring_page(conn, before, limit)

    async def delete_recurring(self, recurring_id: int) -> int:
        """Stops future occurrences and cancels the jobs already created for
        occurrences that have not run. Returns how many were cancelled."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            if not await repo.delete_recurring(conn, recurring_id):
                raise DomainError("recurring_job_not_found", f"no recurring job {recurring_id}")
            return await repo.cancel_occurrences(conn, recurring_id, now)

    async def materialise(self) -> tuple[int, list[Job]]:
        """One pass: for each recurring job whose next occurrence falls within
        the window, creates the jobs of its occurrences before the horizon and
        moves its cursor past them, in one transaction. Safe with any number of
        concurrent passes: rows are locked (SKIP LOCKED), and the unique key
        (recurring_id, occurs_at) refuses a second job for one occurrence anyway.
        A recurring job that cannot be expanded even alone (a zone the rule
        refuses, a row that cannot be decoded) is parked and the others go on
        (core.messaging.poison). Returns how many recurring jobs it claimed and the jobs
        it created."""
        now = self.clock.now()
        window = _Window.at(now, self.config)
        async with self.db.connection() as conn, conn.transaction():
            due = await repo.due_recurring_ids(conn, window.horizon, RECURRING_BATCH)
            created = await isolate(
                due,
                partial(self._materialise_claimed, conn, window),
                partial(self._park_recurring, conn, now),
                loop=MATERIALISER,
            )
        await self.dispatch(created)
        return len(due), created

    async def _materialise_claimed(
        self, conn: asyncpg.Connection, window: _Window, ids: Sequence[int]
    ) -> list[Job]:
        """Expands claimed recurring jobs inside a savepoint, so a row error
        undoes only this attempt and the claim's locks stay held."""
        created: list[Job] = []
        async with conn.transaction():
            for rec in await repo.recurring_by_id(conn, ids):
                created += await self._materialise_one(conn, rec, window)
        return created

    async def _materialise_one(
        self, conn: asyncpg.Connection, rec: Recurring, window: _Window
    ) -> list[Job]:
        cfg = self.config
        assert rec.next_at is not None
        # The intake's rules again: a row written before them fails here, alone.
        zone, cron = domain.parse_zone(rec.timezone), domain.parse_cron(rec.cron)
        # next_at itself is an occurrence: start just before it.
        after = rec.next_at - timedelta(microseconds=1)
        if rec.next_at < window.oldest:
            # Down for longer than the catch-up window: what is older than it is
            # not run late any more.
            log.warning(
                "scheduler_recurring_skipped",
                recurring_id=rec.id,
                missed_from=rec.next_at.isoformat(),
                resumed_at=window.oldest.isoformat(),
            )
            after = window.oldest
        instants, nxt = domain.occurrences(cron, zone, after, window.horizon, RECURRING_PER_PASS)
        created = []
        if instants:
            created = await repo.insert_occurrences(
                conn, rec, instants, cfg.max_attempts, window.now
            )
        await repo.advance_recurring(conn, rec.id, rec.next_at, nxt)
        return created

    async def _park_recurring(
        self, conn: asyncpg.Connection, now: datetime, recurring_id: int, exc: BaseException
    ) -> None:
        reason = f"parked by the {MATERIALISER}: {exc!r}"[:PARK_REASON_MAX]
        await repo.park_recurring(conn, recurring_id, now, reason)

    async def queue_lengths(self) -> list[tuple[str, int, int, int]]:
        """What Redis holds per (category, urgency): ids waiting for their time
        inside the window and ids due and ready for an executor, as
        (category, urgency, waiting, ready); one pipelined round trip."""
        return await self.dispatcher.lengths()

    async def executions(self, job_id: int) -> list[dict[str, Any]]:
        async with self.db.connection() as conn:
            return [dict(r) for r in await repo.executions(conn, job_id)]

    # -- background roles --------------------------------------------------------

    def new_worker_id(self, role: str) -> str:
        import os
        import socket

        return f"{role}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"

    async def close(self) -> None:
        if self._pushing is not None:
            await self._pushing
        done = self.take_pushes_done()
        if done:
            # Else the loader would push these jobs again after the grace (a no-op).
            with contextlib.suppress(Exception):
                async with self.db.connection() as conn:
                    await repo.delete_pushes(conn, done)
        for closer in self._closers:
            await closer()
        await self.redis.aclose()
