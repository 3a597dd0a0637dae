"""The pulse: per-second figures of every process, summed in a real Redis."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from reservo.bootstrap import Container
from reservo.console.pulse import Pulse
from reservo.console.setup import Console
from reservo.core.kernel import metrics
from reservo.core.kernel.clock import OffsetClock
from reservo.core.redis.client import RedisGate, make_client


def own_namespace(container: Container) -> str:
    """The session's namespace is shared; each test counts on its own keys."""
    return f"{container.settings.redis_namespace}:{uuid.uuid4().hex[:8]}"


def booked(n: int) -> None:
    metrics.BOOKINGS.labels("appointments").inc(n)


async def test_what_the_counters_gained_lands_in_its_second(
    container: Container, clock: OffsetClock
) -> None:
    assert isinstance(container.module(Console).pulse, Pulse)  # what the console reads
    pulse = Pulse(container.gate, own_namespace(container), clock)
    booked(3)
    metrics.CONFLICTS.labels("appointments", "slot_full", "redis").inc(2)
    assert await pulse.sample()
    clock.advance(timedelta(seconds=1))
    series = await pulse.series(10)
    assert [v for v in series["booked"] if v] == [3]
    assert [v for v in series["refused"] if v] == [2]
    assert series["booked"].index(3) == series["refused"].index(2)  # the same second
    assert sum(series["holds"]) == 0  # rentals' bookings are another figure

    booked(1)
    assert await pulse.sample()
    clock.advance(timedelta(seconds=1))
    series = await pulse.series(10)
    assert [v for v in series["booked"] if v] == [3, 1]  # one second after the other


async def test_deltas_wait_in_the_process_while_redis_is_away(
    container: Container, clock: OffsetClock
) -> None:
    dead = RedisGate(make_client("redis://127.0.0.1:1/0", 0.05), backoff_s=0.0)
    pulse = Pulse(dead, own_namespace(container), clock)
    booked(4)
    assert not await pulse.sample()
    pulse.gate = container.gate  # Redis is back
    assert await pulse.sample()
    clock.advance(timedelta(seconds=1))
    assert sum((await pulse.series(5))["booked"]) == 4
    await dead.client.aclose()


async def test_one_sampler_per_process_counts_each_event_once(
    container: Container, clock: OffsetClock
) -> None:
    ns = own_namespace(container)
    a, b = Pulse(container.gate, ns, clock), Pulse(container.gate, ns, clock)
    stop = asyncio.Event()
    runs = [asyncio.create_task(a.run(stop)), asyncio.create_task(b.run(stop))]
    await asyncio.sleep(0.1)
    booked(5)
    await asyncio.sleep(1.5)
    stop.set()
    await asyncio.gather(*runs)
    clock.advance(timedelta(seconds=1))
    assert sum((await a.series(10))["booked"]) == 5
