--- Live provider health for routing: latency and outcome stats, circuit
--- breakers and admission control (max_concurrent, max_creates_per_sec),
--- shared by every task of the process. The clock is injectable (tests).
local loop = require "sbx.loop"
local errors = require "sbx.core.errors"
local config = require "sbx.core.config"

local M = {}

---Seconds, monotonic. Tests replace it to make time deterministic.
M.clock = loop.now

M.WINDOW = 100            -- latency samples kept per provider
M.OUTCOMES = 50           -- create outcomes kept for error/429 rates
M.BREAKER_FAILURES = 3    -- consecutive failures that open a breaker
M.BREAKER_COOLDOWN = 30   -- seconds open before a trial create (doubles, max 300)

local stats = {}          -- name -> { creates, execs, outcomes, in_flight, live, cache }
local breakers = {}       -- name -> { state, failures, opened_at, cooldown, trial }
local slots = {}          -- name -> { used, tokens, last }
local throttles = {}      -- name -> { rate, ceiling, until_t, hits }: admission lowered by 429s

M.THROTTLE_START = 10     -- creates/s assumed before the first 429 when none is configured
M.THROTTLE_MIN = 0.1      -- the admitted rate never goes below this
M.THROTTLE_STEP = 0.1     -- each success gives back this share of the ceiling

local function ring_push(r, v, max)
  r.n = (r.n or 0) + 1
  r[(r.n - 1) % max + 1] = v
end

local function of(name)
  local s = stats[name]
  if not s then
    s = { creates = {}, execs = {}, outcomes = {}, in_flight = 0, live = 0 }
    stats[name] = s
  end
  return s
end

local function pct(r, max, p)
  local n = math.min(r.n or 0, max)
  if n == 0 then return nil end
  local a = table.move(r, 1, n, 1, {})
  table.sort(a)
  return a[math.max(1, math.ceil(p * n))]
end

---Stats a policy sees: p50/p95 create, p50 exec (ms), error and 429 rates,
---in-flight creates, live sandboxes. Cached until the next record; treat it
---as read-only.
function M.snapshot(name)
  local s = of(name)
  local c = s.cache
  if not c then
    local n = math.min(s.outcomes.n or 0, M.OUTCOMES)
    local errs, r429 = 0, 0
    for i = 1, n do
      local o = s.outcomes[i]
      if not o.ok then errs = errs + 1 end
      if o.class == "capacity" then r429 = r429 + 1 end
    end
    c = { p50_create_ms = pct(s.creates, M.WINDOW, 0.5), p95_create_ms = pct(s.creates, M.WINDOW, 0.95),
          p50_exec_ms = pct(s.execs, M.WINDOW, 0.5), error_rate = n > 0 and errs / n or 0,
          rate_429 = n > 0 and r429 / n or 0, samples = n }
    s.cache = c
  end
  c.in_flight, c.live = s.in_flight, s.live
  return c
end

---A create finished: latency (ms), ok, error class, and the error itself
---(a RateLimitError lowers the provider's admitted create rate; successes
---bring it back).
function M.record_create(name, ms, ok, class, err)
  local s = of(name)
  if ok then ring_push(s.creates, ms, M.WINDOW) end
  ring_push(s.outcomes, { ok = ok, class = class }, M.OUTCOMES)
  s.cache = nil
  M.breaker_result(name, ok, class)
  if ok then M.recovered(name)
  elseif errors.is(err, "RateLimitError") then M.rate_limited(name, err.retry_after or err.context.retry_after) end
end

function M.record_exec(name, ms)
  local s = of(name)
  ring_push(s.execs, ms, M.WINDOW)
  s.cache = nil
end

function M.in_flight(name, d) local s = of(name); s.in_flight = s.in_flight + d end
function M.live(name, d) local s = of(name); s.live = s.live + d end

---Forget everything (tests).
function M.reset() stats, breakers, slots, throttles = {}, {}, {}, {} end

-- ----------------------------------------------------------- breakers

local function cfg_routing() return config.get().routing end

---Is the breaker letting creates through? false, reason when open.
function M.breaker_allows(name)
  local b = breakers[name]
  if not b or b.state == "closed" then return true end
  local now = M.clock()
  if b.state == "open" then
    if now - b.opened_at < b.cooldown then
      return false, string.format("circuit open after %d failures (retry in %.0f s)", b.failures,
                                  b.cooldown - (now - b.opened_at))
    end
    b.state = "half"
    b.trial = false
  end
  if b.trial then return false, "circuit half-open: a trial create is in flight" end
  return true
end

---Mark the trial create of a half-open breaker as started.
function M.breaker_trial(name)
  local b = breakers[name]
  if b and b.state == "half" then b.trial = true end
end

-- Classes that say the provider is unwell (not the request).
local TRIPS = { retryable = true, capacity = true, unavailable = true }

