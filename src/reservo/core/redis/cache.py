"""JSON cache and "full marks" in Redis, all failing open.

(The per-process layer in front of it is core/redis/local_cache.py; the
batched rate-limit-and-marks checks, core/redis/gate_batch.py.)

A miss is always safe: the caller reads the database. A "full mark" says "this
thing was seen full recently" so the hot path can refuse early without touching
the database; "not marked" (also the fail-open answer) only means "go and check".
Values are written with a TTL, and writers invalidate explicitly with ``delete``.
"""

from __future__ import annotations

from typing import Any

import orjson
import structlog
from redis.typing import EncodableT

from reservo.core.redis.client import (
    Client,
    Command,
    RedisGate,
    ScriptCall,
    evalsha,
    is_cluster,
    pipeline,
)
from reservo.core.redis.gate_batch import GateBatch, ScriptBatch
from reservo.core.redis.local_cache import LocalCache
from reservo.core.redis.ratelimit import Decision, RateLimiter, decide, fail_open, rate_key

log = structlog.get_logger(__name__)

# GET and PTTL in one command: the value and how long Redis will still keep it, so
# a copy kept in process never outlives the Redis entry it was read from.
_GET_WITH_TTL_LUA = "return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}"
# The same, plus the key's generation (KEYS[2], "0" when never bumped), read in the
# same command so a fill knows which generation its database read belongs to.
_GET_VERSIONED_LUA = (
    "return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]),"
    " redis.call('GET', KEYS[2]) or '0'}"
)
# The same for several keys at once: KEYS come in pairs (a value, its
# generation), one triple answered per pair, in order (VersionedBatch).
_GET_VERSIONED_MANY_LUA = """
local out = {}
for i = 1, #KEYS, 2 do
  out[#out + 1] = redis.call('GET', KEYS[i])
  out[#out + 1] = redis.call('PTTL', KEYS[i])
  out[#out + 1] = redis.call('GET', KEYS[i + 1]) or '0'
end
return out
"""
# The same, plus a refresh-ahead lease (KEYS in triples: a value, its
# generation, its refresh lease): a value with ARGV[1] ms of life or less left
# is handed to one reader to read again (4th answer 1) while every other reader
# keeps serving it. The lease ends when the value would have: a refresh that
# never stores leaves it to expire, and the next reader after that fills it.
_GET_VERSIONED_LEASING_LUA = """
local out = {}
for i = 1, #KEYS, 3 do
  local raw = redis.call('GET', KEYS[i])
  local pttl = redis.call('PTTL', KEYS[i])
  local refresh = 0
  if raw and pttl > 0 and pttl <= tonumber(ARGV[1])
      and redis.call('SET', KEYS[i + 2], '1', 'NX', 'PX', pttl) then
    refresh = 1
  end
  out[#out + 1] = raw
  out[#out + 1] = pttl
  out[#out + 1] = redis.call('GET', KEYS[i + 1]) or '0'
  out[#out + 1] = refresh
end
return out
"""
# Store fills only if no change bumped their generation since the fill began: a
# read that raced a booking can then never outlive it in the cache. KEYS in
# pairs (value, generation), ARGV in triples (generation, value, life in ms);
# one answer each (1 stored). One fill per call on a cluster, many batched else.
_SET_IF_GENERATION_LUA = """
local out = {}
for i = 1, #KEYS / 2 do
  local a = 3 * i - 2
  if (redis.call('GET', KEYS[2 * i]) or '0') == ARGV[a] then
    redis.call('SET', KEYS[2 * i - 1], ARGV[a + 1], 'PX', ARGV[a + 2])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""
# A change: a new generation (so fills begun before it are not stored) and the
# value gone. The generation outlives every value it guards.
_BUMP_LUA = """
redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
redis.call('UNLINK', KEYS[1])
return 1
"""
# A value stamped with the generations of the groups it was read under (KEYS[2..],
# "0" when never bumped): the value, its PTTL, then each group's generation, in
# one command; the caller serves the value only if its stamp is the current one.
_GET_STAMPED_LUA = """
local out = {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
for i = 2, #KEYS do out[#out + 1] = redis.call('GET', KEYS[i]) or '0' end
return out
"""
# Generations are kept a day: far longer than any value's life.
_GENERATION_LIFE_MS = 24 * 3600 * 1000
# A lease on repairing a group of marks, taken only while the group's "whole"
# mark (KEYS[1], kept without a TTL) is missing: KEYS[2] the lease, ARGV[1] its
# holder's token, ARGV[2] its life in ms. Both keys share one hash tag.
_LEASE_UNLESS_WHOLE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""
# The repair done: the group is whole again, only if the lease is still the
# holder's (a Redis that lost its state meanwhile lost the lease too, and
# perhaps the marks just written: the group stays not whole).
_SETTLE_WHOLE_LUA = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], '1')
redis.call('DEL', KEYS[2])
return 1
"""


def _ttl_ms(ttl_s: float) -> int:
    ttl_ms = int(ttl_s * 1000)
    if ttl_ms <= 0:
        raise ValueError("ttl_s must be positive: cache entries never live forever")
    return ttl_ms


def _versioned(raw: Any, pttl: Any, generation: Any) -> tuple[bytes | None, float, bytes]:
    """A value, its remaining life (s) and its generation, as the versioned
    scripts answer them; an entry without a life left is a miss."""
    if raw is None or int(pttl) <= 0:
        return None, 0.0, bytes(generation)
    return bytes(raw), int(pttl) / 1000, bytes(generation)


class Cache:
    """Keys are ``{namespace}:cache:{key}`` for values, ``{namespace}:mark:{key}`` for marks.

    On a Redis Cluster a key's slot is decided by the first ``{...}`` in it: the
    namespace must hold no braces, and callers put the tag in ``key`` when keys
    must share a slot (e.g. ``slots:{doctor:7}:2026-01-05``)."""

    def __init__(self, gate: RedisGate, namespace: str = "reservo") -> None:
        self.gate = gate
        self.namespace = namespace
        self.cluster = is_cluster(gate.client)
        self._get_with_ttl = gate.client.register_script(_GET_WITH_TTL_LUA)
        self._get_versioned = gate.client.register_script(_GET_VERSIONED_LUA)
        self._bump = gate.client.register_script(_BUMP_LUA)
        self._get_stamped = gate.client.register_script(_GET_STAMPED_LUA)
        self._lease_unless_whole = gate.client.register_script(_LEASE_UNLESS_WHOLE_LUA)
        self._settle_whole = gate.client.register_script(_SETTLE_WHOLE_LUA)
        self._versioned_batch = ScriptBatch(
            gate,
            gate.client.register_script(_GET_VERSIONED_MANY_LUA),
            (),
            2,
            3,
            name="redis_list_reads",
        )
        self._get_versioned_leasing = gate.client.register_script(_GET_VERSIONED_LEASING_LUA)
        self._store_batch = ScriptBatch(
            gate,
            gate.client.register_script(_SET_IF_GENERATION_LUA),
            (),
            2,
            1,
            name="redis_list_stores",
        )
        self._leasing_batches: dict[int, ScriptBatch] = {}
        self._locals: list[LocalCache[Any]] = []
        self._gate_batches: dict[tuple[RateLimiter, int, int, int], GateBatch] = {}

    def local(self, ttl_s: float, max_entries: int = 4096) -> LocalCache[Any]:
        """A per-process cache in front of these values: ``delete`` of a key drops
        it from every such cache too, so one invalidation covers both layers."""
        local: LocalCache[Any] = LocalCache(ttl_s, max_entries)
        self._locals.append(local)
        return local

    def value_key(self, key: str) -> str:
        return f"{self.namespace}:cache:{key}"

    def mark_key(self, key: str) -> str:
        return f"{self.namespace}:mark:{key}"

    def generation_key(self, key: str) -> str:
        return f"{self.namespace}:gen:{key}"

    def refresh_lease_key(self, key: str) -> str:
        return f"{self.namespace}:refresh:{key}"

    # --- values -------------------------------------------------------------

    async def get_json(self, key: str) -> Any | None:
        """The cached value, or None on a miss, an unreadable entry, or Redis down."""
        rkey = self.value_key(key)

        async def _get(client: Client) -> bytes | str | None:
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

    async def get_bytes(self, key: str) -> tuple[bytes | None, float]:
        """The raw cached value and the seconds Redis keeps it still, in one round
        trip; ``(None, 0)`` on a miss or with Redis down."""
        rkey, script = self.value_key(key), self._get_with_ttl

        async def _get(client: Client) -> tuple[bytes | None, float]:
            raw, pttl = await evalsha(client, script, [rkey])
            if raw is None or int(pttl) <= 0:
                return None, 0.0
            return bytes(raw), int(pttl) / 1000

        return await self.gate.call(_get, (None, 0.0))

    async def set_bytes(self, key: str, data: bytes, ttl_s: float) -> bool:
        """Store already-serialised JSON for ``ttl_s``; False if Redis did not take it."""
        rkey, px = self.value_key(key), _ttl_ms(ttl_s)

        async def _set(client: Client) -> bool:
            return bool(await client.set(rkey, data, px=px))

        return await self.gate.call(_set, False)

    async def set_json(self, key: str, value: Any, ttl_s: float) -> bool:
        """Store ``value`` for ``ttl_s``; False if Redis did not take it.

        Encoding errors raise: an unserialisable value is a bug, not an outage.
        """
        return await self.set_bytes(key, orjson.dumps(value), ttl_s)

    async def delete(self, *keys: str) -> int:
        """Invalidate cached values; returns how many existed (0 if Redis is down).

        One UNLINK per key in a non-transactional pipeline: one round trip, and no
        CROSSSLOT error on a cluster, where a multi-key DEL would need one slot.
        """
        for local in self._locals:
            for k in keys:
                local.invalidate(k)
        return await self._unlink([self.value_key(k) for k in keys])

    # --- values kept until changed ---------------------------------------------
    #
    # For values that every change invalidates explicitly (``bump``): they may
    # live long in Redis because a fill that read the database before a change
    # cannot store its (old) answer after it. Same slot on a cluster: the value
    # and generation keys share the caller's hash tag.

    async def get_versioned(self, key: str) -> tuple[bytes | None, float, bytes | None]:
        """The cached value, the seconds Redis keeps it still, and the key's
        generation to hand back to ``set_if_unchanged`` after a database read:
        ``(None, 0, None)`` with Redis down (then nothing may be stored).

        On a single Redis the reads made in one turn of the event loop go as
        one command (``ScriptBatch``): a cached slot list that is not in the
        process's own copy (most uniform reads) paid redis-py's whole call,
        over twice the CPU of the rest of its request. Each read still gets
        its own atomic GET, PTTL and generation. On a cluster the keys of
        different reads live in different slots: one command each."""
        keys = [self.value_key(key), self.generation_key(key)]
        if not self.cluster:
            got = await self._versioned_batch.check(keys)
            if got is None:
                return None, 0.0, None
            return _versioned(*got)

        async def _get(client: Client) -> tuple[bytes | None, float, bytes | None]:
            return _versioned(*await evalsha(client, self._get_versioned, keys))

        return await self.gate.call(_get, (None, 0.0, None))

    async def get_versioned_refreshing(
        self, key: str, ahead_s: float
    ) -> tuple[bytes | None, float, bytes | None, bool]:
        """``get_versioned``, and whether this caller now holds the value's
        refresh lease: True for one caller per value once it has ``ahead_s`` or
        less to live, who should read it again and ``set_if_unchanged`` it with
        the generation returned here, while the others keep serving the value
        until it expires. Batched like ``get_versioned`` on a single Redis;
        ``(None, 0, None, False)`` with Redis down."""
        keys = [self.value_key(key), self.generation_key(key), self.refresh_lease_key(key)]
        ahead_ms = _ttl_ms(ahead_s)
        down: tuple[bytes | None, float, bytes | None, bool] = (None, 0.0, None, False)
        if not self.cluster:
            batch = self._leasing_batches.get(ahead_ms)
            if batch is None:
                batch = self._leasing_batches[ahead_ms] = ScriptBatch(
                    self.gate,
                    self._get_versioned_leasing,
                    (ahead_ms,),
                    3,
                    4,
                    name="redis_list_reads",
                )
            got = await batch.check(keys)
            if got is None:
                return down
            raw, pttl, generation, refresh = got
            return (*_versioned(raw, pttl, generation), bool(refresh))

        async def _get(client: Client) -> tuple[bytes | None, float, bytes | None, bool]:
            raw, pttl, generation, refresh = await evalsha(
                client, self._get_versioned_leasing, keys, [ahead_ms]
            )
            return (*_versioned(raw, pttl, generation), bool(refresh))

        return await self.gate.call(_get, down)

    async def set_if_unchanged(
        self, key: str, data: bytes, ttl_s: float, generation: bytes
    ) -> bool:
        """Store ``data`` for ``ttl_s`` unless ``bump`` ran since ``generation`` was
        read; False if not stored (changed meanwhile, or Redis down). On a
        single Redis the stores made in one turn go as one command, as the
        reads do (the misses of one turn are read, then stored, together)."""
        keys = [self.value_key(key), self.generation_key(key)]
        args: list[EncodableT] = [generation, data, _ttl_ms(ttl_s)]
        if not self.cluster:
            got = await self._store_batch.check(keys, args)
            return got is not None and bool(got[0])
        script = self._store_batch.script

        async def _set(client: Client) -> bool:
            return bool((await evalsha(client, script, keys, args))[0])

        return await self.gate.call(_set, False)

    async def bump(self, *keys: str) -> bool:
        """A change to these values: drop them here, in this process's local
        caches, and make any fill begun before now unstorable. False when Redis
        did not take it (the caller decides whether to retry)."""
        for local in self._locals:
            for k in keys:
                local.invalidate(k)
        if not keys:
            return True
        calls: list[Command] = [
            ScriptCall(
                self._bump, [self.value_key(k), self.generation_key(k)], [_GENERATION_LIFE_MS]
            )
            for k in keys
        ]

        async def _run(client: Client) -> bool:
            await pipeline(client, calls)
            return True

        return await self.gate.call(_run, False)

    # --- values stamped with the generations of groups --------------------------
    #
    # For many values that one change invalidates together (every cached page
    # of a city's car search over a day a hold covers): each value is stored
    # with the generations of its groups at the moment its database read began,
    # and a read serves it only while they are all still current. A change
    # bumps its groups' generations (``bump_groups``): every value of them, and
    # every fill begun before, is a miss from then on, without listing the
    # values. The value and group keys share the caller's hash tag.

    async def get_stamped(
        self, key: str, groups: list[str]
    ) -> tuple[bytes | None, float, bytes | None]:
        """The cached value if stored under the current generations of
        ``groups``, the seconds Redis keeps it still, and the stamp to hand to
        ``set_stamped`` after a database read: ``(None, 0, None)`` with Redis
        down (then nothing may be stored)."""
        keys = [self.value_key(key), *(self.generation_key(g) for g in groups)]
        script = self._get_stamped

        async def _get(client: Client) -> tuple[bytes | None, float, bytes | None]:
            raw, pttl, *generations = await evalsha(client, script, keys)
            stamp = b",".join(bytes(g) for g in generations) + b"|"
            if raw is None or int(pttl) <= 0 or not bytes(raw).startswith(stamp):
                return None, 0.0, stamp
            return bytes(raw)[len(stamp) :], int(pttl) / 1000, stamp

        return await self.gate.call(_get, (None, 0.0, None))

    async def set_stamped(self, key: str, data: bytes, ttl_s: float, stamp: bytes) -> bool:
        """Store ``data`` for ``ttl_s`` under ``stamp`` (from ``get_stamped``,
        read before the database); False if Redis did not take it."""
        return await self.set_bytes(key, stamp + data, ttl_s)

    async def bump_groups(self, *groups: str) -> bool:
        """A change to every value of these groups: a new generation each, kept
        far longer than any value. False when Redis did not take it."""
        calls: list[Command] = []
        for g in groups:
            calls += [
                ("INCR", self.generation_key(g)),
                ("PEXPIRE", self.generation_key(g), _GENERATION_LIFE_MS),
            ]

        async def _run(client: Client) -> bool:
            await pipeline(client, calls)
            return True

        return bool(calls) and await self.gate.call(_run, False)

    # --- full marks -----------------------------------------------------------

    async def mark(self, key: str, ttl_s: float) -> bool:
        """Note that ``key`` is full for ``ttl_s``; False if Redis did not take it."""
        rkey, px = self.mark_key(key), _ttl_ms(ttl_s)

        async def _mark(client: Client) -> bool:
            return bool(await client.set(rkey, b"1", px=px))

        return await self.gate.call(_mark, False)

    async def is_marked(self, key: str) -> bool:
        """True only if Redis says the mark is set; False when unknown (fail open)."""
        rkey = self.mark_key(key)

        async def _exists(client: Client) -> bool:
            return bool(await client.exists(rkey))

        return await self.gate.call(_exists, False)

    async def marks(self, *keys: str) -> tuple[bool, ...]:
        """``is_marked`` of several keys in one command (MGET on a single Redis; on
        a cluster, where the keys live in different slots, one EXISTS each,
        pipelined); all False when unknown (fail open)."""
        rkeys = [self.mark_key(k) for k in keys]

        async def _mget(client: Client) -> tuple[bool, ...]:
            if self.cluster:
                return tuple(
                    bool(e) for e in await pipeline(client, [("EXISTS", k) for k in rkeys])
                )
            return tuple(v is not None for v in await client.mget(rkeys))

        return await self.gate.call(_mget, tuple(False for _ in keys))

    async def mark_each(self, marks: list[tuple[str, float]]) -> bool:
        """``mark`` of each (key, ttl_s) in one pipeline (on a cluster, one per
        node); False if Redis did not take them all."""
        if not marks:
            return True
        calls: list[Command] = [
            ("SET", self.mark_key(k), b"1", "PX", _ttl_ms(ttl_s)) for k, ttl_s in marks
        ]

        async def _run(client: Client) -> bool:
            await pipeline(client, calls)
            return True

        return await self.gate.call(_run, False)

    # --- marks that say a group of marks is whole --------------------------------
    #
    # A group of marks (e.g. the Idempotency-Keys that reached the database)
    # whose absence is trusted needs to know when Redis lost it: the group has a
    # "whole" mark without a TTL, which only a repair (a rebuild from the
    # truth) sets, and which a flush or a restart without persistence loses
    # with the group. ``whole`` and ``lease`` name keys of the same hash tag.

    async def lease_repairs(
        self, groups: list[tuple[str, str]], token: str, ttl_s: float
    ) -> list[bool]:
        """For each (whole, lease) pair: True when the group is not whole and
        nobody else holds its repair lease, which ``token`` now holds for
        ``ttl_s``; all False when Redis did not answer."""
        px = _ttl_ms(ttl_s)
        calls: list[Command] = [
            ScriptCall(self._lease_unless_whole, [self.mark_key(w), self.mark_key(lk)], [token, px])
            for w, lk in groups
        ]

        async def _run(client: Client) -> list[bool]:
            return [bool(r) for r in await pipeline(client, calls)]

        return await self.gate.call(_run, [False] * len(groups))

    async def settle_repairs(self, groups: list[tuple[str, str]], token: str) -> list[bool]:
        """Mark each (whole, lease) group whole if ``token`` still holds its lease;
        False for a group whose lease was lost (expired, or Redis lost state)."""
        calls: list[Command] = [
            ScriptCall(self._settle_whole, [self.mark_key(w), self.mark_key(lk)], [token])
            for w, lk in groups
        ]

        async def _run(client: Client) -> list[bool]:
            return [bool(r) for r in await pipeline(client, calls)]

        return await self.gate.call(_run, [False] * len(groups))

    async def drop_marks(self, *keys: str) -> bool:
        """Remove these marks; True when Redis took the command (whether or not
        they were set), False when it did not answer."""

        async def _run(client: Client) -> bool:
            await pipeline(client, [("UNLINK", self.mark_key(k)) for k in keys])
            return True

        return await self.gate.call(_run, False)

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
        spare: int = 0,
    ) -> tuple[Decision, tuple[bool, ...]]:
        """Rate-limit hit and mark checks (one answer per mark) in one command.
        ``spare`` (1 = the first mark; 0 none) names a mark whose presence spares
        the call: it is allowed and not counted against the limit.

        The calls made in one turn of the event loop are sent together, as one
        EVALSHA of a script that runs each call's INCR + PTTL + EXISTS in order
        (``GateBatch``): under load the redis-py work of a call (~90-130 us of
        CPU) is paid once per batch instead of once per request, and each call
        still gets exactly the answer it would have got alone. The keys have to
        live on one server, which they do on a single Redis. On a Redis Cluster
        they live in different slots (the rate key is the subject's, a mark the
        marked thing's), so there the same work is a pipeline per call instead
        (``_hit_and_check_spread``). Fails open to ``(allowed, nothing marked)``.
        """
        if limit < 0 or window_s <= 0:
            raise ValueError("limit must be >= 0 and window_s > 0")
        if not 0 <= spare <= len(marks):
            raise ValueError("spare must name one of the marks (1-based), or be 0")
        rkey = rate_key(scope, subject, limiter.namespace)
        if self.cluster:
            return await self._hit_and_check_spread(limiter, rkey, limit, window_s, marks, spare)
        keys = [rkey, *(self.mark_key(m) for m in marks)]
        group = (limiter, window_s * 1000, len(keys), spare)
        batch = self._gate_batches.get(group)
        if batch is None:
            batch = self._gate_batches[group] = GateBatch(self.gate, *group)
        raw = await batch.check(keys)
        if raw is None:
            return fail_open(limit), tuple(False for _ in marks)
        return decide(raw, limit), tuple(bool(e) for e in raw[2:])

    async def _hit_and_check_spread(
        self,
        limiter: RateLimiter,
        rkey: str,
        limit: int,
        window_s: int,
        marks: tuple[str, ...],
        spare: int,
    ) -> tuple[Decision, tuple[bool, ...]]:
        """``hit_and_check`` on a Redis Cluster: the rate limiter's own script on
        the rate key and one EXISTS per mark, pipelined (the nodes concerned are
        asked concurrently). With a ``spare`` mark the marks are asked first and
        the hit sent only when that mark is absent (a second round trip)."""
        hit = ScriptCall(limiter.script, [rkey], [window_s * 1000])
        checks: list[Command] = [("EXISTS", self.mark_key(m)) for m in marks]

        async def _spread(client: Client) -> tuple[Decision, tuple[bool, ...]]:
            if spare:
                exists = tuple(bool(e) for e in await pipeline(client, checks))
                if exists[spare - 1]:
                    return fail_open(limit), exists
                (raw,) = await pipeline(client, [hit])
                return decide(raw, limit), exists
            raw, *flags = await pipeline(client, [hit, *checks])
            return decide(raw, limit), tuple(bool(e) for e in flags)

        return await self.gate.call(_spread, (fail_open(limit), tuple(False for _ in marks)))

    async def _unlink(self, rkeys: list[str]) -> int:
        if not rkeys:
            return 0

        async def _run(client: Client) -> int:
            return sum(int(n) for n in await pipeline(client, [("UNLINK", k) for k in rkeys]))

        return await self.gate.call(_run, 0)
