-- Routing with fake providers: the hard filter, attempts and failover,
-- error classes, breakers, admission, hedging, budgets, the decision log.
package.path = (os.getenv("SBX_SOURCE_DIR") or ".") .. "/spec/routing/?.lua;" .. package.path
local S = require "support"
local sbx = require "sbx"
local errors = require "sbx.core.errors"
local health = require "sbx.routing.health"
local router = require "sbx.routing"
local meter = require "sbx.routing.meter"
local loop = require "sbx.loop"
local json = require "cjson"

local E = { "fa", "fb", "fc" }

local function err(kind, msg, f)
  return errors.new(kind, msg, f)
end

describe("the hard filter", function()
  before_each(S.reset)
  after_each(S.reset)

  it("keeps backends that have what the request needs and says why each other was skipped", function()
    S.fake("fa", { caps = { "exec", "snapshot" }, isolation = "container", price = { per_hour = 0.1 } })
    S.fake("fb", { caps = { "exec" }, isolation = "microvm", price = { per_hour = 0.01 } })
    S.fake("fc", { down = true })
    local r = sbx.route{ only = E, needs = { "snapshot" } }
    assert.same({ "fa" }, r.order)
    assert.matches("lacks capability 'snapshot'", r.reasons.fb)
    assert.matches("unavailable: fake fc is down", r.reasons.fc)
    assert.equal("not in 'only'", r.reasons["local"])
    r = sbx.route{ only = E, isolation = "microvm" }
    assert.same({ "fb" }, r.order)
    assert.matches("isolation 'container' is below 'microvm'", r.reasons.fa)
    r = sbx.route{ only = E, ignore = { "fb" } }
    assert.same({ "fa" }, r.order)
    assert.equal("in 'ignore'", r.reasons.fb)
  end)

  it("prices the request's resources against max_price, with config overrides", function()
    local res = { cpu = true, memory_mb = true }
    S.fake("fa", { price = { per_vcpu_hour = 0.05, per_gib_hour = 0.01 }, options = res })
    S.fake("fb", { price = { per_hour = 0.5 }, options = res })
    -- 2 vCPU + 4 GiB on fa: 0.14/h
    local r = sbx.route{ only = E, max_price = 0.2, cpu = 2, memory_mb = 4096 }
    assert.same({ "fa" }, r.order)
    assert.matches("costs %$0.5000/h, over max_price %$0.2000/h", r.reasons.fb)
    assert.near(0.14, r.candidates[1].price_per_hour, 1e-9)
    r = sbx.route{ only = E, max_price = 0.1, cpu = 2, memory_mb = 4096 }
    assert.same({}, r.order)
    sbx.config({ providers = { fa = { price = { per_hour = 0.01 } } } })   -- config wins
    r = sbx.route{ only = E, max_price = 0.1, cpu = 2, memory_mb = 4096 }
    assert.same({ "fa" }, r.order)
    assert.near(0.01, r.candidates[1].price_per_hour, 1e-9)
  end)

  it("skips a backend that cannot honour an option, and regions it does not have", function()
    S.fake("fa", { options = { image = true }, regions = { "eu" } })
    S.fake("fb", { regions = { "us" } })
    local r = sbx.route{ only = E, image = "x" }
    assert.same({ "fa" }, r.order)
    assert.matches("cannot honour image", r.reasons.fb)
    r = sbx.route{ only = E, region = "us" }
    assert.same({ "fb" }, r.order)
    assert.matches("has no region 'us'", r.reasons.fa)
  end)

  it("raises NoRouteError listing every skip reason", function()
    S.fake("fa", { down = true })
    local ok, e = pcall(sbx.sandbox, { only = { "fa", "local" }, needs = { "gpu" } })
    assert.is_false(ok)
    assert.is_true(errors.is(e, "NoRouteError"))
    assert.matches("fa: unavailable", e.message)
    assert.matches("local: lacks capability 'gpu'", e.message)
    assert.is_table(e.reasons)
  end)
end)

