"""How long this process's event loop went without running its tasks.

A loop held by a synchronous call, or a process the machine does not give the
CPU, serves nothing meanwhile: no request, no job, no heartbeat, and nothing
else says so (a job fires late, a request waits, and every other figure only
shows the consequence). A task that asks to wake every TICK_S measures how late
it woke: ``reservo_event_loop_lag_seconds``, and a ``event_loop_stalled`` log
line past STALL_S, so a stall is seen as a stall, with its length."""

from __future__ import annotations

import asyncio

import structlog

from reservo.core.aio.loops import pause
from reservo.core.kernel import metrics

log = structlog.get_logger(__name__)

# Four wake-ups a second: cheap, and a stall is measured to a quarter second.
TICK_S = 0.25
# A loaded process's loop runs late by milliseconds; a second is a stall.
STALL_S = 1.0


async def watch(stop: asyncio.Event, *, tick_s: float = TICK_S, stall_s: float = STALL_S) -> None:
    """Until ``stop``: how late each wake-up came, observed and, past
    ``stall_s``, logged."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time()
        if await pause(stop, tick_s):
            return
        lag_s = max(0.0, loop.time() - asked - tick_s)
        metrics.EVENT_LOOP_LAG.observe(lag_s)
        if lag_s >= stall_s:
            log.warning("event_loop_stalled", lag_s=round(lag_s, 3))
