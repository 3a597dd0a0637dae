"""What executors need to know of the operators' category settings (pauses and
rate limits, table job_category), read at most once per refresh period per
process: one tiny query a second instead of one per step.

The cache only saves work. A pause is enforced by the claim statement itself
(a stale cache costs a job taken from Redis and put back, never a run); a new
or changed rate limit applies in every process within one refresh period."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from reservo.core.db.database import Database
from reservo.scheduler import repo


@dataclass(frozen=True)
class Rules:
    paused: frozenset[str] = frozenset()
    limits: dict[str, float] = field(default_factory=dict)  # category -> jobs per second


class CategoryRules:
    def __init__(self, db: Database, refresh_s: float) -> None:
        self.db, self.refresh_s = db, refresh_s
        self._rules = Rules()
        self._at = -float("inf")
        self._lock = asyncio.Lock()

    async def current(self) -> Rules:
        if time.monotonic() - self._at < self.refresh_s:
            return self._rules
        async with self._lock:  # the executors of a process ask once between them
            if time.monotonic() - self._at >= self.refresh_s:
                async with self.db.connection() as conn:
                    rows = await repo.category_rules(conn)
                self._rules = Rules(
                    frozenset(r.category for r in rows if r.paused),
                    {r.category: r.per_second for r in rows if r.per_second is not None},
                )
                self._at = time.monotonic()
        return self._rules

    def paused_seen(self, categories: set[str]) -> None:
        """The claim refused jobs of these categories as paused: stop taking
        them now rather than at the next refresh."""
        r = self._rules
        self._rules = Rules(r.paused | categories, r.limits)

    def forget(self) -> None:
        """The next ``current`` reads the table (this process changed it)."""
        self._at = -float("inf")
