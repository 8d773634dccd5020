--- The routing and policy subcommands (API.md, "Running"):
--- sbxlua route, sbxlua policy check (usage: lua/sbx/cli/usage.lua).
local sbx = require "sbx"
local request = require "sbx.cli.request"

local M = {}

local function say(...) io.stdout:write(...) end
local function complain(...) io.stderr:write("sbxlua: ", ...) io.stderr:write("\n") end
local function usage(cmd, ...)
  complain(cmd, ": ", ...)
  return 2
end

local function fmt_ms(x) return x and string.format("%.0f ms", x) or "-" end

-- --------------------------------------------------------------- route

-- What the routing stats are: this process's, empty in a fresh one; the
-- decision log has what earlier processes decided.
local function stats_note(r)
  for _, c in ipairs(r.candidates) do
    if (c.stats.samples or 0) > 0 then return nil end
  end
  return "(stats are this process's own and empty in a fresh `sbxlua route`; earlier decisions are in "
         .. require("sbx.state.owner").state_dir() .. "/decisions.jsonl)"
end

-- The policy that ordered the plan: the named one, or the default when
-- the named one failed (the warning went to stderr once already).
local function policy_used(r)
  if r.policy_error then return "default", " instead of '" .. tostring(r.policy) .. "', which failed" end
  return r.policy, ""
end

function M.route(o)
  local req, err = request.options(o)
  if not req then return usage("route", err) end
  local t
  t, err = request.seconds(o, "timeout")
  if not t then return usage("route", err) end
  if o.timeout then req.timeout_secs = t end
  local r = sbx.route(req)
  if o.json then
    say(request.json({ order = r.order, reasons = r.reasons, plan = r.plan, policy = r.policy,
                       policy_used = (policy_used(r)), policy_error = r.policy_error,
                       candidates = r.candidates, request = r.request },
                     { order = true, candidates = true, capabilities = true, regions = true, needs = true,
                       only = true, ignore = true }), "\n")
    return #r.order > 0 and 0 or 1
  end
  if #r.order == 0 then
    say("no route: no backend can take this request", o.explain and "" or " (--explain says why)", "\n")
  else
    say("order: ", table.concat(r.order, ", "), "\n")
    local name, instead = policy_used(r)
    say("policy: ", name, r.plan and r.plan.reason and (" (" .. r.plan.reason .. ")") or "", instead, "\n")
  end
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
    local note = stats_note(r)
    if note then say(note, "\n") end
  end
  return #r.order > 0 and 0 or 1
end

-- -------------------------------------------------------------- policy

function M.policy(_, rest)
  local policy = require "sbx.routing.policy"
  if rest[1] == "check" and rest[2] and not rest[3] then
    local ok, name = policy.check(rest[2])
    if not ok then
      complain("policy check: ", tostring(name))
      return 1
    end
    if name == nil then
      say("ok: the policy in ", rest[2], " loads and passes the self-check; it has no `name`",
          " (add name = \"...\" to say in logs and warnings which policy decided)\n")
    else
      say("ok: policy '", tostring(name), "' in ", rest[2], " loads and passes the self-check\n")
    end
    return 0
  elseif rest[1] == "list" and not rest[2] then
    say("built-in: ", table.concat(policy.builtins(), ", "), "\n")
    local path = policy.path()
    say("search path: ", #path > 0 and table.concat(path, ":") or "(none)", "\n")
    return 0
  end
  return usage("policy", "expected `check FILE` or `list` (see sbxlua policy --help)")
end

return M
