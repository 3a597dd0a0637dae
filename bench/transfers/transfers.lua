-- wrk script of the HTTP transfers: POST /api/transfers between two random
-- distinct accounts, as the owner of the source account (their own JWT), a random
-- amount, a fresh Idempotency-Key per request.
-- Arguments (after `--`): <accounts file: "accountId ownerJwt" per line> <run id>
-- <max amount>

dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "../wrk_report.lua")

function init(args)
  accounts = read_tokens(args[1])
  run_id = args[2]
  max_amount = tonumber(args[3] or "500")
  counter = 0
  math.randomseed(os.time() * 7919 + tid * 104729)
end

function request()
  counter = counter + 1
  local n = #accounts
  local i = math.random(n)
  local j = math.random(n - 1)
  if j >= i then
    j = j + 1 -- a distinct target, uniformly
  end
  local from, to = accounts[i], accounts[j]
  local body = '{"fromAccountId":' .. from.id .. ',"toAccountId":' .. to.id
    .. ',"amount":' .. math.random(max_amount) .. '}'
  return wrk.format("POST", "/api/transfers", {
    ["Authorization"] = from.auth,
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = run_id .. "-" .. tid .. "-" .. counter,
  }, body)
end

function response(status, headers, body)
  count(status_key(status, body))
end
