--- Routing (DESIGN.md, "Routing"): the hard filter every request passes
--- before any policy, the policy's plan, and the attempts that walk it
--- (fail over only at create, error classes, breakers, admission, hedging,
--- stats, the decision log).
local errors = require "sbx.errors"
local check = require "sbx.check"
local providers = require "sbx.providers"
local health = require "sbx.health"
local meter = require "sbx.meter"
local policy = require "sbx.policy"
local config = require "sbx.config"
local loop = require "sbx.loop"
local json = require "cjson.safe"

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
  if cfg.state_dir then require("sbx.owner").set_state_dir(cfg.state_dir) end
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

-- ------------------------------------------------------- warm sources

-- Where routing finds sandboxes made ahead of time (sbx.pool's open pools).
local warm_sources = {}

---Let routing take warm sandboxes from `src`: src.count(opts) -> { [backend]
---= n } of sandboxes matching the request (nil or empty: none);
---src.take(backend, opts, peek) -> sb, how | nil (with `peek`: only how,
---nothing handed out).
function M.add_warm_source(src)
  assert(type(src) == "table" and type(src.count) == "function" and type(src.take) == "function",
         "add_warm_source: expected { count = fn, take = fn }")
  warm_sources[#warm_sources + 1] = src
end

-- backend -> warm sandboxes matching `opts`, summed over the sources (nil
-- when there is no source).
local function warm_count(opts)
  if #warm_sources == 1 then return warm_sources[1].count(opts) or {} end
  if #warm_sources == 0 then return nil end
  local out = {}
  for _, src in ipairs(warm_sources) do
    for name, n in pairs(src.count(opts) or {}) do out[name] = (out[name] or 0) + n end
  end
  return out
end

-- The first source's matching warm sandbox on `backend`: sb, how (peek: how).
local function warm_take(backend, opts, peek)
  for _, src in ipairs(warm_sources) do
    local sb, how = src.take(backend, opts, peek)
    if sb then return sb, how end
  end
  return nil
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
  local warm = warm_count(opts)
  if warm then
    for _, c in ipairs(cands) do
      c.warm = warm[c.name]
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
  local warm = warm_take(d.order[1], opts, true)
  return { order = d.order, reasons = d.reasons, plan = d.plan, candidates = cands,
           policy = d.policy, policy_error = d.policy_error, request = d.request, warm = warm }
end

---Backend names to try, in order; raises NoRouteError when none is left.
function M.order(opts)
  local d = M.decide(opts)
  if #d.order == 0 then no_route(d) end
  return d.order
end

-- ------------------------------------------------------- error classes

local TERMINAL = { ConfigError = true, FeatureNotSupportedError = true, PathError = true,
                   BudgetExceededError = true, NoRouteError = true, Cancelled = true }

---Classify a create failure: "terminal" (the request is wrong: do not fail
---over, do not trip a breaker), "request" (this backend cannot take this
---request: fail over, no breaker), "capacity" (429/quota: fail over, counts
---toward the 429 rate and the breaker), "unavailable", "retryable".
-- Kinds that say which class they are (API.md "Errors"): a lost or slow
-- link is worth another backend and counts toward the breaker.
local BY_KIND = { RateLimitError = "capacity", QuotaExceededError = "capacity",
                  SandboxConnectionError = "retryable", SandboxTimeoutError = "retryable",
                  AuthenticationError = "unavailable" }

function M.classify(err)
  if type(err) ~= "table" or not err.kind then return "terminal" end
  if TERMINAL[err.kind] or err.phase == "prepare" then return "terminal" end
  if BY_KIND[err.kind] then return BY_KIND[err.kind] end
  local msg = tostring(err.message)
  local status = tonumber(err.status) or tonumber(msg:match("HTTP (%d%d%d)"))
  if status == 429 or msg:lower():find("rate limit", 1, true) or msg:lower():find("quota", 1, true)
     or msg:lower():find("too many", 1, true) then
    return "capacity"
  end
  if status and status >= 400 and status < 500 then return "request" end
  if msg:find("pulling it failed", 1, true) or msg:find("does not exist", 1, true) then return "request" end
  if err.kind == "BackendNotInstalledError" then return "unavailable" end
  return "retryable"
end

-- --------------------------------------------------------- decision log

local log_file, log_path

local function log_decision(entry)
  if config.get().routing.decision_log == false then return end
  local path = require("sbx.owner").state_dir() .. "/decisions.jsonl"
  if log_path ~= path then
    if log_file then log_file:close() end
    local j = require("sbx.fs").journal(path) if j then j:close() end   -- made 0600, as the journal and ledger
    log_file, log_path = io.open(path, "a"), path
    if log_file then log_file:setvbuf("line") end
  end
  if log_file then log_file:write(json.encode(entry) or "{}", "\n") end
end

local function summary(d)
  local cands = {}
  for _, n in ipairs(d.info.names) do
    cands[#cands + 1] = { name = n, skipped = d.reasons[n] }
  end
  return { time = os.time(), request = d.request, policy = d.policy, policy_error = d.policy_error,
           candidates = cands, plan = d.plan }
end

-- ------------------------------------------------------------- attempts

-- One create on `name`: stats in/out, breaker trial, classification.
local function attempt(name, opts, create_on, lease)
  health.breaker_trial(name)
  health.in_flight(name, 1)
  local t0 = loop.now()
  local ok, res = pcall(create_on, name, opts, lease)
  health.in_flight(name, -1)
  local ms = (loop.now() - t0) * 1000
  local class = not ok and M.classify(res) or nil
  if not ok and errors.is(res, "Cancelled") then   -- not the provider's failure: no breaker charge
    health.breaker_result(name, false, "cancelled")  -- (a half-open trial is over)
    if lease then lease:release() end
    error(res, 0)
  end
  if class ~= "terminal" then health.record_create(name, ms, ok, class, not ok and res or nil) end
  if not ok then
    if lease then lease:release() end
    if class == "unavailable" then avail[name] = { ok = false, reason = tostring(res.message), t = loop.now() } end
  end
  return ok, res, class, ms
end

-- Race `first` and, after hedge_ms, `second`; the first success wins and
-- the other is destroyed when it arrives.
local function hedged(first, second, opts, create_on, hedge_ms, tries)
  local function start(name)
    local lease = health.acquire(name, false)
    if not lease then return nil end
    return { name = name, task = loop.spawn(function() return attempt(name, opts, create_on, lease) end) }
  end
  local runs = { start(first) }
  if not runs[1] then return nil end
  local t0, started_second, lasterr = loop.now(), false, nil
  while true do
    if not started_second and (loop.now() - t0) * 1000 >= hedge_ms then
      started_second = true
      local r = start(second)
      if r then runs[#runs + 1] = r end
    end
    local pending = 0
    for i, r in ipairs(runs) do
      if not r.done and r.task:status() == "done" then
        r.done = true
        local jok, ok, res, class, ms = r.task:join()
        if not jok then ok, res, class = false, ok, "terminal" end
        tries[#tries + 1] = { backend = r.name, ok = ok, class = class, ms = ms and math.floor(ms),
                              error = not ok and tostring(res) or nil, hedge = i > 1 or nil }
        if ok then
          for _, other in ipairs(runs) do
            if other ~= r and not other.done then
              other.done = true
              loop.spawn(function()
                local _, ook, osb = other.task:join()
                if ook then pcall(osb.destroy, osb) end
                tries[#tries + 1] = { backend = other.name, ok = ook, lost_hedge = true }
              end)
            end
          end
          return true, res
        end
        if class == "terminal" then return false, res, class end
        lasterr = res
      end
      if not r.done then pending = pending + 1 end
    end
    if pending == 0 and started_second then return false, lasterr end
    if pending == 0 and not started_second then
      started_second = true
      local r = start(second)
      if not r then return false, lasterr end
      runs[#runs + 1] = r
    end
    loop.sleep(0.002)
  end
end

---Create a routed sandbox: walk the plan, failing over at create only.
function M.create(opts, create_on)
  local d = M.decide(opts)
  local waited = loop.now()
  while #d.order == 0 do
    -- Every eligible backend is at max_concurrent: wait (yielding) for a slot.
    if d.info.full == 0 then no_route(d) end
    if loop.now() - waited > (config.get().routing.admission_wait_secs or 600) then no_route(d) end
    loop.sleep(0.01)
    d = M.decide(opts)
  end
  -- The policy's first choice has a warm sandbox of a matching pool: take it.
  local sb, how
  sb, how = warm_take(d.order[1], opts)
  if sb then
    local entry = summary(d)
    entry.warm = how
    entry.attempts = { { backend = sb.backend, ok = true, ms = 0, warm = how.pool } }
    entry.outcome = { backend = sb.backend, id = sb.id, warm = how.pool }
    log_decision(entry)
    return sb
  end
  local plan = d.plan
  local max = math.min(plan.max_attempts or config.get().routing.max_attempts or #d.order, #d.order)
  local entry = summary(d)
  local tries = {}
  entry.attempts = tries
  local last
  local hedge = plan.hedge_after_ms or config.get().routing.hedge_after_ms
  local i = 1
  if hedge and #d.order >= 2 and max >= 2 then
    local ok, res, class = hedged(d.order[1], d.order[2], opts, create_on, hedge, tries)
    if ok == nil then
      -- the first backend had no free slot: walk the plan without hedging
    elseif ok then
      entry.outcome = { backend = res.backend, id = res.id }
      log_decision(entry)
      return res
    end
    if class == "terminal" then
      entry.outcome = { error = tostring(res) }
      log_decision(entry)
      error(res, 0)
    end
    if ok == false then
      last = res
      i = 3
    end
  end
  while i <= max do
    local name = d.order[i]
    i = i + 1
    local lease, why = health.acquire(name, false)
    if not lease then
      tries[#tries + 1] = { backend = name, ok = false, class = "capacity", error = why }
    else
      local ok, res, class, ms = attempt(name, opts, create_on, lease)
      tries[#tries + 1] = { backend = name, ok = ok, class = class, ms = math.floor(ms),
                            error = not ok and tostring(res) or nil }
      if ok then
        entry.outcome = { backend = name, id = res.id }
        log_decision(entry)
        return res
      end
      last = res
      if class == "terminal" then break end
    end
  end
  entry.outcome = { error = tostring(last) }
  log_decision(entry)
  if last == nil then
    errors.raise("SandboxCreationError", "every backend of the plan was at capacity",
                 { op = "create", attempts = tries })
  end
  error(last, 0)
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

---Create on a pinned backend: budget, admission (waits, yielding), stats.
function M.pinned(name, opts, create_on)
  config.get()
  -- the static descriptor only: a pinned create probes no other backend
  local e = statics().by[name]
  local desc = e and e.desc
  if desc then check_pinned(name, desc, opts) end
  if desc and desc.price then
    local fits, why = meter.fits(meter.projected(desc.price, opts, desc.defaults))
    if not fits then
      errors.raise("BudgetExceededError", name .. ": " .. why, { backend = name, op = "create" })
    end
  end
  -- a 429 lowered the admitted rate (health): wait for it and go again,
  -- within routing.admission_wait_secs (a 429 means nothing was made)
  local stop = loop.now() + (config.get().routing.admission_wait_secs or 600)
  while true do
    local lease = health.acquire(name, true)
    local ok, res = attempt(name, opts, create_on, lease)
    if ok then return res end
    if not errors.is(res, "RateLimitError") or loop.now() >= stop then error(res, 0) end
  end
end

-- ----------------------------------------------------- a sandbox's life

---Wrap a provider for one sandbox: exec latency into the stats; destroy
---releases the admission slot and writes the ledger line.
function M.track(p, name, opts, lease, f)
  local rec = meter.start{ id = f.id, backend = name, session = f.session, labels = opts.labels,
                           opts = opts, desc_price = p.descriptor and p.descriptor.price,
                           defaults = p.descriptor and p.descriptor.defaults }
  health.live(name, 1)
  local done = false
  local function finish()
    if done then return end
    done = true
    health.live(name, -1)
    if lease then lease:release() end
    meter.stop(rec)
  end
  local proxy = setmetatable({}, { __index = p })
  function proxy.destroy(h)
    local ok, err = pcall(p.destroy, h)
    finish()
    if not ok then error(err, 0) end
  end
  function proxy.spawn(h, req)
    local t0 = loop.now()
    local proc = p.spawn(h, req)
    local wrapped = setmetatable({}, {
      __index = function(_, k)
        local v = proc[k]
        if k == "wait" then
          return function(_, ...)
            local r = proc:wait(...)
            health.record_exec(name, (loop.now() - t0) * 1000)
            return r
          end
        end
        if type(v) == "function" then return function(_, ...) return v(proc, ...) end end
        return v
      end,
      __close = function() if proc.close then proc:close() end end,
    })
    return wrapped
  end
  return proxy, finish
end

---Forget caches (tests).
function M.reset()
  avail, static = {}, nil
  health.reset()
end

return M
