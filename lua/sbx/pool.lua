--- Warm pools (API.md, "Warm pools"): sandboxes created ahead of time by
--- background tasks through the normal facade, handed out at once by
--- acquire(), destroyed when released (never handed out again).
---
--- A pool is bound to one backend (given, or routed once when the pool is
--- made). It keeps `size` sandboxes idle or on their way; every sandbox it
--- makes is an ordinary sandbox of this session (journaled, owned), so exit,
--- SIGINT/SIGTERM and `sbxlua gc` clean them up like any other.
local loop = require "sbx.loop"
local errors = require "sbx.errors"
local check = require "sbx.check"
local owner = require "sbx.owner"
local providers = require "sbx.providers"
local router = require "sbx.router"
local presets = require "sbx.presets"
local sandbox = require "sbx.sandbox"

local M = {}

M.BACKOFF_MIN = 0.1   -- seconds before retrying after a failed create; doubles per failure
M.BACKOFF_MAX = 30
M.FAIL_AFTER = 3      -- consecutive transient failures before waiting acquires get the error
M.CLOSE_WAIT = 30     -- seconds close() waits for creates in flight before cancelling them
M.PROBE_SECS = 10     -- default seconds between liveness probes of an idle sandbox

local POOL_OPTIONS = { size = "integer", max_idle_secs = "number", reuse = "string", name = "string",
                       probe_secs = "number" }
-- Options that only choose a backend; they do not change the sandbox made.
local ROUTING = { backend = true, policy = true, needs = true, only = true, ignore = true,
                  isolation = true, max_price = true, region = true }
-- Defaults of options that do change it (a missing option equals its default).
local DEFAULTS = { timeout_secs = 3600, command_timeout_secs = 600, allow_internet = true }

local open = {}       -- open pools' states, oldest first (routing looks here)
local count = 0
-- Per sandbox of a pool (weak: a destroyed sandbox goes): the pool's state
-- it belongs to, and whether it is "idle" or "acquired" (nil: neither).
local pool_of = setmetatable({}, { __mode = "k" })
local pooled = setmetatable({}, { __mode = "k" })

