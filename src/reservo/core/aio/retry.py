"""Retry with exponential backoff and jitter (tenacity), counted in Prometheus.

Usage::

    result = await retry_async(lambda: publish(event), name="results_publish", attempts=5)

    async for attempt in retrying("results_publish", attempts=5):
        with attempt:
            await publish(event)

Only exceptions in ``retry_on`` that ``retry_if`` accepts are retried (never
BreakerOpen: an open breaker means "stop trying for now", retrying it would
defeat its purpose);
after the last attempt the original exception is re-raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypedDict, TypeVar, Unpack

from prometheus_client import Counter
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from reservo.core.aio.breaker import BreakerOpen

T = TypeVar("T")

RETRIES = Counter("reservo_retries_total", "Retried calls (one per retry)", ["operation"])
RETRIES_EXHAUSTED = Counter(
    "reservo_retries_exhausted_total", "Calls that failed after their last attempt", ["operation"]
)


def retrying(
    name: str,
    *,
    attempts: int = 5,
    base_s: float = 0.1,
    max_s: float = 10.0,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
    retry_if: Callable[[BaseException], bool] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> AsyncRetrying:
    """A tenacity controller: waits base*2^(n-1) plus up to ``base_s`` of jitter,
    capped at ``max_s``; ``sleep`` is injectable so tests need not wait."""
    if attempts < 1:
        raise ValueError("attempts must be >= 1")

    def should_retry(exc: BaseException) -> bool:
        if not isinstance(exc, retry_on) or isinstance(exc, BreakerOpen):
            return False
        return retry_if is None or retry_if(exc)

    def before_sleep(state: RetryCallState) -> None:
        RETRIES.labels(operation=name).inc()

    def on_give_up(state: RetryCallState) -> None:
        RETRIES_EXHAUSTED.labels(operation=name).inc()
        outcome = state.outcome
        assert outcome is not None
        outcome.result()  # re-raise the original exception, not tenacity's RetryError

    return AsyncRetrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential_jitter(multiplier=base_s, max=max_s, jitter=base_s),
        retry=retry_if_exception(should_retry),
        before_sleep=before_sleep,
        retry_error_callback=on_give_up,
        sleep=sleep,
    )


class RetryOptions(TypedDict, total=False):
    """``retrying``'s keyword options, so that ``retry_async`` passes them on
    without restating them (the defaults live in ``retrying`` alone)."""

    attempts: int
    base_s: float
    max_s: float
    retry_on: tuple[type[BaseException], ...]
    retry_if: Callable[[BaseException], bool] | None
    sleep: Callable[[float], Awaitable[None]]


async def retry_async(
    call: Callable[[], Awaitable[T]], *, name: str, **options: Unpack[RetryOptions]
) -> T:
    """Await ``call()`` until it succeeds or ``attempts`` ran out (then re-raise)."""
    controller = retrying(name, **options)

    # tenacity awaits only what it recognises as a coroutine function; a lambda
    # returning a coroutine would be "called" and never awaited.
    async def attempt() -> T:
        return await call()

    result: T = await controller(attempt)
    return result
