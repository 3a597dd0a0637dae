-- What every wrk script of the benchmarks shares, loaded first by each of them
-- (`dofile`): threads numbered (`tid`) for their random seeds and keys, responses
-- counted per key, and done() printing one "WRK_JSON {...}" line (benchlib.py
-- reads it): statuses summed over the threads, latency percentiles, socket errors.

local threads = {}
statuses = {}

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

-- The key a response is counted under: its status and, for a problem+json
-- answer, its stable code ("409 slot_full").
function status_key(status, body)
  local key = tostring(status)
  if status >= 400 then
    local code = body and body:match('"code"%s*:%s*"([%w_]+)"')
    key = key .. " " .. (code or "?")
  end
  return key
end

function count(key)
  statuses[key] = (statuses[key] or 0) + 1
end

-- Lines of a "<id> <jwt>" file as { id = "...", auth = "Bearer ..." }.
function read_tokens(path)
  local out = {}
  for line in io.lines(path) do
    local id, token = line:match("^(%d+) (%S+)$")
    if id then
      out[#out + 1] = { id = id, auth = "Bearer " .. token }
    end
  end
  return out
end

function done(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    for k, n in pairs(t:get("statuses")) do
      total[k] = (total[k] or 0) + n
    end
  end
  local parts = {}
  for k, n in pairs(total) do
    parts[#parts + 1] = string.format('"%s":%d', k, n)
  end
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"duration_us":%d,"requests":%d,"statuses":{%s},"p50_us":%d,"p90_us":%d,'
      .. '"p99_us":%d,"max_us":%d,"errors":{"connect":%d,"read":%d,"write":%d,"timeout":%d}}\n',
    summary.duration, summary.requests, table.concat(parts, ","),
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    e.connect, e.read, e.write, e.timeout))
end
