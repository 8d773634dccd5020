--- The ProcessHandle base (lua/sbx/providers/contract.lua, docs/providers.md): what
--- every process handle written in Lua shares. The agent link's commands,
--- docker's engine exec and a provider script's own handles are built on it;
--- the C `sbx.Proc` (local, bwrap) does the same in C.
---
--- The base keeps the output (capped per stream, `truncated` past the cap),
--- queues streamed chunks for read(), shapes the result table, and turns
--- read/wait/write/close_stdin/expire/close into a few driver hooks:
---
---   h:_more()       read and deliver some more (may wait); false at the end
---   h:_status()     the finished command's { kind =, n =, why =, broken = }
---   h:running()     boolean
---   h:kill(sig)     signal the command's tree
---   h:_write(data)  feed stdin: true | nil, why, code
---   h:_end_stdin()  end of input
---   h:_release()    close() of a command still running, after its kill
---   h:_flow(all)    optional: read() took chunks (all: wait() takes the rest)
---   h:_abandon()    optional: the waiting caller raised, after the kill
local loop = require "sbx.loop"
local errors = require "sbx.core.errors"

local M = {}

M.MAX_OUTPUT = 1048576   -- bytes kept per stream when the request names none

M.SIGNAMES = { [1] = "SIGHUP", [2] = "SIGINT", [3] = "SIGQUIT", [4] = "SIGILL", [6] = "SIGABRT",
  [7] = "SIGBUS", [8] = "SIGFPE", [9] = "SIGKILL", [10] = "SIGUSR1", [11] = "SIGSEGV",
  [12] = "SIGUSR2", [13] = "SIGPIPE", [14] = "SIGALRM", [15] = "SIGTERM" }
M.STRERROR = setmetatable({}, { __index = function(_, n) return (select(2, errors.errno_name(n))) end })
-- errno numbers a supervisor reports -> their names ("ENOENT"), from the C library
M.ERRNO = setmetatable({}, { __index = function(_, n) return (errors.errno_name(n)) end })

local texts   -- "ENOENT" -> "No such file or directory", from this host's C library
-- The text of an errno name (sbx-agent reports errnos by name), or nil.
local function errno_text(name)
  if not texts then
    texts = {}
    for n = 1, 300 do
      local nm, text = errors.errno_name(n)
      if nm and not texts[nm] then texts[nm] = text end
    end
  end
  return texts[name]
end

---The result table of a finished command from its supervisor's status
---st = { kind = "exit"|"signal"|"timeout"|"killed"|"noexec"|"nocwd"|..., n =,
---errno =, expired =, broken =, why = } (noexec and nocwd: the errno by name,
---as sbx-agent serve reports it, or its number n here), added to `fields` (stdout, stderr,
---truncated, duration_ms); raises for a command that never started or
---whose status never came.
function M.result(st, fields, argv0, cwd)
  local r = fields
  r.timed_out = false
  if st.kind == "exit" then
    r.exit_code = st.n
  elseif st.kind == "signal" then
    r.signal = M.SIGNAMES[st.n] or ("SIG" .. st.n)
  elseif st.kind == "timeout" or (st.kind == "killed" and st.expired) then
    r.timed_out, r.signal = true, "SIGKILL"
  elseif st.kind == "killed" then
    r.signal = "SIGKILL"
  elseif st.kind == "noexec" or st.kind == "nocwd" then
    local name = st.errno or M.ERRNO[st.n]
    local text = st.errno and (errno_text(st.errno) or st.errno) or M.STRERROR[st.n] or ("errno " .. tostring(st.n))
    if st.kind == "noexec" then
      errors.raise("SandboxExecutionError", "spawn: " .. argv0 .. ": " .. text, { op = "exec", errno = name })
    end
    errors.raise(name == "ENOENT" and "FileNotFoundError" or "PathError", "cwd " .. tostring(cwd) .. ": " .. text,
                 { op = "exec", errno = name })
  elseif st.broken then     -- the link to the sandbox broke: retryable, as any lost connection
    errors.raise("SandboxConnectionError", "exec: the link to the sandbox's agent broke before the command's "
                 .. "status came" .. (st.why and (" (" .. st.why .. ")") or "") .. "; the sandbox may have stopped",
                 { op = "exec" })
  else
    errors.raise("SandboxExecutionError", "exec: the command's supervisor ended without a status"
                 .. (st.why and (" (" .. st.why .. ")") or "") .. "; the sandbox may have stopped", { op = "exec" })
  end
  return r
