-- wrk script of the rentals search: GET /api/cars?city=C&from=F&to=T for a random
-- city and a random period among a fixed set (so the Redis cache is exercised as
-- at a holiday peak: many people asking the same few questions).
-- Arguments (after `--`): <bearer token> <cities> <periods "from/to" comma-separated>
-- Prints one "WRK_JSON {...}" line: statuses, latency percentiles.

local threads = {}

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  auth = "Bearer " .. args[1]
  cities = tonumber(args[2])
  periods = {}
  for p in args[3]:gmatch("[^,]+") do
    local f, t = p:match("^(.-)/(.-)$")
    periods[#periods + 1] = "&from=" .. f .. "&to=" .. t
  end
  math.randomseed(os.time() * 7919 + tid * 104729)
  statuses = {}
end

function request()
  local path = string.format("/api/cars?city=city-%02d", math.random(0, cities - 1))
    .. periods[math.random(#periods)]
  return wrk.format("GET", path, { ["Authorization"] = auth })
end

function response(status, headers, body)
  local key = tostring(status)
  if status >= 400 then
    local code = body and body:match('"code"%s*:%s*"([%w_]+)"')
    key = key .. " " .. (code or "?")
  elseif status == 200 and body == "[]" then
    key = "200 empty"
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
