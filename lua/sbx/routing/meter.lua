--- The meter: prices, the ledger of what each sandbox cost, usage reports
--- and the job's budget.
---
--- A sandbox costs its provider's hourly price for its resources times its
--- lifetime (plus any per-sandbox fee). When it is destroyed (or the process
--- exits and destroys it) one JSON line goes to `<state dir>/ledger.jsonl`.
local errors = require "sbx.core.errors"
local json = require "cjson.safe"

local M = {}

-- Published prices (see PRICES.md); users override them in sbx.yaml.
M.PRICES = {
  version = "2026-11-29",
  e2b = { per_vcpu_hour = 0.0504, per_gib_hour = 0.0162 },
  daytona = { per_vcpu_hour = 0.0504, per_gib_hour = 0.0162 },
  modal = { per_vcpu_hour = 0.0710, per_gib_hour = 0.0242 },
  tensorlake = { per_vcpu_hour = 0.05, per_gib_hour = 0.015 },
  ["local"] = {}, bwrap = {}, docker = {}, ray = {}, safehouse = {},
}
local FIELDS = { "per_hour", "per_vcpu_hour", "per_gib_hour", "per_sandbox" }

-- Resources a request is priced at when it names none and its provider's
-- descriptor has no `defaults` (what its sandboxes get unasked).
M.DEFAULT_CPU, M.DEFAULT_MEMORY_MB = 1, 1024

---The cpu and memory_mb a sandbox gets: the request's, else the provider's
---descriptor defaults (the create uses the same), else the meter's.
---@return number cpu, number memory_mb
function M.resources(opts, defaults)
  defaults = defaults or {}
  return opts.cpu or defaults.cpu or M.DEFAULT_CPU, opts.memory_mb or defaults.memory_mb or M.DEFAULT_MEMORY_MB
end

---The effective price table of a provider: config (whole) > built-in table > descriptor.
---@return table { per_hour, per_vcpu_hour, per_gib_hour, per_sandbox, source }
function M.price(name, desc_price)
  local cfg = require("sbx.core.config").provider(name).price
  local base = M.PRICES[name] or desc_price or {}
  local p = { source = cfg and "config" or (M.PRICES[name] and ("default " .. M.PRICES.version) or "provider") }
  for _, f in ipairs(FIELDS) do   -- a config price replaces the built-in one whole
    if cfg then p[f] = cfg[f] or 0 else p[f] = base[f] or 0 end
  end
  return p
end

---Dollars per hour for the request's resources (`defaults`: the provider's
---descriptor defaults, for what the request does not name).
function M.hourly(price, opts, defaults)
  local cpu, mb = M.resources(opts, defaults)
  return (price.per_hour or 0) + (price.per_vcpu_hour or 0) * cpu + (price.per_gib_hour or 0) * mb / 1024
end

---Projected cost of a request on a provider: hourly x timeout_secs + fee.
function M.projected(price, opts, defaults)
  return M.hourly(price, opts, defaults) * (opts.timeout_secs or 3600) / 3600 + (price.per_sandbox or 0)
end

-- ------------------------------------------------------------- budget

local budget            -- dollars, or nil
local spent, reserved = 0, 0

---sbx.budget(usd): cap this job's spend; nil or false removes the cap.
function M.set_budget(usd)
  if usd == false then usd = nil end
  if usd ~= nil and (type(usd) ~= "number" or usd ~= usd or usd < 0) then
    errors.raise("ConfigError", "budget: expected dollars >= 0, got " .. tostring(usd), { op = "budget" })
  end
  budget = usd
  return M.left()
end

---sbx.budget(...): with no argument, what is left (the cap unchanged);
---with one, set_budget. select('#') tells budget() from budget(nil).
function M.budget(...)
  if select("#", ...) == 0 then return M.left() end
  return M.set_budget((...))
end

---Dollars left (math.huge without a budget).
function M.left()
  if not budget then return math.huge end
  return budget - spent - reserved
end

---What this job has spent so far, and what its live sandboxes reserve.
function M.spent() return spent, reserved end

---Would a create that projects `cost` fit? (false, message when not)
function M.fits(cost)
  local left = M.left()
  if cost <= left + 1e-12 then return true end
  return false, string.format("projected $%.4f exceeds the $%.4f left of the budget", cost, math.max(left, 0))
end

-- ------------------------------------------------------------- ledger

local ledger            -- { path=, journal= }

local function ledger_path()
  return require("sbx.state.owner").state_dir() .. "/ledger.jsonl"
end

local function append(line)
  local path = ledger_path()
  if not ledger or ledger.path ~= path then
    if ledger then ledger.journal:close() end
    local j, err = require("sbx.fs").journal(path)
    if not j then return nil, err end
    ledger = { path = path, journal = j }
  end
  return ledger.journal:append(line, false)   -- written, not fsynced: lost only with the machine
end

---The job name recorded with each sandbox: $SBX_JOB, else the script.
function M.job()
  local j = os.getenv("SBX_JOB")
  if j and j ~= "" then return j end
  local a = rawget(_G, "arg")
  return type(a) == "table" and type(a[0]) == "string" and a[0] or "-"
