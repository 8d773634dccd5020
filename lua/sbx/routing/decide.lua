--- Routing's decision (DESIGN.md, "Routing"): the providers' static
--- descriptors and availability, the hard filter every request passes, the
--- policy's plan (with what warm sources hold: routing/warm.lua), and the
--- same checks for a pinned backend.
--- router.lua walks the plan (the attempts) and re-exports what is public.
local errors = require "sbx.core.errors"
local check = require "sbx.core.check"
local providers = require "sbx.providers"
local health = require "sbx.routing.health"
local meter = require "sbx.routing.meter"
local policy = require "sbx.routing.policy"
local config = require "sbx.core.config"
local loop = require "sbx.loop"
local warm = require "sbx.routing.warm"

local M = {}

-- Options every backend honours (the facade implements them on top).
local COMMON = {
  backend = true, policy = true, needs = true, only = true, ignore = true, isolation = true,
  max_price = true, region = true, preset = true, timeout_secs = true,
  command_timeout_secs = true, env_vars = true, files = true, git_repo = true,
  git_ref = true, labels = true, workspace = true,
}

-- Options the backend must honour itself; allow_internet counts only when false.
function M.unsupported(desc, opts)
  local missing = {}
  for k, v in pairs(opts) do
    if not COMMON[k] and not (desc.options or {})[k] and not (k == "allow_internet" and v == true) then
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

-- ------------------------------------------------------- descriptors

M.AVAIL_TTL = 2           -- seconds an availability answer is reused
local avail = {}          -- name -> { ok, reason, t }

local function availability(name, p, now)
  local a = avail[name]
  if a and now - a.t < M.AVAIL_TTL then return a.ok, a.reason end
  local ok, yes, reason = pcall(p.available)
  if not ok then yes, reason = false, tostring(yes) end
  avail[name] = { ok = yes and true or false, reason = (not yes) and tostring(reason) or nil, t = now }
  return avail[name].ok, avail[name].reason
end

-- What does not change between decisions: descriptors, effective prices and
-- limits. Rebuilt when the config or the set of providers changes.
local static

