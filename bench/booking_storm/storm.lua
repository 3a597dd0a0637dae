-- wrk script of the booking storm: POST /api/appointments with a fresh
-- Idempotency-Key per request, a random patient (their own JWT) and a random hot slot.
-- Arguments (after `--`): <patients file: "id jwt" per line> <slot ids, comma-separated> <run id>
-- Prints one "WRK_JSON {...}" line: statuses split by problem code, latency percentiles.

local threads = {}

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  patients = {}
  for line in io.lines(args[1]) do
    local id, token = line:match("^(%d+) (%S+)$")
    if id then
      -- Pre-build what never changes per patient, so request() stays cheap.
      patients[#patients + 1] = { id = id, auth = "Bearer " .. token }
    end
  end
  slots = {}
  for s in args[2]:gmatch("%d+") do
    slots[#slots + 1] = s
  end
  run_id = args[3] or tostring(os.time())
  math.randomseed(os.time() * 7919 + tid * 104729)
  counter = 0
  statuses = {}
end

function request()
  counter = counter + 1
  local p = patients[math.random(#patients)]
  local slot = slots[math.random(#slots)]
  local body = '{"slotId":' .. slot .. ',"patientId":' .. p.id .. '}'
  return wrk.format("POST", "/api/appointments", {
    ["Authorization"] = p.auth,
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = run_id .. "-" .. tid .. "-" .. counter,
  }, body)
end

function response(status, headers, body)
  local key = tostring(status)
  if status >= 400 then
    -- problem+json carries a stable code: 409 slot_full vs patient_busy, etc.
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
