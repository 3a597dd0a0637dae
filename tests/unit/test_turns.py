"""Per-key turns: one holder per key, the others in line in arrival order, and
nothing kept for a key nobody holds."""

from __future__ import annotations

import asyncio

from reservo.core.aio.turns import Turns


async def test_one_holder_per_key_in_arrival_order_and_nothing_kept_after() -> None:
    turns, order, holding = Turns(), [], {"a": 0, "b": 0}
    waited: dict[tuple[str, int], bool] = {}

    async def hold(key: str, i: int) -> None:
        async with turns.turn(key) as w:
            waited[key, i] = w
            holding[key] += 1
            assert holding[key] == 1
            await asyncio.sleep(0.001)
            order.append((key, i))
            holding[key] -= 1

    await asyncio.gather(*(hold(k, i) for i in range(5) for k in ("a", "b")))
    assert [i for k, i in order if k == "a"] == list(range(5))
    assert [i for k, i in order if k == "b"] == list(range(5))
    assert {i: waited["a", i] for i in range(5)} == {0: False, 1: True, 2: True, 3: True, 4: True}
    assert len(turns) == 0


async def test_a_holder_that_raises_or_is_cancelled_passes_the_turn_on() -> None:
    turns = Turns()
    entered = asyncio.Event()

    async def stuck() -> None:
        async with turns.turn("k"):
            entered.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(stuck())
    await entered.wait()
    task.cancel()
    async with turns.turn("k") as waited:
        assert waited
    try:
        async with turns.turn("k"):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    async with turns.turn("k") as waited:
        assert not waited
    assert len(turns) == 0
