-- wrk script of the booking storm: POST /api/appointments with a fresh
-- Idempotency-Key per request, a random patient (their own JWT) and a random hot slot.
-- Arguments (after `--`): <patients file: "id jwt" per line> <slot ids, comma-separated> <run id>
-- Prints one "WRK_JSON {...}" line: statuses split by problem code, latency percentiles.

-- The shared setup(), count() and done() (the WRK_JSON line), beside this script.
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../wrk_report.lua")

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
  -- problem+json carries a stable code: 409 slot_full vs patient_busy, etc.
  count(status_key(status, body))
end