describe("attempts", function()
  before_each(S.reset)
  after_each(S.reset)

  it("fails over at create and records stats", function()
    local a = S.fake("fa", { fail = err("SandboxCreationError", "boom (HTTP 503)") })
    local b = S.fake("fb")
    local sb <close> = sbx.sandbox{ only = { "fa", "fb" }, policy = "cheapest" }
    assert.equal("fb", sb.backend)
    assert.equal(1, a.creates)
    assert.equal(1, b.created)
    assert.equal(1, health.snapshot("fa").error_rate)
    assert.equal(1, health.snapshot("fb").live)
    sb:destroy()
    assert.equal(0, health.snapshot("fb").live)
    assert.equal(1, b.destroyed)
  end)

  it("classifies errors: a bad request does not fail over or trip a breaker", function()
    assert.equal("terminal", router.classify(err("ConfigError", "bad")))
    assert.equal("terminal", router.classify(err("FeatureNotSupportedError", "no")))
    assert.equal("capacity", router.classify(err("SandboxCreationError", "create: slow down (HTTP 429)")))
    assert.equal("capacity", router.classify(err("SandboxCreationError", "quota exceeded")))
    assert.equal("request", router.classify(err("SandboxCreationError", "create: bad (HTTP 400)")))
    assert.equal("retryable", router.classify(err("SandboxCreationError", "create: (HTTP 502)")))
    assert.equal("retryable", router.classify(err("SandboxExecutionError", "connection reset")))
    assert.equal("unavailable", router.classify(err("BackendNotInstalledError", "gone")))
    assert.equal("terminal", router.classify(err("SandboxCreationError", "x", { phase = "prepare" })))
    local a = S.fake("fa", { fail = err("ConfigError", "your request is wrong") })
    local b = S.fake("fb")
    for _ = 1, 5 do
      local ok, e = pcall(sbx.sandbox, { only = { "fa", "fb" }, policy = "cheapest" })
      assert.is_false(ok)
      assert.is_true(errors.is(e, "ConfigError"))
    end
    assert.equal(0, b.creates)
    assert.equal(5, a.creates)
    assert.is_true((health.breaker_allows("fa")))
  end)

  it("honours max_attempts from the plan", function()
    S.fake("fa", { fail = err("SandboxCreationError", "x") })
    local b = S.fake("fb")
    local ok = pcall(sbx.sandbox, { only = { "fa", "fb" },
      policy = function(_, c) return { order = { "fa", "fb" }, max_attempts = 1 } end })
    assert.is_false(ok)
    assert.equal(0, b.creates)
  end)

  it("a 429 counts toward the 429 rate", function()
    S.fake("fa", { fail = err("SandboxCreationError", "create: too busy (HTTP 429)") })
    S.fake("fb")
    local sb <close> = sbx.sandbox{ only = { "fa", "fb" }, policy = "cheapest" }
    assert.equal("fb", sb.backend)
    assert.equal(1, health.snapshot("fa").rate_429)
  end)
end)

describe("circuit breakers", function()
  before_each(S.reset)
  after_each(S.reset)

  it("open after consecutive failures, half-open after the cooldown, close on success", function()
    local a = S.fake("fa", { fail = err("SandboxCreationError", "down (HTTP 503)") })
    S.fake("fb")
    for _ = 1, 3 do
      local sb <close> = sbx.sandbox{ only = { "fa", "fb" }, policy = "cheapest" }
      assert.equal("fb", sb.backend)
    end
    assert.equal(3, a.creates)
    local r = sbx.route{ only = { "fa", "fb" } }
    assert.matches("circuit open after 3 failures", r.reasons.fa)
    do
      local sb <close> = sbx.sandbox{ only = { "fa", "fb" }, policy = "cheapest" }
      assert.equal(3, a.creates)        -- not tried while open
    end
    S.now = S.now + 31                   -- cooldown over: one trial
    a.fail = nil
    local sb <close> = sbx.sandbox{ only = { "fa", "fb" }, policy = "cheapest" }
    assert.equal("fa", sb.backend)
    assert.equal("closed", health.breaker("fa").state)
  end)

  it("a failed trial reopens the breaker for longer", function()
    S.fake("fa", { fail = err("SandboxCreationError", "x (HTTP 500)") })
    S.fake("fb")
    for _ = 1, 3 do local sb <close> = sbx.sandbox{ only = { "fa", "fb" }, policy = "cheapest" } end
    S.now = S.now + 31
    do local sb <close> = sbx.sandbox{ only = { "fa", "fb" }, policy = "cheapest" } end
    local b = health.breaker("fa")
    assert.equal("open", b.state)
    assert.equal(60, b.cooldown)
    S.now = S.now + 31
    assert.matches("circuit open", sbx.route{ only = { "fa", "fb" } }.reasons.fa)
  end)
end)

