-- Live progress on stderr, as a user sees it: under a real pseudo-terminal
-- (util-linux `script`), in a pipe (nothing), with --progress=plain (one
-- line per stage) and with it turned off (SBX_PROGRESS=0, progress = false).
local proc = require "sbx.proc"
local fs = require "sbx.fs"

local BIN = os.getenv("SBX_BIN") or "build/sbxlua"
local STATE = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/progress-" .. proc.getpid()

local function env(extra)
  local e = { "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" .. STATE, "SBX_STATE_DIR=" .. STATE,
              "TERM=xterm" }
  for _, kv in ipairs(extra or {}) do e[#e + 1] = kv end
  return e
end

local function write_job(name, code)
  local path = STATE .. "/" .. name
  local f = assert(io.open(path, "w"))
  f:write(code)
  f:close()
  return path
end

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- Run sbxlua with `args` on a pty of `cols` columns; returns everything the
-- terminal received (stdout and stderr both go there) and the exit code.
local function on_pty(args, extra_env, cols)
  local cmd = {}
  for _, a in ipairs(args) do cmd[#cmd + 1] = sh_quote(a) end
  local line = "stty cols " .. (cols or 100) .. " rows 30; exec " .. sh_quote(BIN) .. " " .. table.concat(cmd, " ")
  local p = assert(proc.spawn{ argv = { "script", "-qfec", line, "/dev/null" }, env = env(extra_env),
                               timeout = 120 })
  local r = p:wait()
  -- script's own exit status is the command's (-e)
  return r.stdout, r.exit_code, r.stderr
end

local function in_pipe(args, extra_env)
  local argv = { BIN }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local r = assert(proc.spawn{ argv = argv, env = env(extra_env), timeout = 120 }):wait()
  return r
end

-- 12 items, 3 at a time, each a sandbox running `sleep 0.25`: about 1 s,
-- so the line shows (stages under progress.DELAY = 0.5 s do not).
local PARALLEL = [[
local items = {}
for i = 1, 12 do items[i] = i end
local r = sbx.parallel(items, function(i)
  local sb <close> = sbx.sandbox("local")
  sb:execute_command("sleep", {"0.25"})
  return i
end, { concurrency = 3, progress = OPT })
print("results " .. #r)
]]

local function parallel_job(opt)
  return write_job("par-" .. tostring(opt) .. ".lua", (PARALLEL:gsub("OPT", tostring(opt))))
end

local has_script = os.execute("command -v script >/dev/null 2>&1")

describe("progress", function()
  setup(function() assert(fs.mkdir_host(STATE)) end)
  teardown(function() fs.rmtree(STATE) end)

  it("on a terminal: sbx.parallel shows a live line redrawn in place, then one summary line", function()
    if not has_script then pending("util-linux script is missing") return end
    local out, code = on_pty({ parallel_job("nil") })
    assert.equal(0, code, out)
    -- redraws: carriage return, the line, erase to the end of the line
    local redraws = 0
    for line in out:gmatch("\r(parallel: [^\r\n]-)\27%[K") do
      redraws = redraws + 1
      assert.matches("^parallel: %[[=> ]+%] %d+/12 done, %d+ failed, %d+ running, %$%d+%.%d%d%d%d, %d+%.%ds$", line)
    end
    assert.is_true(redraws >= 3, "expected several redraws, got " .. redraws .. ":\n" .. out)
    -- the live line is erased before the summary, which stays
    assert.matches("\r\27%[Ksbxlua: parallel: 12/12 done, 0 failed, 0 running, %$0%.0000 in %d+%.%ds\r?\n", out)
    assert.matches("results 12", out)
    -- the counts only grow
    local last = -1
    for n in out:gmatch("\rparallel: %[[=> ]+%] (%d+)/12") do
      assert.is_true(tonumber(n) >= last)
      last = tonumber(n)
    end
  end)

  it("on a narrow terminal the line is cut to its width (a wrapped line cannot be redrawn)", function()
    if not has_script then pending("util-linux script is missing") return end
    local out, code = on_pty({ parallel_job("nil") }, nil, 40)
    assert.equal(0, code, out)
    local n = 0
    for line in out:gmatch("\r(parallel: [^\r\n]-)\27%[K") do
      n = n + 1
      assert.is_true(#line <= 39, "line of " .. #line .. " columns: " .. line)
    end
    assert.is_true(n >= 1, out)
  end)

  it("off a terminal it prints nothing extra", function()
    local r = in_pipe({ parallel_job("nil") })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("results 12\n", r.stdout)
    assert.equal("", r.stderr)
  end)

  it("--progress=plain prints one line per stage, with no redraws", function()
    local r = in_pipe({ "--progress=plain", parallel_job("nil") })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("results 12\n", r.stdout)
    assert.matches("^sbxlua: parallel: 12/12 done, 0 failed, 0 running, %$0%.0000 in %d+%.%ds\n$", r.stderr)
    -- SBX_PROGRESS=plain is the same; the flag wins over the variable
    r = in_pipe({ parallel_job("nil") }, { "SBX_PROGRESS=plain" })
    assert.matches("^sbxlua: parallel: 12/12 done", r.stderr)
    r = in_pipe({ "--progress=off", parallel_job("nil") }, { "SBX_PROGRESS=plain" })
    assert.equal("", r.stderr)
  end)

  it("a label of the caller's, and failures counted", function()
    local job = write_job("fail.lua", [[
      local r, errs = sbx.parallel({1, 2, 3, 4}, function(i)
        sbx.sleep(0.3)
        if i % 2 == 0 then error("item " .. i) end
        return i
      end, { concurrency = 2, collect_errors = true, progress = "evals" })
      print(#r, errs[2] ~= nil)
    ]])
    local r = in_pipe({ "--progress=plain", job })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("^sbxlua: evals: 2/4 done, 2 failed, 0 running", r.stderr)
  end)

  it("an error that stops sbx.parallel ends the line with it", function()
    local job = write_job("stop.lua", [[
      sbx.parallel({1, 2, 3}, function(i)
        sbx.sleep(i == 1 and 0.6 or 5)
        if i == 1 then error("boom") end
      end)
    ]])
    local r = in_pipe({ "--progress=plain", job })
    assert.equal(1, r.exit_code)
    assert.matches("sbxlua: parallel: 0/3 done, 1 failed, 0 running, %$0%.0000, stopped by an error in", r.stderr)
  end)

  it("turned off: SBX_PROGRESS=0 on a terminal, and { progress = false } per call", function()
    if not has_script then pending("util-linux script is missing") return end
    local out, code = on_pty({ parallel_job("nil") }, { "SBX_PROGRESS=0" })
    assert.equal(0, code, out)
    assert.is_nil(out:find("parallel", 1, true), out)
    assert.matches("results 12", out)
    out, code = on_pty({ parallel_job("false") })
    assert.equal(0, code, out)
    assert.is_nil(out:find("parallel", 1, true), out)
  end)

  it("a bad --progress is a usage error", function()
    local r = in_pipe({ "--progress=loud", "-e", "print(1)" })
    assert.equal(2, r.exit_code)
    assert.matches("%-%-progress expects auto, tty, plain or off, got 'loud'", r.stderr)
    r = in_pipe({ "-e", "sbx.parallel({1}, function() end, { progress = 3 })" })
    assert.equal(1, r.exit_code)
    assert.matches("option 'progress' must be", r.stderr)
  end)

  it("pool warm-up and gc show as stages", function()
    local job = write_job("pool.lua", [[
      require("sbx.core.progress").DELAY = 0
      local p <close> = sbx.pool{ backend = "local", size = 3 }
      assert(p:wait_ready(30))
      print("warm")
    ]])
    local r = in_pipe({ "--progress=plain", job })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("^sbxlua: pool pool%-1: 3/3 warm on local, 0 being created in %d+%.%ds\n$", r.stderr)
    -- a killed job leaves 5 sandboxes; gc destroys them, with a stage
    local kill = write_job("leave.lua", [[
      local keep = {}
      for i = 1, 5 do keep[i] = sbx.sandbox("local") end
      print("ready") io.stdout:flush()
      sbx.sleep(60)
    ]])
    local p = assert(proc.spawn{ argv = { BIN, kill }, env = env(), stream = true })
    local seen = ""
    while not seen:find("ready") do
      local which, chunk = p:read()
      assert(which, "the job ended early: " .. seen)
      if which == "stdout" then seen = seen .. chunk end
    end
    p:kill(9)
    p:wait()
    r = in_pipe({ "--progress=plain", "-e", [[
      require("sbx.core.progress").DELAY = 0
      os.exit(require("sbx.state.gc").run{})
    ]] })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("sbxlua: gc: 5/5 sandboxes destroyed, 0 failed in", r.stderr)
  end)

  it("a docker image pull is a stage", function()
    local d = in_pipe({ "-e", "os.exit(require('sbx.providers').get('docker').available() and 0 or 3)" })
    if d.exit_code ~= 0 then pending("no Docker engine") return end
    -- no registry is reachable from here: the pull fails, and says so
    local r = in_pipe({ "--progress=plain", "-e", [[
      require("sbx.core.progress").DELAY = 0
      local ok, err = pcall(sbx.sandbox, "docker", { image = "sbxlua-no-such-image/x:1" })
      print(ok, err.kind)
    ]] })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("false\tSandboxCreationError\n", r.stdout)
    assert.matches("sbxlua: pull sbxlua%-no%-such%-image/x:1: failed in %d+%.%ds\n", r.stderr)
  end)
end)
