"""The feed of cache changes: every ``Cache.bump`` publishes the keys it changed
on one sharded pub/sub channel, and each process listens once, so its own
copies of those values can live as long as the Redis entry instead of a second.

A copy kept on the strength of the feed is only as good as the feed, so the
feed tells how far it can be trusted:

- ``live``: a PING sent on the subscription within the last ``fallback_s`` has
  been answered. Redis answers in order on a connection, so every change
  published before that PING reached Redis has been handled by then. A copy
  served while the feed is live therefore misses no change older than
  ``fallback_s``, even if the connection went silent without an error.
- ``epoch`` moves at every loss and every (re)subscribe, and the copies are
  cleared both times: a change published while nobody listened cannot leave a
  copy behind, and a fill that began under another epoch is kept only for the
  short fallback life.

Sharded pub/sub (SSUBSCRIBE/SPUBLISH, Redis 7) because it works the same on a
single Redis and on a Redis Cluster, where the channel's hash tag puts it on one
shard and the feed listens to that shard's primary directly: the messages and
the PINGs then travel the same connection (a broadcast PUBLISH would reach the
node listened to over the cluster bus, out of order with its PING answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from typing import Any, Protocol

import redis.asyncio
import structlog
from redis.asyncio.client import PubSub
from redis.asyncio.connection import AbstractConnection

from reservo.core.redis import CLUSTER_FAILURES, Client

log = structlog.get_logger(__name__)

# How often the subscription is PINGed: well within any fallback life, so a
# healthy feed stays live.
HEARTBEAT_S = 0.2
# No PING answered for this long: the connection is dropped and opened again.
SILENCE_S = 2.0
# How long an SSUBSCRIBE may take to be confirmed.
CONFIRM_S = 1.0
# Wait between attempts to subscribe while Redis is away.
RETRY_S = 1.0
_names = itertools.count()


class Watcher(Protocol):
    """What the feed keeps in line: a per-process copy of bumped values."""

    def invalidate(self, key: str) -> None: ...

    def clear(self) -> None: ...


class ChangeFeed:
    """One subscription per process, started on first use (``start``), shared by
    every local cache that watches it."""

    def __init__(
        self,
        client: Client,
        channel: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.channel, self._clock = client, channel, clock
        # The client name lets an operator (and the tests) find this connection.
        self.name = f"reservo-changes-{next(_names)}"
        self.epoch = 0
        self._confirmed_at = float("-inf")  # send time of the last answered PING
        self._watchers: list[Watcher] = []
        self._task: asyncio.Task[None] | None = None
        self.retry_s = RETRY_S
        self._lost_once = False

    def watch(self, watcher: Watcher) -> None:
        """Drop ``watcher``'s copy of every key published, and all of them when
        the subscription is lost or made again."""
        self._watchers.append(watcher)

    def live(self, within_s: float) -> bool:
        """Every change published more than ``within_s`` ago has been handled."""
        return self._clock() - self._confirmed_at <= within_s

    def start(self) -> None:
        """Subscribe in the background (once per event loop; no-op when running)."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._run())

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._reset()

    async def _run(self) -> None:
        while True:
            try:
                await self._listen()
            except CLUSTER_FAILURES as exc:
                log.warning("cache.changes_lost", error=repr(exc))
                self._lost_once = True
            finally:
                self._reset()
            await asyncio.sleep(self.retry_s)

    def _reset(self) -> None:
        """Nothing heard from now on: no copy may count on the feed."""
        self._confirmed_at = float("-inf")
        self.epoch += 1
        for watcher in self._watchers:
            watcher.clear()

    async def _listen(self) -> None:
        own = await self._open()
        pubsub = own.pubsub()
        try:
            subscribing_at = self._clock()
            await pubsub.ssubscribe(self.channel)
            reply = await pubsub.get_message(timeout=CONFIRM_S)
            if reply is None or reply["type"] != "ssubscribe":
                raise ConnectionError(f"SSUBSCRIBE not confirmed: {reply!r}")
            # Changes published from now on reach this connection; the copies
            # kept before may have missed some.
            self._reset()
            self._confirmed_at = subscribing_at
            log.info("cache.changes_subscribed", channel=self.channel)
            await self._read(pubsub)
        finally:
            with contextlib.suppress(*CLUSTER_FAILURES):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            with contextlib.suppress(*CLUSTER_FAILURES):
                await own.aclose()

    async def _read(self, pubsub: PubSub) -> None:
        next_ping = self._clock()
        while True:
            now = self._clock()
            if now - self._confirmed_at > SILENCE_S:
                raise ConnectionError(f"no PING answered for {SILENCE_S} s")
            if now >= next_ping:
                await pubsub.ping(repr(now))
                next_ping = now + HEARTBEAT_S
            message = await pubsub.get_message(timeout=HEARTBEAT_S)
            if message is not None:
                self._handle(message)

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "smessage":
            for key in bytes(message["data"]).decode().split("\n"):
                for watcher in self._watchers:
                    watcher.invalidate(key)
        elif kind == "pong":
            with contextlib.suppress(ValueError):  # not one of ours
                self._confirmed_at = max(self._confirmed_at, float(message["data"]))
        elif kind == "sunsubscribe":  # the channel's slot moved to another shard
            raise ConnectionError("the channel moved")

    async def _open(self) -> redis.asyncio.Redis:
        """A client of its own for the subscription, named ``self.name``: to the
        single Redis, or on a cluster to the primary that owns the channel's
        slot (read afresh, as it may have failed over since)."""
        kind: type[AbstractConnection]
        if isinstance(self.client, redis.asyncio.RedisCluster):
            if self._lost_once:  # the owner may have moved: read the layout again
                await self.client.nodes_manager.initialize()
            else:  # the layout the client already has (read once, then a no-op)
                await self.client.initialize()
            node = self.client.get_node_from_key(self.channel)
            if node is None:
                raise ConnectionError(f"no node owns {self.channel}")
            kind, kwargs = node.connection_class, node.connection_kwargs
        else:
            pool = self.client.connection_pool
            kind, kwargs = pool.connection_class, pool.connection_kwargs
        own = redis.asyncio.ConnectionPool(
            connection_class=kind, **{**kwargs, "client_name": self.name}
        )
        return redis.asyncio.Redis.from_pool(own)
