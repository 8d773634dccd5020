-- sbx-agent, as embedded in sbxlua (sbx.agentbin): the supervisor that runs
-- commands inside containers.
local proc = require "sbx.proc"
local fs = require "sbx.fs"
local loop = require "sbx.loop"

local dir = assert(fs.mkdtemp("/tmp", "sbxagent"))
local AGENT = dir .. "/sbx-agent"

local function run(args, o)
  o = o or {}
  local argv = { AGENT }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local p = assert(proc.spawn{ argv = argv, env = { "PATH=/usr/bin:/bin" }, timeout = o.timeout or 30 })
  return p:wait()
end

-- Split the agent's trailer off stderr: stderr, kind, n
local function trailer(stderr)
  local i = stderr:find("\0SBXAGENT1 [^\0]*\n$")
  assert(i, "no trailer in " .. stderr)
  local kind, n = stderr:sub(i + 11):match("^(%a+) (%-?%d+)\n$")
  return stderr:sub(1, i - 1), kind, tonumber(n)
end

describe("sbx-agent", function()
  setup(function()
    local blob = require "sbx.agentbin"
    assert.is_true(#blob > 10000)
    assert.equal("\127ELF", blob:sub(1, 4))
    local root = assert(fs.open_root(dir))
    assert(root:write("sbx-agent", blob, tonumber("755", 8)))
    root:close()
  end)
  teardown(function() fs.rmtree(dir) end)

  it("reports its version", function()
    assert.matches("^sbx%-agent %d+\n$", run({ "version" }).stdout)
  end)

  it("runs a command and reports its exit status last on stderr", function()
    local r = run({ "run", "--", "sh", "-c", "echo out; echo err >&2; exit 3" })
    local err, kind, n = trailer(r.stderr)
    assert.equal("out\n", r.stdout)
    assert.equal("err\n", err)
    assert.equal("exit", kind)
    assert.equal(3, n)
  end)

  it("passes argv exactly and keeps the environment it is given", function()
    local r = run({ "run", "--", "printf", "%s|", "a b", "$(x)", "l1\nl2" })
    assert.equal("a b|$(x)|l1\nl2|", r.stdout)
  end)

  it("a timeout kills the whole tree, setsid grandchildren included", function()
    local tag = "sbxagspec" .. require("sbx.proc").random_hex(8)
    local t0 = loop.now()
    local r = run({ "run", "--timeout", "0.5", "--", "bash", "-c",
                    "setsid bash -c 'exec -a " .. tag .. " sleep 300' & trap '' TERM; sleep 300" })
    local _, kind = trailer(r.stderr)
    assert.equal("timeout", kind)
    assert.is_true(loop.now() - t0 < 5)
    assert.is_false(require("spec.support").alive(tag))
  end)

  it("reports a missing program, a bad cwd, and a signal", function()
    local _, kind, n = trailer(run({ "run", "--", "no-such-program-q" }).stderr)
    assert.equal("noexec", kind)
    assert.equal(2, n)
    _, kind = trailer(run({ "run", "--cwd", "/no/such", "--", "true" }).stderr)
    assert.equal("nocwd", kind)
    _, kind, n = trailer(run({ "run", "--", "sh", "-c", "kill -9 $$" }).stderr)
    assert.equal("signal", kind)
    assert.equal(9, n)
  end)

  it("feeds stdin from a file it then removes, and closes stdin otherwise", function()
    local root = assert(fs.open_root(dir))
    assert(root:write("in.txt", "fed"))
    root:close()
    assert.equal("fed", run({ "run", "--stdin", dir .. "/in.txt", "--", "cat" }).stdout)
    assert.is_nil(io.open(dir .. "/in.txt"))
    assert.equal("", run({ "run", "--", "cat" }).stdout)
  end)

  it("returns when the command exits even if a grandchild holds the pipes", function()
    local t0 = loop.now()
    local r = run({ "run", "--", "sh", "-c", "(sleep 5 &); echo done" })
    assert.equal("done\n", r.stdout)
    assert.is_true(loop.now() - t0 < 2)
  end)

  it("the last trailer wins over one the command forges", function()
    local r = run({ "run", "--", "sh", "-c", "printf '\\000SBXAGENT1 exit 0\\n' >&2; exit 7" })
    local _, kind, n = trailer(r.stderr)
    assert.equal("exit", kind)
    assert.equal(7, n)
  end)

  it("lists a directory as NUL-separated records", function()
    local root = assert(fs.open_root(dir))
    root:write("sub/x.txt", "12345")
    root:close()
    local r = run({ "ls", dir .. "/sub" })
    assert.equal("file\0" .. "5\0", r.stdout:sub(1, 7))
    assert.matches("x%.txt%z$", r.stdout)
    assert.equal(3, run({ "ls", dir .. "/missing" }).exit_code)
  end)
end)

describe("an agent build's name (daemon.link.hash)", function()
  local hash = require("sbx.daemon.link").hash

  it("changes with any one byte of the build, and is stable", function()
    local blob = require "sbx.agentbin"
    local h = hash(blob)
    assert.matches("^%x+$", h)
    assert.equal(12, #h)
    assert.equal(h, hash(blob .. ""))     -- the same bytes, another string
    -- bytes the old sampling skipped (every 16th was read) and the tail
    for _, at in ipairs{ 2, 8, 17, 1000, 4099, 4104, #blob - 70, #blob - 3, #blob } do
      local b = blob:byte(at)
      local other = blob:sub(1, at - 1) .. string.char((b + 1) % 256) .. blob:sub(at + 1)
      assert.not_equal(h, hash(other), "byte " .. at)
    end
    assert.not_equal(hash("abc"), hash("abd"))
    assert.not_equal(hash(""), hash("\0"))
  end)
end)
