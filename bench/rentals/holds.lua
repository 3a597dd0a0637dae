-- wrk script of the holds storm: POST /api/bookings on one of the popular cars,
-- for a fresh customer (so the per-customer rate limit never decides), a random
-- 1-3 day trip among a few weeks, each request with its own Idempotency-Key.
-- Arguments (after `--`): <admin bearer token> <first car id> <cars> <day starts
-- comma-separated, ISO> <run id>
-- Prints one "WRK_JSON {...}" line: statuses, latency percentiles.

-- The shared setup(), count() and done() (the WRK_JSON line), beside this script.
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../wrk_report.lua")

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
  count(status_key(status, body))
end