local function same(a, b)
  if a == b then return true end
  if type(a) ~= "table" or type(b) ~= "table" then return false end
  for k, v in pairs(a) do if not same(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end

-- What a sandbox made from validated `opts` is, for matching requests.
local function shape(opts)
  local s = {}
  for k, v in pairs(opts) do if not ROUTING[k] then s[k] = v end end
  for k, v in pairs(DEFAULTS) do if s[k] == nil then s[k] = v end end
  return s
end

-- --------------------------------------------------------- bookkeeping

local failing

local function poke(st)        -- wake the pool's maintainer
  st.dirty = true
  st.wake:notify()
end

local function changed(st)
  st.changed:notify()
  -- warm-up ends when the pool is full for the first time, fails or closes
  if st.warm and (#st.idle >= st.size or st.closed or failing(st)) then st.warm:done() end
end

-- A create error that no retry fixes (bad request, missing image, ...).
local function hopeless(err)
  local class = router.classify(err)
  return class == "terminal" or class == "request" or class == "unavailable"
end

function failing(st)
  return st.last_error ~= nil and (hopeless(st.last_error) or st.fails >= M.FAIL_AFTER)
end

-- The error an acquire gets when the pool cannot make sandboxes: always a
-- SandboxCreationError (or a kind below it), the backend's error as `cause`.
local function creation_error(st, err, op)
  local kind = errors.is(err, "SandboxCreationError") and err.kind or "SandboxCreationError"
  local msg = tostring(err)
  if type(err) == "table" and err.kind == kind then msg = tostring(err.message) end
  errors.raise(kind, "pool '" .. st.name .. "' cannot create sandboxes on " .. st.backend .. ": " .. msg,
               { backend = st.backend, op = op, cause = err, pool = st.name,
                 retryable = type(err) == "table" and err.retryable or false })
end

local function closed_error(st, op)
  errors.raise("ConfigError", "pool:" .. op .. ": pool '" .. st.name .. "' is closed",
               { op = op, backend = st.backend, pool = st.name })
end

-- An idle sandbox, kept in the order they became idle (oldest first).
local function put_idle(st, sb, since)
  pooled[sb] = "idle"
  local i = #st.idle + 1
  while i > 1 and st.idle[i - 1].since > since do i = i - 1 end
  table.insert(st.idle, i, { sb = sb, since = since, checked = loop.now() })
end

local function take_idle(st)
  while #st.idle > 0 do
    local e = table.remove(st.idle, 1)
    if sandbox.live(e.sb) then return e.sb, e.since end
  end
end

-- The sandbox's destroy hook: count it out of the pool.
local function forget(st, sb)
  local was = pooled[sb]
  pooled[sb] = nil
  if was == "acquired" then
    st.acquired = st.acquired - 1
  elseif was == "idle" then      -- its lifetime ended while idle: replace it
    for i, e in ipairs(st.idle) do
      if e.sb == sb then table.remove(st.idle, i) break end
    end
    poke(st)
  end
  changed(st)
end

-- A new sandbox: to the longest-waiting acquire, else idle.
local function adopt(st, sb, since)
  if st.closed then
    pcall(sb.destroy, sb)
    return
  end
  pool_of[sb] = st
  sandbox.on_destroy(sb, st.on_destroy)
  local w = table.remove(st.waiters, 1)
  if w then
    pooled[sb] = "idle"
    w.sb, w.since = sb, since
    w.ev:notify()
  else
    put_idle(st, sb, since)
  end
end

-- Give `sb` to the caller: its lifetime (timeout_secs) counts from now,
-- and it counts as made by the calling task (sbx.parallel cleans up after
-- a failed item what the item acquired, as what it created).
local function hand_out(st, sb)
  pooled[sb] = "acquired"
  st.acquired = st.acquired + 1
  st.handed = st.handed + 1
  sandbox.expire_after(sb, st.ttl)   -- instead of the lifetime it had idle
  owner.claim(sb)
  poke(st)
  changed(st)
  return sb
end

local function drain(st)
  while #st.idle > 0 do
    local e = table.remove(st.idle)
    pooled[e.sb] = nil
    pcall(e.sb.destroy, e.sb)
  end
end

-- ------------------------------------------------------------ creating

local function start_create(st)
  st.creating = st.creating + 1
  local task
  task = loop.spawn(function()
    local ok, res = pcall(st.create)
    st.creating = st.creating - 1
    st.creators[task] = nil
    if ok then
      st.created = st.created + 1
      st.fails, st.last_error, st.next_try = 0, nil, 0
      adopt(st, res, loop.now())
    elseif not st.closed and not owner.is_shutting_down() and not errors.is(res, "Cancelled") then
      st.failed = st.failed + 1
      st.fails = st.fails + 1
      st.last_error = res
      st.next_try = loop.now() + math.min(M.BACKOFF_MAX, M.BACKOFF_MIN * 2 ^ (st.fails - 1))
      if failing(st) then       -- the waiting acquires get the error instead of hanging
        local ws = st.waiters
        st.waiters = {}
        for _, w in ipairs(ws) do
          w.err = res
          w.ev:notify()
        end
      end
    end
    poke(st)
    changed(st)
  end)
  st.creators[task] = true
end

-- Probe the idle sandboxes not checked for probe_secs (a container can die
-- while idle: OOM, a docker kill, a reboot of the engine); the dead ones are
-- destroyed, so acquire never hands them out, and replaced. The probe runs
-- in the maintainer, so acquire pays nothing for it.
local function probe_idle(st)
  local now, due = loop.now(), {}
  for _, e in ipairs(st.idle) do
    if now - e.checked >= st.probe then due[#due + 1] = e end
  end
  for _, e in ipairs(due) do
    local ok, alive = pcall(e.sb.is_alive, e.sb)
    e.checked = loop.now()
    if not (ok and alive) and pooled[e.sb] == "idle" and sandbox.live(e.sb) then   -- not taken meanwhile
      st.dead = st.dead + 1
      pcall(e.sb.destroy, e.sb)     -- its destroy hook (forget) takes it out and refills
    end
  end
end

-- The pool's background task: retire idle sandboxes past max_idle_secs,
-- keep `size` idle or being created (one at a time, backing off, while
-- creates fail), sleep until something changes.
local function maintain(st)
  while true do
    st.dirty = false
    if st.max_idle then
      while #st.idle > 0 and loop.now() - st.idle[1].since >= st.max_idle do
        local e = table.remove(st.idle, 1)
        st.expired = st.expired + 1
        pooled[e.sb] = nil
        pcall(e.sb.destroy, e.sb)
      end
    end
    if not st.closed then probe_idle(st) end
    if st.closed then break end
    if not owner.is_shutting_down() and loop.now() >= st.next_try then
      while not st.closed and #st.idle + st.creating < st.size and (st.fails == 0 or st.creating == 0) do
        start_create(st)
      end
    end
    if st.closed then break end
    if not st.dirty then
      local due
      if st.max_idle and #st.idle > 0 then due = st.idle[1].since + st.max_idle end
      for _, e in ipairs(st.idle) do due = math.min(due or math.huge, e.checked + st.probe) end
      if st.next_try > loop.now() and #st.idle + st.creating < st.size then
        due = math.min(due or math.huge, st.next_try)
      end
      st.wake:wait(due and math.max(0, due - loop.now()) or nil)
    end
  end
  drain(st)
end

-- Stop refilling; wake every waiting acquire. With `wait` (not from a
-- finalizer): destroy the idle sandboxes and wait for creates in flight
-- (their sandboxes are destroyed as they arrive).
local function close(st, wait)
  if not st.closed then
    st.closed = true
    for i, s in ipairs(open) do
      if s == st then table.remove(open, i) break end
    end
    local ws = st.waiters
    st.waiters = {}
    for _, w in ipairs(ws) do
      w.closed = true
      w.ev:notify()
    end
    poke(st)
    changed(st)
  end
  if not wait then return end
  drain(st)
  local ok, err = pcall(function()
    local deadline = loop.now() + M.CLOSE_WAIT
    while st.creating > 0 and loop.now() < deadline do
      st.changed:wait(deadline - loop.now())
    end
    if st.creating > 0 then           -- give up on them; they clean up after themselves
      for t in pairs(st.creators) do t:cancel() end
      deadline = loop.now() + 5
      while st.creating > 0 and loop.now() < deadline do
        st.changed:wait(deadline - loop.now())
      end
    end
    if st.maint ~= loop.current() then st.maint:join() end
  end)
  if not ok then
    for t in pairs(st.creators) do t:cancel() end
    error(err, 0)
  end
end

-- --------------------------------------------------------------- Pool

local Pool = {}
Pool.__index = Pool
Pool.__close = function(p) p:close() end
Pool.__gc = function(p) close(p._st, false) end   -- the maintainer destroys the idle ones
Pool.__tostring = function(p)
  local st = p._st
  return string.format("Pool(%s, %s, size %d%s)", st.name, st.backend, st.size,
                       st.closed and ", closed" or "")
end

local function check_timeout(op, timeout)
  if timeout ~= nil and (type(timeout) ~= "number" or not (timeout >= 0)) then
    check.bad("pool:" .. op, "timeout must be seconds >= 0, got " .. tostring(timeout))
  end
end

---A ready sandbox: an idle one at once (the pool refills in the background),
---else the next one created. Raises SandboxCreationError when creates keep
---failing, or after `timeout` seconds without one.
---@param timeout? number seconds (default: wait as long as creates may succeed)
---@return table Sandbox
function Pool:acquire(timeout)
  local st = self._st
  check_timeout("acquire", timeout)
  local deadline = timeout and loop.now() + timeout
  while true do
    if st.closed then closed_error(st, "acquire") end
    local sb = take_idle(st)
    if sb then return hand_out(st, sb) end
    if failing(st) then creation_error(st, st.last_error, "acquire") end
    if owner.is_shutting_down() then
      errors.raise("SandboxCreationError", "sbxlua is shutting down: no new sandboxes",
                   { backend = st.backend, op = "acquire", pool = st.name })
    end
    local w = { ev = loop.event() }
    st.waiters[#st.waiters + 1] = w
    poke(st)
    local ok, res = pcall(w.ev.wait, w.ev, deadline and math.max(0, deadline - loop.now()))
    if w.sb then
      if ok and sandbox.live(w.sb) then return hand_out(st, w.sb) end
      if not ok then adopt(st, w.sb, w.since) end   -- cancelled after it was ours: pass it on
    else
      for i, x in ipairs(st.waiters) do
        if x == w then table.remove(st.waiters, i) break end
      end
    end
    if not ok then error(res, 0) end
    if w.err then creation_error(st, w.err, "acquire") end
    if w.closed then closed_error(st, "acquire") end
    if deadline and loop.now() >= deadline then
      errors.raise("SandboxCreationError", string.format(
        "pool '%s': no sandbox ready within %g s (%d being created on %s)%s", st.name, timeout,
        st.creating, st.backend, st.last_error and ("; last error: " .. tostring(st.last_error)) or ""),
        { backend = st.backend, op = "acquire", pool = st.name, retryable = true })
    end
  end
end

---Give a sandbox back: it is destroyed (never handed out again).
function Pool:release(sb)
  local st = self._st
  if getmetatable(sb) ~= sandbox.Sandbox then
    check.bad("pool:release", "expected a sandbox from pool:acquire(), got " .. type(sb))
  end
  if pool_of[sb] ~= st then
    check.bad("pool:release", "sandbox " .. sb.id .. " is not from pool '" .. st.name .. "'")
  end
  sb:destroy()
end

---Wait until `size` sandboxes are idle. true; false after `timeout`
---seconds; raises like acquire() when creates keep failing.
function Pool:wait_ready(timeout)
  local st = self._st
  check_timeout("wait_ready", timeout)
  local deadline = timeout and loop.now() + timeout
  while true do
    if st.closed then closed_error(st, "wait_ready") end
    if #st.idle >= st.size then return true end
    if failing(st) then creation_error(st, st.last_error, "wait_ready") end
    local left = deadline and deadline - loop.now()
    if left and left <= 0 then return false end
    st.changed:wait(left)
  end
end

---{ idle=, creating=, acquired=, created=, failed=, expired=, waiting=, size=, closed= }
function Pool:stats()
  local st = self._st
  return { idle = #st.idle, creating = st.creating, acquired = st.acquired, created = st.created,
           failed = st.failed, expired = st.expired, dead = st.dead, handed_out = st.handed,
           waiting = #st.waiters,
           size = st.size, closed = st.closed, backend = st.backend,
           last_error = st.last_error and tostring(st.last_error) or nil }
end

---Destroy the idle sandboxes and stop refilling; acquired ones stay theirs.
---Waits for creates in flight (up to CLOSE_WAIT s). Closing twice is a no-op.
function Pool:close() close(self._st, true) end

-- ------------------------------------------------------------ making one

---sbx.pool(opts): `f` = { sandbox = sbx.sandbox, options = its option
---types, validate = its option check }.
function M.new(opts, f)
  if opts ~= nil and type(opts) ~= "table" then check.bad("pool", "options must be a table, got " .. type(opts)) end
  local spec = {}
  for k, v in pairs(f.options) do spec[k] = v end
  for k, v in pairs(POOL_OPTIONS) do spec[k] = v end
  opts = check.options(opts, spec, "pool")
  local size = opts.size or 1
  if size < 1 then check.bad("pool", "size must be >= 1, got " .. size) end
  if opts.max_idle_secs and not (opts.max_idle_secs > 0) then
    check.bad("pool", "max_idle_secs must be > 0 seconds")
  end
  if opts.probe_secs and not (opts.probe_secs > 0) then
    check.bad("pool", "probe_secs must be > 0 seconds")
  end
  local reuse = opts.reuse or "destroy"
  if reuse ~= "destroy" and reuse ~= "reset" then
    check.bad("pool", "reuse must be \"destroy\" or \"reset\", got '" .. reuse .. "'")
  end
  if opts.workdir then
    check.bad("pool", "workdir cannot be pooled: every sandbox of a pool needs its own directory")
  end
  local raw = {}              -- what each create passes to sbx.sandbox
  for k, v in pairs(opts) do if not POOL_OPTIONS[k] then raw[k] = v end end
  local probe = {}
  for k, v in pairs(raw) do probe[k] = v end
  local valid = f.validate(probe)
  local backend = valid.backend
  if backend then
    providers.get(backend)    -- unknown names raise ConfigError
  else
    backend = router.order(valid)[1]   -- routed once: NoRouteError says why
  end
  raw.backend = nil
  if reuse == "reset" then
    errors.raise("FeatureNotSupportedError", "pool: reuse = \"reset\" needs a backend that can return a "
      .. "used sandbox to a clean state cheaply; " .. backend .. " cannot (no backend can yet): "
      .. "use reuse = \"destroy\"", { backend = backend, op = "pool" })
  end
  -- Fail at once on what every create would fail on.
  local p = providers.get(backend)
  local up, why = p.available()
  if not up then
    errors.raise("BackendNotInstalledError", backend .. ": " .. tostring(why), { backend = backend, op = "pool" })
  end
  local miss = router.unsupported(p.descriptor, valid)
  if #miss > 0 then
    errors.raise("FeatureNotSupportedError", backend .. " cannot honour " .. table.concat(miss, ", "),
                 { backend = backend, op = "pool" })
  end
  local merged = presets.merge(valid, valid.preset, backend, p.descriptor)
  count = count + 1
  local st = {
    name = opts.name or ("pool-" .. count), backend = backend, size = size,
    max_idle = opts.max_idle_secs, probe = opts.probe_secs or M.PROBE_SECS,
    ttl = merged.timeout_secs or 3600, shape = shape(valid),
    idle = {}, waiters = {}, creators = {},
    creating = 0, acquired = 0, created = 0, failed = 0, expired = 0, dead = 0, handed = 0,
    fails = 0, next_try = 0, closed = false, dirty = false,
    wake = loop.event(), changed = loop.event(),
  }
  st.create = function()
    local o = {}
    for k, v in pairs(raw) do o[k] = v end
    return f.sandbox(backend, o)
  end
  st.on_destroy = function(sb) forget(st, sb) end
  st.warm = require("sbx.progress").start("pool " .. st.name, function()
    return string.format("%d/%d warm on %s, %d being created", #st.idle, st.size, backend, st.creating),
           #st.idle / st.size
  end)
  st.maint = loop.spawn(maintain, st)
  open[#open + 1] = st
  return setmetatable({ _st = st, name = st.name, backend = backend, size = size }, Pool)
end

-- ------------------------------------------------------------- routing

local EMPTY = setmetatable({}, { __newindex = function() error("read-only") end })

-- Routing (router.decide / router.create) asks here for warm sandboxes that
-- match a request: same backend, and every option that shapes the sandbox
-- equal (routing-only options are the router's hard filter's business).
router.add_warm_source{
  ---{ [backend] = idle sandboxes of matching pools }
  count = function(opts)
    if #open == 0 then return EMPTY end
    local want, n = shape(opts), nil
    for _, st in ipairs(open) do
      if #st.idle > 0 and same(st.shape, want) then
        n = n or {}
        n[st.backend] = (n[st.backend] or 0) + #st.idle
      end
    end
    return n or EMPTY
  end,
  ---A matching warm sandbox on `backend`, handed out: sb, how | nil.
  ---With `peek`: only how (a dry run for sbx.route).
  take = function(backend, opts, peek)
    if #open == 0 or not backend then return nil end
    local want
    for _, st in ipairs(open) do
      if st.backend == backend and #st.idle > 0 then
        want = want or shape(opts)
        if same(st.shape, want) then
          local how = { pool = st.name, backend = backend }
          if peek then
            how.reason = "a warm sandbox of pool '" .. st.name .. "' would be taken (no create)"
            return how
          end
          local sb, since = take_idle(st)
          if sb then
            how.id, how.idle_secs = sb.id, math.floor((loop.now() - since) * 1000) / 1000
            how.reason = string.format("warm sandbox from pool '%s' (idle %.1f s): no create", st.name,
                                       how.idle_secs)
            return hand_out(st, sb), how
          end
        end
      end
    end
    return nil
  end,
}

-- At exit the CLI destroys what the session owns after the job's task has
-- ended; creates still in flight in a pool would land after that. The pools
-- close first, waiting for those creates (unless in a finalizer).
owner.on_destroy_all(function(wait)
  local list = {}
  for i, st in ipairs(open) do list[i] = st end
  for _, st in ipairs(list) do
    local ok, err = pcall(close, st, wait)
    if not ok then io.stderr:write("sbxlua: closing pool ", st.name, ": ", tostring(err), "\n") end
  end
end)

---Open pools (tests).
function M.open() return #open end

return M
