-- wrk script of the holds storm: POST /api/bookings on one of the popular cars,
-- for a fresh customer (so the per-customer rate limit never decides), a random
-- 1-3 day trip among a few weeks, each request with its own Idempotency-Key.
-- Arguments (after `--`): <admin bearer token> <first car id> <cars> <day starts
-- comma-separated, ISO> <run id>
-- Prints one "WRK_JSON {...}" line: statuses, latency percentiles.

local threads = {}

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  auth = "Bearer " .. args[1]
  first_car, cars = tonumber(args[2]), tonumber(args[3])
  days = {}
  for d in args[4]:gmatch("[^,]+") do
    days[#days + 1] = d
  end
  run = tonumber(args[5])
  n = 0
  math.randomseed(os.time() * 7919 + tid * 104729)
  statuses = {}
end

function request()
  n = n + 1
  local customer = run * 100000000 + tid * 10000000 + n
  local i = math.random(#days - 3)
  local body = string.format(
    '{"carId":%d,"customerId":%d,"from":"%s","to":"%s"}',
    first_car + math.random(0, cars - 1), customer, days[i], days[i + math.random(1, 3)])
  return wrk.format("POST", "/api/bookings", {
    ["Authorization"] = auth,
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = string.format("h-%d-%d-%d", run, tid, n),
  }, body)
end

function response(status, headers, body)
  local key = tostring(status)
  if status >= 400 then
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
