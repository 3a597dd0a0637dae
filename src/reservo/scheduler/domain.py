"""Pure rules of the scheduler: the Job value, statuses, Redis key names, times."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from reservo.core.schemas import EARLIEST, LATEST

SCHEDULED, QUEUED, RUNNING, DONE = "SCHEDULED", "QUEUED", "RUNNING", "DONE"
FAILED, DEAD, CANCELLED = "FAILED", "DEAD", "CANCELLED"
STATUSES = (SCHEDULED, QUEUED, RUNNING, DONE, FAILED, DEAD, CANCELLED)
PENDING = (SCHEDULED, QUEUED, FAILED)
CANCELLABLE = PENDING

CATEGORY = re.compile(r"^[a-z][a-z0-9._-]{0,63}$")
MIN_URGENCY, MAX_URGENCY = 0, 9
# Absurd dates are refused rather than stored.
MAX_HORIZON = timedelta(days=5 * 366)


@dataclass(frozen=True)
class Job:
    id: int
    category: str
    urgency: int
    run_at: datetime
    payload: dict[str, Any]
    status: str
    attempts: int = 0
    max_attempts: int = 1
    revision: int = 0
    idempotency_key: str | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    last_error: str | None = None
    worker: str | None = field(default=None, compare=False)


class JobFailure(Exception):
    """A handler's failure that keeps apart what the API may show about it
    (``public``, stored as the job's last_error) and what only operators see
    (``detail``: server log and execution log). ``permanent``: no retry, the job
    is DEAD at once (retrying cannot help, e.g. a refused destination)."""

    def __init__(self, public: str, detail: str, *, permanent: bool = False) -> None:
        super().__init__(detail)
        self.public, self.detail, self.permanent = public, detail, permanent


def valid_category(category: str) -> bool:
    return bool(CATEGORY.match(category))


def resolve_run_at(now: datetime, run_at: datetime | None, delay: timedelta | None) -> datetime:
    """At most one of run_at/delay; neither means now. A past run_at is due now."""
    if run_at is not None and delay is not None:
        raise ValueError("give run_at or delay, not both")
    if delay is not None:
        if delay < timedelta(0):
            raise ValueError("delay must not be negative")
        run_at = now + delay
    if run_at is None:
        return now
    if run_at.tzinfo is None:
        raise ValueError("run_at needs a time zone offset")
    if run_at - now > MAX_HORIZON:
        raise ValueError("run_at is too far in the future")
    check_run_at(run_at)
    return run_at


def check_run_at(run_at: datetime) -> None:
    """The accepted range of every instant (core.schemas.Instant), which the
    database repeats (ck_job_run_at_range). A row outside it was written by
    something older than the rule: the loops park it instead of running it."""
    if not EARLIEST <= run_at < LATEST:
        raise ValueError(
            f"run_at {run_at.isoformat()} is outside the accepted range "
            f"[{EARLIEST.isoformat()}, {LATEST.isoformat()})"
        )


def ms(t: datetime) -> int:
    """Epoch milliseconds: the ZSET score."""
    return int(t.timestamp() * 1000)


@dataclass(frozen=True)
class Keys:
    """Redis key names. Every key of one (category, urgency) shares the hash tag
    ``{sched:category:urgency}``, so each Lua script touches one cluster slot."""

    ns: str

    def tag(self, category: str, urgency: int) -> str:
        return f"{self.ns}:{{sched:{category}:{urgency}}}"

    def future(self, category: str, urgency: int) -> str:
        return f"{self.tag(category, urgency)}:future"

    def queue(self, category: str, urgency: int) -> str:
        return f"{self.tag(category, urgency)}:queue"

    def known(self, category: str, urgency: int) -> str:
        # Ids present anywhere in this pipeline (ZSET, LIST or a processing list):
        # loading a job twice is a no-op.
        return f"{self.tag(category, urgency)}:known"

    def processing(self, category: str, urgency: int, worker: str) -> str:
        return f"{self.tag(category, urgency)}:proc:{worker}"

    @property
    def registry(self) -> str:
        # The (category, urgency) pairs in use: movers and workers read this
        # instead of SCANning the keyspace.
        return f"{self.ns}:sched:keys"

    @property
    def lock(self) -> str:
        return f"{self.ns}:sched:mover-lock"

    @property
    def loader_lock(self) -> str:
        return f"{self.ns}:sched:loader-lock"

    @property
    def epoch(self) -> str:
        # Vanishes with a FLUSHALL or a restart without persistence: the loader
        # then reloads the whole window from PostgreSQL.
        return f"{self.ns}:sched:epoch"

    @property
    def workers(self) -> str:
        return f"{self.ns}:sched:workers"

    def alive(self, worker: str) -> str:
        return f"{self.ns}:sched:alive:{worker}"


def pair(category: str, urgency: int) -> str:
    return f"{urgency}:{category}"


def unpair(member: str) -> tuple[str, int]:
    urgency, _, category = member.partition(":")
    return category, int(urgency)
