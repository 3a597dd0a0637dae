"""Fixed-window rate limiter, atomic in Redis, failing open.

Algorithm: a fixed window anchored at the first hit. The first hit creates the
counter with a TTL of ``window_s``; each hit increments it; a hit is allowed while
the count is <= ``limit``; the window ends when the key expires. One Lua script
does INCR + PEXPIRE + PTTL so concurrent hits can neither over-admit nor leave a
counter without a TTL. Time is Redis's (TTLs), so app-server clocks do not matter.

Trade-off, accepted for a filter: up to ``2 * limit`` hits can pass around a
window boundary. The database remains the real guard on scarce things.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from redis.commands.core import AsyncScript

from reservo.core.redis.client import Client, RedisGate

# KEYS[1] counter; ARGV[1] window in ms. Returns {count, pttl_ms}.
# A key found without a TTL (should not happen; e.g. a manual SET) gets one, so a
# subject can never be locked out forever.
_HIT = """
local count = redis.call('INCR', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if count == 1 or ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
"""
_HIT_LUA = _HIT + "return {count, ttl}\n"
# The same hit, then EXISTS of further keys, for a batch of gate checks in one
# command: KEYS come in groups of ARGV[2] (a counter, then its marks), ARGV[1] is
# the window in ms. ARGV[3], when not 0, is the place (1 = the first mark) of the
# mark that spares a call: when it exists the call is not counted (count 0, an
# allowed hit), e.g. a retry of a request that already reached the database.
# Returns {count, pttl_ms, e2, ..., en} per group, concatenated. Groups run in
# order, so two hits of one counter in a batch count as two calls. Every key
# must live on one server: a single Redis (on a cluster the keys are in
# different slots, see Cache.hit_and_check).
_HIT_CHECK_LUA = """
local window = tonumber(ARGV[1])
local per = tonumber(ARGV[2])
local spare = tonumber(ARGV[3] or '0')
local out = {}
for i = 1, #KEYS, per do
  local count, ttl = 0, 0
  if spare == 0 or redis.call('EXISTS', KEYS[i + spare]) == 0 then
    count = redis.call('INCR', KEYS[i])
    ttl = redis.call('PTTL', KEYS[i])
    if count == 1 or ttl < 0 then
      redis.call('PEXPIRE', KEYS[i], window)
      ttl = window
    end
  end
  out[#out + 1] = count
  out[#out + 1] = ttl
  for j = i + 1, i + per - 1 do
    out[#out + 1] = redis.call('EXISTS', KEYS[j])
  end
end
return out
"""


@dataclass(frozen=True, slots=True)
class Decision:
    """``retry_after_s`` is 0 when allowed, else whole seconds until the window ends (>= 1)."""

    allowed: bool
    remaining: int
    retry_after_s: int


def rate_key(scope: str, subject: str | int, namespace: str = "reservo") -> str:
    """``{namespace}:rl:{scope:subject}``: the hash tag keeps each counter on one
    cluster slot; the namespace keeps deployments (and test runs) sharing a Redis apart."""
    return f"{namespace}:rl:{{{scope}:{subject}}}"


def decide(raw: Any, limit: int) -> Decision:
    """Turn the script's ``[count, pttl_ms]`` reply into a Decision (count 0: a
    call the script did not count, allowed)."""
    count, ttl_ms = int(raw[0]), int(raw[1])
    if count <= limit:
        return Decision(allowed=True, remaining=limit - count, retry_after_s=0)
    return Decision(allowed=False, remaining=0, retry_after_s=max(1, math.ceil(ttl_ms / 1000)))


def fail_open(limit: int) -> Decision:
    """What a hit gets when Redis cannot answer: allowed."""
    return Decision(allowed=True, remaining=limit, retry_after_s=0)


class RateLimiter:
    """Counts hits per (scope, subject) in Redis; allows all when Redis is down."""

    def __init__(self, gate: RedisGate, namespace: str = "reservo") -> None:
        self.gate = gate
        self.namespace = namespace
        self.script: AsyncScript = gate.client.register_script(_HIT_LUA)
        self.check_script: AsyncScript = gate.client.register_script(_HIT_CHECK_LUA)

    async def hit(self, scope: str, subject: str | int, limit: int, window_s: int) -> Decision:
        """Record one hit and say whether it is within ``limit`` per ``window_s``."""
        if limit < 0 or window_s <= 0:
            raise ValueError("limit must be >= 0 and window_s > 0")
        key = rate_key(scope, subject, self.namespace)

        async def _hit(client: Client) -> Decision:
            raw = await self.script(keys=[key], args=[window_s * 1000], client=client)
            return decide(raw, limit)

        return await self.gate.call(_hit, fail_open(limit))
