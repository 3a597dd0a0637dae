-- wrk script of the slot reads: GET /api/doctors/{id}/slots?date=D for a random
-- doctor and a random date of the loaded range, as a random patient.
-- Arguments (after `--`): <patients file: "id jwt" per line> <first doctor id>
--                         <last doctor id> <dates, comma-separated YYYY-MM-DD>
--                         [mix: "uniform" (default) or "skewed"]
-- "skewed" is the realistic mix: 80 % of the reads on the next 3 dates of the
-- 10 % most popular doctors, the rest uniform over everything.
-- Prints one "WRK_JSON {...}" line: statuses, latency percentiles.

-- The shared setup(), count() and done() (the WRK_JSON line), beside this script.
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../wrk_report.lua")

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
  local key = status_key(status, body)
  if status == 200 and body == "[]" then
    key = "200 empty"  -- a read that found no slot would flatter the figure
  end
  count(key)
end
