"""Pure rules of the scheduler: the Job value, statuses, Redis key names, times."""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import Any

from cronsim import CronSim, CronSimError

from reservo.core.db.rows import FromRow
from reservo.core.http.schemas import EARLIEST, LATEST
from reservo.core.kernel import timezones

SCHEDULED, QUEUED, RUNNING, DONE = "SCHEDULED", "QUEUED", "RUNNING", "DONE"
FAILED, DEAD, CANCELLED = "FAILED", "DEAD", "CANCELLED"
STATUSES = (SCHEDULED, QUEUED, RUNNING, DONE, FAILED, DEAD, CANCELLED)
PENDING = (SCHEDULED, QUEUED, FAILED)
# A job whose parents (POST /api/jobs `after`) are not all DONE yet. Stored
# only: no pending statement takes it (never pushed, never claimed), and the
# API shows it as SCHEDULED (``public_status``), the contract's word for a job
# that has not run and is not due yet.
WAITING = "WAITING"
CANCELLABLE = (*PENDING, WAITING)
# PATCH runAt: a job not claimed yet (a FAILED one waits for its retry). The
# same set as cancel, hence the same refusal code (not_cancellable).
RESCHEDULABLE = CANCELLABLE
# What POST /api/jobs sets when a parent ends DEAD or CANCELLED.
DEPENDENCY_FAILED = "dependency_failed"
MAX_UNIQUE_KEY = 200
MAX_AFTER = 100
# POST /retry: what no worker will run again on its own.
RETRYABLE = (FAILED, DEAD)

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

    @classmethod
    def of_values(cls, values: Iterable[Any]) -> Job:
        """A job from its fields' values in order (a claimed row). The frozen
        dataclass' __init__ sets each of the 15 fields through
        object.__setattr__; the claim builds hundreds of jobs per statement,
        and this takes half the time."""
        job = object.__new__(cls)
        job.__dict__.update(zip(JOB_FIELDS, values, strict=True))
        return job


JOB_FIELDS = tuple(f.name for f in fields(Job))


def public_status(status: str) -> str:
    """A job's status as the API shows it: WAITING is a SCHEDULED job whose
    parents have not all finished."""
    return SCHEDULED if status == WAITING else status


@dataclass(frozen=True, slots=True)
class Extras:
    """What POST /api/jobs may add to a job: its ``unique_key`` (one
    unfinished job per category and key) and the jobs it runs ``after``."""

    unique_key: str | None = None
    after: tuple[int, ...] = ()


NO_EXTRAS = Extras()


@dataclass(frozen=True)
class Recurring(FromRow):
    """A recurring job: ``cron`` (5 fields) read in ``timezone``; ``next_at`` is
    the next occurrence no job exists for yet (None: none left)."""

    id: int
    category: str
    cron: str
    timezone: str
    payload: dict[str, Any]
    urgency: int
    next_at: datetime | None
    created_at: datetime | None = None


class JobFailure(Exception):
    """A handler's failure that keeps apart what the API may show about it
    (``public``, stored as the job's last_error) and what only operators see
    (``detail``: server log and execution log). ``permanent``: no retry, the job
    is DEAD at once (retrying cannot help, e.g. a refused destination)."""

    def __init__(self, public: str, detail: str, *, permanent: bool = False) -> None:
        super().__init__(detail)
        self.public, self.detail, self.permanent = public, detail, permanent


class JobDeferred(Exception):
    """The handler did not run the job, for a reason that is not the job's (its
    destination already has as many calls in flight as it may): it is put back,
    due again after ``delay_s``, and this claim does not count as an attempt."""

    def __init__(self, reason: str, delay_s: float) -> None:
        super().__init__(reason)
        self.delay_s = delay_s


# A category's rate limit, in jobs started per second across every worker:
# below one a day and a half is not a limit but a stop (pause it instead);
# above what a scheduler drains (docs/BENCHMARKS.md, ~18,000/s) means nothing.
MIN_RATE, MAX_RATE = 0.001, 100_000.0


