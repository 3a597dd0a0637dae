"""What the overview shows, gathered in one pass: the per-second series from the
pulse (Redis), the health of each dependency, and the cheap capped reads of
PostgreSQL (repo). A dependency that is down leaves its panels empty and says
so; it never fails the page."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog

from reservo.console import repo
from reservo.console.charts import Sparkline, percent, sparkline
from reservo.console.pulse import Pulse
from reservo.core.db.database import Database
from reservo.core.kernel.clock import Clock
from reservo.core.messaging.transport.kafka import broker_answers, group_lag
from reservo.core.redis.client import RedisGate
from reservo.verify import Status

log = structlog.get_logger(__name__)

WINDOW_S = 180
# Counts above this show as "N+" (an index scan of N entries at most).
CAP = 10_000
SETTLING_SHOWN = 5
LATEST_SHOWN = 5


def capped(n: int) -> str:
    """A count read up to CAP, as the pages show it (the ``capped`` filter):
    "10,000+" at the cap."""
    return f"{CAP:,}+" if n >= CAP else f"{n:,}"


@dataclass(frozen=True)
class Health:
    name: str
    ok: bool


@dataclass(frozen=True)
class Settling:
    match_id: int
    home: str
    away: str
    settled: int
    pending: int  # capped at CAP
    result_at: datetime | None

    @property
    def percent(self) -> int:
        return percent(self.settled, self.settled + self.pending)


@dataclass(frozen=True)
class Jobs:
    due: int  # capped at CAP
    late_s: float  # how long the oldest due job has waited (0 when none is due)
    running: int


@dataclass(frozen=True)
class Count:
    """A count read up to CAP."""

    name: str
    n: int


@dataclass(frozen=True)
class Consumer:
    name: str
    lag: str  # what is waiting for it, in words (depends on the transport)
    dead_letters: int  # capped at CAP


class KafkaLag:
    """The consumer groups' lag, measured in the background at most every
    ``every_s`` (a measurement dials the broker: never on the page's time); the
    page shows the last measurement and its age."""

    def __init__(
        self,
        bootstrap: str,
        groups: Callable[[], dict[str, tuple[str, Sequence[str]]]],
        every_s: float = 5.0,
    ):
        self.bootstrap = bootstrap
        self.groups = groups
        self.every_s = every_s
        self._lag: dict[str, int | None] = {}
        self._ok = True
        self._at: float | None = None  # time.monotonic() of the last measurement
        self._task: asyncio.Task[None] | None = None

    def describe(self, consumer: str) -> str:
        """What waits for ``consumer``, in words; starts a measurement when due."""
        idle = self._task is None or self._task.done()
        if idle and (self._at is None or time.monotonic() - self._at >= self.every_s):
            self._task = asyncio.create_task(self._measure())
        if self._at is None:
            return "measuring…"
        age = f"{time.monotonic() - self._at:.0f} s ago"
        if not self._ok:
            return f"unknown: the broker did not answer ({age})"
        lag = self._lag.get(consumer)
        if lag is None:
            return f"nothing committed yet ({age})"
        return f"{lag:,} records behind ({age})"

    async def _measure(self) -> None:
        try:
            self._lag = await group_lag(self.bootstrap, self.groups())
            self._ok = True
        except Exception as exc:
            log.warning("console_kafka_lag_failed", error=repr(exc))
            self._ok = False
        self._at = time.monotonic()


@dataclass(frozen=True)
class Overview:
    at: datetime
    charts: list[Sparkline]
    health: list[Health]
    database_ok: bool
    backlog: dict[str, Any]
    consumers: list[Consumer]
    settling: list[Settling]
    jobs: Jobs | None
    latest: list[dict[str, Any]]
    kafka: bool  # consumers are Kafka groups (else the relay feeds them)
    # The last scheduled invariant check (reservo verify), None: none known yet.
    invariants: Status | None = None


class Figures:
    def __init__(
        self,
        db: Database,
        gate: RedisGate,
        clock: Clock,
        pulse: Pulse,
        consumers: Callable[[], list[str]],  # every consumer that subscribed
        topics: Callable[[str], Sequence[str]],  # what a consumer reads
        kafka_bootstrap: str | None,
        kafka_group_prefix: str = "reservo",
        invariants: Callable[[], Awaitable[Status | None]] | None = None,
    ) -> None:
        self.db = db
        self.gate = gate
        self.clock = clock
        self.pulse = pulse
        self.consumers = consumers
        self.kafka_bootstrap = kafka_bootstrap
        self.invariants = invariants
        self.kafka_lag = (
            KafkaLag(
                kafka_bootstrap,
                lambda: {c: (f"{kafka_group_prefix}.{c}", topics(c)) for c in consumers()},
            )
            if kafka_bootstrap
            else None
        )

    async def health(self) -> list[Health]:
        checks = [self.db.ping(), self.gate.ping()]
        if self.kafka_bootstrap:
            checks.append(broker_answers(self.kafka_bootstrap, timeout_s=0.1))
        answers = await asyncio.gather(*checks)
        names = ["PostgreSQL", "Redis", "Kafka"]
        return [Health(name, ok) for name, ok in zip(names, answers, strict=False)]

    async def pending_legs(self, match_ids: list[int]) -> dict[int, int]:
        """Each match's pending legs, counted up to CAP (shown through the capped filter)."""
        if not match_ids:
            return {}
        async with self.db.connection() as conn:
            rows = await repo.pending_legs(conn, match_ids, CAP)
        return {r["id"]: r["pending"] for r in rows}

    async def job_statuses(self, statuses: Sequence[str]) -> list[Count]:
        """Jobs per status, each counted up to CAP (an index range per status)."""
        async with self.db.connection() as conn:
            rows = await repo.job_status_counts(conn, list(statuses), CAP)
        return [Count(r["status"], r["n"]) for r in rows]

    async def dead_letter_consumers(self) -> list[Count]:
        """Every consumer that parked a letter, and how many wait for a replay
        (up to CAP)."""
        async with self.db.connection() as conn:
            rows = await repo.dead_letters_waiting(conn, CAP)
        return [Count(r["consumer"], r["waiting"]) for r in rows]

    async def overview(self) -> Overview:
        now = self.clock.now()
        health, series, invariants = await asyncio.gather(
            self.health(), self.pulse.series(WINDOW_S), self._invariants()
        )
        charts = [sparkline(f.name, f.title, series[f.name]) for f in self.pulse.figures]
        database_ok = health[0].ok
        backlog: dict[str, Any] = {}
        consumers: list[Consumer] = []
        settling: list[Settling] = []
        jobs: Jobs | None = None
        latest: list[dict[str, Any]] = []
        if database_ok:
            try:
                async with self.db.connection() as conn:
                    b = await repo.backlog(conn, now)
                    parked = {
                        r["consumer"]: r["waiting"]
                        for r in await repo.dead_letters_waiting(conn, CAP)
                    }
                    rows = await repo.settling_matches(conn, SETTLING_SHOWN, CAP)
                    j = await repo.jobs_due(conn, now, CAP)
                    latest = [dict(r) for r in await repo.latest_appointments(conn, LATEST_SHOWN)]
            except Exception as exc:  # the page still shows what Redis and the pings said
                log.warning("console_overview_read_failed", error=repr(exc))
                database_ok = False
            else:
                backlog = dict(b)
                settling = [
                    Settling(
                        r["id"],
                        r["home"],
                        r["away"],
                        r["settled_bets"],
                        r["pending"],
                        r["result_at"],
                    )
                    for r in rows
                ]
                oldest = j["oldest_pending"]
                late = (
                    (now - oldest).total_seconds() if oldest is not None and oldest <= now else 0.0
                )
                jobs = Jobs(j["due"], late, j["running"])
                consumers = [
                    Consumer(name, self._lag(name, backlog), parked.get(name, 0))
                    for name in self.consumers()
                ]
        return Overview(
            at=now,
            charts=charts,
            health=health,
            database_ok=database_ok,
            backlog=backlog,
            consumers=consumers,
            settling=settling,
            jobs=jobs,
            latest=latest,
            kafka=self.kafka_lag is not None,
            invariants=invariants,
        )

    async def _invariants(self) -> Status | None:
        return await self.invariants() if self.invariants is not None else None

    def _lag(self, consumer: str, backlog: dict[str, Any]) -> str:
        if self.kafka_lag is not None:
            # Each consumer is a Kafka group reading at its own pace (the outbox
            # backlog is what has not reached Kafka yet).
            return self.kafka_lag.describe(consumer)
        # The local transport: the relay hands every event to every consumer as
        # it publishes it, so what waits for a consumer is the outbox backlog.
        return f"{backlog.get('pending', 0):,} events"
