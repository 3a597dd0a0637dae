"""An asyncio circuit breaker: closed -> open -> half-open -> closed.

Why our own: the asyncio breakers on PyPI (aiobreaker, last release 2021;
aiocircuitbreaker, 2022) are unmaintained and take no injectable clock, which
makes their timing untestable. This one is small and fully unit-tested.

- CLOSED: calls pass. Failures are remembered for ``window_s``; when
  ``failure_threshold`` of them fall inside the window, the breaker OPENs.
- OPEN: calls fail fast with ``BreakerOpen`` until ``reset_timeout_s`` passed.
- HALF_OPEN: up to ``half_open_max_calls`` trial calls pass; a success closes the
  breaker, a failure opens it again for another ``reset_timeout_s``.

Usage::

    breaker = CircuitBreaker("kafka", failure_threshold=5, window_s=30, reset_timeout_s=10)
    async with breaker:          # raises BreakerOpen when open
        await publish(...)
    result = await breaker.call(fetch, url)
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable
from enum import Enum
from types import TracebackType
from typing import ParamSpec, TypeVar

from prometheus_client import Counter, Gauge

P = ParamSpec("P")
T = TypeVar("T")

BREAKER_STATE = Gauge(
    "reservo_breaker_state",
    "Circuit breaker state (0 closed, 1 half-open, 2 open)",
    ["breaker"],
    multiprocess_mode="max",
)
BREAKER_TRANSITIONS = Counter(
    "reservo_breaker_transitions_total", "Circuit breaker state changes", ["breaker", "to"]
)
BREAKER_REJECTED = Counter(
    "reservo_breaker_rejected_total", "Calls refused because the breaker was open", ["breaker"]
)


class State(Enum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class BreakerOpen(Exception):
    """The breaker refuses calls; ``retry_after_s`` says when it will try again."""

    def __init__(self, name: str, retry_after_s: float) -> None:
        super().__init__(f"circuit breaker {name!r} is open (retry in {retry_after_s:.2f}s)")
        self.name = name
        self.retry_after_s = retry_after_s


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        failure_threshold: int = 5,
        window_s: float = 30.0,
        reset_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        half_open_max_calls: int = 1,
        counts_as_failure: Callable[[BaseException], bool] = lambda exc: isinstance(exc, Exception),
    ) -> None:
        if failure_threshold < 1 or window_s <= 0 or reset_timeout_s < 0:
            raise ValueError("failure_threshold >= 1, window_s > 0, reset_timeout_s >= 0")
        self.name = name
        self.failure_threshold = failure_threshold
        self.window_s = window_s
        self.reset_timeout_s = reset_timeout_s
        self.half_open_max_calls = half_open_max_calls
        self._clock = clock
        self._counts_as_failure = counts_as_failure
        self._failures: deque[float] = deque()
        self._state = State.CLOSED
        self._opened_at = 0.0
        self._trials = 0  # calls admitted while half-open and not yet finished
        BREAKER_STATE.labels(breaker=name).set(State.CLOSED.value)

    @property
    def state(self) -> State:
        # OPEN turns HALF_OPEN by itself once the reset timeout passed.
        if self._state is State.OPEN and self._clock() - self._opened_at >= self.reset_timeout_s:
            self._set(State.HALF_OPEN)
        return self._state

    def _set(self, state: State) -> None:
        if state is self._state:
            return
        self._state = state
        if state is State.OPEN:
            self._opened_at = self._clock()
        if state is not State.HALF_OPEN:
            self._trials = 0
        if state is State.CLOSED:
            self._failures.clear()
        BREAKER_STATE.labels(breaker=self.name).set(state.value)
        BREAKER_TRANSITIONS.labels(breaker=self.name, to=state.name.lower()).inc()

    def before_call(self) -> None:
        """Admit a call or raise BreakerOpen (the low-level half of ``async with``)."""
        state = self.state
        if state is State.OPEN:
            BREAKER_REJECTED.labels(breaker=self.name).inc()
            wait = self.reset_timeout_s - (self._clock() - self._opened_at)
            raise BreakerOpen(self.name, max(0.0, wait))
        if state is State.HALF_OPEN:
            if self._trials >= self.half_open_max_calls:
                BREAKER_REJECTED.labels(breaker=self.name).inc()
                raise BreakerOpen(self.name, 0.0)
            self._trials += 1

    def record_success(self) -> None:
        if self._state is State.HALF_OPEN:
            self._set(State.CLOSED)

    def record_failure(self) -> None:
        now = self._clock()
        if self._state is State.HALF_OPEN:
            self._set(State.OPEN)
            return
        if self._state is State.OPEN:
            return
        self._failures.append(now)
        while self._failures and now - self._failures[0] > self.window_s:
            self._failures.popleft()
        if len(self._failures) >= self.failure_threshold:
            self._set(State.OPEN)

    async def __aenter__(self) -> CircuitBreaker:
        self.before_call()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.record_success()
        elif self._counts_as_failure(exc):
            self.record_failure()
        elif self._state is State.HALF_OPEN:
            # Not a failure (e.g. cancelled): free the trial slot without deciding.
            self._trials = max(0, self._trials - 1)

    async def call(self, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        async with self:
            return await fn(*args, **kwargs)
