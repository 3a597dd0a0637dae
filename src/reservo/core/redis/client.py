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
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio
import redis.exceptions
import structlog
from prometheus_client import Counter
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import SSLConnection, parse_url
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
# A cluster client re-reads the layout after a failed call at most this often
# (redis-py's default is 1 s): after a master's replica is promoted, calls for
# its slots go to the dead master until the next re-read. Every call after a
# failure asks for one; this bounds them to ten a second per client.
TOPOLOGY_REFRESH_S = 0.1
# On a cluster, a failed call that some node answered or could have answered
# (one master dead, a failover under way) holds the gate this long at most, not
# the whole backoff: the other masters keep serving their slots, and a master's
# replica is promoted seconds after it died, so a long hold would make every
# call wait past the promotion (with a 1 s hold, calls for the dead master's slots
# were back 0.4-1.8 s after the promotion; 0.1-0.6 s with this). A cluster none of whose
# nodes answers holds the gate for the whole backoff, as a single Redis does.
CLUSTER_NODE_BACKOFF_S = 0.25


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
    With ``cluster`` the URL names one or more nodes of a Redis Cluster, the way
    a PostgreSQL URL names several hosts (``redis://h1:7001,h2:7002/0``): the
    client reads the layout from the first of them that answers, so it starts
    while any one of them is up. A call that fails there makes the client re-read
    which node owns which slot before its next call (after a failover, the next
    call to a moved slot lands on the promoted replica). No retry either:
    redis-py's cluster pipeline retries by closing every connection of the
    client, calls in flight included, which under concurrency turns one timeout
    into a storm.
    """
    options: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "decode_responses": False,
        "health_check_interval": HEALTH_CHECK_INTERVAL_S,
        "retry": Retry(NoBackoff(), 0),
    }
    nodes = startup_nodes(url)
    if not cluster:
        if len(nodes) > 1:
            raise ValueError("a Redis URL naming several hosts needs RESERVO_REDIS_CLUSTER=true")
        return redis.asyncio.Redis.from_url(url, **options)
    # Credentials, db and options as the URL says them, read from its first host.
    params: dict[str, Any] = dict(parse_url(_first_host(url)))
    del params["host"], params["port"]
    if params.pop("connection_class", None) is SSLConnection:
        params["ssl"] = True
    seeds = [ClusterNode(h, p) for h, p in nodes]
    return _Cluster(
        startup_nodes=seeds,
        topology_refresh_min_interval=TOPOLOGY_REFRESH_S,
        **params,
        **options,
    )


def startup_nodes(url: str) -> list[tuple[str, int]]:
    """The (host, port) pairs a Redis URL names: ``redis://[user:pw@]h1[:p1][,h2[:p2]...]/db``
    (port 6379 when left out; an IPv6 host in brackets)."""
    netloc = urlsplit(url).netloc
    hosts = netloc.rpartition("@")[2]
    nodes: list[tuple[str, int]] = []
    for item in hosts.split(","):
        if item.startswith("["):  # [::1]:7000
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        if not host:
            raise ValueError(f"a Redis URL with an empty host: {url!r}")
        nodes.append((host, int(port or 6379)))
    return nodes


def _first_host(url: str) -> str:
    """``url`` naming only its first host (user, password, db and options kept)."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{hosts.split(',')[0]}"))


def is_cluster(client: Client) -> bool:
    return isinstance(client, redis.asyncio.RedisCluster)


async def evalsha(
    client: Client, script: AsyncScript, keys: list[str], args: Sequence[EncodableT] = ()
) -> Any:
    """One script run by its SHA; loads it once if the server forgot it (restart,
    flush, a replica just promoted), which ran nothing."""
    try:
        return await client.evalsha(script.sha, len(keys), *keys, *args)
    except redis.exceptions.NoScriptError:
        script.sha = await client.script_load(script.script)
        return await client.evalsha(script.sha, len(keys), *keys, *args)


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
        hold = self.backoff_s
        if is_cluster(self.client) and not isinstance(
            exc, redis.exceptions.RedisClusterUnreachableError
        ):
            hold = min(hold, CLUSTER_NODE_BACKOFF_S)
        self._down_until = now + hold
        self._failed = True
        # Many in-flight calls fail together when Redis dies: warn once per period.
        if now >= self._quiet_until:
            self._quiet_until = now + self.backoff_s
            log.warning(
                "redis.unavailable",
                reason=reason,
                error=f"{type(exc).__name__}: {exc}",
                backoff_s=hold,
            )
