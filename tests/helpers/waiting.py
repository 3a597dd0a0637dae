"""Waiting with a bound: every wait of the suite ends, by success or by a clear failure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import pytest


class Worker(Protocol):
    """A background worker run by hand: one round, how much it did (0: idle)."""

    async def run_once(self) -> int: ...


async def drain(*workers: Worker, timeout_s: float = 30.0) -> None:
    """Run ``workers`` in rounds, each once a round, until a round where none did
    anything. Bounded by a deadline, even when a round itself never returns: a
    worker that never goes idle, or hangs, fails the test with its name instead
    of hanging the suite."""
    rounds, running = 0, ""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                busy = False
                for worker in workers:
                    running = type(worker).__name__
                    busy = bool(await worker.run_once()) or busy
                rounds += 1
                if not busy:
                    return
    except TimeoutError:
        pass
    pytest.fail(
        f"drain: not idle after {timeout_s} s ({rounds} full rounds; "
        f"{running}.run_once() was running)"
    )


async def wait_until(
    check: Callable[[], Awaitable[bool] | bool],
    timeout_s: float = 10.0,
    what: str = "the condition",
    step_s: float = 0.05,
) -> float:
    """Poll ``check`` (a state to read, with no event to wait on; sync or async)
    until it is true and return the seconds it took; fails the test with ``what``
    after ``timeout_s``."""
    t0 = time.monotonic()
    while True:
        ok = check()
        if not isinstance(ok, bool):
            ok = await ok
        if ok:
            return time.monotonic() - t0
        if time.monotonic() - t0 >= timeout_s:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(step_s)
