-- wrk script of the hello ceiling: GET /hello, statuses and latency as WRK_JSON.

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  statuses = {}
end

function request()
  return wrk.format("GET", "/hello")
end

function response(status, headers, body)
  local key = tostring(status)
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
