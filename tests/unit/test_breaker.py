"""Circuit breaker and retry primitives (no I/O; time is injected)."""

from __future__ import annotations

import pytest

from reservo.core.aio.breaker import BREAKER_STATE, BreakerOpen, CircuitBreaker, State
from reservo.core.aio.retry import RETRIES, RETRIES_EXHAUSTED, retry_async


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Boom(Exception):
    pass


async def fail() -> None:
    raise Boom()


async def ok() -> str:
    return "ok"


def breaker(clock: FakeClock, name: str = "t", **kw: float) -> CircuitBreaker:
    return CircuitBreaker(
        name,
        failure_threshold=int(kw.get("threshold", 3)),
        window_s=kw.get("window", 10.0),
        reset_timeout_s=kw.get("reset", 5.0),
        clock=clock,
    )


async def test_opens_after_threshold_failures_within_window_and_fails_fast() -> None:
    clock = FakeClock()
    b = breaker(clock, "opens")
    for _ in range(3):
        with pytest.raises(Boom):
            await b.call(fail)
    assert b.state is State.OPEN
    assert BREAKER_STATE.labels(breaker="opens")._value.get() == State.OPEN.value
    calls = 0

    async def counted() -> None:
        nonlocal calls
        calls += 1

    clock.t += 2
    with pytest.raises(BreakerOpen) as info:
        await b.call(counted)
    assert calls == 0  # fail fast: the function is not even called
    assert info.value.retry_after_s == pytest.approx(3.0)


async def test_failures_outside_the_window_do_not_add_up() -> None:
    clock = FakeClock()
    b = breaker(clock)
    for _ in range(2):
        with pytest.raises(Boom):
            await b.call(fail)
    clock.t += 11  # the first two failures leave the 10 s window
    with pytest.raises(Boom):
        await b.call(fail)
    assert b.state is State.CLOSED
    with pytest.raises(Boom):
        await b.call(fail)
    with pytest.raises(Boom):
        await b.call(fail)
    assert b.state is State.OPEN


async def test_successes_do_not_reset_closed_window_but_half_open_success_closes() -> None:
    clock = FakeClock()
    b = breaker(clock)
    for _ in range(3):
        with pytest.raises(Boom):
            await b.call(fail)
    clock.t += 5
    assert b.state is State.HALF_OPEN
    assert await b.call(ok) == "ok"
    assert b.state is State.CLOSED
    # Closed again with a clean slate: two new failures are not enough.
    for _ in range(2):
        with pytest.raises(Boom):
            await b.call(fail)
    assert b.state is State.CLOSED


async def test_half_open_failure_reopens_for_a_full_reset_timeout() -> None:
    clock = FakeClock()
    b = breaker(clock)
    for _ in range(3):
        with pytest.raises(Boom):
            await b.call(fail)
    clock.t += 5
    with pytest.raises(Boom):
        await b.call(fail)  # the trial call fails
    assert b.state is State.OPEN
    clock.t += 4.9
    with pytest.raises(BreakerOpen):
        await b.call(ok)
    clock.t += 0.1
    assert await b.call(ok) == "ok"
    assert b.state is State.CLOSED


async def test_half_open_admits_only_one_trial_at_a_time() -> None:
    clock = FakeClock()
    b = breaker(clock)
    for _ in range(3):
        with pytest.raises(Boom):
            await b.call(fail)
    clock.t += 5
    async with b:  # the trial is in flight
        with pytest.raises(BreakerOpen):
            async with b:
                pass
    assert b.state is State.CLOSED


async def test_async_with_records_outcomes() -> None:
    clock = FakeClock()
    b = breaker(clock, threshold=1)
    with pytest.raises(Boom):
        async with b:
            raise Boom()
    assert b.state is State.OPEN


def test_rejects_nonsense_configuration() -> None:
    with pytest.raises(ValueError):
        CircuitBreaker("bad", failure_threshold=0)


async def test_retry_backs_off_exponentially_with_jitter_and_counts() -> None:
    sleeps: list[float] = []

    async def sleep(s: float) -> None:
        sleeps.append(s)

    attempts = 0

    async def flaky() -> str:
        nonlocal attempts
        attempts += 1
        if attempts < 4:
            raise Boom()
        return "done"

    before = RETRIES.labels(operation="flaky")._value.get()
    # A lambda returning a coroutine (the usual way to pass arguments) is awaited too.
    result = await retry_async(
        lambda: flaky(), name="flaky", attempts=5, base_s=0.1, max_s=10, sleep=sleep
    )
    assert result == "done" and attempts == 4
    assert RETRIES.labels(operation="flaky")._value.get() - before == 3
    # base * 2^(n-1) plus up to base of jitter.
    for n, s in enumerate(sleeps, start=1):
        assert 0.1 * 2 ** (n - 1) <= s <= 0.1 * 2 ** (n - 1) + 0.1


async def test_retry_gives_up_with_the_original_exception_and_respects_the_cap() -> None:
    sleeps: list[float] = []

    async def sleep(s: float) -> None:
        sleeps.append(s)

    before = RETRIES_EXHAUSTED.labels(operation="hopeless")._value.get()
    with pytest.raises(Boom):
        await retry_async(fail, name="hopeless", attempts=6, base_s=1, max_s=3, sleep=sleep)
    assert len(sleeps) == 5 and max(sleeps) <= 3
    assert RETRIES_EXHAUSTED.labels(operation="hopeless")._value.get() - before == 1


async def test_retry_does_not_retry_other_exceptions_nor_an_open_breaker() -> None:
    sleeps: list[float] = []

    async def sleep(s: float) -> None:
        sleeps.append(s)

    async def wrong() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        await retry_async(wrong, name="w", attempts=5, retry_on=(Boom,), sleep=sleep)

    async def open_breaker() -> None:
        raise BreakerOpen("b", 1.0)

    with pytest.raises(BreakerOpen):
        await retry_async(open_breaker, name="b", attempts=5, sleep=sleep)
    assert sleeps == []
