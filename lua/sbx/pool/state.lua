--- A warm pool's state (sbx.pool): its idle sandboxes, the creates in
--- flight, the maintainer task that keeps `size` of them, and close. pool.lua
--- holds the Pool object, sbx.pool(opts) and the warm source routing asks.
local loop = require "sbx.loop"
local errors = require "sbx.core.errors"
local owner = require "sbx.state.owner"
local router = require "sbx.routing"
local sandbox = require "sbx.sandbox"

local M = {}

M.BACKOFF_MIN = 0.1   -- seconds before retrying after a failed create; doubles per failure
M.BACKOFF_MAX = 30
M.FAIL_AFTER = 3      -- consecutive transient failures before waiting acquires get the error
M.CLOSE_WAIT = 30     -- seconds close() waits for creates in flight before cancelling them
M.PROBE_SECS = 10     -- default seconds between liveness probes of an idle sandbox

local open = {}       -- open pools' states, oldest first (routing looks here)
local count = 0
-- Per sandbox of a pool (weak: a destroyed sandbox goes): the pool's state
-- it belongs to, and whether it is "idle" or "acquired" (nil: neither).
local pool_of = setmetatable({}, { __mode = "k" })
local pooled = setmetatable({}, { __mode = "k" })

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

M.open, M.pool_of = open, pool_of
M.poke, M.failing, M.creation_error, M.closed_error = poke, failing, creation_error, closed_error
M.take_idle, M.hand_out, M.adopt, M.forget = take_idle, hand_out, adopt, forget
M.maintain, M.close = maintain, close

return M
