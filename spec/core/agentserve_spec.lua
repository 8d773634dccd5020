-- `sbx-agent serve` (docs/agent-protocol.md), the embedded agent driven
-- through its stdin/stdout with sbx.daemon.wire's frames: commands, many at once,
-- their trees, file operations, and what a broken host does to it.
-- Over 400 lines: every case drives the same agent helper (Agent below).
local proc = require "sbx.proc"
local fs = require "sbx.fs"
local loop = require "sbx.loop"
local wire = require "sbx.daemon.wire"

local dir = assert(fs.mkdtemp("/tmp", "sbxserve"))
local AGENT = dir .. "/sbx-agent"
local ENV = { "PATH=/usr/bin:/bin" }

-- ------------------------------------------------------------- a host

local Agent = {}
Agent.__index = Agent

local function start(argv)
  local p = assert(proc.spawn{ argv = argv or { AGENT, "serve" }, env = ENV, keep_stdin = true,
                               stream = true, timeout = 60 })
  return setmetatable({ p = p, d = wire.decoder(), by_id = {}, stderr = {} }, Agent)
end

-- Read one chunk from the agent and sort its frames by id; false at its end.
function Agent:pump()
  local which, chunk = self.p:read()
  if not which then return false end
  if which == "stderr" then
    self.stderr[#self.stderr + 1] = chunk
    return true
  end
  for _, f in ipairs(assert(self.d:feed(chunk))) do
    local q = self.by_id[f.id] or {}
    self.by_id[f.id] = q
    q[#q + 1] = f
  end
  return true
end

local LAST = { X = true, Z = true, E = true }

-- The frames of request `id` up to its last one (X, Z or E), or of id 0
-- up to `n` frames; nil when the agent ends first.
function Agent:answer(id, n)
  while true do
    local q = self.by_id[id] or {}
    for i, f in ipairs(q) do
      if LAST[f.kind] or i == n then
        self.by_id[id] = { table.unpack(q, i + 1) }
        return { table.unpack(q, 1, i) }
      end
    end
    if not self:pump() then return nil end
  end
end

function Agent:send(data) assert(self.p:write(data)) end

-- Close the agent's stdin and wait for it: the proc result.
function Agent:finish()
  self.p:close_stdin()
  while self:pump() do end
  return self.p:wait()
end

local function outcome(frames)
  assert(frames, "the agent ended before answering")
  local r = { out = {}, err = {}, frames = frames }
  for _, f in ipairs(frames) do
    if f.kind == "P" then
      r.pid = wire.fields("P", f.payload)
    elseif f.kind == "O" then
      local buf = f.payload:byte(1) == 1 and r.out or r.err
      buf[#buf + 1] = f.payload:sub(2)
    elseif f.kind == "X" then
      r.kind, r.n, r.truncated, r.errno = wire.fields("X", f.payload)
    elseif f.kind == "E" then
      r.error = wire.fields("E", f.payload)
    end
  end
  r.stdout, r.stderr = table.concat(r.out), table.concat(r.err)
  return r
end

function Agent:run(id, req)
  self:send(wire.run(id, req))
  return outcome(self:answer(id))
end

-- A file request's answer: data, errno name ("" on success), message (or
-- E's message with "REFUSED", as the agent link reports it).
function Agent:call(frame, id)
  self:send(frame)
  local data, errno, msg = {}, nil, nil
  for _, f in ipairs(assert(self:answer(id))) do
    if f.kind == "D" then data[#data + 1] = f.payload
    elseif f.kind == "Z" then errno, msg = wire.fields("Z", f.payload)
    elseif f.kind == "E" then errno, msg = "REFUSED", wire.fields("E", f.payload) end
  end
  return table.concat(data), errno, msg
end

-- One agent per test; it must end cleanly (exit 0 at stdin's EOF).
local function with_agent(fn, argv)
  local a = start(argv)
  local ok, err = pcall(fn, a)
  local r = a:finish()
  if not ok then error(err, 0) end
  assert.equal(0, r.exit_code, table.concat(a.stderr))
  return a
end

-- A process that is gone or a zombie (its reaper may not have run yet).
local function alive(pid)
  local f = io.open("/proc/" .. pid .. "/stat")
  if not f then return false end
  local stat = f:read("a")
  f:close()
  return stat:match("%) (%a)") ~= "Z"
end

local function gone_soon(pid)
  local t0 = loop.now()
  while alive(pid) and loop.now() - t0 < 3 do loop.sleep(0.05) end
  return not alive(pid)
end

local function write(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

-- ---------------------------------------------------------------- specs

describe("sbx-agent serve", function()
  setup(function()
    local root = assert(fs.open_root(dir))
    assert(root:write("sbx-agent", require "sbx.agentbin", tonumber("755", 8)))
    root:close()
  end)
  teardown(function() fs.rmtree(dir) end)

  it("says hello with its build and protocol 3", function()
    with_agent(function(a)
      local h = a:answer(0, 1)[1]
      assert.equal("H", h.kind)
      local version, protocol = wire.fields("H", h.payload)
      assert.matches("^sbx%-agent %d+$", version)
      assert.equal(3, protocol)   -- 3: errnos by name
    end)
  end)

  it("runs a command: P, its stdout and stderr, then X with the exit status", function()
    with_agent(function(a)
      local r = a:run(1, { argv = { "sh", "-c", "echo out; echo err >&2; exit 3" }, env = ENV })
      assert.equal("P", r.frames[1].kind)
      assert.is_true(r.pid > 1)
      assert.equal("out\n", r.stdout)
      assert.equal("err\n", r.stderr)
      assert.equal("exit", r.kind)
      assert.equal(3, r.n)
      assert.equal(0, r.truncated)
      assert.equal("", r.errno)         -- only a command that never started has one
      assert.equal("X", r.frames[#r.frames].kind)
      r = a:run(2, { argv = { "sh", "-c", "kill -9 $$" }, env = ENV })
      assert.equal("signal", r.kind)
      assert.equal(9, r.n)
    end)
  end)

  it("raises its commands' oom_score_adj above its own, so a memory limit kills them first", function()
    with_agent(function(a)
      local r = a:run(1, { argv = { "cat", "/proc/self/oom_score_adj" }, env = ENV })
      assert.equal("500\n", r.stdout)
      local own = io.open("/proc/" .. a.p.pid .. "/oom_score_adj"):read("a")
      assert.is_true(tonumber(own) < 500, "the agent's own: " .. own)
    end)
  end)

  it("feeds stdin from the request, or /dev/null", function()
    with_agent(function(a)
      assert.equal("fed\0bytes", a:run(1, { argv = { "cat" }, stdin = "fed\0bytes" }).stdout)
      local r = a:run(2, { argv = { "cat" } })
      assert.equal("", r.stdout)
      assert.equal("exit", r.kind)
    end)
  end)

  it("keep_stdin: the stdin field first, then I frames until an empty one", function()
    with_agent(function(a)
      a:send(wire.run(7, { argv = { "cat" }, stdin = "a", keep_stdin = true }))
      a:send(wire.stdin(7, "b") .. wire.stdin(7, string.rep("c", 300000)))
      a:send(wire.stdin(7, ""))
      local r = outcome(a:answer(7))
      assert.equal("ab" .. string.rep("c", 300000), r.stdout)
      assert.equal("exit", r.kind)
      -- I for a command that is gone, or that never kept stdin: E
      local _, errno, msg = a:call(wire.stdin(7, "late"), 7)
      assert.equal("REFUSED", errno)
      assert.matches("not a running command", msg)
    end)
  end)

  it("builds the environment from scratch and finds the program on its PATH", function()
    local bin = dir .. "/bin"
    os.execute("mkdir -p " .. bin)
    write(bin .. "/only-here", "#!/bin/sh\necho found \"$@\"\n")
    os.execute("chmod 755 " .. bin .. "/only-here")
    with_agent(function(a)
      local r = a:run(1, { argv = { "env" }, env = { "A=1", "B=two words" } })
      assert.equal("A=1\nB=two words\n", r.stdout)   -- nothing inherited; default PATH
      r = a:run(2, { argv = { "only-here", "x" }, env = { "PATH=" .. bin .. ":/usr/bin:/bin" } })
      assert.equal("found x\n", r.stdout)
      r = a:run(3, { argv = { "only-here" }, env = ENV })   -- the agent's own PATH is not used
      assert.equal("noexec", r.kind)
      assert.equal("ENOENT", r.errno)   -- by name; n is 0
      assert.equal(0, r.n)
    end)
  end)

  it("raises its own fd limit for many commands, and each command gets the one it was given", function()
    local f = io.popen("ulimit -Hn")
    local hard = f:read("a"):match("%S+")   -- a number or "unlimited"
    f:close()
    with_agent(function(a)
      a:run(1, { argv = { "true" } })    -- the agent is serving
      local lf = assert(io.open("/proc/" .. a.p.pid .. "/limits"))
      local soft = lf:read("a"):match("Max open files%s+(%d+)")
      lf:close()
      assert.equal(math.min(tonumber(hard) or math.huge, 65536), tonumber(soft))
      assert.equal("200\n" .. hard .. "\n",
                   a:run(2, { argv = { "sh", "-c", "ulimit -Sn; ulimit -Hn" }, env = ENV }).stdout)
    end, { "bash", "-c", 'ulimit -Sn 200 && exec "$0" serve', AGENT })
  end)

  it("runs in cwd; a missing cwd or program is X without P", function()
    with_agent(function(a)
      assert.equal(dir .. "\n", a:run(1, { argv = { "pwd" }, cwd = dir }).stdout)
      local r = a:run(2, { argv = { "pwd" }, cwd = dir .. "/no/such" })
      assert.equal("nocwd", r.kind)
      assert.equal("ENOENT", r.errno)
      assert.equal(0, r.n)
      assert.is_nil(r.pid)
      r = a:run(3, { argv = { "no-such-program-q" }, env = ENV })
      assert.equal("noexec", r.kind)
      assert.equal("ENOENT", r.errno)   -- by name; n is 0
      assert.equal(0, r.n)
      assert.equal(1, #r.frames)
    end)
  end)

  it("a timeout kills the whole tree, setsid grandchildren included", function()
    with_agent(function(a)
      local t0 = loop.now()
      local r = a:run(1, { argv = { "bash", "-c", "setsid sleep 300 & echo $!; trap '' TERM; sleep 300" },
                           env = ENV, timeout = 0.5 })
      assert.equal("timeout", r.kind)
      assert.is_true(loop.now() - t0 < 5)
      local grandchild = tonumber(r.stdout:match("^(%d+)\n"))
      assert.is_not_nil(grandchild, r.stdout)
      assert.is_true(gone_soon(grandchild))
    end)
  end)

  it("K 9 kills the tree and reports killed; other signals go to the process group", function()
    with_agent(function(a)
      a:send(wire.run(1, { argv = { "sh", "-c", "setsid sleep 300 & echo $!; exec sleep 300" }, env = ENV }))
      local early = {}
      repeat
        assert(a:pump())
        for _, f in ipairs(a.by_id[1] or {}) do if f.kind == "O" then early[#early + 1] = f.payload:sub(2) end end
      until table.concat(early):find("\n")
      a:send(wire.signal(1, 9))
      local r = outcome(a:answer(1))
      assert.equal("killed", r.kind)
      assert.equal(9, r.n)
      assert.is_true(gone_soon(tonumber(r.stdout:match("^(%d+)"))))

      a:send(wire.run(2, { argv = { "sh", "-c", "sleep 300 & echo $!; wait" }, env = ENV }))
      repeat assert(a:pump()) until #(a.by_id[2] or {}) >= 2     -- P and the sleep's pid
      a:send(wire.signal(2, 15))
      r = outcome(a:answer(2))
      assert.equal("signal", r.kind)
      assert.equal(15, r.n)
      assert.is_true(gone_soon(tonumber(r.stdout:match("^(%d+)"))))   -- the group's other member
    end)
  end)

  it("caps each stream at max_output, reads past it and reports truncated", function()
    with_agent(function(a)
      local r = a:run(1, { argv = { "sh", "-c", "head -c 300000 /dev/zero; head -c 10 /dev/zero >&2" },
                           env = ENV, max_output = 1000 })
      assert.equal(1000, #r.stdout)
      assert.equal(10, #r.stderr)
      assert.equal(1, r.truncated)
      assert.equal("exit", r.kind)
      assert.equal(0, r.n)
    end)
  end)

  it("does not wait for a grandchild that holds the pipes", function()
    with_agent(function(a)
      local t0 = loop.now()
      local r = a:run(1, { argv = { "sh", "-c", "(sleep 5 &); echo done" }, env = ENV })
      assert.equal("done\n", r.stdout)
      assert.equal("exit", r.kind)
      assert.is_true(loop.now() - t0 < 2)
    end)
  end)

  it("answers 100 commands in flight at once on one stream", function()
    with_agent(function(a)
      local reqs = {}
      for i = 1, 100 do
        reqs[#reqs + 1] = wire.run(i, { argv = { "sh", "-c", "cat; echo out$1; echo err$1 >&2; exit $(($1 % 7))",
                                                 "sh", tostring(i) },
                                        env = ENV, stdin = "in" .. i .. ":" })
      end
      a:send(table.concat(reqs))
      for i = 100, 1, -1 do
        local r = outcome(a:answer(i))
        assert.equal("P", r.frames[1].kind)    -- before any output
        assert.equal("in" .. i .. ":out" .. i .. "\n", r.stdout)
        assert.equal("err" .. i .. "\n", r.stderr)
        assert.equal("exit", r.kind)
        assert.equal(i % 7, r.n)
      end
    end)
  end)

  it("a host that stops reading slows the command down instead of growing the agent", function()
    with_agent(function(a)
      local total = 48 * 1024 * 1024
      a:send(wire.run(1, { argv = { "head", "-c", tostring(total), "/dev/zero" }, env = ENV,
                           max_output = total }))
      loop.sleep(1)                -- nobody reads: the agent's queue must stop at its limit
      local f = assert(io.open("/proc/" .. a.p.pid .. "/status"))
      local rss = tonumber(f:read("a"):match("VmRSS:%s+(%d+)"))
      f:close()
      assert.is_true(rss < 16 * 1024, "the agent holds " .. rss .. " KiB")
      local r = outcome(a:answer(1))
      assert.equal(total, #r.stdout)
      assert.equal("exit", r.kind)
    end)
  end)

  it("reads, writes, lists, stats, removes and makes directories", function()
    local d = dir .. "/files"
    with_agent(function(a)
      local _, errno = a:call(wire.mkdir(1, d .. "/sub/deep"), 1)
      assert.equal("", errno)
      _, errno = a:call(wire.write(2, d .. "/a.txt", "hello", tonumber("600", 8)), 2)
      assert.equal("", errno)
      _, errno = a:call(wire.write(3, d .. "/a.txt", " world", nil, true), 3)
      assert.equal("", errno)
      local data
      data, errno = a:call(wire.read(4, d .. "/a.txt", 1000), 4)
      assert.equal("", errno)
      assert.equal("hello world", data)
      local rec = a:call(wire.stat(5, d .. "/a.txt"), 5)
      assert.equal("file\0" .. "11\0", rec:sub(1, 8))
      assert.matches("%z600%z$", rec)
      local raw = a:call(wire.list(6, d), 6)
      local names = {}
      for kind, size, _, name in raw:gmatch("(%Z*)%z(%Z*)%z(%Z*)%z(%Z*)%z") do names[name] = kind .. ":" .. size end
      assert.same({ ["a.txt"] = "file:11", sub = names.sub }, names)
      assert.matches("^dir:", names.sub)
      -- a big file comes in several D frames
      local big = string.rep("0123456789", 200000)
      assert.equal("", select(2, a:call(wire.write(7, d .. "/big", big), 7)))
      assert.equal(big, (a:call(wire.read(8, d .. "/big", #big), 8)))
      _, errno = a:call(wire.remove(9, d, false), 9)
      assert.equal("ENOTEMPTY", errno)
      _, errno = a:call(wire.remove(10, d, true), 10)
      assert.equal("", errno)
      assert.is_nil(io.open(d .. "/a.txt"))
    end)
  end)

  it("file errors: Z with the errno and a message naming the path", function()
    local d = dir .. "/errs"
    os.execute("mkdir -p " .. d)
    write(d .. "/target", "keep me")
    write(d .. "/file", "x")
    os.execute("ln -s " .. d .. "/target " .. d .. "/link")
    with_agent(function(a)
      local data, errno, msg = a:call(wire.read(1, d .. "/missing", 10), 1)
      assert.equal("ENOENT", errno)
      assert.equal("", data)
      assert.matches(d .. "/missing", msg, 1, true)
      data, errno, msg = a:call(wire.read(2, d .. "/target", 4), 2)
      assert.equal("keep", data)
      assert.equal("EFBIG", errno)
      assert.matches("target", msg)
      data, errno = a:call(wire.read(3, d .. "/target", 7), 3)
      assert.equal("keep me", data)
      assert.equal("", errno)
      _, errno = a:call(wire.read(4, d, 10), 4)
      assert.equal("EISDIR", errno)
      _, errno = a:call(wire.remove(5, d .. "/link", false), 5)
      assert.equal("", errno)
      assert.is_nil(io.open(d .. "/link"))
      assert.is_not_nil(io.open(d .. "/target"))
      _, errno, msg = a:call(wire.mkdir(6, d .. "/file/sub"), 6)
      assert.equal("ENOTDIR", errno)
      assert.matches("file/sub", msg)
      _, errno = a:call(wire.list(7, d .. "/nope"), 7)
      assert.equal("ENOENT", errno)
      _, errno = a:call(wire.stat(8, d .. "/nope"), 8)
      assert.equal("ENOENT", errno)
      _, errno = a:call(wire.remove(9, d .. "/nope", true), 9)
      assert.equal("ENOENT", errno)
      _, errno = a:call(wire.write(10, d .. "/no/dir/f", "x"), 10)
      assert.equal("ENOENT", errno)
    end)
  end)

  it("answers a bad payload, an unknown type or a taken id with E and goes on", function()
    with_agent(function(a)
      local _, errno, msg = a:call(wire.frame("K", 5, "\0\0"), 5)
      assert.equal("REFUSED", errno)
      assert.matches("does not parse", msg)
      _, errno = a:call(wire.frame("r", 6, string.pack(">I8s4", 10, "/etc/hostname") .. "extra"), 6)
      assert.equal("REFUSED", errno)
      _, errno = a:call(wire.frame("R", 7, string.pack(">I4I4I8s4I4I4s4", 0, 0, 10, "", 0, 0, "")), 7)
      assert.equal("REFUSED", errno)       -- an empty argv
      _, errno = a:call(wire.frame("m", 8, string.pack(">s4", "/tmp/a\0b")), 8)
      assert.equal("REFUSED", errno)       -- a NUL inside a path
      _, errno, msg = a:call(wire.frame("Q", 9, "whatever"), 9)
      assert.equal("REFUSED", errno)
      assert.matches("unknown", msg)
      _, errno = a:call(wire.signal(10, 15), 10)
      assert.equal("REFUSED", errno)       -- no such command
      a:send(wire.run(11, { argv = { "sleep", "300" }, env = ENV }))
      _, errno, msg = a:call(wire.mkdir(11, dir .. "/x"), 11)
      assert.equal("REFUSED", errno)
      assert.matches("in use", msg)
      a:send(wire.signal(11, 9))
      assert.equal("killed", outcome(a:answer(11)).kind)
      local r = a:run(12, { argv = { "echo", "still here" }, env = ENV })
      assert.equal("still here\n", r.stdout)
    end)
  end)

  for _, len in ipairs({ wire.MAX_FRAME + 1, 4 }) do
    it("a frame length of " .. len .. " is E with id 0, then the agent ends", function()
      local a = start()
      a:send(wire.run(1, { argv = { "sleep", "300" }, env = ENV }))
      repeat assert(a:pump()) until a.by_id[1]
      local pid = wire.fields("P", a.by_id[1][1].payload)
      a:send(string.pack(">I4", len) .. "R\0\0\0\2")
      local frames = a:answer(0, 2)  -- H, E
      assert.equal("E", frames[2].kind)
      assert.matches("broken", wire.fields("E", frames[2].payload))
      while a:pump() do end        -- it closes its stdout by itself
      assert.equal(1, a.p:wait().exit_code)
      assert.is_true(gone_soon(pid))
    end)
  end

  it("at stdin's EOF kills every command and exits promptly", function()
    local a = start()
    a:send(wire.run(1, { argv = { "sh", "-c", "setsid sleep 1000 & echo $!; exec sleep 1000" }, env = ENV }))
    repeat assert(a:pump()) until #(a.by_id[1] or {}) >= 2
    local pid = wire.fields("P", a.by_id[1][1].payload)
    local grandchild = tonumber(a.by_id[1][2].payload:sub(2):match("^(%d+)"))
    local t0 = loop.now()
    local r = a:finish()
    assert.equal(0, r.exit_code)
    assert.is_true(loop.now() - t0 < 3)
    assert.is_true(gone_soon(pid))
    assert.is_true(gone_soon(grandchild))
  end)
end)
