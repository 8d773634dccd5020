-- A 429 storm from E2B (the stand-in's create rate limit, 429 with
-- Retry-After past it): admission backs off (health lowers the admitted
-- rate and pauses for Retry-After; a pinned create waits and goes again),
-- no job is lost, and every sandbox is destroyed.
local sbx = require "sbx"
local health = require "sbx.routing.health"
local R = require "spec.support.standin.e2b_run"

describe("e2b: a 429 storm", function()
  local s
  setup(function() s = R.start{ scale = true, rate = 4 } end)
  teardown(function()
    require("sbx.core.config").use{}
    health.reset()
    if s then s:stop() end
  end)

  it("admission backs off, nothing is lost, every sandbox is destroyed", function()
    R.use(s)
    health.reset()
    local throttled = false
    local jobs = {}
    for i = 1, 16 do jobs[i] = i end
    local out = sbx.parallel(jobs, function(i)
      local sb <close> = sbx.sandbox("e2b")
      throttled = throttled or select(2, health.admitted_rate("e2b"))
      return sb:execute_command("echo", { "job" .. i }).stdout
    end, { concurrency = 16 })
    for i = 1, 16 do assert.equal("job" .. i .. "\n", out[i]) end
    local st = s:stats()
    assert.is_true(throttled, "the 429s should have lowered the admitted rate")
    assert.equal(16, st.created)
    assert.is_true(st.limited > 0, "the stand-in should have answered 429")
    -- backing off: a few 429s per sandbox at most, not a tight loop of them
    assert.is_true(st.limited < 48, "too many 429s: " .. st.limited)
    assert.equal(0, st.live)
  end)
end)
