"""The scheduler's Lua scripts. Each touches the keys of one (category, urgency)
only (one hash tag, one cluster slot) and runs atomically in Redis."""

from __future__ import annotations

# KEYS: future, queue, known. ARGV: ahead (ms), id1, score1, id2, score2, ...
# Adds each id not already in this pipeline: to the queue when due by Redis'
# clock within `ahead` (the fire-ahead: see SchedulerSettings), else to the
# ZSET. An id already waiting in the ZSET takes the new score (ZADD XX): a job
# rescheduled or retried through the API runs at its new run_at, earlier or
# later, not at the one it was first loaded with. An id already in the queue or
# a processing list stays there: the claim refuses it while the row's run_at is
# beyond the fire-ahead and the executor loads it again.
# Returns how many were added.
LOAD = """
local t = redis.call('TIME')
local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local added = 0
for i = 2, #ARGV, 2 do
  local score = tonumber(ARGV[i + 1])
  if redis.call('SADD', KEYS[3], ARGV[i]) == 1 then
    if score <= due then
      redis.call('LPUSH', KEYS[2], ARGV[i])
    else
      redis.call('ZADD', KEYS[1], score, ARGV[i])
    end
    added = added + 1
  else
    redis.call('ZADD', KEYS[1], 'XX', score, ARGV[i])
  end
end
return added
"""

# KEYS: future, queue. ARGV: batch, ahead (ms). Moves up to `batch` ids due by
# Redis' TIME within `ahead` from the ZSET to the queue in one atomic step (no
# read-then-pipeline gap). Returns {moved, score of the next future id or -1,
# the bound it moved up to (redis now + ahead, ms)}.
MOVE = """
local t = redis.call('TIME')
local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', due, 'LIMIT', 0, tonumber(ARGV[1]))
if #ids > 0 then
  redis.call('ZREM', KEYS[1], unpack(ids))
  redis.call('LPUSH', KEYS[2], unpack(ids))
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local nscore = -1
if #nxt > 0 then nscore = tonumber(nxt[2]) end
return {#ids, nscore, due}
"""

# KEYS: queue, processing. ARGV: n. The reliable pop of up to n ids: each moves
# into this worker's processing list, where it stays until acknowledged.
TAKE = """
local out = {}
for i = 1, tonumber(ARGV[1]) do
  local id = redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT')
  if not id then break end
  out[#out + 1] = id
end
return out
"""

# KEYS: processing, known. ARGV: the ids, comma-separated in one argument (a
# batch of 500 as 500 arguments cost the client more to encode than the rest
# of the acknowledgement). The job left Redis for good (settled, skipped, or
# handed back to PostgreSQL for a retry). One pass over the processing list (an
# LREM per id would be quadratic in the batch size); what is not acknowledged
# stays, in order.
ACK = """
local ids, gone = {}, {}
for id in string.gmatch(ARGV[1], '[^,]+') do
  ids[#ids + 1] = id
  gone[id] = true
end
local items = redis.call('LRANGE', KEYS[1], 0, -1)
local keep = {}
for i = 1, #items do
  if not gone[items[i]] then keep[#keep + 1] = items[i] end
end
if #keep < #items then
  redis.call('DEL', KEYS[1])
  for i = 1, #keep, 1000 do
    redis.call('RPUSH', KEYS[1], unpack(keep, i, math.min(i + 999, #keep)))
  end
end
for i = 1, #ids, 1000 do
  redis.call('SREM', KEYS[2], unpack(ids, i, math.min(i + 999, #ids)))
end
return #ids
"""

# KEYS: processing (of a dead worker), queue. Hands everything back, to the
# consumer end so it is taken first. Returns how many.
REQUEUE = """
local n = 0
while redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT') do n = n + 1 end
return n
"""

# KEYS: lock. ARGV: owner token. Compare-and-delete: only the owner releases.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: lock. ARGV: owner token, ttl ms. Compare-and-extend.
EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

# KEYS: processing, queue. ARGV: ids, the first due first. Ids this worker took
# but may not run now (their category is paused: the claim refused them) go
# back to the consumer end of their queue, the first due taken first, and stay
# known (they are still in this pipeline). One pass over the processing list,
# as ACK; an id no longer in it is not pushed. Returns how many went back.
PUT_BACK = """
local back, found = {}, {}
for i = 1, #ARGV do back[ARGV[i]] = true end
local items = redis.call('LRANGE', KEYS[1], 0, -1)
local keep = {}
for i = 1, #items do
  if back[items[i]] then found[items[i]] = true else keep[#keep + 1] = items[i] end
end
if #keep == #items then return 0 end
redis.call('DEL', KEYS[1])
for i = 1, #keep, 1000 do
  redis.call('RPUSH', KEYS[1], unpack(keep, i, math.min(i + 999, #keep)))
end
local n = 0
for i = #ARGV, 1, -1 do
  if found[ARGV[i]] then
    redis.call('RPUSH', KEYS[2], ARGV[i])
    n = n + 1
  end
end
return n
"""

# KEYS: a category's bucket. ARGV: rate (tokens per second), capacity, tokens
# wanted, tokens given back (taken earlier, not used: the queue had fewer jobs).
# A token bucket on Redis' clock, shared by every worker process: it fills at
# `rate` up to `capacity` (a new bucket starts full), and hands out whole
# tokens. Returns {tokens granted, ms until the next whole token (0 when all
# wanted were granted)}. The key expires once idle for long enough to have
# filled up anyway, so an expired bucket starts as the old one would be.
TOKENS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local rate, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local want, back = tonumber(ARGV[3]), tonumber(ARGV[4])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(b[1]), tonumber(b[2])
if tokens == nil or at == nil then tokens, at = cap, now end
if now > at then
  tokens = tokens + (now - at) * rate / 1000000
  at = now
end
tokens = math.min(cap, tokens + back)
local got = math.min(want, math.floor(tokens))
tokens = tokens - got
redis.call('HSET', KEYS[1], 'tokens', string.format('%.9f', tokens),
           'at', string.format('%.0f', at))
redis.call('PEXPIRE', KEYS[1], math.ceil(math.max(60, 2 * cap / rate) * 1000))
local wait = 0
if got < want then wait = math.ceil((1 - tokens) * 1000 / rate) end
return {got, wait}
"""
