-- providers/safehouse.lua on Linux, through spec/support/safehouse (a
-- stand-in for Agent Safehouse v0.11.1; docs/safehouse.md). What safehouse
-- is given (argv, its own environment, the command's), the network off with
-- allow_internet = false (a namespace of the stand-in's, as root and as
-- nobody), timeouts that kill the tree, safehouse's refusals as typed
-- errors, what it cannot do, and why it is unavailable here without the
-- test knob. The stand-in's own grammar: safehouse_standin_spec.lua.
local sbx = require "sbx"
local config = require "sbx.core.config"
local fs = require "sbx.fs"
local loop = require "sbx.loop"
local proc = require "sbx.proc"
local stream = require "sbx.stream"
local S = require "spec.support"

local SOURCE = S.SOURCE:sub(1, 1) == "/" and S.SOURCE or (os.getenv("PWD") .. "/" .. S.SOURCE)
local STANDIN = SOURCE .. "/spec/support/safehouse"
local TOOLS_PATH = "PATH=/usr/bin:/bin:/usr/sbin:/sbin"
-- what safehouse adds to the command's environment of its own
local SAFEHOUSE_OWN = { SHELL = true, TMPDIR = true, PWD = true, TERM = true, APP_SANDBOX_CONTAINER_ID = true }

local function write(path, text, mode)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  if mode then assert(fs.chmod_host(path, mode)) end
end

-- A safehouse program for one test: the stand-in, with its settings (`vars`,
-- a map) set by a wrapper (dash's PWD taken out again), logging every call.
local function standin(vars)
  local dir = S.tmpdir("sbxsafehouse")
  assert(fs.chmod_host(dir, tonumber("755", 8)))
  local t = { dir = dir, log = dir .. "/log", program = dir .. "/safehouse" }
  function t.set(v)
    local sets = { "SAFEHOUSE_STANDIN_LOG=" .. t.log }
    for k, x in pairs(v or {}) do sets[#sets + 1] = k .. "=" .. x end
    write(t.program, "#!/bin/sh\nexec env -u PWD " .. table.concat(sets, " ") .. " " .. STANDIN .. ' "$@"\n',
          tonumber("755", 8))
  end
  t.set(vars)
  -- the calls logged: { args = {...}, env = {...}, child = {...}, net = "deny"|"allow" }
  function t.calls()
    local f = io.open(t.log, "rb")
    if not f then return {} end
    local data = f:read("a")
    f:close()
    local calls, cur, key = {}, nil, nil
    for tok in data:gmatch("([^%z]*)%z") do
      if key then
        if key == "net" then cur.net = tok else table.insert(cur[key == "arg" and "args" or key], tok) end
        key = nil
      elseif tok == "call" then cur = { args = {}, env = {}, child = {} }
      elseif tok == "end" then calls[#calls + 1] = cur
      else key = tok end
    end
    return calls
  end
  function t.last() local c = t.calls() return c[#c] end
  function t.use(extra)
    local c = { program = t.program, allow_non_darwin = true }
    for k, v in pairs(extra or {}) do c[k] = v end
    config.use{ providers = { safehouse = c } }
  end
  function t.cleanup() fs.rmtree(dir) end
  return t
end

local function set_of(list)
  local out = {}
  for _, kv in ipairs(list) do
    local k, v = kv:match("^([^=]*)=(.*)$")
    out[k] = v
  end
  return out
end

-- A listener of this process on 127.0.0.1 that answers "hi" to each client.
local function listener()
  local l, port = assert(stream.listen{ host = "127.0.0.1", port = 0 })
  local n = 0
  local task = loop.spawn(function()
    while true do
      local c = l:accept(60)
      if not c then return end
      n = n + 1
      c:write("hi\n")
      c:close()
    end
  end)
  return { port = port, count = function() return n end,
           close = function() task:cancel() l:close() end }
end
local function connect_cmd(port)
  return { "bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/" .. port .. " && head -n1 <&3" }
end

describe("safehouse provider", function()
  local sh
  before_each(function() sh = standin() sh.use() end)
  after_each(function() sh.cleanup() config.use(config.EMPTY) end)

  describe("on Linux without the test knob", function()
    it("is unavailable: macOS only (sandbox-exec), also with only one of program and allow_non_darwin", function()
      for _, c in ipairs{ {}, { program = sh.program }, { allow_non_darwin = true } } do
        config.use{ providers = { safehouse = c } }
        local d = sbx.providers().safehouse
        assert.is_false(d.available)
        assert.matches("macOS only (sandbox-exec); this host is Linux", d.reason, 1, true)
        local kind, err = S.kind_of(function() sbx.sandbox("safehouse") end)
        assert.equal("BackendNotInstalledError", kind)
        assert.matches("macOS only", err.message, 1, true)
      end
      sh.use{ program = sh.dir .. "/no-such-safehouse" }
      assert.matches("no-such-safehouse is not an executable file", sbx.providers().safehouse.reason, 1, true)
    end)

    it("sbxlua providers and doctor say why", function()
      local u = S.user("safehouse-cli")
      local r = u.run({ "providers" })
      assert.equal(0, r.exit_code, r.stderr)
      assert.matches("safehouse +no +process +[%w,]+ +%(macOS only %(sandbox%-exec%); this host is Linux", r.stdout)
      r = u.run({ "doctor" })
      assert.equal(0, r.exit_code, r.stderr)
      assert.matches("warn  backend safehouse: macOS only (sandbox-exec)", r.stdout, 1, true)
      assert.matches("host: Linux (safehouse needs macOS; allow_non_darwin is false)", r.stdout, 1, true)
      -- with the knob in the config file: available
      u.write("xdg/sbxlua/config.yaml", "providers:\n  safehouse:\n    program: " .. sh.program
              .. "\n    allow_non_darwin: true\n")
      r = u.run({ "providers" })
      assert.matches("safehouse +yes +process", r.stdout)
      u.cleanup()
    end)
  end)

  describe("what safehouse is given", function()
    it("argv: --workdir, no workdir config, --, the command's environment as K=V tokens, the command", function()
      local sb <close> = sbx.sandbox("safehouse", { env_vars = { FOO = "a b", EMPTY = "" } })
      local r = sb:execute_command("printenv", { "FOO" }, { env = { LINE = "x\ny" } })
      assert.equal("a b\n", r.stdout)
      local c = sh.last()
      assert.same({ "--workdir=" .. sb.workdir, "--trust-workdir-config=false", "--",
                    "EMPTY=", "FOO=a b", "HOME=" .. sb.workdir, "LINE=x\ny",
                    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "printenv", "FOO" }, c.args)
      for _, a in ipairs(c.args) do assert.is_nil(a:match("^%-%-env"), a) end
      assert.equal("allow", c.net)
    end)

    it("safehouse's own environment is PATH and HOME only: nothing of sbxlua's reaches it or the command", function()
      write(sh.dir .. "/sbx.yaml", "providers:\n  safehouse:\n    program: " .. sh.program
            .. "\n    allow_non_darwin: true\n")
      local r = S.sbxlua({ "-e", "local sb <close> = sbx.sandbox('safehouse')\n"
                               .. "io.write(sb:execute_command('env').stdout)" },
        { env = { S.PATH, "SBX_CANARY_SECRET=canary-5521", "SAFEHOUSE_ENV_PASS=SBX_CANARY_SECRET",
                  "SAFEHOUSE_ADD_DIRS=/", "SAFEHOUSE_TRUST_WORKDIR_CONFIG=1", "LANG=C.UTF-8",
                  "SBX_STATE_DIR=" .. sh.dir .. "/state", "SBX_CONFIG=" .. sh.dir .. "/sbx.yaml" } })
      assert.equal(0, r.exit_code, r.stderr)
      assert.is_nil(r.stdout:find("canary-5521", 1, true))
      local c = sh.last()
      local home = set_of(c.env).HOME
      table.sort(c.env)
      assert.same({ "HOME=" .. home, TOOLS_PATH }, c.env)
      assert.matches("/state/local/", home, 1, true)
      for _, e in ipairs(c.child) do assert.is_nil(e:find("canary", 1, true), e) end
      -- the command's variables: sbxlua's (PATH, HOME) and safehouse's own few, nothing else
      local names = {}
      for line in r.stdout:gmatch("[^\n]+") do
        local k = line:match("^([^=]+)=")
        if k and not SAFEHOUSE_OWN[k] then names[#names + 1] = k end
      end
      table.sort(names)
      assert.same({ "HOME", "PATH" }, names)
    end)

    it("refuses variable names safehouse would read as the command, and a command that looks like one", function()
      local sb <close> = sbx.sandbox("safehouse")
      local kind, err = S.kind_of(function() sb:execute_command("true", {}, { env = { ["my-var"] = "x" } }) end)
      assert.equal("ConfigError", kind)
      assert.matches('"my-var" is not a NAME safehouse accepts', err.message, 1, true)
      kind, err = S.kind_of(function() sb:execute_command("A=b", {}) end)
      assert.equal("ConfigError", kind)
      assert.matches("would be read as a variable assignment", err.message, 1, true)
      assert.equal(0, #sh.calls() - 1)   -- only create's first command reached safehouse
    end)

    it("cannot limit cpu or memory: FeatureNotSupportedError when pinned, and nothing is created", function()
      local before = #require("sbx.state.owner").owned()
      for _, o in ipairs{ { cpu = 2 }, { memory_mb = 512 }, { image = "python:3.12" } } do
        local kind, err = S.kind_of(function() sbx.sandbox("safehouse", o) end)
        assert.equal("FeatureNotSupportedError", kind)
        assert.matches("safehouse cannot honour " .. next(o), err.message, 1, true)
      end
      assert.equal(before, #require("sbx.state.owner").owned())
      assert.equal(0, #sh.calls())
    end)
  end)

  describe("the network", function()
    local l
    before_each(function() l = listener() end)
    after_each(function() l.close() end)

    it("is there by default (allow_internet's default, API.md) and off with allow_internet = false", function()
      local on <close> = sbx.sandbox("safehouse")
      local r = on:execute_command(connect_cmd(l.port)[1], { table.unpack(connect_cmd(l.port), 2) })
      assert.equal("hi\n", r.stdout, r.stderr)
      assert.equal("allow", sh.last().net)
      local off <close> = sbx.sandbox("safehouse", { allow_internet = false })
      local n = l.count()
      r = off:execute_command(connect_cmd(l.port)[1], { table.unpack(connect_cmd(l.port), 2) })
      assert.equal(1, r.exit_code)
      assert.matches("Network is unreachable", r.stderr, 1, true)
      assert.equal(n, l.count())
      local c = sh.last()
      assert.equal("deny", c.net)
      assert.equal("--append-profile=" .. off.workdir .. "/.sbx-deny-network.sb", c.args[3])
      assert.equal("(deny network*)", off:read_file(".sbx-deny-network.sb"):match("\n(%(deny network%*%))\n$"))
      -- an edit of the profile through the API is undone before the next command
      off:write_file(".sbx-deny-network.sb", "")
      r = off:execute_command(connect_cmd(l.port)[1], { table.unpack(connect_cmd(l.port), 2) })
      assert.equal(1, r.exit_code)
      assert.equal(n, l.count())
      -- and resume keeps it off
      local again = sbx.resume(sbx.json.decode(sbx.json.encode(off:session_state())))
      r = again:execute_command(connect_cmd(l.port)[1], { table.unpack(connect_cmd(l.port), 2) })
      assert.equal(1, r.exit_code)
      assert.equal(n, l.count())
    end)

    it("in a workdir of the user's: the profile goes with the sandbox, the directory stays", function()
      local wd = S.tmpdir("sbxshwd")
      finally(function() fs.rmtree(wd) end)
      write(wd .. "/mine.txt", "kept")
      local sb = sbx.sandbox("safehouse", { workdir = wd, allow_internet = false })
      assert.equal(wd, sb.workdir)
      assert.equal("kept", sb:execute_command("cat", { "mine.txt" }).stdout)
      assert.equal("--append-profile=" .. wd .. "/.sbx-deny-network.sb", sh.last().args[3])
      sb:destroy()
      assert.same({ "mine.txt" }, fs.list_host(wd))
    end)

    it("the stand-in's namespace holds as another user too (unshare --user --map-current-user)", function()
      if S.host("id -u") ~= "0\n" then
        pending("needs root to switch to an unprivileged user (as this user the specs above took that path)")
        return
      end
      if not proc.which("setpriv") then pending("no setpriv") return end
      write(sh.dir .. "/deny.sb", "(deny network*)\n", tonumber("644", 8))
      local function as_nobody(profile)
        local argv = { "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", STANDIN,
                       "--workdir=/tmp" }
        if profile then argv[#argv + 1] = "--append-profile=" .. profile end
        for _, a in ipairs{ "--", "PATH=/usr/bin:/bin", "sh", "-c", 'id -u; "$@"', "sh",
                            table.unpack(connect_cmd(l.port)) } do argv[#argv + 1] = a end
        local p = assert(proc.spawn{ argv = argv, env = { TOOLS_PATH, "HOME=/tmp" }, cwd = "/tmp", timeout = 30 })
        local r = p:wait()
        p:close()
        return r
      end
      local r = as_nobody(nil)
      assert.equal("65534\nhi\n", r.stdout, r.stderr)
      local n = l.count()
      r = as_nobody(sh.dir .. "/deny.sb")
      assert.equal("65534\n", r.stdout, r.stderr)
      assert.matches("Network is unreachable", r.stderr, 1, true)
      assert.equal(n, l.count())
    end)
  end)

  it("a timeout kills the whole tree, through the network namespace too", function()
    local sb <close> = sbx.sandbox("safehouse", { allow_internet = false })
    local tag = S.tag("sbxsh")
    local t0 = loop.now()
    local r = sb:execute_command("bash", { "-c", "(trap '' TERM; exec -a " .. tag .. "a sleep 300) & "
      .. "setsid bash -c 'exec -a " .. tag .. "b sleep 300' & sleep 300" }, { timeout = 0.5 })
    assert.is_true(r.timed_out)
    assert.is_true(loop.now() - t0 < 10)
    loop.sleep(0.2)
    assert.equal(0, S.pgrep(tag))
    assert.equal("deny", sh.last().net)
  end)

  it("gc destroys what a SIGKILLed session left: the directory and the command's tree", function()
    write(sh.dir .. "/sbx.yaml", "providers:\n  safehouse:\n    program: " .. sh.program
          .. "\n    allow_non_darwin: true\n")
    local env = { S.PATH, "SBX_STATE_DIR=" .. sh.dir .. "/state", "SBX_CONFIG=" .. sh.dir .. "/sbx.yaml" }
    local tag = S.tag("sbxshgc")
    local p = S.sbxlua({ "-e", "local sb = sbx.sandbox('safehouse', { allow_internet = false })\n"
      .. "print(sb.workdir) io.stdout:flush()\n"
      .. "sb:execute_command('bash', { '-c', 'exec -a " .. tag .. " sleep 300' })" },
      { env = env, stream = true, timeout = 60 })
    local dir = S.expect_output(p, "\n"):match("^(.-)\n")
    for _ = 1, 100 do if S.alive(tag) then break end loop.sleep(0.05) end
    assert.is_true(S.alive(tag))
    S.host("kill -9 " .. p.pid)
    p:wait()
    p:close()
    assert.is_true(fs.stat_host(dir) ~= nil)
    local r = S.sbxlua({ "gc" }, { env = env })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("destroyed 1 sandbox", r.stdout .. r.stderr)
    assert.is_nil(fs.stat_host(dir))
    assert.equal(0, S.pgrep(tag))
  end)

  describe("safehouse's refusals", function()
    it("not Darwin, no sandbox-exec: BackendNotInstalledError at create, and no sandbox is left", function()
      local owner = require "sbx.state.owner"
      local made = {}
      finally(function() for _, t in ipairs(made) do t.cleanup() end end)   -- one finally per test
      for mode, says in pairs{ ["not-darwin"] = "safehouse requires macOS (Darwin) to execute commands under "
                               .. "sandbox-exec.; Detected platform: Linux",
                               ["no-sandbox-exec"] = "safehouse could not find sandbox-exec in PATH." } do
        local t = standin({ SAFEHOUSE_STANDIN_MODE = mode })
        made[#made + 1] = t
        t.use()
        local before = #owner.owned()
        local kind, err = S.kind_of(function() sbx.sandbox("safehouse") end)
        assert.equal("BackendNotInstalledError", kind, mode)
        assert.matches("safehouse: " .. says, err.message, 1, true)
        assert.equal(before, #owner.owned())
      end
    end)

    it("a refusal after create: BackendNotInstalledError from the command", function()
      local sb <close> = sbx.sandbox("safehouse")
      sh.set({ SAFEHOUSE_STANDIN_MODE = "not-darwin" })
      local kind, err = S.kind_of(function() sb:execute_command("true") end)
      assert.equal("BackendNotInstalledError", kind)
      assert.matches("requires macOS (Darwin)", err.message, 1, true)
    end)

    it("the profile denies an exec (EPERM in the child): SandboxExecutionError naming it", function()
      sh.set({ SAFEHOUSE_STANDIN_DENY_EXEC = "ls" })
      local sb <close> = sbx.sandbox("safehouse")
      local kind, err = S.kind_of(function() sb:execute_command("ls", { "-l" }) end)
      assert.equal("SandboxExecutionError", kind)
      assert.equal("EPERM", err.errno)
      assert.matches("the sandbox profile denied running ls (Operation not permitted)", err.message, 1, true)
      -- streamed stderr is seen too
      kind = S.kind_of(function() sb:execute_command("ls", {}, { on_stderr = function() end }) end)
      assert.equal("SandboxExecutionError", kind)
      -- a command that prints the same but ran is a result
      local r = sb:execute_command("sh", { "-c", "echo 'env: ls: Operation not permitted' >&2; exit 126" })
      assert.equal(126, r.exit_code)
    end)

    it("a program that went away after create: BackendNotInstalledError", function()
      local sb <close> = sbx.sandbox("safehouse")
      os.remove(sh.program)
      local kind, err = S.kind_of(function() sb:execute_command("true") end)
      assert.equal("BackendNotInstalledError", kind)
      assert.matches("is not an executable file", err.message, 1, true)
    end)
  end)
end)
