"""The feed of cache changes on a Redis Cluster whose master owning the channel
dies: the feed loses its subscription (the copies are cleared and fall back to
the short life), subscribes again to the promoted replica, and a change made by
another process then reaches its copies by message again."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

from reservo.core.cache import Cache, LocalCache
from reservo.core.redis import RedisGate
from tests.redis_cluster import LocalCluster, RedisTarget

NODE_TIMEOUT_MS = 2000


async def _until_live(cache: Cache, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not cache.changes.live(1.0):
        assert time.monotonic() < deadline, f"the feed did not subscribe within {within_s} s"
        await asyncio.sleep(0.02)


async def _gone(copies: LocalCache[int], key: str) -> None:
    """The copy is dropped within 0.5 s: by the message (its life is 30 s)."""
    started = time.monotonic()
    while copies.peek(key) is not None:
        assert time.monotonic() - started < 0.5
        await asyncio.sleep(0.01)


async def test_the_feed_follows_its_channel_to_the_promoted_replica(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", node_timeout_ms=NODE_TIMEOUT_MS) as cluster:
        ns = f"changes-{uuid.uuid4().hex[:8]}"
        mine = Cache(RedisGate(cluster.target.client(0.5), backoff_s=0.1), ns)
        other = Cache(RedisGate(cluster.target.client(0.5), backoff_s=0.1), ns)
        # The fallback life is 30 s: only a message can drop a copy quickly.
        copies = mine.local(30.0, watched=True)
        key = "slots:{doctor:1}:2030-01-01"
        fills = 0

        async def fill() -> tuple[int, float]:
            nonlocal fills
            fills += 1
            return fills, 60.0

        try:
            assert await copies.get(key, fill) == 1  # starts the feed
            await _until_live(mine, 5.0)
            assert len(copies) == 0  # cleared when the subscription was made
            assert await copies.get(key, fill) == 2
            assert await copies.get(key, fill) == 2  # kept
            assert await other.bump(key)
            await _gone(copies, key)
            assert await copies.get(key, fill) == 3
            victim = cluster.master_of(mine.changes.channel)
            epoch = mine.changes.epoch
            cluster.kill(victim.port)
            await asyncio.to_thread(cluster.wait_failover, victim.port, 30)
            assert cluster.master_of(mine.changes.channel).port != victim.port
            await _until_live(mine, 15.0)
            assert mine.changes.epoch > epoch and len(copies) == 0  # cleared, subscribed again
            assert await copies.get(key, fill) == 4  # a copy kept under the new subscription
            assert await copies.get(key, fill) == 4
            # A process started after the failover makes the next change (the
            # pipeline of a client that lived through it keeps asking the dead
            # master: a limit of the client, not of the feed).
            alive = cluster.master_of(mine.changes.channel).port
            late_client = RedisTarget(f"redis://127.0.0.1:{alive}/0", cluster=True).client(0.5)
            late = Cache(RedisGate(late_client, backoff_s=0.1), ns)
            try:
                assert await late.bump(key)
            finally:
                await late.gate.client.aclose()
            await _gone(copies, key)
            assert await copies.get(key, fill) == 5
        finally:
            for cache in (mine, other):
                await cache.close()
                await cache.gate.client.aclose()
