-- wrk script of the rentals search: GET /api/cars?city=C&from=F&to=T for a random
-- city and a random period among a fixed set (so the Redis cache is exercised as
-- at a holiday peak: many people asking the same few questions).
-- Arguments (after `--`): <bearer token> <cities> <periods "from/to" comma-separated>
-- Prints one "WRK_JSON {...}" line: statuses, latency percentiles.

-- The shared setup(), count() and done() (the WRK_JSON line), beside this script.
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../wrk_report.lua")

function init(args)
  auth = "Bearer " .. args[1]
  cities = tonumber(args[2])
  periods = {}
  for p in args[3]:gmatch("[^,]+") do
    local f, t = p:match("^(.-)/(.-)$")
    periods[#periods + 1] = "&from=" .. f .. "&to=" .. t
  end
  math.randomseed(os.time() * 7919 + tid * 104729)
end

function request()
  local path = string.format("/api/cars?city=city-%02d", math.random(0, cities - 1))
    .. periods[math.random(#periods)]
  return wrk.format("GET", path, { ["Authorization"] = auth })
end

function response(status, headers, body)
  local key = status_key(status, body)
  -- The first page of a search: {"items":[...],"next":...}; no car free is an empty page.
  if status == 200 and body:sub(1, 11) == '{"items":[]' then
    key = "200 empty"
  end
  count(key)
end
