--- Routing (DESIGN.md, "Routing"): the hard filter every request passes
--- before any policy, the policy's plan, and the attempts that walk it
--- (fail over only at create, error classes, breakers, admission, hedging,
--- stats, the decision log).
---
--- The decision itself (descriptors, the filter, the policy, warm sources)
--- is router_decide.lua's; this module re-exports it.
local errors = require "sbx.core.errors"
local health = require "sbx.routing.health"
local meter = require "sbx.routing.meter"
local config = require "sbx.core.config"
local loop = require "sbx.loop"
local json = require "cjson.safe"
local decide = require "sbx.routing.decide"

local M = {}
local no_route, warm_take = decide.no_route, decide.warm_take

-- The decision (router_decide.lua).
M.unsupported, M.candidates, M.add_warm_source = decide.unsupported, decide.candidates, decide.add_warm_source
M.decide, M.route, M.order = decide.decide, decide.route, decide.order

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
  local path = require("sbx.state.owner").state_dir() .. "/decisions.jsonl"
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
    if class == "unavailable" then decide.mark_unavailable(name, tostring(res.message)) end
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

---Create on a pinned backend: budget, admission (waits, yielding), stats.
function M.pinned(name, opts, create_on)
  config.get()
  local desc = decide.pinned_desc(name, opts)
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
  decide.reset()
  health.reset()
end

return M
