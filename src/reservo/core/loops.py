"""Stop-aware background loops: one way to run work again and again until a
worker is told to stop, so every role logs, survives and stops the same way."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

from reservo.core.errors import DomainError

log = structlog.get_logger(__name__)
T = TypeVar("T")


async def pause(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` or until ``stop`` is set; True when stopped."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), max(0.0, seconds))
    return stop.is_set()


async def run_every(
    stop: asyncio.Event,
    period_s: float,
    name: str,
    work: Callable[[], Awaitable[T]],
    *,
    again: Callable[[T], bool] | None = None,
) -> None:
    """Run ``work`` every ``period_s`` until ``stop``. A dependency away (a 503
    DomainError) is a warning, anything else is logged with its traceback; both
    are retried next period. ``again(result)`` true runs it at once instead
    (a drain that found a full batch)."""
    while not stop.is_set():
        try:
            result = await work()
        except DomainError as exc:
            log.warning("worker_unavailable", worker=name, error=exc.detail)
        except Exception:
            log.exception("worker_error", worker=name)
        else:
            if again is not None and again(result):
                continue
        await pause(stop, period_s)
