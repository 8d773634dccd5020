--- Warm pools (API.md, "Warm pools"): sandboxes created ahead of time by
--- background tasks through the normal facade, handed out at once by
--- acquire(), destroyed when released (never handed out again).
---
--- A pool is bound to one backend (given, or routed once when the pool is
--- made). It keeps `size` sandboxes idle or on their way; every sandbox it
--- makes is an ordinary sandbox of this session (journaled, owned), so exit,
--- SIGINT/SIGTERM and `sbxlua gc` clean them up like any other.
---
--- The pool's state and maintainer: pool_state.lua.
local loop = require "sbx.loop"
local errors = require "sbx.core.errors"
local check = require "sbx.core.check"
local owner = require "sbx.state.owner"
local providers = require "sbx.providers"
local router = require "sbx.routing"
local presets = require "sbx.sandbox.presets"
local sandbox = require "sbx.sandbox"
local state = require "sbx.pool.state"

local M = {}

local POOL_OPTIONS = { size = "integer", max_idle_secs = "number", reuse = "string", name = "string",
                       probe_secs = "number" }
-- Options that only choose a backend; they do not change the sandbox made.
local ROUTING = { backend = true, policy = true, needs = true, only = true, ignore = true,
                  isolation = true, max_price = true, region = true }
-- Defaults of options that do change it (a missing option equals its default).
local DEFAULTS = { timeout_secs = 3600, command_timeout_secs = 600, allow_internet = true }

local open, pool_of = state.open, state.pool_of
local count = 0

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

local poke, failing, creation_error, closed_error = state.poke, state.failing, state.creation_error,
  state.closed_error
local take_idle, hand_out, adopt, forget = state.take_idle, state.hand_out, state.adopt, state.forget
local maintain, close = state.maintain, state.close

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
    max_idle = opts.max_idle_secs, probe = opts.probe_secs or state.PROBE_SECS,
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
  st.warm = require("sbx.core.progress").start("pool " .. st.name, function()
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
