-- Scripts (policies, presets) cannot run past their budgets inside one C
-- call: pattern functions count steps, string.rep and table.move/insert/
-- remove are bounded; and SIGTERM/SIGINT end sbxlua even while a job is
-- stuck inside one C call.
local script = require "sbx.script"
local proc = require "sbx.proc"
local loop = require "sbx.loop"

-- The time budget is far away here, so that the instruction budget is what
-- stops the call even on a loaded machine (the time budget has its own case).
local LIMITS = { memory = 8 * 1024 * 1024, instructions = 1000000, millis = 60000 }
local EVIL = '("a"):rep(34), ("a?"):rep(34) .. ("a"):rep(34)'

local function call(body)
  local s <close> = script.new(LIMITS)
  assert(s:load("return { f = function() " .. body .. " end }", "=evil.lua"))
  return s:call("f")
end

describe("script budgets inside C calls", function()
  it("a backtracking string.find, as a function or a method, stops at the budget", function()
    for _, body in ipairs{ "return string.find(" .. EVIL .. ")",
                           "local s, p = " .. EVIL .. " return s:find(p)",
                           "local s, p = " .. EVIL .. " return s:match(p)",
                           "local s, p = " .. EVIL .. " return (s:gsub(p, ''))",
                           "local s, p = " .. EVIL .. " for x in s:gmatch(p) do end" } do
      local ok, msg, code = call(body)
      assert.is_nil(ok, body)
      assert.equal("budget", code)
      assert.matches("^evil.lua:1: string%.%a+: instruction budget of 1000000 exceeded while matching", msg)
    end
  end)

  it("the step budget and the instruction budget are one", function()
    -- 60 small matches fit; the loop around them is what runs out
    local ok, r = call("local n = 0 for i = 1, 60 do if ('abc'):find('b') then n = n + 1 end end return n")
    assert.is_true(ok)
    assert.equal(60, r)
    local ok2, _, code = call("while true do ('x'):rep(200):find('y') end")
    assert.is_nil(ok2)
    assert.equal("budget", code)
  end)

  it("the time budget stops a match too", function()
    local s <close> = script.new{ memory = 8 << 20, instructions = 1 << 50, millis = 50 }
    assert(s:load("return { f = function() return string.find(" .. EVIL .. ") end }", "=slow.lua"))
    local ok, msg, code = s:call("f")
    assert.is_nil(ok)
    assert.equal("budget", code)
    assert.matches("string.find: time budget of 50 ms exceeded while matching", msg)
  end)

  it("plain find is linear: a 1 MB needle over 2 MB", function()
    local ok, r = call([[
      local h = ("a"):rep(2000000)
      return { h:find(("a"):rep(1000000) .. "b", 1, true) == nil, h:find(("a"):rep(1000000), 2, true) } ]])
    assert.is_true(ok)
    assert.same({ true, 2, 1000001 }, r)
  end)

  it("string.rep: an empty result returns at once, a huge one hits the memory cap", function()
    local ok, r = call("return #(''):rep(math.maxinteger) + #('a'):rep(0) + #(''):rep(1 << 62, '')")
    assert.is_true(ok)
    assert.equal(0, r)
    local ok2, _, code = call("return #('ab'):rep(1 << 40)")
    assert.is_nil(ok2)
    assert.equal("memory", code)
    local ok3, r3 = call("return ('ab'):rep(3, ', ')")
    assert.is_true(ok3)
    assert.equal("ab, ab, ab", r3)
    -- the same strings as stock's rep
    local cases = {}
    for _, str in ipairs{ "", "x", "ab", "hello\0" } do
      for _, sep in ipairs{ "", ",", "--" } do
        for _, n in ipairs{ -1, 0, 1, 2, 3, 7, 64, 1000 } do cases[#cases + 1] = { str, n, sep } end
      end
    end
    local s <close> = script.new(LIMITS)
    assert(s:load("return { f = function(cases) local out = {} for i, c in ipairs(cases) do"
                  .. " out[i] = c[1]:rep(c[2], c[3]) end return out end }", "=rep.lua"))
    local ok4, got = s:call("f", cases)
    assert.is_true(ok4)
    for i, c in ipairs(cases) do assert.equal(c[1]:rep(c[2], c[3]), got[i]) end
  end)

  it("table.move/insert/remove refuse spans no script can hold", function()
    local ok, msg = call("table.move({}, 1, 1e15, 1)")
    assert.is_nil(ok)
    assert.matches("evil.lua:1: table.move: over 1048576 elements", msg)
    ok, msg = call("local t = setmetatable({}, { __len = function() return 1e15 end }) table.insert(t, 1, 'x')")
    assert.is_nil(ok)
    assert.matches("table.insert: over 1048576 elements", msg)
    ok, msg = call("local t = setmetatable({}, { __len = function() return 1e15 end }) table.remove(t, 1)")
    assert.is_nil(ok)
    assert.matches("table.remove: over 1048576 elements", msg)
    local ok4, r = call("local t = {1, 2, 3} table.insert(t, 1, 0) table.insert(t, 9) table.remove(t, 2)"
                        .. " return table.concat(table.move(t, 1, 4, 2, {}), ',', 2, 5)")
    assert.is_true(ok4)
    assert.equal("0,2,3,9", r)
  end)
end)

describe("a policy or preset file with a pathological pattern", function()
  local dir = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/script-budget-" .. proc.getpid()
  local BIN = os.getenv("SBX_BIN") or "build/sbxlua"
  local function write(name, code)
    os.execute("mkdir -p " .. dir)
    local f = assert(io.open(dir .. "/" .. name, "w"))
    f:write(code)
    f:close()
    return dir .. "/" .. name
  end
  local function run(args, stream)
    local argv = { BIN }
    for _, a in ipairs(args) do argv[#argv + 1] = a end
    return assert(proc.spawn{ argv = argv, env = { "PATH=/usr/bin:/bin", "HOME=" .. dir,
                                                   "SBX_STATE_DIR=" .. dir }, timeout = 120,
                              stream = stream })
  end

  it("policy check reports the budget with file:line instead of hanging", function()
    local f = write("evil.lua", "return { name = 'evil', route = function(req, c)\n"
                    .. "  string.find(" .. EVIL .. ")\n  return { order = c } end }")
    local r = run{ "policy", "check", f }:wait()
    assert.equal(1, r.exit_code)
    assert.is_false(r.timed_out)
    -- the instruction budget, or on a loaded machine the time budget first
    assert.matches("evil.lua:2: string%.find: %a+ budget of %d+ ?m?s? exceeded", r.stderr)
  end)

  it("a preset file's top level is stopped the same way (ConfigError)", function()
    write("evilp.lua", "local x = ('a'):rep(34):find(('a?'):rep(34) .. ('a'):rep(34))\n"
          .. "return { name = 'evilp', description = 'x', image = 'debian' }")
    local r = assert(proc.spawn{ argv = { BIN, "-e", "local ok, e = pcall(sbx.sandbox, 'local', { preset = 'evilp' })"
                                   .. " print(e.kind, e.message)" },
                           env = { "PATH=/usr/bin:/bin", "HOME=" .. dir, "SBX_STATE_DIR=" .. dir,
                                   "SBX_PRESET_PATH=" .. dir }, timeout = 120 }):wait()
    assert.is_false(r.timed_out)
    assert.matches("ConfigError", r.stdout)
    assert.matches("instruction budget of %d+ exceeded while matching", r.stdout)
  end)

  it("SIGTERM ends a job stuck in a stock string.find, exit 143", function()
    local job = write("stuck.lua", "print('ready') io.stdout:flush()\n"
                      .. "string.find(" .. EVIL .. ")\nprint('finished')")
    local p = run({ job }, true)
    local seen = ""
    while not seen:find("ready") do
      local which, chunk = p:read()
      assert(which, "the job ended early: " .. seen)
      if which == "stdout" then seen = seen .. chunk end
    end
    loop.sleep(0.2)
    p:kill(15)
    local r = p:wait()
    assert.is_false(r.timed_out)
    assert.equal(143, r.exit_code)
    assert.matches("not handled in time", r.stderr or "")
  end)
end)
