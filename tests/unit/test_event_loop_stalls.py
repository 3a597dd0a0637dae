"""core/aio/stalls.py: a loop held by a synchronous call is measured and logged
with the length of the stall; a loop that runs on time logs nothing."""

from __future__ import annotations

import asyncio
import time

from structlog.testing import capture_logs

from reservo.core.aio import stalls
from reservo.core.kernel import metrics


def _observed_over(bound: float) -> float:
    """How many lag observations so far were over ``bound`` (a bucket's bound)."""
    samples = metrics.EVENT_LOOP_LAG.collect()[0].samples
    count = next(s.value for s in samples if s.name.endswith("_count"))
    within = next(
        s.value for s in samples if s.name.endswith("_bucket") and float(s.labels["le"]) == bound
    )
    return count - within


async def test_a_held_loop_is_logged_as_a_stall_with_its_length() -> None:
    stop = asyncio.Event()
    before_half, before_one = _observed_over(0.5), _observed_over(1.0)
    with capture_logs() as logs:
        watcher = asyncio.create_task(stalls.watch(stop, tick_s=0.05, stall_s=0.5))
        await asyncio.sleep(0.2)  # a few ticks on time
        time.sleep(0.8)  # noqa: ASYNC251 (the synchronous call that holds the loop)
        await asyncio.sleep(0.2)
        stop.set()
        await watcher
    stalled = [e for e in logs if e["event"] == "event_loop_stalled"]
    assert len(stalled) == 1, logs
    assert 0.7 <= stalled[0]["lag_s"] <= 1.5, stalled
    assert stalled[0]["log_level"] == "warning"
    assert _observed_over(0.5) == before_half + 1  # the stall, in its own bucket
    assert _observed_over(1.0) == before_one


async def test_a_loop_on_time_logs_nothing_and_stops_when_told() -> None:
    stop = asyncio.Event()
    with capture_logs() as logs:
        watcher = asyncio.create_task(stalls.watch(stop, tick_s=0.02, stall_s=0.5))
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.wait_for(watcher, 1)
    assert not [e for e in logs if e["event"] == "event_loop_stalled"]