end

---A sandbox starts costing: reserve its projected cost against the budget.
---@return table record for stop()
function M.start(f)
  local price = M.price(f.backend, f.desc_price)
  local cpu, mb = M.resources(f.opts, f.defaults)
  local r = {
    id = f.id, backend = f.backend, session = f.session, job = M.job(), labels = f.labels,
    cpu = cpu, memory_mb = mb,
    price = price, per_hour = M.hourly(price, f.opts, f.defaults), started = os.time(),
    t0 = require("sbx.loop").now(), projected = M.projected(price, f.opts, f.defaults),
  }
  reserved = reserved + r.projected
  return r
end

---The sandbox is gone: write its ledger line (once).
function M.stop(r)
  if r.done then return end
  r.done = true
  reserved = reserved - r.projected
  local secs = math.max(0, require("sbx.loop").now() - r.t0)
  local cost = r.per_hour * secs / 3600 + (r.price.per_sandbox or 0)
  spent = spent + cost
  local ok, err = append(json.encode{
    v = 1, id = r.id, backend = r.backend, session = r.session, job = r.job,
    labels = r.labels, cpu = r.cpu, memory_mb = r.memory_mb, started = r.started,
    ended = os.time(), seconds = math.floor(secs * 1000 + 0.5) / 1000,
    per_hour = r.per_hour, price_source = r.price.source, cost_usd = cost,
  } .. "\n")
  if not ok then io.stderr:write("sbxlua: cannot write the ledger: ", tostring(err), "\n") end
end

---Parse --since: "24h", "30m", "7d", "90s", an epoch, or "YYYY-MM-DD".
function M.since(s, now)
  now = now or os.time()
  if s == nil then return 0 end
  local n, unit = tostring(s):match("^(%d+%.?%d*)([smhdw]?)$")
  if n then
    if unit == "" then return tonumber(n) end
    local mult = ({ s = 1, m = 60, h = 3600, d = 86400, w = 604800 })[unit]
    return now - tonumber(n) * mult
  end
  local y, mo, d = tostring(s):match("^(%d%d%d%d)-(%d%d)-(%d%d)$")
  if y then
    local t = os.time{ year = tonumber(y), month = tonumber(mo), day = tonumber(d), hour = 0 }
    -- os.time normalizes 2026-13-45 to a real date: a date must survive the round trip
    if os.date("%Y-%m-%d", t) == s then return t end
    errors.raise("ConfigError", "usage: --since " .. s .. " is not a date (YYYY-MM-DD)", { op = "usage" })
  end
  errors.raise("ConfigError", "usage: --since expects 24h, 30m, 7d, an epoch or YYYY-MM-DD, got '"
               .. tostring(s) .. "'", { op = "usage" })
end

---The ledger's lines of sandboxes that ended at `since` (epoch) or later,
---decoded; a torn or foreign line is skipped.
---@return table[]
function M.entries(since)
  local data = require("sbx.fs").read_host(ledger_path(), 256 * 1024 * 1024) or ""
  local list = {}
  for line in data:gmatch("[^\n]+") do
    local e = json.decode(line)
    if type(e) == "table" and type(e.cost_usd) == "number" and (tonumber(e.ended) or 0) >= (since or 0) then
      list[#list + 1] = e
    end
  end
  return list
end

---Spend from the ledger: { total = {cost_usd, sandboxes, seconds}, groups = { [key] = {...} } }
function M.usage(o)
  o = o or {}
  local by = o.by or "provider"
  if by ~= "provider" and by ~= "label" and by ~= "job" then
    errors.raise("ConfigError", "usage: 'by' must be provider, label or job, got '" .. tostring(by) .. "'",
                 { op = "usage" })
  end
  local since = type(o.since) == "number" and o.since or M.since(o.since)
  local total = { cost_usd = 0, sandboxes = 0, seconds = 0 }
  local groups = {}
  local function add(key, e)
    local g = groups[key]
    if not g then g = { cost_usd = 0, sandboxes = 0, seconds = 0 }; groups[key] = g end
    g.cost_usd = g.cost_usd + (e.cost_usd or 0)
    g.sandboxes = g.sandboxes + 1
    g.seconds = g.seconds + (e.seconds or 0)
  end
  for _, e in ipairs(M.entries(since)) do
    total.cost_usd = total.cost_usd + e.cost_usd
    total.sandboxes = total.sandboxes + 1
    total.seconds = total.seconds + (e.seconds or 0)
    if by == "provider" then add(tostring(e.backend), e)
    elseif by == "job" then add(tostring(e.job or "-"), e)
    else
      local any = false
      if type(e.labels) == "table" then
        for k, v in pairs(e.labels) do add(tostring(k) .. "=" .. tostring(v), e); any = true end
      end
      if not any then add("(no labels)", e) end
    end
  end
  return { by = by, since = since, total = total, groups = groups }
end

return M
