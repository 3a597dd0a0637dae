-- wrk script of the hello ceiling: GET /hello, statuses and latency as WRK_JSON.

-- The shared setup(), count() and done() (the WRK_JSON line), beside this script.
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "wrk_report.lua")

function request()
  return wrk.format("GET", "/hello")
end

function response(status, headers, body)
  count(tostring(status))
end