describe("admission control", function()
  before_each(S.reset)
  after_each(S.reset)

  it("a backend at max_concurrent spills routed requests to the next", function()
    S.fake("fa")
    S.fake("fb", { price = { per_hour = 1 } })
    sbx.config({ providers = { fa = { max_concurrent = 2 } } })
    local a1 = sbx.sandbox{ only = { "fa", "fb" }, policy = "cheapest" }
    local a2 = sbx.sandbox{ only = { "fa", "fb" }, policy = "cheapest" }
    local b1 <close> = sbx.sandbox{ only = { "fa", "fb" }, policy = "cheapest" }
    assert.equal("fa", a1.backend)
    assert.equal("fa", a2.backend)
    assert.equal("fb", b1.backend)
    assert.matches("at max_concurrent %(2%)", sbx.route{ only = { "fa", "fb" } }.reasons.fa)
    a1:destroy()
    local a3 <close> = sbx.sandbox{ only = { "fa", "fb" }, policy = "cheapest" }
    assert.equal("fa", a3.backend)
    a2:destroy()
  end)

  it("a pinned create waits for a slot, yielding to other tasks", function()
    S.fake("fa")
    sbx.config({ providers = { fa = { max_concurrent = 1 } } })
    local first = sbx.sandbox("fa")
    local ticks = 0
    local ticker = sbx.spawn(function() for _ = 1, 5 do ticks = ticks + 1; sbx.sleep(0.01) end end)
    local got = false
    local waiter = sbx.spawn(function()
      local sb <close> = sbx.sandbox("fa")
      got = true
      return ticks
    end)
    sbx.sleep(0.03)
    -- still in its create: waiting, or woken from one of its short sleeps
    assert.is_false(got)
    assert.is_true(waiter:status() == "waiting" or waiter:status() == "ready", waiter:status())
    first:destroy()
    local ok, seen = waiter:join()
    assert.is_true(ok)
    assert.is_true(seen >= 2)       -- the ticker ran while the waiter waited
    ticker:join()
  end)

  it("max_creates_per_sec spaces creates out", function()
    S.fake("fa")
    sbx.config({ providers = { fa = { max_creates_per_sec = 10 } } })
    health.clock = loop.now
    local t0 = loop.now()
    for _ = 1, 13 do local sb <close> = sbx.sandbox("fa") end
    local took = loop.now() - t0
    health.clock = function() return S.now end
    -- a burst of one second's worth (10), then one every 0.1 s
    assert.is_true(took >= 0.25 and took < 3, "13 creates at 10/s took " .. took)
  end)
end)

describe("hedged creates", function()
  before_each(S.reset)
  after_each(S.reset)

  it("start the next candidate after hedge_after_ms, keep the winner, destroy the loser", function()
    local a = S.fake("fa", { held = true })
    local b = S.fake("fb", { price = { per_hour = 1 } })
    local sb <close> = sbx.sandbox{ only = { "fa", "fb" },
      policy = function(_, c) return { order = { "fa", "fb" }, hedge_after_ms = 50 } end }
    assert.equal("fb", sb.backend)
    assert.equal(0, a.created)      -- did not wait for the slow one, still held
    a.held = false                  -- the slow one arrives and is destroyed
    local deadline = loop.now() + 10
    while a.destroyed == 0 and loop.now() < deadline do sbx.sleep(0.01) end
    assert.equal(1, a.created)
    assert.equal(1, a.destroyed)
    assert.equal(0, b.destroyed)
  end)

  it("a first candidate that fails at once hands over to the second without waiting", function()
    S.fake("fa", { fail = errors.new("SandboxCreationError", "no (HTTP 503)") })
    S.fake("fb")
    local t0 = loop.now()
    local sb <close> = sbx.sandbox{ only = { "fa", "fb" },
      policy = function() return { order = { "fa", "fb" }, hedge_after_ms = 5000 } end }
    assert.equal("fb", sb.backend)
    assert.is_true(loop.now() - t0 < 1)
  end)

  it("do not hedge when the first answers in time", function()
    S.fake("fa")
    local b = S.fake("fb")
    local sb <close> = sbx.sandbox{ only = { "fa", "fb" },
      policy = function() return { order = { "fa", "fb" }, hedge_after_ms = 200 } end }
    assert.equal("fa", sb.backend)
    assert.equal(0, b.creates)
  end)
end)

