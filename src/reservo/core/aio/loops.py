"""Stop-aware background loops: one way to run work again and again until a
worker is told to stop, so every role logs, survives and stops the same way."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

from reservo.core.kernel.errors import DomainError

log = structlog.get_logger(__name__)
T = TypeVar("T")


async def pause(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` or until ``stop`` is set; True when stopped."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), max(0.0, seconds))
    return stop.is_set()


async def run_paced(
    stop: asyncio.Event,
    name: str,
    step: Callable[[], Awaitable[float]],
    *,
    retry_s: float,
    log_as: str = "worker",
    field: str = "worker",
    traceback: bool = True,
) -> None:
    """Run ``step`` until ``stop``; it returns how long to wait before the next
    run (0: yield to the other tasks, then go on). A dependency away (a
    DomainError, e.g. 503) is a warning, anything else an error (with its
    traceback unless ``traceback`` is off, for loops whose dependency's outages
    are routine); both wait ``retry_s`` and run again: the truth is in PostgreSQL."""
    while not stop.is_set():
        try:
            wait = await step()
        except DomainError as exc:
            log.warning(f"{log_as}_unavailable", **{field: name}, error=exc.detail)
            wait = retry_s
        except Exception as exc:
            report = log.exception if traceback else log.warning
            report(f"{log_as}_error", **{field: name}, error=repr(exc))
            wait = retry_s
        if wait > 0:
            await pause(stop, wait)
        else:
            await asyncio.sleep(0)


async def run_every(
    stop: asyncio.Event,
    period_s: float,
    name: str,
    work: Callable[[], Awaitable[T]],
    *,
    again: Callable[[T], bool] | None = None,
) -> None:
    """Run ``work`` every ``period_s`` until ``stop`` (errors as in ``run_paced``).
    ``again(result)`` true runs it at once instead (a drain that found a full
    batch)."""

    async def step() -> float:
        result = await work()
        return 0.0 if again is not None and again(result) else period_s

    await run_paced(stop, name, step, retry_s=period_s)