end

local Base = {}
M.Base = Base

---A handle class on the base: `methods` (the driver's hooks and anything
---else) with the base's read, wait, write, close_stdin, expire, close and
---__close behind them. No __gc: close() may wait (a kill over the link or
---the engine), which a finalizer must not.
function M.class(methods)
  local C = setmetatable(methods or {}, { __index = Base })
  C.__index = C
  C.__close = function(h) h:close() end
  return C
end

---A new handle of class `C` for spawn request `req` (argv, cwd, max_output,
---stream), with the driver's own `fields`.
function M.new(C, req, fields)
  local h = fields or {}
  h.argv0, h.cwd = req.argv and req.argv[1], req.cwd
  h.max, h.streaming, h.start = req.max_output or M.MAX_OUTPUT, req.stream, loop.now()
  h.out, h.outn, h.err, h.errn, h.truncated = {}, 0, {}, 0, false
  h.queue, h.qhead, h.qtail, h.qbytes = {}, 1, 0, 0
  return setmetatable(h, C)
end

---Keep what fits under the cap of stream `which` (1 stdout, 2 stderr);
---the rest counts as truncated.
function Base:_capture(which, data)
  local n = which == 1 and self.outn or self.errn
  local room = self.max - n
  if #data > room then
    self.truncated = true
    data = data:sub(1, room)
  end
  if #data > 0 then
    local buf = which == 1 and self.out or self.err
    buf[#buf + 1] = data
    if which == 1 then self.outn = n + #data else self.errn = n + #data end
  end
end

---Output of stream `which` arrived: kept under the cap and, while
---streaming, queued for read(); true when it was queued.
function Base:_deliver(which, data)
  if #data == 0 then return false end
  self:_capture(which, data)
  if not self.streaming then return false end
  self.qtail = self.qtail + 1
  self.queue[self.qtail] = { which == 1 and "stdout" or "stderr", data }
  self.qbytes = self.qbytes + #data
  return true
end

---The clock stops: the command ended (duration_ms of the result).
function Base:_ended() self.duration = loop.now() - self.start end

-- If the caller is cancelled (or errors) mid-wait, the command must die too.
function Base:_guard(fn)
  local ok, err = pcall(fn)
  if not ok then
    pcall(self.kill, self)
    if self._abandon then self:_abandon() end
    error(err, 0)
  end
end

function Base:_flow() end

---The next streamed chunk: "stdout"|"stderr", data; nil at the end.
function Base:read()
  self:_guard(function()
    while self.qhead > self.qtail and self:_more() do end
  end)
  local item = self.queue[self.qhead]
  if not item then return nil end
  self.queue[self.qhead] = nil
  self.qhead = self.qhead + 1
  self.qbytes = self.qbytes - #item[2]
  self:_flow(false)
  return item[1], item[2]
end

---Wait for the end: { stdout, stderr, exit_code, signal, timed_out, truncated, duration_ms }.
function Base:wait()
  self.streaming = false
  self:_flow(true)
  self:_guard(function() while self:_more() do end end)
  local st = self:_status()
  st.expired = self.expired
  return M.result(st, { stdout = table.concat(self.out), stderr = table.concat(self.err),
    truncated = self.truncated, duration_ms = math.floor(self.duration * 1000 + 0.5) }, self.argv0, self.cwd)
end

---The caller's deadline passed: kill the tree; the result says timed_out.
function Base:expire()
  self.expired = true
  self:kill(9)
end

function Base:write(data)
  if not self:running() or self.stdin_closed then return nil, "write: stdin is closed", "EPIPE" end
  return self:_write(data)
end

function Base:close_stdin()
  if not self.stdin_closed and self:running() then
    self.stdin_closed = true
    self:_end_stdin()
  end
end

---Release everything: a command still running is killed. Idempotent.
function Base:close()
  if self:running() then
    pcall(self.kill, self, 9)
    self:_release()
  end
  if self.writer then self.writer:cancel() end
end

return M
