"""Redis client factory and the fail-open gate every Redis helper goes through.

Redis is a filter, cache and dispatcher, never the source of truth. So when it is
down or slow, callers get a safe default instead of an error, and the gate then
skips Redis for ``backoff_s`` so a dead Redis does not cost a timeout per request.

Clients are built with ``decode_responses=False``: every helper deals in bytes
(orjson reads and writes bytes directly), which keeps one convention everywhere.

The client is a single Redis or a Redis Cluster (``make_client(..., cluster=True)``).
Every key reservo uses names its hash tag (``{...}``) so that each script and
each multi-key command touches one cluster slot; ``pipeline`` runs batches that
may span slots (and nodes) in one round of round trips either way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import redis.asyncio
import redis.exceptions
import structlog
from prometheus_client import Counter
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.typing import EncodableT, KeyT

log = structlog.get_logger(__name__)

T = TypeVar("T")
# What every helper talks to: one Redis, or a Redis Cluster.
Client: TypeAlias = redis.asyncio.Redis | redis.asyncio.RedisCluster

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
# redis-py's cluster client answers CLUSTERDOWN (a master failing over) by
# closing all its connections, those other calls are using too: such a call
# then fails inside redis-py with AttributeError (its socket writer is gone).
# And a cluster none of whose nodes answers (all down, or not up yet) raises
# RedisClusterUnreachableError, which is not a RedisError.
CLUSTER_FAILURES: tuple[type[BaseException], ...] = (
    *FAILURES,
    redis.exceptions.RedisClusterException,
    AttributeError,
)

# Idle pooled connections are PINGed before reuse after this many seconds, so a
# Redis restart shows up as a reconnect rather than a failed request.
HEALTH_CHECK_INTERVAL_S = 30


class _Cluster(redis.asyncio.RedisCluster):
    """redis-py's cluster client, made to read the cluster's layout before a
    command picks its node. Out of the box, commands issued concurrently on a
    fresh client pick their node before the layout is known, and about a quarter
    of 50 such commands failed ("Connection closed by server"); initialising
    first (a no-op once done) made every one of them succeed."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        await self.initialize()
        return await super().execute_command(*args, **kwargs)


def make_client(url: str, timeout_s: float, *, cluster: bool = False) -> Client:
    """A client that fails fast: short socket timeouts and no built-in retries.

    redis-py retries connection errors 10 times by default; here the gate's
    backoff is the retry policy, so the client must give up after one attempt.
    With ``cluster`` the URL names any node of a Redis Cluster (the client reads
    the others from it). A call that fails there makes the client re-read which
    node owns which slot before its next call (after a failover, the next call
    to a moved slot lands on the promoted replica). No retry either: redis-py's
    cluster pipeline retries by closing every connection of the client, calls
    in flight included, which under concurrency turns one timeout into a storm.
    """
    from_url = _Cluster.from_url if cluster else redis.asyncio.Redis.from_url
    return from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        decode_responses=False,
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
        retry=Retry(NoBackoff(), 0),
    )


def is_cluster(client: Client) -> bool:
    return isinstance(client, redis.asyncio.RedisCluster)


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One run of a registered script in a ``pipeline``."""

    script: AsyncScript
    keys: Sequence[KeyT]
    args: Sequence[EncodableT] = ()


# A pipeline entry: a script run, or a raw command such as ("SADD", key, member).
Command: TypeAlias = ScriptCall | tuple[EncodableT, ...]


async def pipeline(client: Client, commands: Sequence[Command]) -> list[Any]:
    """Send ``commands`` in one non-transactional pipeline (on a cluster: one per
    node, concurrently) and return their replies in order; raises the first error.

    Scripts go by EVALSHA. A server that answers NOSCRIPT (restarted, flushed, or
    a replica just promoted) ran nothing for that entry: the scripts are loaded
    (on every primary of a cluster) and only those entries are sent again, so no
    command runs twice. Each entry must keep to one slot; entries may differ.
    """
    replies = await _send(client, commands)
    missing = [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)]
    if missing:
        scripts: dict[str, AsyncScript] = {}
        for i in missing:
            entry = commands[i]
            assert isinstance(entry, ScriptCall)  # only EVALSHA answers NOSCRIPT
            scripts[entry.script.sha] = entry.script
        for script in scripts.values():
            await client.script_load(script.script)
        again = await _send(client, [commands[i] for i in missing])
        for i, reply in zip(missing, again, strict=True):
            replies[i] = reply
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


async def _send(client: Client, commands: Sequence[Command]) -> list[Any]:
    async with client.pipeline(transaction=False) as pipe:
        for c in commands:
            if isinstance(c, ScriptCall):
                pipe.execute_command("EVALSHA", c.script.sha, len(c.keys), *c.keys, *c.args)
            else:
                pipe.execute_command(*c)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        return replies


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | redis.exceptions.TimeoutError):
        return "timeout"
    if isinstance(
        exc,
        OSError | redis.exceptions.ConnectionError | redis.exceptions.RedisClusterUnreachableError,
    ):
        return "connection"
    return "error"


class RedisGate:
    """Runs Redis calls, failing open and backing off after a failure.

    ``timeout_s`` (optional) bounds a whole call, pipelines and pool waits
    included; socket timeouts alone only bound each read or connect.
    """

    def __init__(
        self,
        client: Client,
        backoff_s: float = 1.0,
        *,
        timeout_s: float | None = None,
    ) -> None:
        self.client = client
        self.failures = CLUSTER_FAILURES if is_cluster(client) else FAILURES
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self._down_until = 0.0
        self._quiet_until = 0.0  # no second warning before this (monotonic)
        self._failed = False

    @property
    def available(self) -> bool:
        """False while in backoff after a failure: calls return their default."""
        return time.monotonic() >= self._down_until

    async def call(self, fn: Callable[[Client], Awaitable[T]], default: T) -> T:
        """``await fn(client)``, or ``default`` if Redis fails or is in backoff."""
        if not self.available:
            REDIS_SKIPPED.inc()
            return default
        try:
            async with asyncio.timeout(self.timeout_s):
                result = await fn(self.client)
        except self.failures as exc:
            self._on_failure(exc)
            return default
        if self._failed:
            self._failed = False
            log.info("redis.recovered")
        return result

    async def ping(self) -> bool:
        """True if Redis answered; goes through the gate, so never raises."""

        async def _ping(client: Client) -> bool:
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
