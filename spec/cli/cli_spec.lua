-- The sbxlua command line, run as a user would: exit codes, errors,
-- signals, SIGKILL + gc, and the commands of API.md.
local proc = require "sbx.proc"
local loop = require "sbx.loop"
local fs = require "sbx.fs"
local json = require "cjson"
local S = require "spec.support"

-- sbxlua with HOME and SBX_STATE_DIR in STATE: sbxlua(args, { env =, stdin =,
-- timeout = }) -> result; start(args) -> the running process.
local H = S.home("cli", { timeout = 60 })
local BIN, STATE = S.BIN, H.dir
local env, sbxlua, start, write_job = H.env, H.run, H.start, H.write
local expect_output, alive = S.expect_output, S.alive

local function live_sandboxes()
  local r = sbxlua({ "ls", "--json" })
  assert.equal(0, r.exit_code, r.stderr)
  return json.decode(r.stdout)
end

describe("sbxlua CLI", function()
  setup(function() os.execute("mkdir -p " .. STATE) end)
  teardown(function() fs.rmtree(STATE) end)

  it("version and --help", function()
    local r = sbxlua({ "version" })
    assert.equal(0, r.exit_code)
    assert.matches("^sbxlua %d+%.%d+%.%d+ %(Lua 5%.4%)", r.stdout)
    r = sbxlua({ "--help" })
    assert.equal(0, r.exit_code)
    assert.matches("usage: sbxlua %[%-%-config FILE%] JOB.lua", r.stdout)
    r = sbxlua({})
    assert.equal(2, r.exit_code)
    r = sbxlua({ "--bogus" })
    assert.equal(2, r.exit_code)
    assert.matches("unknown option", r.stderr)
  end)

  it("-e runs inline code with the full standard library and sbx", function()
    local r = sbxlua({ "-e", "print(string.format('%d', 6*7), type(io.open), type(sbx.sandbox))" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("42\tfunction\tfunction\n", r.stdout)
  end)

  it("runs a job with arguments in `arg`, and require 'sbx' is the global", function()
    local job = write_job("args.lua", "print(arg[0]:match('args.lua$'), arg[1], arg[2], #arg, require('sbx') == sbx)")
    local r = sbxlua({ job, "one", "two words" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("args.lua\tone\ttwo words\t2\ttrue\n", r.stdout)
  end)

  it("a syntax error names file:line and exits 1", function()
    local job = write_job("broken.lua", "local x = 1\nlocal = 2\n")
    local r = sbxlua({ job })
    assert.equal(1, r.exit_code)
    assert.matches("broken%.lua:2:", r.stderr)
  end)

  it("a missing job file is a clear error", function()
    local r = sbxlua({ STATE .. "/no-such-job.lua" })
    assert.equal(1, r.exit_code)
    assert.matches("no%-such%-job%.lua", r.stderr)
  end)

  it("a job that raises exits 1 with the error and a traceback, sandboxes destroyed", function()
    local job = write_job("raise.lua", [[
      local sb = sbx.sandbox("local")
      io.write(sb.workdir, "\n") io.stdout:flush()
      sb:execute_command("nope-not-a-program", {})
    ]])
    local r = sbxlua({ job })
    assert.equal(1, r.exit_code)
    assert.matches("SandboxExecutionError", r.stderr)
    assert.matches("stack traceback", r.stderr)
    assert.matches("raise%.lua:3", r.stderr)
    local workdir = r.stdout:match("^(.-)\n")
    assert.is_nil(fs.open_root(workdir))
    assert.same({}, live_sandboxes())
  end)

  it("os.exit(n) in a job exits n after destroying sandboxes", function()
    local job = write_job("exit.lua", [[
      local sb = sbx.sandbox("local")
      print(sb.workdir)
      os.exit(3)
    ]])
    local r = sbxlua({ job })
    assert.equal(3, r.exit_code, r.stderr)
    assert.is_nil(fs.open_root(r.stdout:match("^(.-)\n")))
    assert.same({}, live_sandboxes())
  end)

  describe("exec", function()
    it("streams output and returns the command's status", function()
      local r = sbxlua({ "exec", "--", "sh", "-c", "echo out; echo err >&2; exit 7" })
      assert.equal(7, r.exit_code)
      assert.equal("out\n", r.stdout)
      assert.equal("err\n", r.stderr)
    end)
    it("runs a lone command through the shell", function()
      local r = sbxlua({ "exec", "--", "echo a | tr a b" })
      assert.equal("b\n", r.stdout)
    end)
    it("exits 124 with a message on timeout", function()
      local r = sbxlua({ "exec", "--timeout", "0.5", "--", "sleep", "30" })
      assert.equal(124, r.exit_code)
      assert.matches("timed out", r.stderr)
    end)
    it("takes --env and --file", function()
      local src = write_job("payload.txt", "payload")
      local r = sbxlua({ "exec", "--env", "GREETING=hi", "--file", src .. ":in/p.txt", "--",
                         "sh", "-c", "echo $GREETING; cat in/p.txt" })
      assert.equal(0, r.exit_code, r.stderr)
      assert.equal("hi\npayload", r.stdout)
    end)
    it("reports bad options and unknown backends", function()
      local r = sbxlua({ "exec", "--wat", "--", "true" })
      assert.equal(2, r.exit_code)
      r = sbxlua({ "exec", "--backend", "nosuch", "--", "true" })
      assert.equal(2, r.exit_code)
      assert.matches("unknown backend 'nosuch'", r.stderr)
      r = sbxlua({ "exec" })
      assert.equal(2, r.exit_code)
    end)
  end)

  it("providers lists local as available, as text, JSON and a matrix", function()
    local r = sbxlua({ "providers" })
    assert.equal(0, r.exit_code)
    assert.matches("local%s+yes%s+process", r.stdout)
    r = sbxlua({ "providers", "--json" })
    local d = json.decode(r.stdout)
    assert.is_true(d["local"].available)
    assert.equal("process", d["local"].isolation)
    r = sbxlua({ "providers", "--matrix" })
    assert.matches("| backend | isolation |", r.stdout, 1, true)
  end)

  it("the README's feature matrix is the one the descriptors generate", function()
    local r = sbxlua({ "providers", "--matrix" })
    local f = assert(io.open((os.getenv("SBX_SOURCE_DIR") or ".") .. "/README.md"))
    local readme = f:read("a")
    f:close()
    local block = readme:match("<!%-%- matrix:begin %-%->\n(.-)<!%-%- matrix:end %-%->")
    assert.is_string(block, "README.md has no matrix block")
    assert.equal(r.stdout, block)
  end)

  it("a read-only state directory fails creates clearly and creates nothing", function()
    local ro = STATE .. "/readonly"
    os.execute("mkdir -p " .. ro .. " && chmod 555 " .. ro)
    -- root ignores mode bits: make it unwritable for root too with a file in the way
    os.execute("rmdir " .. ro .. " && touch " .. ro)
    local r = sbxlua({ "-e", "sbx.sandbox('local')" }, { env = { "SBX_STATE_DIR=" .. ro } })
    assert.equal(1, r.exit_code)
    assert.matches("SandboxCreationError: cannot record the sandbox", r.stderr)
    assert.matches("readonly", r.stderr)
    os.remove(ro)
  end)

  it("survives a closed stdout pipe (SIGPIPE)", function()
    local r = sbxlua({ "-e", "for i = 1, 200000 do print(i) end" }, { timeout = 20 })
    assert.equal(0, r.exit_code)
    local p = io.popen(BIN .. " -e 'for i = 1, 200000 do print(i) end' | head -1")
    assert.equal("1\n", p:read("a"))
    p:close()
  end)

  it("doctor reports what works", function()
    local r = sbxlua({ "doctor" })
    assert.equal(0, r.exit_code)
    assert.matches("ok%s+backend local", r.stdout)
    assert.matches("process containment", r.stdout)
  end)

  for _, case in ipairs{ { "SIGINT", 2, 130 }, { "SIGTERM", 15, 143 } } do
    it(case[1] .. " kills running commands, destroys sandboxes, exits " .. case[3], function()
      local tag = "sbxcli" .. require("sbx.proc").random_hex(8)
      local job = write_job("sig.lua", [[
        local sb = sbx.sandbox("local")
        print("ready " .. sb.workdir) io.stdout:flush()
        sb:execute_command("bash", {"-c", "exec -a ]] .. tag .. [[ sleep 300"})
      ]])
      local p = start({ job })
      local out = expect_output(p, "ready [^\n]+\n")
      local workdir = out:match("ready ([^\n]+)")
      loop.sleep(0.3)
      assert.is_true(alive(tag))
      p:kill(case[2])
      local t0 = loop.now()
      local r = p:wait()
      assert.equal(case[3], r.exit_code)
      assert.is_true(loop.now() - t0 < 10)
      assert.is_false(alive(tag))
      assert.is_nil(fs.open_root(workdir))
      assert.same({}, live_sandboxes())
    end)
  end

  it("after SIGKILL, ls shows the orphans and gc removes processes and directories", function()
    local tag = "sbxgc" .. require("sbx.proc").random_hex(8)
    local job = write_job("killed.lua", [[
      local dirs = {}
      for i = 1, 3 do
        local sb = sbx.sandbox("local")
        sb:spawn("bash", {"-c", "setsid bash -c 'exec -a ]] .. tag .. [[ sleep 300' & exec -a ]] .. tag .. [[ sleep 300"})
        dirs[#dirs + 1] = sb.workdir
      end
      print("ready " .. table.concat(dirs, " ")) io.stdout:flush()
      sbx.sleep(300)
    ]])
    local p = start({ job })
    local out = expect_output(p, "ready [^\n]+\n")
    loop.sleep(0.3)
    os.execute("kill -9 " .. p.pid)
    p:wait()
    assert.is_true(alive(tag))
    local orphans = live_sandboxes()
    assert.equal(3, #orphans)
    assert.is_false(orphans[1].session_alive)
    local r = sbxlua({ "gc", "--dry-run" })
    assert.equal(0, r.exit_code)
    -- at least these 3: gc also takes what other dead sessions of this host
    -- left on a backend (another spec's SIGKILLed docker job, in parallel)
    assert.is_true(select(2, r.stdout:gsub("would destroy", "")) >= 3, r.stdout)
    r = sbxlua({ "gc" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.is_true(tonumber(r.stdout:match("destroyed (%d+) sandboxes") or "0") >= 3, r.stdout)
    loop.sleep(0.1)
    assert.is_false(alive(tag))
    for dir in out:match("ready ([^\n]+)"):gmatch("%S+") do assert.is_nil(fs.open_root(dir)) end
    assert.same({}, live_sandboxes())
    r = sbxlua({ "gc" })        -- idempotent
    assert.equal(0, r.exit_code)
    assert.matches("gc: nothing to do", r.stdout)
  end)

  it("gc never touches a live session's sandboxes", function()
    local job = write_job("live.lua", [[
      local sb <close> = sbx.sandbox("local")
      sb:write_file("keep.txt", "kept")
      print("ready") io.stdout:flush()
      io.read("l")  -- until the spec says go
      print(sb:read_file("keep.txt"), sb:execute_command("echo alive").stdout)
    ]])
    local p = start({ job })
    expect_output(p, "ready\n")
    local r = sbxlua({ "gc" })
    assert.equal(0, r.exit_code)
    assert.equal(1, #live_sandboxes())
    assert.is_true(live_sandboxes()[1].session_alive)
    p:write("go\n")
    local rest = ""
    while true do
      local which, chunk = p:read()
      if not which then break end
      if which == "stdout" then rest = rest .. chunk end
    end
    local res = p:wait()
    assert.equal(0, res.exit_code, res.stderr)
    assert.equal("kept\talive\n\n", rest)
    assert.same({}, live_sandboxes())
  end)

  -- A child of a killed sbxlua between clone and exec holds a copy of its
  -- fds, the session lock among them: gc right after the kill took the
  -- session for live (1 in ~45 G2 kills). flock(1) plays that child.
  it("gc reaps a killed sbxlua's session even while something else holds its lock", function()
    local tag = "sbxheld" .. proc.random_hex(8)
    local job = write_job("held.lua", [[
      local sb = sbx.sandbox("local")
      sb:spawn("bash", {"-c", "exec -a ]] .. tag .. [[ sleep 300"})
      print("ready " .. require("sbx.state.owner").lock_path()) io.stdout:flush()
      sbx.sleep(300)
    ]])
    local p = start({ job })
    local lock = expect_output(p, "ready [^\n]+\n"):match("ready ([^\n]+)")
    os.execute("kill -9 " .. p.pid)
    p:wait()
    local holder = assert(proc.spawn{ argv = { "flock", lock, "sleep", "30" }, env = env(), timeout = 60 })
    local deadline = loop.now() + 10
    while not fs.is_locked(lock) and loop.now() < deadline do loop.sleep(0.02) end
    assert.is_true(fs.is_locked(lock))
    local r = sbxlua({ "gc" })
    holder:kill(9)
    holder:wait()
    assert.equal(0, r.exit_code, r.stderr)
    assert.is_true(tonumber(r.stdout:match("destroyed (%d+) sandboxes from %d+ dead sessions") or "0") >= 1,
                   r.stdout)   -- at least this one (see above)
    loop.sleep(0.1)
    assert.is_false(alive(tag))
  end)

  it("a session whose pid now belongs to another process is dead, lock or not", function()
    -- a journal naming a running process (us) with another start time
    local sessions = STATE .. "/sessions"
    assert(fs.mkdir_host(sessions))
    local id = "vm-reused-" .. proc.random_hex(4)
    local f = assert(io.open(sessions .. "/" .. id .. ".jsonl", "w"))
    f:write(json.encode{ event = "session", host = require("sbx.state.owner").hostname(), pid = proc.getpid(),
                         pid_start = 1, started = os.time() }, "\n")
    f:close()
    local holder = assert(proc.spawn{ argv = { "flock", sessions .. "/" .. id .. ".lock", "sleep", "30" },
                                      env = env(), timeout = 60 })
    local deadline = loop.now() + 10
    while not fs.is_locked(sessions .. "/" .. id .. ".lock") and loop.now() < deadline do loop.sleep(0.02) end
    local r = sbxlua({ "gc" })
    holder:kill(9)
    holder:wait()
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("from 1 dead sessions", r.stdout)
    assert.is_nil(io.open(sessions .. "/" .. id .. ".jsonl"))     -- forgotten
  end)

  it("a session whose cgroup could not be removed at exit stays for gc to finish", function()
    local job = write_job("busy.lua", [[
      local sb = sbx.sandbox("local")
      require("sbx.providers.builtin.local").forget_session = function() error("cgroup busy", 0) end
      print(require("sbx.state.owner").lock_path())
    ]])
    local r = sbxlua({ job })
    assert.equal(0, r.exit_code, r.stderr)
    local journal = r.stdout:gsub("%.lock\n$", ".jsonl")
    assert.is_truthy(io.open(journal))                 -- kept: the session is not done
    r = sbxlua({ "gc" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("from 1 dead sessions", r.stdout)
    assert.is_nil(io.open(journal))
  end)

  it("a sandbox whose destroy failed stays in the journal for gc", function()
    local job = write_job("destroyfail.lua", [[
      local sb = sbx.sandbox("local")
      local backend = require "sbx.providers.builtin.local"
      local destroy = backend.destroy
      backend.destroy = function() error("rmtree: Device or resource busy", 0) end
      print(sb.workdir)
      print(pcall(sb.destroy, sb))
      backend.destroy = destroy
    ]])
    local r = sbxlua({ job })
    assert.equal(0, r.exit_code, r.stderr)
    local dir = r.stdout:match("^([^\n]+)")
    assert.matches("false\trmtree: Device or resource busy", r.stdout)
    assert.is_not_nil(fs.open_root(dir))               -- left behind, but known
    r = sbxlua({ "gc" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.is_true(tonumber(r.stdout:match("destroyed (%d+) sandboxes from %d+ dead sessions") or "0") >= 1,
                   r.stdout)   -- at least this one (see above)
    assert.is_nil(fs.open_root(dir))
  end)

  it("gc without a Docker engine checks the other backends and says what it skipped", function()
    local r = sbxlua({ "gc" }, { env = { "DOCKER_HOST=unix://" .. STATE .. "/no-engine.sock" } })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("gc: nothing to do", r.stdout)
    assert.matches("gc: docker not checked: no Docker socket at .*no%-engine%.sock", r.stderr)
  end)

  -- gc takes a journal whose lock is free for a dead session's: the lock
  -- must be held before the journal exists (a CI flake left a cgroup so)
  it("a session's journal appears only once its lock is held", function()
    local job = write_job("lockfirst.lua", [[
      local fs = require "sbx.fs"
      local journal, seen = fs.journal, {}
      fs.journal = function(path)
        seen[#seen + 1] = tostring(fs.is_locked((path:gsub("%.jsonl$", ".lock"))))
        return journal(path)
      end
      local sb <close> = sbx.sandbox("local")
      print(table.concat(seen, ","))
    ]])
    local r = sbxlua({ job })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("true\n", r.stdout)
  end)
end)
