-- Admission feedback (lua/sbx/routing/health.lua): a 429 (RateLimitError) lowers
-- the provider's admitted create rate, once per burst, with a pause of its
-- Retry-After; successes give it back until the throttle is gone. A quota
-- answer (QuotaExceededError) is not a rate and leaves it alone.
local health = require "sbx.routing.health"
local config = require "sbx.core.config"
local errors = require "sbx.core.errors"

describe("admission after a 429", function()
  local now
  before_each(function()
    health.reset()
    now = 1000
    health.clock = function() return now end
  end)
  after_each(function()
    health.clock = require("sbx.loop").now
    health.reset()
    config.use{}
  end)

  local function limited(after)
    health.record_create("e2b", 5, false, "capacity",
                         errors.new("RateLimitError", "e2b: create: HTTP 429", { retry_after = after }))
  end

  it("halves the configured rate once per burst, then climbs back to it", function()
    config.use{ providers = { e2b = { max_creates_per_sec = 8 } } }
    assert.same({ 8, false }, { health.admitted_rate("e2b") })
    limited(2)
    assert.same({ 4, true }, { health.admitted_rate("e2b") })
    limited(2)                                  -- the same burst: no second halving
    assert.same({ 4, true }, { health.admitted_rate("e2b") })
    now = now + 3
    limited(nil)
    assert.same({ 2, true }, { health.admitted_rate("e2b") })
    for _ = 1, 7 do health.record_create("e2b", 5, true) end
    local rate, throttled = health.admitted_rate("e2b")
    assert.is_true(throttled)
    assert.is_true(rate > 7 and rate < 8, tostring(rate))
    health.record_create("e2b", 5, true)
    assert.same({ 8, false }, { health.admitted_rate("e2b") })
  end)

  it("without a configured rate, starts from THROTTLE_START and never goes below THROTTLE_MIN", function()
    assert.same({}, { (health.admitted_rate("e2b")) })
    limited(1)
    assert.same({ health.THROTTLE_START / 2, true }, { health.admitted_rate("e2b") })
    for _ = 1, 20 do now = now + 400 limited(1) end
    assert.equal(health.THROTTLE_MIN, (health.admitted_rate("e2b")))
  end)

  it("a quota answer does not lower the rate", function()
    health.record_create("e2b", 5, false, "capacity",
                         errors.new("QuotaExceededError", "maximum number of concurrent E2B sandboxes", {}))
    assert.same({ nil, false }, { health.admitted_rate("e2b") })
  end)
end)
