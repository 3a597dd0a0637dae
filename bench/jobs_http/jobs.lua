-- wrk script of POST /api/jobs over HTTP: a service caller enqueues an `http` job
-- due in a day (so no executor runs during the measurement), each request with its
-- own Idempotency-Key unless told otherwise.
-- Arguments (after `--`): <service bearer token> <run id> <"key" or "nokey">
-- Prints one "WRK_JSON {...}" line: statuses, latency percentiles.

local threads = {}

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  auth = "Bearer " .. args[1]
  run = args[2]
  with_key = args[3] ~= "nokey"
  n = 0
  statuses = {}
end

function request()
  n = n + 1
  local body = string.format(
    '{"category":"http","urgency":%d,"delayMs":86400000,'
      .. '"payload":{"url":"http://127.0.0.1:9/job/%d/%d","method":"POST"}}',
    n % 10, tid, n)
  local headers = { ["Authorization"] = auth, ["Content-Type"] = "application/json" }
  if with_key then
    headers["Idempotency-Key"] = string.format("j-%s-%d-%d", run, tid, n)
  end
  return wrk.format("POST", "/api/jobs", headers, body)
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
    for k, c in pairs(t:get("statuses")) do
      total[k] = (total[k] or 0) + c
    end
  end
  local parts = {}
  for k, c in pairs(total) do
    parts[#parts + 1] = string.format('"%s":%d', k, c)
  end
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"duration_us":%d,"requests":%d,"statuses":{%s},"p50_us":%d,"p90_us":%d,'
      .. '"p99_us":%d,"max_us":%d,"errors":{"connect":%d,"read":%d,"write":%d,"timeout":%d}}\n',
    summary.duration, summary.requests, table.concat(parts, ","),
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    e.connect, e.read, e.write, e.timeout))
end
