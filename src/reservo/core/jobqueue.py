"""The job queue every module may enqueue delayed jobs into.

The scheduler module (``reservo.scheduler``) implements it; the composition root
builds that implementation and hands it to every module's setup as
``Shared.scheduler``. A module depends on this protocol, never on the scheduler,
so the modules that enqueue and the module that runs the jobs stay apart."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel

from reservo.core.module import JobCheck, JobHandler


class QueuedJob(Protocol):
    """What an enqueue hands back: the job's id (kept to cancel it later)."""

    @property
    def id(self) -> int: ...


class JobQueue(Protocol):
    def register(
        self,
        category: str,
        handler: JobHandler,
        check: JobCheck | None = None,
        *,
        payload: type[BaseModel] | None = None,
        public: bool = True,
    ) -> None:
        """Who runs the jobs of a category (the root registers every module's ``jobs``)."""

    async def enqueue(
        self,
        category: str,
        payload: dict[str, Any],
        *,
        run_at: datetime | None = None,
        idempotency_key: str | None = None,
        conn: Any = None,
    ) -> QueuedJob:
        """With ``conn`` the job commits with the caller's transaction (then
        ``dispatch`` it after the commit); an idempotency key already used
        answers the job it created."""

    async def dispatch(self, jobs: Sequence[Any]) -> None:
        """After the commit: hand the jobs due soon to the runners now (a failure
        loses nothing, the queue finds them later)."""

    async def cancel(self, job_id: int, *, conn: Any = None) -> bool: ...

    async def cancel_by_key(self, category: str, key: str, *, conn: Any) -> bool: ...

    async def close(self) -> None: ...
