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
    anything. Bounded by a deadline, even when a round itself hangs: a worker that
    never goes idle, or never returns, fails the test with its name instead of
    hanging the suite."""
    deadline = time.monotonic() + timeout_s
    rounds = 0
    while True:
        busy = []
        for worker in workers:
            left = deadline - time.monotonic()
            try:
                async with asyncio.timeout(max(left, 0)):
                    done = await worker.run_once()
            except TimeoutError:
                pytest.fail(
                    f"drain: {type(worker).__name__}.run_once() still running after {timeout_s} s"
                )
            if done:
                busy.append(type(worker).__name__)
        rounds += 1
        if not busy:
            return
        if time.monotonic() >= deadline:
            pytest.fail(
                f"drain: {', '.join(busy)} still busy after {rounds} rounds in {timeout_s} s"
            )


async def wait_until(
    check: Callable[[], Awaitable[bool]],
    timeout_s: float,
    what: str = "the condition",
    step_s: float = 0.05,
) -> None:
    """Poll ``check`` (a state to read, with no event to wait on) until it is true;
    fails the test with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(step_s)
