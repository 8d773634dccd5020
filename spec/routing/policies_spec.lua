-- Policies: every built-in, hostile policies (errors, loops, allocation,
-- garbage plans, forbidden globals), hot reload with broken edits, and
-- `sbxlua policy check`.
package.path = (os.getenv("SBX_SOURCE_DIR") or ".") .. "/spec/routing/?.lua;" .. package.path
local S = require "support"
local sbx = require "sbx"
local health = require "sbx.routing.health"
local policy = require "sbx.routing.policy"
local proc = require "sbx.proc"

local ALL = { "fa", "fb", "fc" }

-- Three fakes: fa cheap but slow, fb free and fast, fc pricey and medium.
local function three()
  S.fake("fa", { price = { per_hour = 0.05 } })
  S.fake("fb")
  S.fake("fc", { price = { per_hour = 0.20 } })
  for _ = 1, 5 do
    health.record_create("fa", 900, true)
    health.record_create("fb", 300, true)
    health.record_create("fc", 100, true)
  end
end

local warnings
local real_warn = policy.warn
local function capture() warnings = {}; policy.warn = function(m) warnings[#warnings + 1] = m end end

describe("built-in policies", function()
  before_each(function() S.reset(); three(); capture() end)
  after_each(function() S.reset(); policy.warn = real_warn end)

  it("default: cheapest healthy first, recently failing last", function()
    assert.same({ "fb", "fa", "fc" }, sbx.route{ only = ALL }.order)
    for _ = 1, 4 do health.record_create("fb", 0, false, "retryable") end
    health.record_create("fb", 300, true)   -- keep the breaker closed: healthy again later
    for _ = 1, 6 do health.record_create("fb", 0, false, "request") end
    local r = sbx.route{ only = ALL }
    assert.same({ "fa", "fc", "fb" }, r.order)
    assert.matches("recently failing last", r.plan.reason)
  end)

  it("cheapest: by price for the request's resources", function()
    assert.same({ "fb", "fa", "fc" }, sbx.route{ only = ALL, policy = "cheapest" }.order)
  end)

  it("fastest: by live p50 create (+ exec) latency; unmeasured last", function()
    assert.same({ "fc", "fb", "fa" }, sbx.route{ only = ALL, policy = "fastest" }.order)
    S.fake("fd")
    assert.same({ "fc", "fb", "fa", "fd" }, sbx.route{ only = { "fa", "fb", "fc", "fd" }, policy = "fastest" }.order)
  end)

  it("local-first: this machine's backends first, then the cheapest remote", function()
    local r = sbx.route{ only = { "fa", "fb", "fc", "local" }, policy = "local-first" }
    assert.same({ "local", "fb", "fa", "fc" }, r.order)
  end)

  it("round-robin: rotates the first choice", function()
    local firsts = {}
    for i = 1, 6 do firsts[i] = sbx.route{ only = ALL, policy = "round-robin" }.order[1] end
    assert.same({ "fa", "fb", "fc", "fa", "fb", "fc" }, firsts)
  end)

  it("a function policy sees candidates with prices and stats, and a request copy", function()
    local seen
    local r = sbx.route{ only = ALL, needs = { "exec" }, policy = function(req, cands, stats, now)
      seen = { req = req, cands = cands, stats = stats, now = now }
      return { order = { cands[3], "fa" }, reason = "mine" }
    end }
    assert.same({ "fc", "fa" }, r.order)
    assert.same({ "exec" }, seen.req.needs)
    assert.equal(1000, seen.now)
    assert.equal(300, seen.stats.fb.p50_create_ms)
    assert.near(0.2, seen.cands[3].price_per_hour, 1e-9)
    assert.equal("microvm", seen.cands[1].isolation)
  end)

  it("an unknown policy name is a ConfigError", function()
    local ok, e = pcall(sbx.route, { only = ALL, policy = "nope" })
    assert.is_false(ok)
    assert.equal("ConfigError", e.kind)
    assert.matches("unknown policy 'nope'", e.message)
  end)
end)

local function policy_file(name, body)
  local path = S.DIR .. "/" .. name .. ".lua"
  S.write(path, body)
  return path
end

describe("hostile policies", function()
  before_each(function() S.reset(); three(); capture() end)
  after_each(function() S.reset(); policy.warn = real_warn end)

  local cases = {
    { "errors", "return { name = 'e', route = function() error('kaboom') end }", "e_errors.lua:1: kaboom" },
    { "loops", "return { name = 'l', route = function()\n while true do end\n end }", "instruction budget" },
    -- 4 KiB a step: the memory cap comes long before the time budget, even under ASan
    { "allocates", "return { name = 'a', route = function() local t = {} for i = 1, 1e9 do t[i] = ('x'):rep(4096) .. i end end }",
      "memory cap" },
    { "doubles", "return { name = 'd', route = function() local s = 'x' for i = 1, 64 do s = s .. s end end }", "memory cap" },
    { "returns nil", "return { name = 'n', route = function() return nil end }", "returned nil" },
    { "returns NaN", "return { name = 'n', route = function(r, c) return { order = c, max_attempts = 0/0 } end }",
      "max_attempts" },
    { "hedges NaN", "return { name = 'n', route = function(r, c) return { order = c, hedge_after_ms = 0/0 } end }",
      "hedge_after_ms" },
    { "names an unknown backend", "return { name = 'u', route = function() return { order = { 'nowhere' } } end }",
      "'nowhere', which is not a candidate" },
    { "names a filtered backend", "return { name = 'f', route = function() return { order = { 'local' } } end }",
      "'local', which is not a candidate" },
    { "returns a wrong type", "return { name = 'w', route = function() return { order = { 42 } } end }",
      "plan.order%[1%] is number" },
    { "returns a cyclic table", "return { name = 'c', route = function() local t = {} t.order = t return t end }",
      "cyclic" },
    { "returns a function", "return { name = 'c', route = function() return { order = {}, f = print } end }",
      "undefined global 'print'" },
    { "calls os.exit", "return { name = 'x', route = function() os.exit(1) end }", "field 'exit'" },
    { "opens a file", "return { name = 'x', route = function() return io.open('/etc/passwd') end }", "undefined global 'io'" },
    { "requires", "return { name = 'x', route = function() return require('os') end }", "undefined global 'require'" },
    { "loads code", "return { name = 'x', route = function() return load('return 1')() end }", "undefined global 'load'" },
    { "uses debug", "return { name = 'x', route = function() return debug.getinfo(1) end }", "undefined global 'debug'" },
    { "backtracks a pattern", "return { name = 'x', route = function() return ('a'):rep(3000):match('.-.-.-.-b') end }",
      "string.match: instruction budget of 1000000 exceeded while matching" },
  }
  for i, case in ipairs(cases) do
    it("a policy that " .. case[1] .. " is reported and the default takes over", function()
      local file = policy_file("e_" .. case[1]:gsub("%W", "_"), case[2])
      if i == 1 then file = policy_file("e_errors", case[2]) end
      local r = sbx.route{ only = ALL, policy = file }
      assert.same({ "fb", "fa", "fc" }, r.order)      -- the default's plan
      assert.is_string(r.policy_error)
      assert.matches(case[3], r.policy_error)
      assert.matches("the default policy takes over", r.policy_error)
    end)
  end

  it("a policy whose top level loops or errors cannot load", function()
    local f = policy_file("top_loop", "while true do end")
    local ok, err = policy.check(f)
    assert.is_nil(ok)
    assert.matches("top_loop.lua:1: instruction budget", err)
    f = policy_file("top_syntax", "return {\n name = 'x',\n route = function( end }")
    ok, err = policy.check(f)
    assert.matches("top_syntax.lua:3:", err)
    f = policy_file("top_noroute", "return { name = 'x' }")
    ok, err = policy.check(f)
    assert.matches("'route' is missing", err)
  end)

  it("a policy cannot reach the host: each runs in its own state", function()
    local f = policy_file("probe", [[
      return { name = 'probe', route = function(req, c)
        local seen = {}
        for _, k in ipairs{ 'io', 'debug', 'package', 'require', 'load', 'loadfile', 'dofile',
                            'collectgarbage', 'coroutine', 'sbx' } do
          if rawget(_G, k) ~= nil then seen[#seen + 1] = k end
        end
        if os.execute or os.getenv or os.remove or string.dump then seen[#seen + 1] = 'os/dump' end
        if #seen > 0 then error('visible: ' .. table.concat(seen, ',')) end
        return { order = c, reason = tostring(os.time() > 0) .. type(os.clock()) .. type(os.date('%Y')) }
      end } ]])
    local r = sbx.route{ only = ALL, policy = f }
    assert.is_nil(r.policy_error)
    assert.equal("truenumberstring", r.plan.reason)
  end)

  it("a job that keeps routing through a looping policy neither hangs nor grows", function()
    local f = policy_file("loop2", "return { name = 'l', route = function() while true do end end }")
    local t0 = require("sbx.loop").now()
    for _ = 1, 5 do sbx.route{ only = ALL, policy = f } end
    assert.is_true(require("sbx.loop").now() - t0 < 5)
  end)

  it("a looping function policy is stopped too", function()
    local r = sbx.route{ only = ALL, policy = function() while true do end end }
    assert.matches("instruction budget", r.policy_error)
    assert.same({ "fb", "fa", "fc" }, r.order)
  end)
end)

describe("hot reload", function()
  before_each(function() S.reset(); three(); capture() end)
  after_each(function() S.reset(); policy.warn = real_warn end)

  local function mine(first)
    return "return { name = 'mine', route = function(req, c)\n"
        .. "  local order = { '" .. first .. "' }\n"
        .. "  for _, x in ipairs(c) do if x.name ~= '" .. first .. "' then order[#order + 1] = x.name end end\n"
        .. "  return { order = order, reason = 'first " .. first .. "' } end }\n"
  end

  it("picks up an edited policy by name from SBX_POLICY_PATH-style dirs, keeps the last good on a broken edit", function()
    local dir = S.DIR .. "/pp"
    os.execute("mkdir -p '" .. dir .. "'")
    sbx.config({ policy_path = { dir } })
    S.write(dir .. "/mine.lua", mine("fc"))
    assert.equal("fc", sbx.route{ only = ALL, policy = "mine" }.order[1])
    S.write(dir .. "/mine.lua", mine("fa") .. "-- longer\n")
    assert.equal("fa", sbx.route{ only = ALL, policy = "mine" }.order[1])
    -- a broken edit: syntax error
    S.write(dir .. "/mine.lua", "return { name = 'mine', route = function( }")
    local r = sbx.route{ only = ALL, policy = "mine" }
    assert.equal("fa", r.order[1])
    assert.is_nil(r.policy_error)
    assert.equal(1, #warnings)
    assert.matches("mine.lua:1: .*keeping the last good version", warnings[1])
    sbx.route{ only = ALL, policy = "mine" }
    assert.equal(1, #warnings)                 -- said once per broken version
    -- a broken edit: loads, but fails the self-check (garbage plan)
    S.write(dir .. "/mine.lua", "return { name = 'mine', route = function() return { order = 7 } end }")
    assert.equal("fa", sbx.route{ only = ALL, policy = "mine" }.order[1])
    assert.matches("self%-check failed", warnings[2])
    -- fixed again
    S.write(dir .. "/mine.lua", mine("fb") .. "-- fixed, and longer still\n")
    r = sbx.route{ only = ALL, policy = "mine" }
    assert.equal("fb", r.order[1])
    assert.equal("first fb", r.plan.reason)
  end)

  it("a file policy is the config's default_policy", function()
    local f = policy_file("dflt", mine("fc"))
    sbx.config({ default_policy = f })
    assert.equal("fc", sbx.route{ only = ALL }.order[1])
  end)
end)

describe("sbxlua policy check", function()
  local function run(args)
    return require("spec.support").sbxlua(args, { env = { "PATH=/usr/bin:/bin", "HOME=" .. S.DIR,
                                                          "SBX_STATE_DIR=" .. S.DIR }, timeout = 30 })
  end

  it("accepts a good policy and rejects a bad one with file:line", function()
    local src = os.getenv("SBX_SOURCE_DIR") or "."
    local r = run{ "policy", "check", src .. "/policies/cheapest.lua" }
    assert.equal(0, r.exit_code)
    assert.matches("ok: policy 'cheapest'", r.stdout)
    local f = policy_file("bad_check", "return { name = 'b', route = function(r, c)\n  return { order = { c[1], 'ghost' } }\nend }")
    r = run{ "policy", "check", f }
    assert.equal(1, r.exit_code)
    assert.matches("'ghost', which is not a candidate", r.stderr)
    r = run{ "policy", "check", S.DIR .. "/missing.lua" }
    assert.equal(1, r.exit_code)
    r = run{ "policy", "list" }
    assert.matches("cheapest, default, fastest, local%-first, round%-robin", r.stdout)
  end)
end)
