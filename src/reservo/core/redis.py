"""Redis client factory and the fail-open gate every Redis helper goes through.

Redis is a filter, cache and dispatcher, never the source of truth. So when it is
down or slow, callers get a safe default instead of an error, and the gate then
skips Redis for ``backoff_s`` so a dead Redis does not cost a timeout per request.

Clients are built with ``decode_responses=False``: every helper deals in bytes
(orjson reads and writes bytes directly), which keeps one convention everywhere.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio
import redis.exceptions
import structlog
from prometheus_client import Counter
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

log = structlog.get_logger(__name__)

T = TypeVar("T")

REDIS_FAILURES = Counter(
    "reservo_redis_failures",
    "Redis calls that failed (error or timeout) and were answered with the fail-open default.",
    ["reason"],
)
REDIS_SKIPPED = Counter(
    "reservo_redis_skipped",
    "Redis calls answered with the fail-open default without trying, during backoff.",
)

# Errors that mean "Redis is not usable right now". On Python 3.11,
# asyncio.TimeoutError is the builtin TimeoutError, itself an OSError.
FAILURES: tuple[type[BaseException], ...] = (
    redis.exceptions.RedisError,
    OSError,
    asyncio.TimeoutError,
)

# Idle pooled connections are PINGed before reuse after this many seconds, so a
# Redis restart shows up as a reconnect rather than a failed request.
HEALTH_CHECK_INTERVAL_S = 30


def make_client(url: str, timeout_s: float) -> redis.asyncio.Redis:
    """A client that fails fast: short socket timeouts and no built-in retries.

    redis-py retries connection errors 10 times by default; here the gate's
    backoff is the retry policy, so the client must give up after one attempt.
    """
    return redis.asyncio.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        decode_responses=False,
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
        retry=Retry(NoBackoff(), 0),
    )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | redis.exceptions.TimeoutError):
        return "timeout"
    if isinstance(exc, OSError | redis.exceptions.ConnectionError):
        return "connection"
    return "error"


class RedisGate:
    """Runs Redis calls, failing open and backing off after a failure.

    ``timeout_s`` (optional) bounds a whole call, pipelines and pool waits
    included; socket timeouts alone only bound each read or connect.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        backoff_s: float = 1.0,
        *,
        timeout_s: float | None = None,
    ) -> None:
        self.client = client
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self._down_until = 0.0
        self._quiet_until = 0.0  # no second warning before this (monotonic)
        self._failed = False

    @property
    def available(self) -> bool:
        """False while in backoff after a failure: calls return their default."""
        return time.monotonic() >= self._down_until

    async def call(self, fn: Callable[[redis.asyncio.Redis], Awaitable[T]], default: T) -> T:
        """``await fn(client)``, or ``default`` if Redis fails or is in backoff."""
        if not self.available:
            REDIS_SKIPPED.inc()
            return default
        try:
            async with asyncio.timeout(self.timeout_s):
                result = await fn(self.client)
        except FAILURES as exc:
            self._on_failure(exc)
            return default
        if self._failed:
            self._failed = False
            log.info("redis.recovered")
        return result

    async def ping(self) -> bool:
        """True if Redis answered; goes through the gate, so never raises."""

        async def _ping(client: redis.asyncio.Redis) -> bool:
            return bool(await client.ping())

        return await self.call(_ping, False)

    def _on_failure(self, exc: BaseException) -> None:
        now = time.monotonic()
        reason = _reason(exc)
        REDIS_FAILURES.labels(reason=reason).inc()
        self._down_until = now + self.backoff_s
        self._failed = True
        # Many in-flight calls fail together when Redis dies: warn once per period.
        if now >= self._quiet_until:
            self._quiet_until = now + self.backoff_s
            log.warning(
                "redis.unavailable",
                reason=reason,
                error=f"{type(exc).__name__}: {exc}",
                backoff_s=self.backoff_s,
            )
