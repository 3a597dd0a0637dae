"""Builds the verify module: the checks run by the maintenance role every
RESERVO_VERIFY_INTERVAL_S (0: never), their counts exported as the gauge
reservo_invariant_violations{check} and kept for the console."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass

import structlog

from reservo.core.aio.loops import run_every
from reservo.core.kernel import metrics
from reservo.core.module import Module
from reservo.shared import Shared
from reservo.verify import status
from reservo.verify.domain import CHECKS, DEFAULT_GRACE_S, Limits, Report
from reservo.verify.runner import verify

log = structlog.get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class Verify(Module):
    limits: Limits


def limits_of(shared: Shared) -> Limits:
    """A job is lost once the reaper could have taken it back and did not."""
    s = shared.settings.scheduler
    return Limits(grace_s=DEFAULT_GRACE_S, lease_s=s.reaper_timeout_s + s.reaper_period_s)


def setup(shared: Shared) -> Verify:
    limits = limits_of(shared)
    interval = shared.settings.verify_interval_s

    async def once() -> Report:
        report = await verify(shared.db.connection, CHECKS, limits, shared.clock.now())
        await publish(shared, report)
        return report

    def duty(stop: asyncio.Event) -> Awaitable[None]:
        return run_every(stop, interval, "verify", once)

    return Verify(name="verify", limits=limits, maintenance=[duty] if interval > 0 else [])


async def publish(shared: Shared, report: Report) -> None:
    """The run's counts: the gauge (alert on it), the console's copy, a log line."""
    for name, n in report.violations().items():
        metrics.INVARIANT_VIOLATIONS.labels(check=name).set(n)
    await status.save(shared.gate, shared.settings.redis_namespace, report)
    fields = {"violations": report.violations(), "duration_s": round(report.duration_s, 1)}
    if report.ok:
        log.info("invariants_hold", **fields)
    else:
        log.error("invariants_violated", **fields)
