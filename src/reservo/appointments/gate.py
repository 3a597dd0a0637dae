"""The Redis filter in front of a booking: the patient's rate limit, the slot's
full mark and the Idempotency-Keys that reached the database, and the line a
booking attempt waits in per slot in this process.

The filter trusts the absence of a key's ``seen`` mark (a full slot refuses
the attempt without the database) only while Redis has kept every such mark:
the marks are kept in ``BUCKETS`` groups, each with a ``whole`` mark that only
a repair from PostgreSQL sets (appointments/gate_repair.py). Redis that lost
its state (a flush, a restart without persistence, a cluster node emptied)
lost a group's ``whole`` mark with its marks, and is read in the same round
trip as them: until the group is repaired, an attempt the full mark would
refuse asks PostgreSQL whether its key has an answer stored (docs/DESIGN.md)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from reservo.appointments.domain import Limits
from reservo.core.aio.turns import Turns
from reservo.core.kernel import metrics
from reservo.core.kernel.errors import DomainError
from reservo.core.redis.cache import Cache
from reservo.core.redis.ratelimit import RateLimiter

if TYPE_CHECKING:  # gate_repair names its keys with this module's functions
    from reservo.appointments.gate_repair import KeyMarks

# The gate's two counters, looked up once (``labels()`` locks on every call).
_RATE_LIMITED = metrics.CONFLICTS.labels("appointments", "rate_limited", "redis")
_FULL_BY_REDIS = metrics.CONFLICTS.labels("appointments", "slot_full", "redis")


# The endpoint of a booking's Idempotency-Key, and how a key is named in Redis.
BOOK_ENDPOINT = "POST /api/appointments"
# The seen marks are kept in this many groups, each with its own ``whole`` mark
# under the same hash tag: on a Redis Cluster a group lives on one node, so a
# node that lost its state lost the ``whole`` marks of the groups it held.
BUCKETS = 16


def request_key(key_owner: str, key: str) -> str:
    """A booking's Idempotency-Key as the gate knows it: its caller's and endpoint's."""
    return f"{key_owner}:{BOOK_ENDPOINT}:{key}"


def full_key(slot_id: int) -> str:
    return f"full:{{slot:{slot_id}}}"


def bucket_of(request_key: str) -> int:
    return _digest(request_key)[0] % BUCKETS


def seen_key(request_key: str) -> str:
    digest = _digest(request_key)
    return f"seen:{{gate:{digest[0] % BUCKETS}}}:{digest.hex()}"


def whole_key(bucket: int) -> str:
    """Set (without a TTL) while the group's seen marks are all there."""
    return f"seen-whole:{{gate:{bucket}}}"


def repair_key(bucket: int) -> str:
    """The lease of the one repair of the group under way."""
    return f"seen-repair:{{gate:{bucket}}}"


def _digest(request_key: str) -> bytes:
    return hashlib.blake2b(request_key.encode(), digest_size=12).digest()


def slot_full(may_be_replay: bool = False) -> GateRefusal:
    return GateRefusal("slot_full", "this slot has no capacity left", may_be_replay=may_be_replay)


class GateRefusal(DomainError):
    """A refusal from the Redis filter, which created nothing and is not stored.
    ``may_be_replay``: the attempt could be the retry of a request that reached
    the database while Redis forgot its key, so its stored answer is worth a
    look before the refusal is answered."""

    def __init__(
        self,
        code: str,
        detail: str,
        *,
        may_be_replay: bool,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(code, detail, headers=headers)
        self.may_be_replay = may_be_replay


class RateLimited(GateRefusal):
    """429 ``rate_limited`` from the gate. It may be a replay unless Redis marks
    the slot full with its key marks whole: unlimited, the same attempt would be
    refused ``slot_full`` by that mark without the database. So the storm's
    limited attempts on full slots cost PostgreSQL nothing, and keep being
    answered while it is away."""

    def __init__(self, limit: int, window_s: int, retry_after_s: int, may_be_replay: bool) -> None:
        super().__init__(
            "rate_limited",
            f"at most {limit} booking attempts per {window_s} s",
            headers={"Retry-After": str(max(1, retry_after_s))},
            may_be_replay=may_be_replay,
        )


class Gate:
    cache: Cache
    limiter: RateLimiter
    limits: Limits
    key_marks: KeyMarks
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
        answer, or takes its own single turn, and never creates a second thing.
        While the key's group of seen marks is not whole, "never seen" is not
        trusted: the refusal says it may be a replay."""
        bucket = bucket_of(request_key)
        decision, (full, seen, whole) = await self.cache.hit_and_check(
            self.limiter,
            "book",
            patient_id,
            self.limits.booking_rate_limit,
            self.limits.booking_rate_window_s,
            full_key(slot_id),
            seen_key(request_key),
            whole_key(bucket),
            spare=2,
        )
        whole = whole and not self.key_marks.pending(bucket)
        if not whole:
            self.key_marks.repair_soon()
        if not decision.allowed:
            _RATE_LIMITED.inc()
            raise RateLimited(
                self.limits.booking_rate_limit,
                self.limits.booking_rate_window_s,
                decision.retry_after_s,
                may_be_replay=not (full and whole),
            )
        if full and not seen:
            _FULL_BY_REDIS.inc()
            raise slot_full(may_be_replay=not whole)

    @asynccontextmanager
    async def turn(self, slot_id: int, request_key: str) -> AsyncIterator[None]:
        """One booking attempt per slot at a time goes on to the database from this
        process; the others wait in line here instead of on the slot row's lock
        with a pool connection each. An attempt that waited checks the full mark
        again, as the gate did, since the attempt before it may have filled the
        slot: a full slot then refuses it (raises slot_full) without the database,
        unless its Idempotency-Key already reached the database (or may have:
        its group of seen marks is not whole)."""
        async with self._turns.turn(slot_id) as waited:
            if waited:
                bucket = bucket_of(request_key)
                full, seen, whole = await self.cache.marks(
                    full_key(slot_id), seen_key(request_key), whole_key(bucket)
                )
                if full and not seen:
                    whole = whole and not self.key_marks.pending(bucket)
                    _FULL_BY_REDIS.inc()
                    raise slot_full(may_be_replay=not whole)
            yield

    async def remember_key(self, request_key: str) -> None:
        """Tell the Redis filter that this key reached the database (after its
        claim committed, so a repair that reads the claims after Redis lost
        this mark finds the key there). A mark Redis did not take leaves its
        group not whole."""
        if not await self.cache.mark(seen_key(request_key), self.limits.key_memory_s):
            self.key_marks.missed(request_key)

    async def _mark_full(self, slot_id: int, seat_back_in_s: float | None = None) -> None:
        """``seat_back_in_s``: when a held seat of the slot ends at the latest
        (its hold unpaid, the seat is free again then, before any job ran): the
        mark never outlives it, so it never refuses a booking the database would
        take. None: no hold, the usual life."""
        life = float(self.limits.full_mark_ttl_s)
        if seat_back_in_s is not None:
            life = min(life, seat_back_in_s)
        if life > 0:
            await self.cache.mark(full_key(slot_id), life)

    async def _clear_full(self, slot_id: int) -> None:
        await self.cache.clear_mark(full_key(slot_id))
