"""Redis side of the scheduler: the window of due-soon job ids. Never the truth:
everything here can be rebuilt from PostgreSQL by the loader.

Works on one Redis and on a Redis Cluster alike: each script keeps to the keys of
one (category, urgency), one hash tag (``Keys``); a batch over several of them
is a non-transactional pipeline, which a cluster splits per node."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from reservo.core.redis.client import Client, Command, ScriptCall, pipeline
from reservo.scheduler import lua
from reservo.scheduler.domain import Keys, pair, unpair

# Ids per LOAD/ACK call: bounds the time one script blocks Redis.
CHUNK = 500
# ACK is one pass over the processing list: acknowledge a batch in one call.
ACK_CHUNK = 5000
Entry = tuple[int, str, int, int]  # id, category, urgency, score (epoch ms)


def _text(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


def _chunks(items: Sequence[Any], n: int) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


class Dispatch:
    def __init__(self, client: Client, keys: Keys, ahead_s: float = 0.0) -> None:
        # Ids due within ``ahead_s`` by Redis' clock are handed out already
        # (SchedulerSettings.fire_ahead_s).
        self.r, self.keys, self.ahead_ms = client, keys, round(ahead_s * 1000)
        self._load = client.register_script(lua.LOAD)
        self._move = client.register_script(lua.MOVE)
        self._take = client.register_script(lua.TAKE)
        self._ack = client.register_script(lua.ACK)
        self._requeue = client.register_script(lua.REQUEUE)
        self._release = client.register_script(lua.RELEASE)
        self._extend = client.register_script(lua.EXTEND)
        self._put_back = client.register_script(lua.PUT_BACK)
        self._tokens = client.register_script(lua.TOKENS)

    # -- loading -----------------------------------------------------------------

    async def load(self, entries: Iterable[Entry]) -> int:
        """Adds ids not already in their pipeline; returns how many were new."""
        groups: dict[tuple[str, int], list[Entry]] = defaultdict(list)
        for e in entries:
            groups[(e[1], e[2])].append(e)
        if not groups:
            return 0
        k = self.keys
        commands: list[Command] = [("SADD", k.registry, *(pair(c, u) for c, u in groups))]
        for (c, u), items in groups.items():
            for chunk in _chunks(items, CHUNK):
                args: list[int] = [self.ahead_ms]
                for e in chunk:
                    args += [e[0], e[3]]
                keys = [k.future(c, u), k.queue(c, u), k.known(c, u)]
                commands.append(ScriptCall(self._load, keys, args))
        results = await pipeline(self.r, commands)
        return sum(int(x) for x in results[1:])

    async def epoch(self, fresh: str) -> str:
        """The current epoch token, creating it (as ``fresh``) when Redis lost it."""
        await self.r.set(self.keys.epoch, fresh, nx=True)
        got = await self.r.get(self.keys.epoch)
        return _text(got) if got else fresh

    async def synced(self, token: str) -> bool:
        """Whether a loader loaded the whole window under epoch ``token`` less
        than a resync period ago."""
        got = await self.r.get(self.keys.synced)
        return got is not None and _text(got) == token

    async def mark_synced(self, token: str, period_ms: int) -> None:
        await self.r.set(self.keys.synced, token, px=period_ms)

    async def pairs(self) -> list[tuple[str, int]]:
        members = await self.r.smembers(self.keys.registry)
        return sorted((unpair(_text(m)) for m in members), key=lambda p: (p[1], p[0]))

    async def lengths(self) -> list[tuple[str, int, int, int]]:
        """(category, urgency, ZCARD future, LLEN queue) of every registered pair."""
        pairs = await self.pairs()
        if not pairs:
            return []
        commands: list[Command] = []
        for c, u in pairs:
            commands += [("ZCARD", self.keys.future(c, u)), ("LLEN", self.keys.queue(c, u))]
        got = await pipeline(self.r, commands)
        return [(c, u, int(got[2 * i]), int(got[2 * i + 1])) for i, (c, u) in enumerate(pairs)]

    # -- moving ------------------------------------------------------------------

    async def move(
        self, pairs: Sequence[tuple[str, int]], batch: int
    ) -> list[tuple[int, int, int]]:
        """One atomic MOVE per key, pipelined. Returns (moved, next_score, bound)
        per key: the bound is Redis' now plus the fire-ahead, in ms."""
        k = self.keys
        args = [batch, self.ahead_ms]
        results = await pipeline(
            self.r,
            [ScriptCall(self._move, [k.future(c, u), k.queue(c, u)], args) for c, u in pairs],
        )
        return [(int(a), int(b), int(n)) for a, b, n in results]

    async def acquire(self, token: str, ttl_ms: int, key: str | None = None) -> bool:
        """SET NX PX with an owner token, or extend it when we already own it.
        ``key`` defaults to the mover's lock."""
        key = key or self.keys.lock
        if await self.r.set(key, token, nx=True, px=ttl_ms):
            return True
        return bool(await self._extend(keys=[key], args=[token, ttl_ms]))

    async def release(self, token: str, key: str | None = None) -> None:
        await self._release(keys=[key or self.keys.lock], args=[token])

    # -- taking and acknowledging ------------------------------------------------

    async def take(
        self, pairs: Sequence[tuple[str, int]], worker: str, n: int
    ) -> list[tuple[tuple[str, int], list[int]]]:
        """Reliable pop of up to n ids, most urgent keys first."""
        k, out, left = self.keys, [], n
        for c, u in pairs:
            ids = await self._take(keys=[k.queue(c, u), k.processing(c, u, worker)], args=[left])
            if ids:
                out.append(((c, u), [int(i) for i in ids]))
                left -= len(ids)
                if left <= 0:
                    break
        return out

    async def put_back(self, worker: str, groups: dict[tuple[str, int], list[int]]) -> None:
        """Ids this worker took but may not run now (paused category) go back
        to the consumer end of their queues, each group's first id taken first."""
        k = self.keys
        await pipeline(
            self.r,
            [
                ScriptCall(self._put_back, [k.processing(c, u, worker), k.queue(c, u)], ids)
                for (c, u), ids in groups.items()
            ],
        )

    async def tokens(
        self, category: str, rate: float, capacity: float, want: int, back: int = 0
    ) -> tuple[int, float]:
        """Up to ``want`` tokens of the category's bucket (every worker's), after
        giving back ``back`` unused ones: (granted, seconds until the next one)."""
        got, wait_ms = await self._tokens(
            keys=[self.keys.bucket(category)], args=[repr(rate), repr(capacity), want, back]
        )
        return int(got), int(wait_ms) / 1000

    async def wait_one(
        self, c: str, u: int, worker: str, timeout_s: float
    ) -> list[tuple[tuple[str, int], list[int]]]:
        """BLMOVE: sleeps in Redis until a job arrives (or timeout)."""
        k = self.keys
        got = await self.r.blmove(
            k.queue(c, u),
            k.processing(c, u, worker),
            timeout_s,  # type: ignore[arg-type]  # Redis >= 6 takes fractional seconds
            "RIGHT",
            "LEFT",
        )
        return [((c, u), [int(got)])] if got is not None else []

    async def ack(self, worker: str, groups: dict[tuple[str, int], list[int]]) -> None:
        """One linear-time script per (category, urgency) of the batch."""
        k = self.keys
        await pipeline(
            self.r,
            [
                ScriptCall(
                    self._ack,
                    [k.processing(c, u, worker), k.known(c, u)],
                    [",".join(map(str, chunk))],
                )
                for (c, u), ids in groups.items()
                for chunk in _chunks(ids, ACK_CHUNK)
            ],
        )

    # -- workers' liveness -------------------------------------------------------

    async def alive(self, worker: str, ttl_ms: int) -> None:
        async with self.r.pipeline(transaction=False) as pipe:
            pipe.sadd(self.keys.workers, worker)
            pipe.set(self.keys.alive(worker), b"1", px=ttl_ms)
            await pipe.execute()

    async def leave(self, worker: str) -> None:
        await self.requeue_of(worker)

    async def requeue_dead(self) -> int:
        """Hands the processing lists of workers without a live key back to their queues."""
        moved = 0
        for raw in await self.r.smembers(self.keys.workers):
            worker = _text(raw)
            if not await self.r.exists(self.keys.alive(worker)):
                moved += await self.requeue_of(worker)
        return moved

    async def give_back(self, worker: str, pairs: Iterable[tuple[str, int]]) -> int:
        """A live worker returns its processing lists of ``pairs`` to their queues."""
        k, moved = self.keys, 0
        for c, u in set(pairs):
            moved += int(
                await self._requeue(keys=[k.processing(c, u, worker), k.queue(c, u)], args=[])
            )
        return moved

    async def requeue_of(self, worker: str) -> int:
        k, moved = self.keys, 0
        for c, u in await self.pairs():
            moved += int(
                await self._requeue(keys=[k.processing(c, u, worker), k.queue(c, u)], args=[])
            )
        await self.r.srem(k.workers, worker)
        await self.r.delete(k.alive(worker))
        return moved