@dataclass(frozen=True)
class Category(FromRow):
    """An operator's settings of one category (job_category; no row: running,
    unlimited) and, for the overview, its jobs due now, running and dead."""

    category: str
    paused: bool
    per_second: float | None
    due: int = 0
    running: int = 0
    dead: int = 0


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
    """The accepted range of every instant (core.http.schemas.Instant), which the
    database repeats (ck_job_run_at_range). A row outside it was written by
    something older than the rule: the loops park it instead of running it."""
    if not EARLIEST <= run_at < LATEST:
        raise ValueError(
            f"run_at {run_at.isoformat()} is outside the accepted range "
            f"[{EARLIEST.isoformat()}, {LATEST.isoformat()})"
        )


# -- recurring jobs ---------------------------------------------------------------

# The longest run of local times a zone ever skipped (Samoa, 2011-12-30: a day).
_MAX_GAP = timedelta(hours=25)


def parse_zone(name: str) -> zoneinfo.ZoneInfo:
    """A time zone by the one rule of every zone (core.kernel.timezones); UnknownZone
    (a ValueError) for anything else."""
    return timezones.zone(name)


def parse_cron(expr: str) -> str:
    """A 5-field cron expression (minute hour day-of-month month day-of-week),
    normalised to single spaces; ValueError when the library refuses it or when
    it never matches (e.g. 30 February)."""
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError("cron needs exactly 5 fields: minute hour day-of-month month day-of-week")
    norm = " ".join(fields)
    try:
        next(CronSim(norm, datetime(2000, 1, 1)))
    except (CronSimError, StopIteration) as exc:
        raise ValueError(f"bad cron expression {expr!r}: {exc}") from exc
    return norm


def local_instant(local: datetime, zone: zoneinfo.ZoneInfo) -> datetime:
    """The UTC instant of a naive local wall time. A time the zone skipped (the
    hour lost when clocks go forward) is the next valid instant: the first local
    minute after it that exists. A time that happens twice (the hour repeated
    when clocks go back) is its first pass (fold=0): it runs once."""
    t, end = local, local + _MAX_GAP
    while t <= end:
        aware = t.replace(tzinfo=zone, fold=0)
        if aware.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == t:
            return aware.astimezone(UTC)
        t = t.replace(second=0, microsecond=0) + timedelta(minutes=1)
    raise ValueError(f"no valid local time in {zone.key} near {local.isoformat()}")


# A bound on the matched wall times that may map to instants already passed: a
# repeated hour holds at most 60 minutes of them, a skipped day 1440; with room.
PASSED_WALL_TIMES = 3000


def occurrences(
    cron: str, zone: zoneinfo.ZoneInfo, after: datetime, until: datetime, limit: int
) -> tuple[list[datetime], datetime | None]:
    """The occurrences strictly after ``after`` and before ``until`` (at most
    ``limit``, in UTC, strictly increasing) and the first occurrence not among
    them (None when there is none before LATEST). Computed on local wall times,
    then mapped to instants by ``local_instant``: the occurrences of a skipped
    hour collapse into the one next valid instant, and the second pass of a
    repeated hour maps to instants already passed, so each runs once."""
    start = after.astimezone(zone).replace(tzinfo=None)
    found: list[datetime] = []
    last = after
    # Wall times the cron matches beyond ``limit`` that may map to instants
    # already passed: at most PASSED_WALL_TIMES of them.
    for n, local in enumerate(CronSim(cron, start)):
        if local.year >= LATEST.year or n > limit + PASSED_WALL_TIMES:
            return found, None
        at = local_instant(local, zone)
        if at >= LATEST:
            return found, None
        if at <= last:
            continue
        if at >= until or len(found) >= limit:
            return found, at
        found.append(at)
        last = at
    return found, None


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
    def synced(self) -> str:
        # The epoch the last full resync of the window loaded, for one resync
        # period: a loader that starts or takes over within it has nothing to
        # rebuild. Lost with its shard, it only costs a full resync.
        return f"{self.ns}:sched:epoch:synced"

    @property
    def workers(self) -> str:
        return f"{self.ns}:sched:workers"

    def alive(self, worker: str) -> str:
        return f"{self.ns}:sched:alive:{worker}"

    def bucket(self, category: str) -> str:
        # The category's token bucket (its rate limit), shared by every worker;
        # a hash tag of its own (one key per script call).
        return f"{self.ns}:{{sched-rate:{category}}}:bucket"


def pair(category: str, urgency: int) -> str:
    return f"{urgency}:{category}"


def unpair(member: str) -> tuple[str, int]:
    urgency, _, category = member.partition(":")
    return category, int(urgency)
