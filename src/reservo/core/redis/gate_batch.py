"""Rate-limit-and-marks checks made in the same turn of the event loop, sent to
Redis as one command (``Cache.hit_and_check`` under load)."""

from __future__ import annotations

import asyncio

from reservo.core.redis.client import Client, RedisGate, evalsha
from reservo.core.redis.ratelimit import RateLimiter


class GateBatch:
    """Rate-limit-and-marks checks of one shape (window, keys per call) made in
    the same turn of the event loop, sent as one EVALSHA.

    The first call of a turn schedules the send; every call made before it runs
    joins the batch. A batch is at most ``max_calls`` calls (one script run
    holds Redis for a few microseconds per call); more are sent as further
    commands. On NOSCRIPT (Redis restarted or flushed its script cache) nothing
    ran, so the script is loaded and the command retried once. A failure answers
    every call of the batch with None (the caller fails open)."""

    def __init__(
        self,
        gate: RedisGate,
        limiter: RateLimiter,
        window_ms: int,
        keys_per_call: int,
        spare: int = 0,
        max_calls: int = 200,
    ) -> None:
        self.gate, self.script = gate, limiter.check_script
        self.window_ms, self.per, self.max_calls = window_ms, keys_per_call, max_calls
        self.spare = spare  # the mark that spares a call from counting (0: none)
        self._keys: list[str] = []
        self._waiters: list[asyncio.Future[list[int] | None]] = []
        self._sending: set[asyncio.Task[None]] = set()  # strong references
        self._loop: asyncio.AbstractEventLoop | None = None

    async def check(self, keys: list[str]) -> list[int] | None:
        """The script's answer for these keys (count, pttl, one flag per mark), or
        None when Redis did not answer."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a batch left behind by a loop that stopped
            self._loop, self._keys, self._waiters = loop, [], []
        if not self._waiters:
            loop.call_soon(self._send_pending)
        waiter: asyncio.Future[list[int] | None] = loop.create_future()
        self._keys.extend(keys)
        self._waiters.append(waiter)
        return await waiter

    def _send_pending(self) -> None:
        keys, waiters = self._keys, self._waiters
        self._keys, self._waiters = [], []
        step = self.max_calls * self.per
        for i in range(0, len(waiters), self.max_calls):
            part = keys[i * self.per : i * self.per + step]
            task = asyncio.ensure_future(self._send(part, waiters[i : i + self.max_calls]))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, keys: list[str], waiters: list[asyncio.Future[list[int] | None]]) -> None:
        script, args = self.script, (self.window_ms, self.per, self.spare)

        async def _run(client: Client) -> list[int]:
            return list(await evalsha(client, script, keys, args))

        try:
            raw = await self.gate.call(_run, None)
        except asyncio.CancelledError:
            for waiter in waiters:
                waiter.cancel()
            raise
        except Exception as exc:  # a bug, not an outage: every caller raises it
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(exc)
            return
        width = self.per + 1  # count, pttl, then one flag per mark
        for n, waiter in enumerate(waiters):
            if not waiter.done():  # a caller cancelled meanwhile needs no answer
                waiter.set_result(None if raw is None else raw[n * width : (n + 1) * width])
