-- wrk script of the job enqueues: POST /api/jobs (category http, a small
-- payload) as a service, each request with a fresh Idempotency-Key.
-- Arguments (after `--`): <service JWT> <run id> <delayMs>

dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "../wrk_report.lua")

function init(args)
  auth = "Bearer " .. args[1]
  run_id = args[2]
  delay = args[3]
  counter = 0
  math.randomseed(os.time() * 7919 + tid * 104729)
end

function request()
  counter = counter + 1
  local key = run_id .. "-" .. tid .. "-" .. counter
  local body = '{"category":"http","urgency":' .. math.random(0, 9) .. ',"delayMs":' .. delay
    .. ',"payload":{"url":"http://callbacks.bench.invalid/hook","body":{"n":"' .. key .. '"}}}'
  return wrk.format("POST", "/api/jobs", {
    ["Authorization"] = auth,
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = key,
  }, body)
end

function response(status, headers, body)
  count(status_key(status, body))
end
