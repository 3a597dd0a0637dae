"""The scheduler's use cases and its public facade, ``Scheduler``.

PostgreSQL holds every job; Redis holds only the ids due within the window.
Enqueue writes the row (in the caller's transaction when given one); the loader
guarantees it reaches Redis; the mover promotes due ids; executors claim them in
PostgreSQL with a conditional update before running the handler."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import redis.asyncio
import structlog

from reservo.core.clock import Clock
from reservo.core.db import Database
from reservo.core.errors import DomainError
from reservo.core.idempotency import Within
from reservo.scheduler import domain, repo
from reservo.scheduler.dispatch import Dispatch
from reservo.scheduler.domain import Job, Keys

log = structlog.get_logger(__name__)

Handler = Callable[[Job], Awaitable[None]]
# Refuses a payload at enqueue time through the API (raises DomainError), e.g.
# an http job's destination; the handler checks again when it runs.
Check = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Config:
    window_s: float = 300.0
    loader_period_s: float = 5.0
    resync_period_s: float = 60.0
    loader_batch: int = 5000
    mover_batch: int = 1000
    mover_idle_s: float = 0.01
    mover_lock: bool = True
    loader_lock: bool = True
    lock_ttl_ms: int = 5000
    max_attempts: int = 5
    backoff_base_s: float = 1.0
    backoff_max_s: float = 600.0
    loaders: int = 1
    movers: int = 1
    reapers: int = 1
    executors: int = 2
    executor_batch: int = 200
    executor_idle_s: float = 0.05
    heartbeat_s: float = 2.0
    reaper_timeout_s: float = 15.0
    reaper_period_s: float = 2.0


class Scheduler:
    """Public facade. Handlers must be idempotent: a job whose worker died is run again."""

    def __init__(
        self, db: Database, clock: Clock, client: redis.asyncio.Redis, ns: str, config: Config
    ) -> None:
        self.db, self.clock, self.config = db, clock, config
        self.redis = client
        self.keys = Keys(ns)
        self.dispatcher = Dispatch(client, self.keys)
        self.handlers: dict[str, Handler] = {}
        self.checks: dict[str, Check] = {}
        self._closers: list[Callable[[], Awaitable[None]]] = []

    # -- facade ------------------------------------------------------------------

    def register(self, category: str, handler: Handler, check: Check | None = None) -> None:
        if not domain.valid_category(category):
            raise ValueError(f"bad category name {category!r}")
        self.handlers[category] = handler
        if check is not None:
            self.checks[category] = check

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
        if conn is not None:
            return await self._insert(conn, category, urgency, when, payload, idempotency_key, now)
        async with self.db.transaction() as own:
            job = await self._insert(own, category, urgency, when, payload, idempotency_key, now)
        await self.dispatch([job])
        return job

    async def _insert(
        self,
        conn: asyncpg.Connection,
        category: str,
        urgency: int,
        run_at: datetime,
        payload: dict[str, Any],
        key: str | None,
        now: datetime,
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

    async def create(
        self,
        category: str,
        payload: dict[str, Any],
        *,
        urgency: int,
        run_at: datetime | None,
        delay: timedelta | None,
        within: Within[Job] | None = None,
    ) -> Job:
        if category not in self.handlers:
            raise DomainError("unknown_category", f"no handler for category {category!r}")
        check = self.checks.get(category)
        if check is not None:
            check(payload)
        now = self.clock.now()
        try:
            when = domain.resolve_run_at(now, run_at, delay)
        except ValueError as exc:
            raise DomainError("validation_error", str(exc)) from exc
        async with self.db.transaction() as conn:
            job = await self._insert(conn, category, urgency, when, payload, None, now)
            if within is not None:
                await within(conn, job)
        await self.dispatch([job])
        return job

    async def get(self, job_id: int) -> Job:
        async with self.db.connection() as conn:
            job = await repo.get_job(conn, job_id)
        if job is None:
            raise DomainError("job_not_found", f"no job {job_id}")
        return job

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

    async def executions(self, job_id: int) -> list[dict[str, Any]]:
        async with self.db.connection() as conn:
            return [dict(r) for r in await repo.executions(conn, job_id)]

    # -- background roles --------------------------------------------------------

    def new_worker_id(self, role: str) -> str:
        import os
        import socket

        return f"{role}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"

    async def close(self) -> None:
        for closer in self._closers:
            await closer()
        await self.redis.aclose()