function M.breaker_result(name, ok, class)
  local b = breakers[name]
  if ok then
    if b then b.state, b.failures, b.trial, b.cooldown = "closed", 0, false, nil end
    return
  end
  if not TRIPS[class] then
    if b and b.state == "half" then b.trial = false end
    return
  end
  if not b then
    b = { state = "closed", failures = 0 }
    breakers[name] = b
  end
  b.failures = b.failures + 1
  local rc = cfg_routing()
  local limit = rc.breaker_failures or M.BREAKER_FAILURES
  local base = rc.breaker_cooldown_secs or M.BREAKER_COOLDOWN
  if b.state == "half" then
    b.state, b.opened_at, b.trial = "open", M.clock(), false
    b.cooldown = math.min((b.cooldown or base) * 2, math.max(base, 300))
  elseif b.failures >= limit then
    b.state, b.opened_at, b.cooldown = "open", M.clock(), b.cooldown or base
  end
end

function M.breaker(name) return breakers[name] end

-- ---------------------------------------------------------- admission

local function limits(name)
  local p = config.get().providers[name]
  if not p then return nil, nil end
  return p.max_concurrent, p.max_creates_per_sec
end

local function slot(name)
  local s = slots[name]
  if not s then s = { used = 0 }; slots[name] = s end
  return s
end

---Why `name` cannot take one more sandbox now (nil when it can).
function M.full(name)
  local max = limits(name)
  if max and slot(name).used >= max then
    return string.format("at max_concurrent (%d)", max)
  end
end

---The provider answered 429: halve its admitted create rate (from the
---configured max_creates_per_sec, else THROTTLE_START) and admit nothing
---before `retry_after` seconds have passed.
function M.rate_limited(name, retry_after)
  local _, conf = limits(name)
  local t = throttles[name]
  local now = M.clock()
  if not t then
    local ceiling = conf and conf > 0 and conf or M.THROTTLE_START
    t = { rate = ceiling, ceiling = ceiling, hits = 0 }
    throttles[name] = t
  end
  t.hits = t.hits + 1
  -- the 429s of one burst (creates admitted before the pause) halve it once
  if not (t.until_t and now < t.until_t) then t.rate = math.max(M.THROTTLE_MIN, t.rate / 2) end
  local pause = tonumber(retry_after) or 1 / t.rate
  t.until_t = math.max(t.until_t or 0, now + math.min(pause, 300))
  local s = slot(name)
  s.tokens, s.last = 0, now
end

---A create went through: the admitted rate climbs back (additively); at
---the ceiling the throttle is gone.
function M.recovered(name)
  local t = throttles[name]
  if not t then return end
  t.rate = t.rate + t.ceiling * M.THROTTLE_STEP
  if t.rate >= t.ceiling then throttles[name] = nil end
end

---The create rate admitted now (nil: unlimited), and whether 429s lowered it.
function M.admitted_rate(name)
  local _, conf = limits(name)
  local t = throttles[name]
  if t then return math.min(t.rate, conf or math.huge), true end
  return conf, false
end

-- Seconds until a create token is there (0 = take it now).
local function token_wait(name)
  local rate = M.admitted_rate(name)
  if not rate or rate <= 0 then return 0 end
  local s = slot(name)
  local now = M.clock()
  local t = throttles[name]
  if t and t.until_t and now < t.until_t then return t.until_t - now end
  local cap = math.max(1, rate)
  s.tokens = math.min(cap, (s.tokens or cap) + (now - (s.last or now)) * rate)
  s.last = now
  if s.tokens >= 1 then
    s.tokens = s.tokens - 1
    return 0
  end
  return (1 - s.tokens) / rate
end

local Lease = {}
Lease.__index = Lease
function Lease:release()
  if self.released then return end
  self.released = true
  local s = slot(self.name)
  s.used = s.used - 1
end

---Take a slot (and a create token) on `name`. With `wait`, yields until one
---is free (at most routing.admission_wait_secs, default 600); without,
---returns nil, reason when the provider is full.
function M.acquire(name, wait)
  local deadline = loop.now() + (cfg_routing().admission_wait_secs or 600)
  local delay = 0.005
  while true do
    local why = M.full(name)
    if not why then break end
    if not wait then return nil, why end
    if loop.now() >= deadline then
      errors.raise("SandboxCreationError", name .. ": waited too long for a free slot (" .. why .. ")",
                   { backend = name, op = "create", retryable = true })
    end
    loop.sleep(delay)
    delay = math.min(delay * 2, 0.1)
  end
  local s = slot(name)
  s.used = s.used + 1
  local lease = setmetatable({ name = name }, Lease)
  local ok, err = pcall(function()
    while true do
      local w = token_wait(name)
      if w <= 0 then return end
      loop.sleep(w)
    end
  end)
  if not ok then lease:release(); error(err, 0) end
  return lease
end

return M
