-- What every wrk script of the benchmarks shares: thread ids, counting statuses
-- split by problem code, and the one "WRK_JSON {...}" summary line benchlib.run_wrk
-- reads. A script loads it first with:
--   dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "../wrk_common.lua")
-- and then defines init() (calling common_init()) and request().

local threads = {}

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

-- Per thread state; seeds the generator differently in each thread.
function common_init()
  math.randomseed(os.time() * 7919 + tid * 104729)
  statuses = {}
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

function response(status, headers, body)
  local key = tostring(status)
  if status >= 400 then
    -- problem+json carries a stable code: 409 insufficient_funds vs request_in_progress.
    local code = body and body:match('"code"%s*:%s*"([%w_]+)"')
    key = key .. " " .. (code or "?")
  end
  statuses[key] = (statuses[key] or 0) + 1
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
