"""The Redis filter in front of a booking: the patient's rate limit, the slot's
full mark and the Idempotency-Keys that reached the database, and the line a
booking attempt waits in per slot in this process."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from reservo.appointments.domain import Limits
from reservo.core.aio.turns import Turns
from reservo.core.kernel import metrics
from reservo.core.kernel.errors import DomainError
from reservo.core.redis.cache import Cache
from reservo.core.redis.ratelimit import RateLimiter

# The gate's two counters, looked up once (``labels()`` locks on every call).
_RATE_LIMITED = metrics.CONFLICTS.labels("appointments", "rate_limited", "redis")
_FULL_BY_REDIS = metrics.CONFLICTS.labels("appointments", "slot_full", "redis")


def full_key(slot_id: int) -> str:
    return f"full:{{slot:{slot_id}}}"


def seen_key(request_key: str) -> str:
    digest = hashlib.blake2b(request_key.encode(), digest_size=12).hexdigest()
    return f"seen:{digest}"


def slot_full() -> DomainError:
    return DomainError("slot_full", "this slot has no capacity left")


class RateLimited(DomainError):
    """429 ``rate_limited`` from the gate. ``may_be_replay``: the attempt could be
    the retry of a request that reached the database while Redis forgot its key
    (expired, restarted), so its stored answer is worth a look. It cannot be when
    Redis marks the slot full: unlimited, the same attempt would be refused
    ``slot_full`` by that mark without the database. So the storm's limited
    attempts on full slots cost PostgreSQL nothing, and keep being answered
    while it is away."""

    def __init__(self, limit: int, window_s: int, retry_after_s: int, may_be_replay: bool) -> None:
        super().__init__(
            "rate_limited",
            f"at most {limit} booking attempts per {window_s} s",
            headers={"Retry-After": str(max(1, retry_after_s))},
        )
        self.may_be_replay = may_be_replay


class Gate:
    cache: Cache
    limiter: RateLimiter
    limits: Limits
    _turns: Turns

    async def admit(self, patient_id: int, slot_id: int, request_key: str) -> None:
        """The Redis filter in front of a booking, in one round trip; returns when
        the attempt may go on to the database. Raises 429 when the patient is over
        the rate limit, and 409 slot_full when Redis marks the slot full and has
        never seen this request's Idempotency-Key (a retry of a request that
        reached the database must get its stored answer, so it goes on). A
        refusal here created nothing and is not recorded: a retry with the same
        key is simply evaluated again. A retry of a key that reached the
        database (seen) is not counted against the limit: it replays its stored
        answer, or takes its own single turn, and never creates a second thing."""
        decision, (full, seen) = await self.cache.hit_and_check(
            self.limiter,
            "book",
            patient_id,
            self.limits.booking_rate_limit,
            self.limits.booking_rate_window_s,
            full_key(slot_id),
            seen_key(request_key),
            spare=2,
        )
        if not decision.allowed:
            _RATE_LIMITED.inc()
            raise RateLimited(
                self.limits.booking_rate_limit,
                self.limits.booking_rate_window_s,
                decision.retry_after_s,
                may_be_replay=not full,
            )
        if full and not seen:
            _FULL_BY_REDIS.inc()
            raise slot_full()

    @asynccontextmanager
    async def turn(self, slot_id: int, request_key: str) -> AsyncIterator[None]:
        """One booking attempt per slot at a time goes on to the database from this
        process; the others wait in line here instead of on the slot row's lock
        with a pool connection each. An attempt that waited checks the full mark
        again, as the gate did, since the attempt before it may have filled the
        slot: a full slot then refuses it (raises slot_full) without the database,
        unless its Idempotency-Key already reached the database."""
        async with self._turns.turn(slot_id) as waited:
            if waited:
                full, seen = await self.cache.marks(full_key(slot_id), seen_key(request_key))
                if full and not seen:
                    _FULL_BY_REDIS.inc()
                    raise slot_full()
            yield

    async def remember_key(self, request_key: str) -> None:
        """Tell the Redis filter that this key reached the database. Both marks live
        in the same Redis, so losing Redis loses both and the database decides."""
        await self.cache.mark(seen_key(request_key), self.limits.key_memory_s)

    async def _mark_full(self, slot_id: int) -> None:
        await self.cache.mark(full_key(slot_id), self.limits.full_mark_ttl_s)

    async def _clear_full(self, slot_id: int) -> None:
        await self.cache.clear_mark(full_key(slot_id))
