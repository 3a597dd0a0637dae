"""A per-process TTL cache in front of Redis (``Cache.local``)."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class LocalCache(Generic[V]):
    """A per-process TTL cache in front of Redis, for values allowed to be a few
    seconds stale.

    - One fill per key at a time: concurrent misses of a key wait for the same
      fill instead of each asking Redis and PostgreSQL.
    - An entry lives ``ttl_s`` at most, and never longer than the life the fill
      reports (the remaining TTL of the Redis entry it came from), so a value is
      never older than the Redis TTL after its database read.
    - ``invalidate`` drops the entry now, and a fill already in flight for that
      key is not stored (its read may predate the change).
    - At most ``max_entries``: the oldest go first (expired ones go when read).

    Other processes see a change when their own entry expires (``ttl_s``).
    """

    def __init__(
        self,
        ttl_s: float,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.ttl_s, self.max_entries, self._clock = ttl_s, max_entries, clock
        # Oldest first. An OrderedDict: a dict's oldest key, after many deletions
        # at its front, is found by scanning past every deleted slot (4 us at
        # 10,000 entries, on every store once full); popitem(last=False) is O(1).
        self._entries: OrderedDict[str, tuple[float, V]] = OrderedDict()
        self._filling: dict[str, asyncio.Future[V]] = {}
        self._stale_fills: set[str] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def peek(self, key: str) -> V | None:
        hit = self._entries.get(key)
        if hit is None:
            return None
        if hit[0] <= self._clock():
            del self._entries[key]
            return None
        return hit[1]

    async def get(self, key: str, fill: Callable[[], Awaitable[tuple[V, float]]]) -> V:
        """The live entry, or the value ``fill()`` returns with its remaining life
        (seconds; 0 or less: return it but keep nothing)."""
        if self.ttl_s <= 0:
            return (await fill())[0]
        value = self.peek(key)
        if value is not None:
            return value
        pending = self._filling.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._filling[key] = future
        try:
            value, life_s = await fill()
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning without waiters
            raise
        else:
            future.set_result(value)
            if key in self._stale_fills:
                self._stale_fills.discard(key)
            elif life_s > 0:
                self._store(key, value, min(self.ttl_s, life_s))
            return value
        finally:
            self._filling.pop(key, None)
            self._stale_fills.discard(key)

    def invalidate(self, key: str) -> None:
        self._entries.pop(key, None)
        if key in self._filling:
            self._stale_fills.add(key)

    def _store(self, key: str, value: V, life_s: float) -> None:
        now = self._clock()
        if key not in self._entries:
            while len(self._entries) >= self.max_entries:
                self._entries.popitem(last=False)
        self._entries.pop(key, None)  # re-inserted last: the oldest stay first
        self._entries[key] = (now + life_s, value)
