"""Readiness as an orchestrator reads it.

Each dependency has a check (an async probe that answers True when the dependency
answered). A *required* one is what serving needs (PostgreSQL): when it fails the
process is not ready. The others (Redis, a fail-open filter and cache; Kafka,
behind the outbox) only make it *degraded*: every request is still served, so an
orchestrator must not pull the instance, and the failure shows in the body and in
``reservo_dependency_up``.

Every check runs at once, each bounded by ``timeout_s`` (a frozen dependency reads
down, not slow), and the report is reused for ``cache_s``; concurrent callers
share the one check in flight, so a flood of probes costs each dependency one
check per period per process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from reservo.core.kernel.metrics import DEPENDENCY_UP

UP, DOWN, DEGRADED = "up", "down", "degraded"
# The overall status: serving normally, serving without an optional dependency,
# or not serving.
OK, UNAVAILABLE = "ok", "unavailable"


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    probe: Callable[[], Awaitable[bool]]
    required: bool


@dataclass(frozen=True, slots=True)
class Report:
    # name -> "up", or when its check failed "down" (required) / "degraded".
    checks: dict[str, str]

    @property
    def ready(self) -> bool:
        return DOWN not in self.checks.values()

    @property
    def status(self) -> str:
        if not self.ready:
            return UNAVAILABLE
        return DEGRADED if DEGRADED in self.checks.values() else OK


class Readiness:
    def __init__(self, checks: Sequence[Check], *, timeout_s: float, cache_s: float) -> None:
        self.checks = tuple(checks)
        self.timeout_s = timeout_s
        self.cache_s = cache_s
        self._last: Report | None = None
        self._fresh_until = 0.0
        self._running: asyncio.Future[Report] | None = None

    async def report(self) -> Report:
        if self._last is not None and time.monotonic() < self._fresh_until:
            return self._last
        if self._running is None:
            self._running = asyncio.ensure_future(self._check_all())
        # Shielded: a caller that goes away does not cancel the others' check.
        return await asyncio.shield(self._running)

    async def _check_all(self) -> Report:
        try:
            answers = await asyncio.gather(*(self._answers(c) for c in self.checks))
            report = Report(
                {
                    c.name: UP if ok else DOWN if c.required else DEGRADED
                    for c, ok in zip(self.checks, answers, strict=True)
                }
            )
            for c, ok in zip(self.checks, answers, strict=True):
                DEPENDENCY_UP.labels(dependency=c.name).set(1 if ok else 0)
            self._last, self._fresh_until = report, time.monotonic() + self.cache_s
            return report
        finally:
            self._running = None

    async def _answers(self, check: Check) -> bool:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await check.probe()
        except Exception:
            # Whatever went wrong (a timeout, a driver error the probe did not
            # expect), the dependency did not answer in time: that is the finding.
            return False
