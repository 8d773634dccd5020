-- The sbxlua binary raises its own threads' priority SBX_LOOP_BOOST (5)
-- nice steps where it may (root, CAP_SYS_NICE), so that the loop is not
-- starved by the commands it starts; every command, and os.execute's and
-- io.popen's children, start at the priority sbxlua was started with.
local S = require "spec.support"
local proc = require "sbx.proc"

local function run(argv, env)
  local p = assert(proc.spawn{ argv = argv, env = env or { S.PATH }, timeout = 60 })
  local r = p:wait()
  p:close()
  return r
end

-- What an sbxlua prints about the priorities it runs at: "threads: n,n,...",
-- "command: n", "popen: n", "execute: n" (one per line).
local PROBE = [[
  local function nice_of(stat) return tonumber(stat:match("%) (.*)$"):match(string.rep("%S+ ", 16) .. "(%S+)")) end
  local sb <close> = sbx.sandbox("local")
  for _ = 1, 4 do sbx.parallel({ 1, 2, 3 }, function() sb:execute_command("true", {}) end) end
  local t = {}
  for _, tid in ipairs(require("sbx.fs").list_host("/proc/self/task")) do
    t[#t + 1] = nice_of(io.open("/proc/self/task/" .. tid .. "/stat"):read("a"))
  end
  print("threads: " .. table.concat(t, ","))
  print("command: " .. sb:execute_command("sh", { "-c", "cut -d' ' -f19 /proc/$$/stat" }).stdout:match("%-?%d+"))
  local p = io.popen("cut -d' ' -f19 /proc/self/stat")
  print("popen: " .. p:read("a"):match("%-?%d+"))
  p:close()
  io.stdout:flush()
  io.write("execute: ") io.stdout:flush()
  os.execute("cut -d' ' -f19 /proc/self/stat")
]]

local function probe(prefix, env)
  local argv = {}
  for _, a in ipairs(prefix) do argv[#argv + 1] = a end
  for _, a in ipairs{ S.BIN, "-e", PROBE } do argv[#argv + 1] = a end
  local r = run(argv, env)
  assert.equal(0, r.exit_code, r.stderr)
  local out = {}
  for k, v in r.stdout:gmatch("(%a+): ([^\n]+)") do out[k] = v end
  local threads = {}
  for n in out.threads:gmatch("%-?%d+") do threads[#threads + 1] = tonumber(n) end
  return threads, tonumber(out.command), tonumber(out.popen), tonumber(out.execute)
end

local function may_raise()
  return run({ "sh", "-c", "nice -n -1 true 2>/dev/null" }).exit_code == 0
end

describe("the loop's priority", function()
  local env = { S.PATH, "SBX_STATE_DIR=" .. S.tmpdir("sbxboost") }

  it("is 5 steps up, for every thread; commands and popen/execute children are not", function()
    if not may_raise() then return pending("this process may not raise a priority") end
    local threads, command, popen, execute = probe({ "nice", "-n", "3" }, env)
    assert.is_true(#threads >= 1)
    for _, n in ipairs(threads) do assert.equal(-2, n) end
    assert.equal(3, command)
    assert.equal(3, popen)
    assert.equal(3, execute)
  end)

  it("SBX_LOOP_BOOST sets the steps, 0 turns it off", function()
    if not may_raise() then return pending("this process may not raise a priority") end
    local e = { table.unpack(env) }
    e[#e + 1] = "SBX_LOOP_BOOST=2"
    local threads, command = probe({ "nice", "-n", "3" }, e)
    for _, n in ipairs(threads) do assert.equal(1, n) end
    assert.equal(3, command)
    e[#e] = "SBX_LOOP_BOOST=0"
    threads, command = probe({ "nice", "-n", "3" }, e)
    for _, n in ipairs(threads) do assert.equal(3, n) end
    assert.equal(3, command)
  end)

  it("where it may not be raised, nothing changes and everything runs", function()
    -- RLIMIT_NICE cannot give it back once dropped, and root ignores it:
    -- setpriv drops CAP_SYS_NICE for the run
    if run({ "sh", "-c", "command -v setpriv" }).exit_code ~= 0 then return pending("no setpriv") end
    local threads, command, popen = probe({ "setpriv", "--inh-caps=-sys_nice", "--bounding-set=-sys_nice",
                                            "nice", "-n", "3" }, env)
    for _, n in ipairs(threads) do assert.equal(3, n) end
    assert.equal(3, command)
    assert.equal(3, popen)
  end)
end)
