"""core.http.batching.Batcher: what arrives while a batch runs is the next batch."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from reservo.core.http.batching import AGAIN, Batcher, Outcome


class Recorder:
    """A batch run that records its batches and waits for ``release`` to end."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.running = 0
        self.most = 0
        self.release = asyncio.Event()
        self.release.set()

    async def run(self, items: list[int]) -> Sequence[Outcome[int]]:
        self.batches.append(items)
        self.running += 1
        self.most = max(self.most, self.running)
        await self.release.wait()
        self.running -= 1
        out: list[Outcome[int]] = []
        for i in items:
            out.append(ValueError(i) if i < 0 else i * 10)
        return out


async def test_items_of_one_turn_form_one_batch_and_later_ones_the_next() -> None:
    rec = Recorder()
    rec.release.clear()
    batcher = Batcher(rec.run, max_items=100, lanes=1, name="test")
    first = [asyncio.create_task(batcher.submit(i)) for i in range(5)]
    await asyncio.sleep(0.01)
    assert rec.batches == [[0, 1, 2, 3, 4]]
    later = [asyncio.create_task(batcher.submit(i)) for i in range(5, 8)]
    await asyncio.sleep(0.01)
    assert len(rec.batches) == 1  # one lane: the others wait for its batch
    rec.release.set()
    assert await asyncio.gather(*first, *later) == [i * 10 for i in range(8)]
    assert rec.batches == [[0, 1, 2, 3, 4], [5, 6, 7]] and rec.most == 1


async def test_each_lane_runs_a_batch_while_the_others_wait() -> None:
    rec = Recorder()
    rec.release.clear()
    batcher = Batcher(rec.run, max_items=100, lanes=2, name="test")
    first = [asyncio.create_task(batcher.submit(i)) for i in range(3)]
    await asyncio.sleep(0.01)
    second = [asyncio.create_task(batcher.submit(i)) for i in range(3, 5)]
    await asyncio.sleep(0.01)
    assert rec.batches == [[0, 1, 2], [3, 4]] and rec.running == 2  # both lanes busy
    third = [asyncio.create_task(batcher.submit(i)) for i in range(5, 9)]
    await asyncio.sleep(0.01)
    assert len(rec.batches) == 2  # no third lane: these wait, together
    rec.release.set()
    assert await asyncio.gather(*first, *second, *third) == [i * 10 for i in range(9)]
    assert rec.batches[2] == [5, 6, 7, 8] and rec.most == 2
    await batcher.close()


async def test_max_items_caps_a_batch() -> None:
    rec = Recorder()
    batcher = Batcher(rec.run, max_items=3, name="test")
    assert await asyncio.gather(*(batcher.submit(i) for i in range(7))) == [
        i * 10 for i in range(7)
    ]
    assert [len(b) for b in rec.batches] == [3, 3, 1]


async def test_an_error_is_its_items_own_and_again_goes_to_the_next_batch() -> None:
    seen: list[list[int]] = []

    async def run(items: list[int]) -> Sequence[Outcome[int]]:
        seen.append(items)
        out: list[Outcome[int]] = []
        for i in items:
            if i == 2 and len(seen) == 1:
                out.append(AGAIN)
            elif i < 0:
                out.append(KeyError(i))
            else:
                out.append(i)
        return out

    batcher = Batcher(run, name="test")
    results = await asyncio.gather(
        *(batcher.submit(i) for i in (1, -1, 2, 3)), return_exceptions=True
    )
    assert results[0] == 1 and isinstance(results[1], KeyError) and results[2:] == [2, 3]
    assert seen == [[1, -1, 2, 3], [2]]


async def test_a_failing_run_fails_each_item_of_its_batch() -> None:
    async def run(items: list[int]) -> Sequence[Outcome[int]]:
        raise RuntimeError("bug")

    batcher = Batcher(run, name="test")
    results = await asyncio.gather(*(batcher.submit(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)


async def test_a_cancelled_submitter_does_not_cancel_the_batch() -> None:
    rec = Recorder()
    rec.release.clear()
    batcher = Batcher(rec.run, name="test")
    cut = asyncio.create_task(batcher.submit(1))
    kept = asyncio.create_task(batcher.submit(2))
    await asyncio.sleep(0.01)
    cut.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cut
    rec.release.set()
    assert await kept == 20
    await batcher.close()
    assert rec.batches == [[1, 2]] and rec.running == 0
