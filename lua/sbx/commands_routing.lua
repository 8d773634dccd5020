--- The routing and policy subcommands (API.md, "Running"):
--- sbxlua route, sbxlua policy check (usage: lua/sbx/usage.lua).
local sbx = require "sbx"
local errors = require "sbx.errors"

local M = {}

local function say(...) io.stdout:write(...) end
local function complain(...) io.stderr:write("sbxlua: ", ...) io.stderr:write("\n") end

local function fmt_ms(x) return x and string.format("%.0f ms", x) or "-" end

-- --------------------------------------------------------------- route

local ROUTE_OPTS = { policy = "value", need = "list", only = "list", ignore = "list",
                     isolation = "value", ["max-price"] = "value", region = "value", cpu = "value",
                     ["memory-mb"] = "value", image = "value", timeout = "value",
                     explain = "bool", json = "bool" }

function M.route(args, parse)
  local o, rest = parse(args, ROUTE_OPTS, "route")
  if not o then complain(rest) return 2 end
  if #rest > 0 then complain("route: unexpected argument ", rest[1]) return 2 end
  local req = { policy = o.policy, needs = o.need, only = o.only, ignore = o.ignore,
                isolation = o.isolation, region = o.region, image = o.image }
  for flag, key in pairs{ ["max-price"] = "max_price", cpu = "cpu", ["memory-mb"] = "memory_mb",
                          timeout = "timeout_secs" } do
    if o[flag] then
      local n = tonumber(o[flag])
      if not n then complain("route: --", flag, " expects a number, got ", o[flag]) return 2 end
      req[key] = n
    end
  end
  local ok, r = pcall(sbx.route, req)
  if not ok then
    if errors.is(r, "SandboxError") then complain(tostring(r)) return 1 end
    error(r, 0)
  end
  if o.json then
    say(sbx.json.encode{ order = r.order, reasons = r.reasons, plan = r.plan, policy = r.policy,
                         policy_error = r.policy_error, candidates = r.candidates, request = r.request }, "\n")
    return #r.order > 0 and 0 or 1
  end
  if #r.order == 0 then
    say("no route: no backend can take this request\n")
  else
    say("order: ", table.concat(r.order, ", "), "\n")
    say("policy: ", r.policy, r.plan and r.plan.reason and (" (" .. r.plan.reason .. ")") or "", "\n")
  end
  if r.policy_error then say("warning: ", r.policy_error, "\n") end
  if o.explain then
    local by = {}
    for _, c in ipairs(r.candidates) do by[c.name] = c end
    local rank = {}
    for i, n in ipairs(r.order) do rank[n] = i end
    local names = {}
    for _, c in ipairs(r.candidates) do names[#names + 1] = c.name end
    for n in pairs(r.reasons) do names[#names + 1] = n end
    table.sort(names, function(a, b)
      local ra, rb = rank[a] or 1e9, rank[b] or 1e9
      if ra ~= rb then return ra < rb end
      return a < b
    end)
    for _, n in ipairs(names) do
      local c = by[n]
      if c then
        local s = c.stats
        say(string.format("  %-2s %-11s kept     $%.4f/h  isolation=%s  p50 create %s  p50 exec %s  errors %.0f%%  in flight %d\n",
          rank[n] and tostring(rank[n]) or "-", n, c.price_per_hour, c.isolation, fmt_ms(s.p50_create_ms),
          fmt_ms(s.p50_exec_ms), (s.error_rate or 0) * 100, s.in_flight or 0))
      else
        say(string.format("  -  %-11s skipped  %s\n", n, r.reasons[n]))
      end
    end
  end
  return #r.order > 0 and 0 or 1
end

-- -------------------------------------------------------------- policy

function M.policy(args, parse)
  local o, rest = parse(args, {}, "policy")
  if not o then complain(rest) return 2 end
  local policy = require "sbx.policy"
  if rest[1] == "check" and rest[2] and not rest[3] then
    local ok, name = policy.check(rest[2])
    if not ok then
      complain("policy check: ", tostring(name))
      return 1
    end
    say("ok: policy '", tostring(name), "' in ", rest[2], " loads and passes the self-check\n")
    return 0
  elseif rest[1] == "list" and not rest[2] then
    say("built-in: ", table.concat(policy.builtins(), ", "), "\n")
    local path = policy.path()
    say("search path: ", #path > 0 and table.concat(path, ":") or "(none)", "\n")
    return 0
  end
  complain("usage: sbxlua policy check FILE | sbxlua policy list")
  return 2
end

return M
