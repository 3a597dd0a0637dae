"""The suite's waits end: ``drain`` and ``wait_until`` fail the test clearly
instead of hanging it (tests/helpers/waiting.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.helpers.waiting import drain, wait_until


class Batches:
    """A worker with ``left`` rounds of work, then idle; counts its rounds."""

    def __init__(self, left: int) -> None:
        self.left, self.rounds = left, 0

    async def run_once(self) -> int:
        self.rounds += 1
        if self.left:
            self.left -= 1
            return 1
        return 0


class Restless:
    """Never idle: there is always more."""

    async def run_once(self) -> int:
        await asyncio.sleep(0)
        return 1


class Stuck:
    """A round that never returns."""

    async def run_once(self) -> int:
        await asyncio.Event().wait()
        return 0


async def test_drain_runs_every_worker_until_a_round_where_none_did_anything() -> None:
    a, b = Batches(3), Batches(1)
    await drain(a, b)
    assert (a.left, b.left) == (0, 0)
    # Three busy rounds of ``a``, then one where both were idle.
    assert (a.rounds, b.rounds) == (4, 4)


async def test_drain_fails_on_a_worker_that_never_goes_idle() -> None:
    started = time.monotonic()
    with pytest.raises(
        pytest.fail.Exception, match=r"not idle after 0.2 s .*Restless.run_once\(\) was running"
    ):
        await drain(Batches(0), Restless(), timeout_s=0.2)
    assert time.monotonic() - started < 2


async def test_drain_fails_on_a_round_that_never_returns() -> None:
    started = time.monotonic()
    with pytest.raises(
        pytest.fail.Exception,
        match=r"not idle after 0.2 s \(0 full rounds; Stuck.run_once\(\) was running\)",
    ):
        await drain(Stuck(), timeout_s=0.2)
    assert time.monotonic() - started < 2


async def test_wait_until_returns_once_true_and_fails_naming_what_it_waited_for() -> None:
    calls = 0

    async def third_time() -> bool:
        nonlocal calls
        calls += 1
        return calls == 3

    await wait_until(third_time, 5, step_s=0.001)
    assert calls == 3

    async def never() -> bool:
        return False

    with pytest.raises(pytest.fail.Exception, match="waiting for the backlog to empty"):
        await wait_until(never, 0.1, "the backlog to empty", step_s=0.01)