describe("budgets and the meter", function()
  before_each(S.reset)
  after_each(S.reset)

  it("refuses a create whose projected cost exceeds what is left", function()
    S.fake("fa", { price = { per_hour = 1.0 } })
    sbx.budget(0.5)
    local ok, e = pcall(sbx.sandbox, "fa", { timeout_secs = 3600 })
    assert.is_false(ok)
    assert.is_true(errors.is(e, "BudgetExceededError"))
    local sb <close> = sbx.sandbox("fa", { timeout_secs = 1200 })   -- $0.33 projected
    ok, e = pcall(sbx.sandbox, "fa", { timeout_secs = 1200 })        -- 0.17 left
    assert.is_true(errors.is(e, "BudgetExceededError"))
    -- routed: the free backend still fits
    S.fake("fb")
    local r = sbx.route{ only = { "fa", "fb" }, timeout_secs = 1200 }
    assert.same({ "fb" }, r.order)
    assert.matches("over budget", r.reasons.fa)
    ok, e = pcall(sbx.sandbox, { only = { "fa" }, timeout_secs = 1200 })
    assert.is_true(errors.is(e, "BudgetExceededError"))
  end)

  it("writes a ledger line when a sandbox is destroyed and reports usage", function()
    S.fake("fa", { price = { per_hour = 3600 } })   -- $1 a second
    local sb = sbx.sandbox("fa", { labels = { team = "x" }, timeout_secs = 60 })
    sbx.sleep(0.05)
    sb:destroy()
    local u = sbx.usage{ by = "provider" }
    assert.is_true(u.groups.fa.sandboxes >= 1)
    assert.is_true(u.groups.fa.cost_usd >= 0.04 and u.groups.fa.cost_usd < 5)
    local l = sbx.usage{ by = "label" }
    assert.is_truthy(l.groups["team=x"])
    assert.is_truthy(sbx.usage{ by = "job" }.total.sandboxes >= 1)
    assert.has_error(function() sbx.usage{ by = "color" } end)
    assert.equal(0, sbx.usage{ since = os.time() + 10 }.total.sandboxes)
  end)

  it("has the published default prices, versioned", function()
    assert.equal("2026-11-29", meter.PRICES.version)
    local p = sbx.providers().e2b.price
    assert.near(0.0504, p.per_vcpu_hour, 1e-9)
    assert.near(0.166, meter.hourly(p, { cpu = 2, memory_mb = 4096 }), 1e-3)
    assert.equal(0, sbx.providers()["local"].price.per_hour)
  end)
end)

describe("the decision log", function()
  before_each(S.reset)
  after_each(S.reset)

  it("appends one JSON line per routed create with candidates, plan and outcome", function()
    S.fake("fa", { fail = err("SandboxCreationError", "nope (HTTP 503)") })
    S.fake("fb")
    local sb <close> = sbx.sandbox{ only = { "fa", "fb" }, policy = "cheapest", labels = { k = "v" } }
    local f = assert(io.open(require("sbx.state.owner").state_dir() .. "/decisions.jsonl"))
    local last
    for line in f:lines() do last = line end
    f:close()
    local e = json.decode(last)
    assert.equal("cheapest", e.policy)
    assert.equal("fb", e.outcome.backend)
    assert.equal("fa", e.attempts[1].backend)
    assert.equal("retryable", e.attempts[1].class)
    assert.same({ "fa", "fb" }, e.plan.order)
  end)
end)
