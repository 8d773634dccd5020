-- The ProcessHandle base (lua/sbx/providers/process_handle.lua) that the agent link,
-- docker's engine exec and provider scripts build their handles on: output
-- caps, the read queue, the result's shape, close, and the guard that kills
-- a command whose waiter is cancelled. The driver here is a scripted one:
-- the base's job is what it makes of what a driver delivers.
local loop = require "sbx.loop"
local handle = require "sbx.providers.process_handle"
local contract = require "sbx.providers.contract"

-- A driver that delivers `chunks` ({ which, data } each) one per _more()
-- (yielding in between), then ends with `status`.
local function scripted(chunks, status)
  local C = handle.class{
    _more = function(self)
      if self.status then return false end
      loop.sleep(0)
      self.i = self.i + 1
      local c = chunks[self.i]
      if c then self:_deliver(c[1], c[2]) return true end
      self.status = self.killed and { kind = "killed" } or status
      self:_ended()
      return false
    end,
    _status = function(self) return self.status end,
    running = function(self) return not self.status end,
    kill = function(self, sig) self.kills[#self.kills + 1] = sig or 9 end,
    _write = function(self, data) self.stdin[#self.stdin + 1] = data return true end,
    _end_stdin = function(self) self.stdin[#self.stdin + 1] = "<eof>" end,
    _release = function(self) self.status = { kind = "killed" } self.released = self.released + 1 end,
  }
  return C
end

local function new(chunks, status, req)
  req = req or {}
  req.argv = req.argv or { "prog" }
  return handle.new(scripted(chunks, status), req, { i = 0, kills = {}, stdin = {}, released = 0 })
end

describe("the process-handle base", function()
  it("is a ProcessHandle the contract accepts", function()
    local h = new({}, { kind = "exit", n = 0 })
    assert.equal(h, contract.check_process(h, "base"))
  end)

  it("keeps output up to max_output per stream and says truncated", function()
    local h = new({ { 1, "abc" }, { 2, "xy" }, { 1, "defgh" }, { 2, "z" } }, { kind = "exit", n = 3 },
                  { max_output = 4 })
    local r = h:wait()
    assert.equal("abcd", r.stdout)
    assert.equal("xyz", r.stderr)
    assert.is_true(r.truncated)
    assert.equal(3, r.exit_code)
    assert.is_false(r.timed_out)
    assert.is_nil(r.signal)
    assert.equal("integer", math.type(r.duration_ms))
    local under = new({ { 1, "abcd" } }, { kind = "exit", n = 0 }, { max_output = 4 }):wait()
    assert.equal("abcd", under.stdout)
    assert.is_false(under.truncated)
  end)

  it("queues streamed chunks for read() in order, then nil; wait() has the output too", function()
    local h = new({ { 1, "a" }, { 2, "b" }, { 1, "" }, { 1, "c" } }, { kind = "exit", n = 0 }, { stream = true })
    local got = {}
    while true do
      local which, data = h:read()
      if not which then break end
      got[#got + 1] = which .. ":" .. data
    end
    assert.same({ "stdout:a", "stderr:b", "stdout:c" }, got)
    assert.equal(0, h.qbytes)
    local r = h:wait()
    assert.equal("ac", r.stdout)
    assert.equal("b", r.stderr)
  end)

  it("shapes signals, timeouts and kills into the result", function()
    assert.equal("SIGTERM", new({}, { kind = "signal", n = 15 }):wait().signal)
    local t = new({}, { kind = "timeout" }):wait()
    assert.is_true(t.timed_out)
    assert.equal("SIGKILL", t.signal)
    assert.is_nil(t.exit_code)
    local h = new({}, { kind = "killed" })
    h:expire()
    assert.same({ 9 }, h.kills)
    assert.is_true(h:wait().timed_out)         -- killed after expire(): timed out
    local k = new({}, { kind = "killed" }):wait()
    assert.is_false(k.timed_out)
    assert.equal("SIGKILL", k.signal)
  end)

  it("raises typed errors for a command that never started or whose status never came", function()
    local ok, err = pcall(function() new({}, { kind = "noexec", n = 2 }):wait() end)
    assert.is_false(ok)
    assert.equal("SandboxExecutionError", err.kind)
    assert.equal("ENOENT", err.errno)
    assert.matches("spawn: prog: ", err.message, 1, true)
    ok, err = pcall(function() new({}, { kind = "nocwd", n = 2 }, { cwd = "/nowhere" }):wait() end)
    assert.equal("FileNotFoundError", err.kind)
    assert.matches("cwd /nowhere", err.message, 1, true)
    ok, err = pcall(function() new({}, { kind = "lost", broken = true, why = "reset" }):wait() end)
    assert.equal("SandboxConnectionError", err.kind)
    assert.matches("(reset)", err.message, 1, true)
    ok, err = pcall(function() new({}, { kind = "lost" }):wait() end)
    assert.equal("SandboxExecutionError", err.kind)
  end)

  it("feeds stdin until close_stdin, then refuses writes (EPIPE)", function()
    local h = new({ { 1, "x" } }, { kind = "exit", n = 0 })
    assert.is_true(h:write("one"))
    h:close_stdin()
    h:close_stdin()
    assert.same({ "one", "<eof>" }, h.stdin)
    local ok, why, code = h:write("two")
    assert.is_nil(ok)
    assert.equal("write: stdin is closed", why)
    assert.equal("EPIPE", code)
  end)

  it("closes idempotently, by close() and by <close>; a finished command is not killed", function()
    local h = new({ { 1, "x" } }, { kind = "exit", n = 0 })
    h:close()
    h:close()
    assert.same({ 9 }, h.kills)
    assert.equal(1, h.released)
    assert.is_false(h:running())
    local g
    do
      local c <close> = new({}, { kind = "exit", n = 0 })
      g = c
    end
    assert.equal(1, g.released)
    local done = new({}, { kind = "exit", n = 0 })
    done:wait()
    done:close()
    assert.same({}, done.kills)
    assert.equal(0, done.released)
  end)

  it("kills the command when its waiter is cancelled", function()
    local h = new({ { 1, "a" }, { 1, "b" }, { 1, "c" }, { 1, "d" } }, { kind = "exit", n = 0 })
    local t = loop.spawn(function() return h:wait() end)
    loop.spawn(function() loop.sleep(0) t:cancel() end)
    local ok, err = t:join()
    assert.is_false(ok)
    assert.equal("Cancelled", err.kind)
    assert.same({ 9 }, h.kills)
  end)
end)

describe("process_handle in the provider script environment", function()
  it("lets a script build its own ProcessHandle on the base", function()
    local p = require("sbx.providers.script").compile([[
local H = process_handle.class{
  _more = function(self)
    if self.status then return false end
    self:_deliver(1, "hello from " .. self.argv0)
    self.status = { kind = "exit", n = 7 }
    self:_ended()
    return true
  end,
  _status = function(self) return self.status end,
  running = function(self) return not self.status end,
  kill = function() end, _write = function() return true end, _end_stdin = function() end,
  _release = function(self) self.status = { kind = "killed" } end,
}
local L = builtin("local")
L.descriptor.name = "handmade"
L.spawn = function(h, req) return process_handle.new(H, req, {}) end
return L
]], "/tmp/handmade.lua", "handmade")
    local ph = contract.check_process(p.spawn(nil, { argv = { "greeter" }, max_output = 5 }), "handmade.lua")
    local r = ph:wait()
    assert.equal("hello", r.stdout)
    assert.is_true(r.truncated)
    assert.equal(7, r.exit_code)
  end)
end)
