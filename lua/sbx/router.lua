--- Routing: the hard filter every request passes before any policy, and
--- the order in which backends are tried.
local errors = require "sbx.errors"
local check = require "sbx.check"
local providers = require "sbx.providers"

local M = {}

-- Options every backend honours (the facade implements them on top).
local COMMON = {
  backend = true, policy = true, needs = true, only = true, ignore = true, isolation = true,
  max_price = true, region = true, preset = true, timeout_secs = true,
  command_timeout_secs = true, env_vars = true, files = true, git_repo = true,
  git_ref = true, labels = true,
}

-- Options the backend must honour itself; allow_internet counts only when false.
function M.unsupported(desc, opts)
  local missing = {}
  for k, v in pairs(opts) do
    if not COMMON[k] and not desc.options[k] and not (k == "allow_internet" and v == true) then
      missing[#missing + 1] = k == "allow_internet" and "allow_internet = false" or k
    end
  end
  table.sort(missing)
  return missing
end

local function has(list, x)
  for _, v in ipairs(list or {}) do if v == x then return true end end
  return false
end

local function hourly_price(desc, opts)
  local p = desc.price or {}
  return (p.per_hour or 0) + (p.per_vcpu_hour or 0) * (opts.cpu or 1)
       + (p.per_gib_hour or 0) * (opts.memory_mb or 1024) / 1024
end

---The hard filter: which backends may take this request, and why not the others.
function M.candidates(opts)
  local keep, reasons = {}, {}
  local min_iso = opts.isolation and providers.ISOLATION[opts.isolation]
  if opts.isolation and not min_iso then
    check.bad("sandbox", "unknown isolation '" .. opts.isolation
      .. "' (process, namespace, container, gvisor, microvm)")
  end
  local all, described = {}, providers.describe()
  for _, n in ipairs(providers.names) do all[#all + 1] = n end
  for _, n in ipairs(providers.planned) do all[#all + 1] = n end
  for _, name in ipairs(all) do
    local why
    if opts.only and not has(opts.only, name) then why = "not in 'only'"
    elseif has(opts.ignore, name) then why = "in 'ignore'" end
    local desc = not why and described[name]
    if desc and not desc.available then why = "unavailable: " .. tostring(desc.reason) end
    if desc and not why then
      for _, cap in ipairs(opts.needs or {}) do
        if not has(desc.capabilities, cap) then why = "lacks capability '" .. cap .. "'"; break end
      end
    end
    if desc and not why and min_iso and providers.ISOLATION[desc.isolation] < min_iso then
      why = "isolation '" .. desc.isolation .. "' is below '" .. opts.isolation .. "'"
    end
    if desc and not why then
      local miss = M.unsupported(desc, opts)
      if #miss > 0 then why = "cannot honour " .. table.concat(miss, ", ") end
    end
    if desc and not why and opts.max_price and hourly_price(desc, opts) > opts.max_price then
      why = string.format("costs $%.4f/h, over max_price $%.4f/h", hourly_price(desc, opts), opts.max_price)
    end
    if why then reasons[name] = why else keep[#keep + 1] = desc end
  end
  return keep, reasons
end

---Backend names to try, in order; raises NoRouteError when none is left.
function M.order(opts)
  local keep, reasons = M.candidates(opts)
  local order = {}
  for _, d in ipairs(keep) do order[#order + 1] = d.name end
  if type(opts.policy) == "function" then
    local ok, plan = pcall(opts.policy, opts, keep, {}, os.time())
    local valid = ok and type(plan) == "table" and type(plan.order) == "table"
    local picked = {}
    for _, c in ipairs(valid and plan.order or {}) do
      local n = type(c) == "table" and c.name or c
      if not has(order, n) then valid = false break end
      picked[#picked + 1] = n
    end
    if valid then order = picked
    else
      io.stderr:write("sbxlua: the routing policy failed (", ok and "bad plan" or tostring(plan),
                      "); using the default order\n")
    end
  elseif opts.policy ~= nil and opts.policy ~= "default" then
    check.bad("sandbox", "unknown policy '" .. opts.policy .. "' (known: default)")
  end
  if #order == 0 then
    local lines = {}
    for _, n in ipairs(providers.names) do lines[#lines + 1] = n .. ": " .. (reasons[n] or "?") end
    for _, n in ipairs(providers.planned) do
      if reasons[n] then lines[#lines + 1] = n .. ": " .. reasons[n] end
    end
    errors.raise("NoRouteError", "no backend can take this request; " .. table.concat(lines, "; "),
                 { op = "create", reasons = reasons })
  end
  return order
end

return M
