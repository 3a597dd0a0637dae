"""The one source of time. Every time-based rule asks a Clock, never datetime.now()."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol

# Seconds in an hour, for settings given in hours and TTLs given in seconds.
HOUR_S = 3600


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class OffsetClock:
    """The system clock moved by a settable offset: lets tests 'wait' 15 minutes
    while the real world (PostgreSQL, Redis TTLs) keeps running."""

    def __init__(self, offset: timedelta = timedelta(0)) -> None:
        self.offset = offset

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, delta: timedelta) -> None:
        self.offset += delta
