"""Script calls made in the same turn of the event loop, sent to Redis as one
command: the rate-limit-and-marks checks (``Cache.hit_and_check``), the
versioned reads of cached lists (``Cache.get_versioned``) and their stores
(``Cache.set_if_unchanged``) under load."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.commands.core import AsyncScript
from redis.typing import EncodableT

from reservo.core.kernel import metrics
from reservo.core.redis.client import Client, RedisGate, evalsha
from reservo.core.redis.ratelimit import RateLimiter


class ScriptBatch:
    """Calls of one script made in the same turn of the event loop, sent as one
    EVALSHA: each call's ``keys_per_call`` keys in order, ``args`` once, then
    each call's own arguments in order (as many per call, if any), and each
    call answered with its ``width`` values of the flat reply.

    The first call of a turn schedules the send; every call made before it runs
    joins the batch. A batch is at most ``max_calls`` calls (one script run
    holds Redis for a few microseconds per call); more are sent as further
    commands. On NOSCRIPT (Redis restarted or flushed its script cache) nothing
    ran, so the script is loaded and the command retried once. A failure answers
    every call of the batch with None (the caller fails open). Every key must
    live on one server (a single Redis). ``name`` labels the commands' sizes
    (``reservo_batch_items``)."""

    def __init__(
        self,
        gate: RedisGate,
        script: AsyncScript,
        args: Sequence[EncodableT],
        keys_per_call: int,
        width: int,
        max_calls: int = 200,
        *,
        name: str,
    ) -> None:
        self.gate, self.script, self.args = gate, script, tuple(args)
        self._sizes = metrics.BATCH_ITEMS.labels(name)
        self.per, self.width, self.max_calls = keys_per_call, width, max_calls
        self._keys: list[str] = []
        self._own_args: list[EncodableT] = []
        self._waiters: list[asyncio.Future[list[Any] | None]] = []
        self._sending: set[asyncio.Task[None]] = set()  # strong references
        self._loop: asyncio.AbstractEventLoop | None = None

    async def check(self, keys: list[str], own_args: Sequence[EncodableT] = ()) -> list[Any] | None:
        """The script's answer for these keys (and this call's own arguments,
        the same number on every call), or None when Redis did not answer."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a batch left behind by a loop that stopped
            self._loop, self._keys, self._own_args, self._waiters = loop, [], [], []
        if not self._waiters:
            loop.call_soon(self._send_pending)
        waiter: asyncio.Future[list[Any] | None] = loop.create_future()
        self._keys.extend(keys)
        self._own_args.extend(own_args)
        self._waiters.append(waiter)
        return await waiter

    def _send_pending(self) -> None:
        keys, own_args, waiters = self._keys, self._own_args, self._waiters
        self._keys, self._own_args, self._waiters = [], [], []
        per_args = len(own_args) // len(waiters) if waiters else 0
        for i in range(0, len(waiters), self.max_calls):
            part = waiters[i : i + self.max_calls]
            self._sizes.observe(len(part))
            task = asyncio.ensure_future(
                self._send(
                    keys[i * self.per : (i + len(part)) * self.per],
                    [*self.args, *own_args[i * per_args : (i + len(part)) * per_args]],
                    part,
                )
            )
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(
        self,
        keys: list[str],
        args: list[EncodableT],
        waiters: list[asyncio.Future[list[Any] | None]],
    ) -> None:
        script = self.script

        async def _run(client: Client) -> list[Any]:
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
        width = self.width
        for n, waiter in enumerate(waiters):
            if not waiter.done():  # a caller cancelled meanwhile needs no answer
                waiter.set_result(None if raw is None else raw[n * width : (n + 1) * width])


class GateBatch(ScriptBatch):
    """Rate-limit-and-marks checks of one shape (window, keys per call, the
    sparing mark) made in the same turn of the event loop: each call answered
    with its count, pttl and one flag per mark."""

    def __init__(
        self,
        gate: RedisGate,
        limiter: RateLimiter,
        window_ms: int,
        keys_per_call: int,
        spare: int = 0,
        max_calls: int = 200,
    ) -> None:
        args = (window_ms, keys_per_call, spare)
        super().__init__(
            gate,
            limiter.check_script,
            args,
            keys_per_call,
            keys_per_call + 1,
            max_calls,
            name="redis_gate_checks",
        )
