"""Rebuilding the booking gate's seen marks after Redis lost them.

The gate refuses an attempt at a full slot from Redis alone only when its
Idempotency-Key has no ``seen`` mark and the key's group of marks is whole
(appointments/gate.py). A group is whole once a repair has copied into Redis
every booking key PostgreSQL holds that a mark could still stand for (the keys
are kept, and their marks live, ``key_memory_s``), and stays whole until Redis
loses it again: the ``whole`` mark has no TTL, so only a loss of Redis's state
(which loses the marks with it) removes it, or a process whose seen mark Redis
did not take (``missed``).

A repair leases the groups that are not whole (one repair per group across
all processes), reads the claims from PostgreSQL after taking the lease (so
after the loss: a key claimed later marks itself after its claim commits, on
the Redis that lost nothing since), writes their marks with the life they had
left, and makes each group whole only if its lease is still held (a Redis
that lost its state again meanwhile lost the lease too). A repair that fails
(PostgreSQL or Redis away) leaves the groups not whole: the next attempt that
finds one so starts another after a pause."""

from __future__ import annotations

import asyncio
import secrets
import time
from datetime import timedelta

import structlog

from reservo.appointments.gate import (
    BOOK_ENDPOINT,
    BUCKETS,
    bucket_of,
    repair_key,
    request_key,
    seen_key,
    whole_key,
)
from reservo.core.http.idempotency import IdempotencyStore
from reservo.core.kernel.clock import Clock
from reservo.core.redis.cache import Cache

log = structlog.get_logger(__name__)

# Keys read and marked per round trip pair.
_PAGE = 1000
# A repair's lease: longer than a repair of a day's bookings takes. A repair
# that outlives it only lets a second one start (both write the same marks;
# the first one's groups are then made whole by the second).
_LEASE_S = 120.0
# After a repair (or one that found every group leased or whole), this process
# waits this long before it starts another.
_PAUSE_S = 1.0


class KeyMarks:
    """The seen marks' repairs in this process: at most one running at a time."""

    def __init__(
        self, cache: Cache, store: IdempotencyStore, clock: Clock, key_memory_s: int
    ) -> None:
        self.cache, self.store, self.clock = cache, store, clock
        self.memory = timedelta(seconds=key_memory_s)
        self._running: asyncio.Task[bool] | None = None
        self._next_at = 0.0  # monotonic
        self._unwhole: set[int] = set()  # groups whose whole mark is to be dropped
        self._dropping: asyncio.Task[None] | None = None

    def pending(self, bucket: int) -> bool:
        """Whether this process still has to drop the group's whole mark."""
        return bucket in self._unwhole

    def missed(self, request_key: str) -> None:
        """A key reached the database but its seen mark did not reach Redis (a
        timeout, Redis refusing writes): its group is not whole any more. Its
        whole mark (and any repair's lease, whose read of PostgreSQL may have
        begun before this key's claim) is dropped, in the background until
        Redis takes it; the next attempt that finds the group so repairs it."""
        self._unwhole.add(bucket_of(request_key))
        if self._dropping is None:
            self._dropping = asyncio.ensure_future(self._drop_whole())

    async def _drop_whole(self) -> None:
        try:
            while self._unwhole:
                groups = sorted(self._unwhole)
                keys = [k for b in groups for k in (whole_key(b), repair_key(b))]
                if await self.cache.drop_marks(*keys):
                    self._unwhole.difference_update(groups)
                else:
                    await asyncio.sleep(_PAUSE_S)
        finally:
            self._dropping = None

    def repair_soon(self) -> None:
        """Start a repair in the background unless one runs, one ran less than a
        pause ago, or Redis is away (a repair could not write)."""
        now = time.monotonic()
        if self._running is not None or now < self._next_at or not self.cache.gate.available:
            return
        self._next_at = now + _PAUSE_S
        self._running = asyncio.ensure_future(self.repair())
        self._running.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[bool]) -> None:
        self._running = None
        self._next_at = time.monotonic() + _PAUSE_S
        if not task.cancelled() and task.exception() is not None:
            log.warning("gate.repair_failed", error=repr(task.exception()))

    async def whole(self) -> bool:
        """Whether every group of seen marks is whole (False when Redis is away)."""
        return all(await self.cache.marks(*(whole_key(b) for b in range(BUCKETS))))

    async def repair(self) -> bool:
        """Repair the groups that are not whole and nobody else repairs; True when
        this call made at least one whole."""
        token = secrets.token_hex(12)
        groups = [(whole_key(b), repair_key(b)) for b in range(BUCKETS)]
        leased = await self.cache.lease_repairs(groups, token, _LEASE_S)
        mine = {b for b, held in enumerate(leased) if held}
        if not mine:
            return False
        started = time.monotonic()
        now = self.clock.now()
        after, marked = (now - self.memory, "", ""), 0
        while True:
            page = await self.store.keys_since(BOOK_ENDPOINT, after, _PAGE)
            marks = []
            for created_at, caller, key in page:
                rkey = request_key(caller, key)
                life_s = (created_at + self.memory - now).total_seconds()
                if bucket_of(rkey) in mine and life_s > 0:
                    marks.append((seen_key(rkey), life_s))
            if not await self.cache.mark_each(marks):
                return False  # Redis away: the leases expire, a later repair begins again
            marked += len(marks)
            if len(page) < _PAGE:
                break
            after = page[-1]
        settled = await self.cache.settle_repairs([groups[b] for b in sorted(mine)], token)
        log.info(
            "gate.marks_repaired",
            groups=sum(settled),
            leased=len(mine),
            marks=marked,
            took_s=round(time.monotonic() - started, 3),
        )
        return any(settled)
