"""JSON cache and "full marks" in Redis, all failing open.

A miss is always safe: the caller reads the database. A "full mark" says "this
thing was seen full recently" so the hot path can refuse early without touching
the database; "not marked" (also the fail-open answer) only means "go and check".
Values are written with a TTL, and writers invalidate explicitly with ``delete``.
"""

from __future__ import annotations

from typing import Any

import orjson
import redis.asyncio
import redis.exceptions
import structlog

from reservo.core.ratelimit import Decision, RateLimiter, decide, fail_open, rate_key
from reservo.core.redis import RedisGate

log = structlog.get_logger(__name__)


def _ttl_ms(ttl_s: float) -> int:
    ttl_ms = int(ttl_s * 1000)
    if ttl_ms <= 0:
        raise ValueError("ttl_s must be positive: cache entries never live forever")
    return ttl_ms


class Cache:
    """Keys are ``{namespace}:cache:{key}`` for values, ``{namespace}:mark:{key}`` for marks."""

    def __init__(self, gate: RedisGate, namespace: str = "reservo") -> None:
        self.gate = gate
        self.namespace = namespace

    def value_key(self, key: str) -> str:
        return f"{self.namespace}:cache:{key}"

    def mark_key(self, key: str) -> str:
        return f"{self.namespace}:mark:{key}"

    # --- values -------------------------------------------------------------

    async def get_json(self, key: str) -> Any | None:
        """The cached value, or None on a miss, an unreadable entry, or Redis down."""
        rkey = self.value_key(key)

        async def _get(client: redis.asyncio.Redis) -> bytes | str | None:
            raw: bytes | str | None = await client.get(rkey)
            return raw

        raw = await self.gate.call(_get, None)
        if raw is None:
            return None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            # A corrupt entry is a miss, not an outage; the next set_json replaces it.
            log.warning("cache.corrupt_entry", key=rkey)
            return None

    async def set_json(self, key: str, value: Any, ttl_s: float) -> bool:
        """Store ``value`` for ``ttl_s``; False if Redis did not take it.

        Encoding errors raise: an unserialisable value is a bug, not an outage.
        """
        rkey, data, px = self.value_key(key), orjson.dumps(value), _ttl_ms(ttl_s)

        async def _set(client: redis.asyncio.Redis) -> bool:
            return bool(await client.set(rkey, data, px=px))

        return await self.gate.call(_set, False)

    async def delete(self, *keys: str) -> int:
        """Invalidate cached values; returns how many existed (0 if Redis is down).

        One UNLINK per key in a non-transactional pipeline: one round trip, and no
        CROSSSLOT error on a cluster, where a multi-key DEL would need one slot.
        """
        return await self._unlink([self.value_key(k) for k in keys])

    # --- full marks -----------------------------------------------------------

    async def mark(self, key: str, ttl_s: float) -> bool:
        """Note that ``key`` is full for ``ttl_s``; False if Redis did not take it."""
        rkey, px = self.mark_key(key), _ttl_ms(ttl_s)

        async def _mark(client: redis.asyncio.Redis) -> bool:
            return bool(await client.set(rkey, b"1", px=px))

        return await self.gate.call(_mark, False)

    async def is_marked(self, key: str) -> bool:
        """True only if Redis says the mark is set; False when unknown (fail open)."""
        rkey = self.mark_key(key)

        async def _exists(client: redis.asyncio.Redis) -> bool:
            return bool(await client.exists(rkey))

        return await self.gate.call(_exists, False)

    async def clear_mark(self, key: str) -> bool:
        """Remove a mark (e.g. a seat was released); True if one was set."""
        return await self._unlink([self.mark_key(key)]) > 0

    # --- hot path -------------------------------------------------------------

    async def hit_and_check(
        self,
        limiter: RateLimiter,
        scope: str,
        subject: str | int,
        limit: int,
        window_s: int,
        *marks: str,
    ) -> tuple[Decision, tuple[bool, ...]]:
        """Rate-limit hit and mark checks (one answer per mark) in one command.

        One script (INCR + PTTL + EXISTS of each mark) run by EVALSHA directly: a
        pipeline of EVALSHA plus one EXISTS per mark cost ~200 us of redis-py CPU
        per call against ~90-130 us for the single command. The keys then have to
        live on one server, which they do: reservo talks to one Redis, not a
        cluster (a cluster would need the marks under the rate key's hash tag).
        On NOSCRIPT (Redis restarted or flushed its script cache) nothing ran, so
        load and retry once. Fails open to ``(allowed, nothing marked)``.
        """
        if limit < 0 or window_s <= 0:
            raise ValueError("limit must be >= 0 and window_s > 0")
        rkey = rate_key(scope, subject, limiter.namespace)
        keys = [rkey, *(self.mark_key(m) for m in marks)]
        script, window_ms = limiter.check_script, window_s * 1000

        async def _both(client: redis.asyncio.Redis) -> tuple[Decision, tuple[bool, ...]]:
            try:
                raw = await client.evalsha(script.sha, len(keys), *keys, window_ms)
            except redis.exceptions.NoScriptError:
                script.sha = await client.script_load(script.script)
                raw = await client.evalsha(script.sha, len(keys), *keys, window_ms)
            return decide(raw, limit), tuple(bool(e) for e in raw[2:])

        return await self.gate.call(_both, (fail_open(limit), tuple(False for _ in marks)))

    async def _unlink(self, rkeys: list[str]) -> int:
        if not rkeys:
            return 0

        async def _run(client: redis.asyncio.Redis) -> int:
            async with client.pipeline(transaction=False) as pipe:
                for rkey in rkeys:
                    pipe.unlink(rkey)
                return sum(int(n) for n in await pipe.execute())

        return await self.gate.call(_run, 0)