local function statics()
  local cfg = config.get()
  if static and static.cfg == cfg and static.gen == providers.generation
     and static.n == #providers.names then
    return static
  end
  local st = { cfg = cfg, gen = providers.generation, n = #providers.names, names = {}, by = {} }
  for _, n in ipairs(providers.names) do st.names[#st.names + 1] = n end
  for _, n in ipairs(providers.planned) do st.names[#st.names + 1] = n end
  for i, name in ipairs(st.names) do
    local d, p = {}, nil
    local loaded, got = pcall(providers.get, name)
    if loaded then
      p = got
      for k, v in pairs(p.descriptor) do d[k] = v end
    else
      d = { name = name, capabilities = {}, options = {},
            unavailable = errors.is(got, "BackendNotInstalledError") and "not in this build yet" or tostring(got) }
    end
    local pc = cfg.providers[name] or {}
    d.price = meter.price(name, d.price)
    d.limits = { max_concurrent = pc.max_concurrent, max_creates_per_sec = pc.max_creates_per_sec }
    if pc.regions or pc.region then d.regions = pc.regions or { pc.region } end
    if pc.enabled == false then d.unavailable = "disabled in the config" end
    d.order = i
    st.by[name] = { desc = d, p = p }
  end
  static = st
  return st
end

-- Availability of one static entry: (ok, reason).
local function available(e, name, now)
  if e.desc.unavailable then return false, e.desc.unavailable end
  return availability(name, e.p, now)
end

-- Make `sbxlua providers` / sbx.providers() show effective prices too.
providers.on_describe(function(d)
  d.price = meter.price(d.name, d.price)
  d.price_per_hour = meter.hourly(d.price, {}, d.defaults)   -- a sandbox with the defaults
  local pc = config.provider(d.name)
  d.limits = { max_concurrent = pc.max_concurrent, max_creates_per_sec = pc.max_creates_per_sec }
  if pc.enabled == false then d.available, d.reason = false, "disabled in the config" end
end)

-- A new config: forget what was worked out from the old one. (Providers
-- read their own settings: config.provider(name).)
config.on_change(function(cfg)
  avail, static = {}, nil
  if cfg.state_dir then require("sbx.state.owner").set_state_dir(cfg.state_dir) end
end)

-- ------------------------------------------------------- the hard filter

---Which backends may take this request, and why not the others.
---@return table[] candidates (policy-shaped), table reasons, table info
---With `reuse`, each provider's candidate table is kept between decisions and
---updated in place (for the built-in policies, which do not mutate them).
function M.candidates(opts, reuse)
  local keep, reasons = {}, {}
  local info = { budget = 0, full = 0 }
  local min_iso = opts.isolation and providers.ISOLATION[opts.isolation]
  if opts.isolation and not min_iso then
    check.bad("sandbox", "unknown isolation '" .. opts.isolation
      .. "' (process, namespace, container, gvisor, microvm)")
  end
  local st, now = statics(), loop.now()
  local names = st.names
  local only, ignore
  if opts.only then only = {} for _, n in ipairs(opts.only) do only[n] = true end end
  if opts.ignore then ignore = {} for _, n in ipairs(opts.ignore) do ignore[n] = true end end
  -- the options a backend must honour itself, worked out once
  local own = {}
  for k, v in pairs(opts) do
    if not COMMON[k] and not (k == "allow_internet" and v == true) then own[#own + 1] = k end
  end
  table.sort(own)
  local needs, region, max_price = opts.needs, opts.region, opts.max_price
  local hours = (opts.timeout_secs or 3600) / 3600
  local budgeted = meter.left() < math.huge
  local by = st.by
  for i = 1, #names do
    local name = names[i]
    local e = by[name]
    local desc, why = e.desc, nil
    if only and not only[name] then why = "not in 'only'"
    elseif ignore and ignore[name] then why = "in 'ignore'"
    else
      local up, reason = available(e, name, now)
      if not up then why = "unavailable: " .. tostring(reason) end
    end
    if not why and needs then
      for _, cap in ipairs(needs) do
        if not has(desc.capabilities, cap) then why = "lacks capability '" .. cap .. "'"; break end
      end
    end
    if not why and min_iso and (providers.ISOLATION[desc.isolation] or 0) < min_iso then
      why = "isolation '" .. tostring(desc.isolation) .. "' is below '" .. opts.isolation .. "'"
    end
    if not why and #own > 0 then
      local dopts, miss = desc.options or {}, nil
      for _, k in ipairs(own) do
        if not dopts[k] then
          miss = miss or {}
          miss[#miss + 1] = k == "allow_internet" and "allow_internet = false" or k
        end
      end
      if miss then why = "cannot honour " .. table.concat(miss, ", ") end
    end
    if not why and region and desc.regions and #desc.regions > 0 and not has(desc.regions, region) then
      why = "has no region '" .. region .. "' (" .. table.concat(desc.regions, ", ") .. ")"
    end
    local hourly = 0
    if not why then
      local pr = desc.price
      hourly = meter.hourly(pr, opts, desc.defaults)
      if max_price and hourly > max_price then
        why = string.format("costs $%.4f/h, over max_price $%.4f/h", hourly, max_price)
      elseif budgeted then
        local fits, bwhy = meter.fits(hourly * hours + pr.per_sandbox)
        if not fits then why = "over budget: " .. bwhy; info.budget = info.budget + 1 end
      end
    end
    if not why then
      local ok, bwhy = health.breaker_allows(name)
      if not ok then why = bwhy end
    end
    if not why and e.desc.limits.max_concurrent then
      why = health.full(name)
      if why then info.full = info.full + 1 end
    end
    if why then
      reasons[name] = why
    elseif reuse then
      local c = e.cand
      if not c then
        c = { name = name, capabilities = desc.capabilities, isolation = desc.isolation,
              regions = desc.regions or {} }
        e.cand = c
      end
      c.price_per_hour, c.stats, c.index = hourly, health.snapshot(name), #keep + 1
      keep[#keep + 1] = c
    else
      keep[#keep + 1] = { name = name, capabilities = desc.capabilities, isolation = desc.isolation,
                          price_per_hour = hourly, regions = desc.regions or {},
                          stats = health.snapshot(name), index = #keep + 1 }
    end
  end
  info.names = names
  return keep, reasons, info
end

-- -------------------------------------------------------------- deciding

local function policy_name(opts)
  if type(opts.policy) == "function" then return "(function)" end
  return opts.policy or config.get().default_policy or "default"
end

-- Copy of the request a policy (and the log) sees: plain data only.
local REQ_FIELDS = { "needs", "only", "ignore", "isolation", "max_price", "region", "cpu", "memory_mb",
                     "disk_mb", "gpu", "timeout_secs", "image", "template", "labels", "allow_internet",
                     "snapshot_id" }
local function request_of(opts)
  local r = {}
  for _, k in ipairs(REQ_FIELDS) do r[k] = opts[k] end
  r.policy = type(opts.policy) == "string" and opts.policy or nil
  return r
end

-- The policy for a request: a function, a loaded policy, or nil, why.
local function policy_for(opts)
  local name = policy_name(opts)
  if type(opts.policy) == "function" then return opts.policy, name end
  local pol, err, why = policy.get(name)
  if not pol and why == "missing" and opts.policy ~= nil then
    errors.raise("ConfigError", "sandbox: " .. err, { op = "create" })
  end
  return pol, name, err
end

local function run_policy(pol, name, err, req, cands, stats, now)
  local plan
  if pol then
    local copy = {}
    for i, c in ipairs(cands) do copy[i] = c end
    plan, err = policy.call(pol, req, copy, stats, now)
    if plan then return plan, name end
  end
  -- The policy failed: say so and let the default take over.
  local perr = "policy '" .. name .. "' failed: " .. tostring(err) .. "; the default policy takes over"
  if name ~= "default" then
    local def = policy.get("default")
    if def then
      local copy = {}
      for i, c in ipairs(cands) do copy[i] = c end
      plan = policy.call(def, req, copy, stats, now)
    end
  end
  if not plan then
    local order = {}
    for _, c in ipairs(cands) do order[#order + 1] = c.name end
    plan = { order = order, reason = "configured order" }
  end
  return plan, name, perr
end

---The full decision for a request: candidates, skip reasons, policy, plan.
function M.decide(opts)
  config.get()
  local pol, pname, perr0 = policy_for(opts)
  local cands, reasons, info = M.candidates(opts, type(pol) == "table" and pol.fn ~= nil)
  local req = request_of(opts)
  local d = { request = req, candidates = cands, reasons = reasons, info = info,
              policy = policy_name(opts) }
  if #cands == 0 then d.order = {} return d end
  -- A backend with warm sandboxes of a matching pool (sbx.pool) creates in
  -- ~0 ms: its candidate says so (warm = n, create latency 0) to the policy.
  local held = warm.count(opts)
  if held then
    for _, c in ipairs(cands) do
      c.warm = held[c.name]
      if c.warm then
        local s = {}
        for k, v in pairs(c.stats) do s[k] = v end
        s.p50_create_ms, s.p95_create_ms = 0, 0
        c.stats = s
      end
    end
  end
  local stats = {}
  for _, c in ipairs(cands) do stats[c.name] = c.stats end
  local plan, _, perr = run_policy(pol, pname, perr0, req, cands, stats, health.clock())
  d.plan, d.order, d.policy_error = plan, plan.order, perr
  if perr then policy.warn(perr) end
  return d
end

local function no_route(d)
  local lines = {}
  for _, n in ipairs(d.info.names) do
    if d.reasons[n] then lines[#lines + 1] = n .. ": " .. d.reasons[n] end
  end
  local msg = "no backend can take this request; " .. table.concat(lines, "; ")
  if d.info.budget > 0 then   -- some backend passed every check but the budget
    errors.raise("BudgetExceededError", "the job's budget cannot cover this sandbox; " .. table.concat(lines, "; "),
                 { op = "create", reasons = d.reasons })
  end
  errors.raise("NoRouteError", msg, { op = "create", reasons = d.reasons })
end

---Dry run (sbx.route): { order, reasons, plan, candidates, policy, policy_error }.
function M.route(opts)
  local d = M.decide(opts)
  local cands = {}
  for i, c in ipairs(d.candidates) do
    cands[i] = {}
    for k, v in pairs(c) do cands[i][k] = v end
  end
  local peeked = warm.take(d.order[1], opts, true)
  return { order = d.order, reasons = d.reasons, plan = d.plan, candidates = cands,
           policy = d.policy, policy_error = d.policy_error, request = d.request, warm = peeked }
end

---Backend names to try, in order; raises NoRouteError when none is left.
function M.order(opts)
  local d = M.decide(opts)
  if #d.order == 0 then no_route(d) end
  return d.order
end

-- A pinned backend gets the request's routing options checked as routing
-- would check them, instead of ignoring them.
local function check_pinned(name, desc, opts)
  local function bad(kind, why)
    errors.raise(kind, name .. " was asked for, but " .. why, { backend = name, op = "create" })
  end
  if opts.only and not has(opts.only, name) then bad("ConfigError", "it is not in 'only'") end
  if has(opts.ignore, name) then bad("ConfigError", "it is in 'ignore'") end
  for _, cap in ipairs(opts.needs or {}) do
    if not has(desc.capabilities, cap) then bad("FeatureNotSupportedError", "it lacks capability '" .. cap .. "'") end
  end
  local min_iso = opts.isolation and providers.ISOLATION[opts.isolation]
  if min_iso and (providers.ISOLATION[desc.isolation] or 0) < min_iso then
    bad("FeatureNotSupportedError", "its isolation '" .. tostring(desc.isolation) .. "' is below '"
        .. opts.isolation .. "'")
  end
  if opts.region and desc.regions and #desc.regions > 0 and not has(desc.regions, opts.region) then
    bad("FeatureNotSupportedError", "it has no region '" .. opts.region .. "' ("
        .. table.concat(desc.regions, ", ") .. ")")
  end
  local pr = desc.price
  if opts.max_price and pr then
    local hourly = pr.per_hour + pr.per_vcpu_hour * (opts.cpu or meter.DEFAULT_CPU)
                   + pr.per_gib_hour * (opts.memory_mb or meter.DEFAULT_MEMORY_MB) / 1024
    if hourly > opts.max_price then
      bad("ConfigError", string.format("it costs $%.4f/h, over max_price $%.4f/h", hourly, opts.max_price))
    end
  end
  if type(opts.policy) == "string" then policy_for(opts) end   -- an unknown name: ConfigError
end

---The static descriptor of pinned backend `name` (nil for an unknown one),
---the request's routing options checked against it (raises as routing would).
function M.pinned_desc(name, opts)
  -- the static descriptor only: a pinned create probes no other backend
  local e = statics().by[name]
  local desc = e and e.desc
  if desc then check_pinned(name, desc, opts) end
  return desc
end

---A create on `name` found it unavailable: routing skips it for AVAIL_TTL.
function M.mark_unavailable(name, reason)
  avail[name] = { ok = false, reason = reason, t = loop.now() }
end

M.no_route, M.warm_take, M.add_warm_source = no_route, warm.take, warm.add

---Forget the descriptors and availability answers (tests).
function M.reset()
  avail, static = {}, nil
end

return M
