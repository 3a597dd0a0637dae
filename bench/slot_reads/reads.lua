-- wrk script of the slot reads: GET /api/doctors/{id}/slots?date=D for a random
-- doctor and a random date of the loaded range, as a random patient.
-- Arguments (after `--`): <patients file: "id jwt" per line> <first doctor id>
--                         <last doctor id> <dates, comma-separated YYYY-MM-DD>
--                         [mix: "uniform" (default) or "skewed"]
-- "skewed" is the realistic mix: 80 % of the reads on the next 3 dates of the
-- 10 % most popular doctors, the rest uniform over everything.
-- Prints one "WRK_JSON {...}" line: statuses, latency percentiles.

local threads = {}

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  auths = {}
  for line in io.lines(args[1]) do
    local token = line:match("^%d+ (%S+)$")
    if token then
      auths[#auths + 1] = "Bearer " .. token
    end
  end
  first_doctor, last_doctor = tonumber(args[2]), tonumber(args[3])
  dates = {}
  for d in args[4]:gmatch("[%d-]+") do
    dates[#dates + 1] = d
  end
  skewed = args[5] == "skewed"
  popular_last = first_doctor + math.max(0, math.floor((last_doctor - first_doctor + 1) / 10) - 1)
  math.randomseed(os.time() * 7919 + tid * 104729)
  statuses = {}
end

function request()
  local doctor, date
  if skewed and math.random() < 0.8 then
    doctor = math.random(first_doctor, popular_last)
    date = dates[math.random(math.min(3, #dates))]
  else
    doctor = math.random(first_doctor, last_doctor)
    date = dates[math.random(#dates)]
  end
  local path = "/api/doctors/" .. doctor .. "/slots?date=" .. date
  return wrk.format("GET", path, { ["Authorization"] = auths[math.random(#auths)] })
end

function response(status, headers, body)
  local key = tostring(status)
  if status >= 400 then
    local code = body and body:match('"code"%s*:%s*"([%w_]+)"')
    key = key .. " " .. (code or "?")
  elseif status == 200 and body == "[]" then
    key = "200 empty"  -- a read that found no slot would flatter the figure
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
