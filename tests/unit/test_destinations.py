"""The share of calls one destination gets (scheduler/destinations.py): a call
beyond it waits while the destination answers, and is refused once it does not."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from reservo.scheduler.destinations import Busy, Destinations

SLOW_S = 0.2


async def _call(slots: Destinations, key: str, seconds: float | asyncio.Event) -> bool:
    """True when the call ran, False when it was refused."""
    try:
        async with slots.slot(key):
            if isinstance(seconds, asyncio.Event):
                await seconds.wait()
            else:
                await asyncio.sleep(seconds)
    except Busy:
        return False
    return True


async def test_a_burst_to_a_quick_destination_waits_its_turn() -> None:
    slots = Destinations(4, SLOW_S)
    ran = await asyncio.gather(*(_call(slots, "quick", 0.01) for _ in range(60)))
    assert all(ran)


async def test_one_hung_call_does_not_refuse_the_calls_that_keep_ending() -> None:
    # One call hangs; the other slot serves 20 calls of 20 ms, twice SLOW_S.
    slots, hang = Destinations(2, SLOW_S), asyncio.Event()
    hung = asyncio.create_task(_call(slots, "mixed", hang))
    await asyncio.sleep(0)
    started = time.monotonic()
    ran = await asyncio.gather(*(_call(slots, "mixed", 0.02) for _ in range(20)))
    assert all(ran) and time.monotonic() - started > SLOW_S
    hang.set()
    assert await hung


async def test_a_destination_that_stops_answering_refuses_the_calls_beyond_its_share() -> None:
    slots, hang = Destinations(2, SLOW_S), asyncio.Event()
    held = [asyncio.create_task(_call(slots, "stuck", hang)) for _ in range(2)]
    started = time.monotonic()
    # Waiting ones give up SLOW_S after the stuck calls started; later ones at once.
    assert await asyncio.gather(*(_call(slots, "stuck", 0) for _ in range(3))) == [False] * 3
    assert SLOW_S <= time.monotonic() - started < SLOW_S + 0.5
    later = time.monotonic()
    assert not await _call(slots, "stuck", 0)
    assert time.monotonic() - later < SLOW_S / 2  # refused at once, not after a wait
    # Another destination is not held back by it.
    assert await _call(slots, "other", 0)
    hang.set()
    assert await asyncio.gather(*held) == [True, True]


@pytest.mark.parametrize("outcome", ["ends", "raises"])
async def test_a_slot_is_given_back_however_the_call_ends(outcome: str) -> None:
    slots = Destinations(1, SLOW_S)
    with pytest.raises(RuntimeError) if outcome == "raises" else contextlib.nullcontext():
        async with slots.slot("once"):
            if outcome == "raises":
                raise RuntimeError("the call failed")
    assert await _call(slots, "once", 0)
    assert not slots._lanes  # forgotten once idle
