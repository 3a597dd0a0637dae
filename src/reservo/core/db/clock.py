"""PostgreSQL's clock, read in this process: the time every decision takes.

Every time-based rule asks a Clock (core/kernel/clock.py) and compares what it
reads with times other processes wrote: a hold's end set by an API process, a
heartbeat stamped by another worker, a job's run_at. With each process's own
wall clock, a worker 30 s ahead expired holds 30 s early, started jobs before
their time and reaped the jobs of live workers as lost. So a process reads
PostgreSQL's clock (``clock_timestamp()``) at start and every
``sync_interval_s``, and between two readings counts from the last one on its
monotonic clock, which no wall-clock step or skew moves. Every process then
agrees with PostgreSQL, and with each other, to within one round trip to the
database (never ahead of PostgreSQL's clock: the reading is anchored where its
answer arrived) plus the drift of a monotonic clock over one interval (parts per
million). Before its first reading (PostgreSQL away since the process started)
it reads its own wall clock; a worker waits for that first reading before its
roles start (``first``).

The skew of the process's own wall clock against PostgreSQL's is exported as
``reservo_clock_skew_seconds`` and logged (``clock_skew``) past ``alert_s``: it
changes no decision any more, but says the machine's time service is broken."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import structlog
from prometheus_client import Gauge

from reservo.core.aio.loops import pause
from reservo.core.db.database import Database, Queries

log = structlog.get_logger(__name__)
Q = Queries.load("reservo.core.db")

CLOCK_SKEW = Gauge(
    "reservo_clock_skew_seconds",
    "This process's wall clock minus PostgreSQL's (positive: ahead), at its last reading",
    multiprocess_mode="liveall",
)
# While no reading has succeeded, the next attempt comes this soon.
RETRY_S = 1.0


class DatabaseClock:
    """A Clock reading PostgreSQL's time (see the module's docstring)."""

    def __init__(self, db: Database, *, sync_interval_s: float, alert_s: float) -> None:
        self.db = db
        self.sync_interval_s, self.alert_s = sync_interval_s, alert_s
        # PostgreSQL's time at one instant, and this process's monotonic reading then.
        self._anchor: tuple[datetime, float] | None = None
        self._last = datetime.min.replace(tzinfo=UTC)
        self.skew_s: float | None = None

    @property
    def synced(self) -> bool:
        return self._anchor is not None

    def now(self) -> datetime:
        if self._anchor is None:
            at = datetime.now(UTC)
        else:
            db_at, mono_at = self._anchor
            at = db_at + timedelta(seconds=time.monotonic() - mono_at)
        # A new reading may land a fraction of a millisecond behind the old one's
        # count: time read here never goes back.
        if at < self._last:
            return self._last
        self._last = at
        return at

    async def sync(self) -> float:
        """Reads PostgreSQL's clock once; returns this process's skew (seconds)."""
        async with self.db.connection() as conn:
            wall_before = time.time()
            db_at: datetime = await conn.fetchval(Q.clock_now)
            mono_after, wall_after = time.monotonic(), time.time()
        # The statement read the clock somewhere in the round trip. Anchored at its
        # end, the count is never ahead of PostgreSQL's clock (late by at most the
        # round trip): a job started "at" its run_at, or a hold ended, is never
        # early, only up to a round trip late. Anchored at the middle it was up to
        # half a round trip early (0.9 ms, seen by tests/acceptance's lateness test).
        self._anchor = (db_at, mono_after)
        skew = (wall_before + wall_after) / 2 - db_at.timestamp()
        self.skew_s = skew
        CLOCK_SKEW.set(skew)
        if abs(skew) > self.alert_s:
            log.warning("clock_skew", skew_s=round(skew, 3), alert_s=self.alert_s)
        return skew

    async def first(self, stop: asyncio.Event) -> None:
        """Returns once PostgreSQL's clock was read (or ``stop`` is set)."""
        while not self.synced and not stop.is_set():
            try:
                await self.sync()
            except Exception as exc:
                log.warning("clock_sync_failed", error=repr(exc))
                await pause(stop, RETRY_S)

    async def run(self, stop: asyncio.Event) -> None:
        """Reads PostgreSQL's clock again every ``sync_interval_s`` until ``stop``."""
        while not stop.is_set():
            wait = self.sync_interval_s
            try:
                await self.sync()
            except Exception as exc:  # PostgreSQL away: the count goes on from the last one
                log.warning("clock_sync_failed", error=repr(exc))
                wait = RETRY_S if not self.synced else min(wait, RETRY_S * 5)
            await pause(stop, wait)
