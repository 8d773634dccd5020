--- Background processes (API.md, sb:spawn) and what every command's result
--- goes through on the way out: streamed chunks to the callbacks, and
--- check = true's CommandFailedError.
local loop = require "sbx.loop"
local errors = require "sbx.core.errors"
local check = require "sbx.core.check"

local M = {}

---Deliver streamed chunks of process handle `p` to opts.on_stdout /
---opts.on_stderr, in the calling task, until the output ends.
function M.pump(p, opts)
  while true do
    local which, chunk = p:read()
    if not which then return end
    local cb = which == "stdout" and opts.on_stdout or opts.on_stderr
    if cb then cb(chunk) end
  end
end

---check = true: a non-zero exit, a signal or a timeout raises
---CommandFailedError carrying the result (context.result); else r.
function M.checked(backend, r, argv, op)
  if r.exit_code == 0 and not r.signal and not r.timed_out then return r end
  local how = r.timed_out and "timed out" or r.signal and ("killed by " .. r.signal)
              or ("exit " .. tostring(r.exit_code))
  local shown = argv[1] == "sh" and argv[2] == "-c" and argv[3] or table.concat(argv, " ")
  if #shown > 200 then shown = shown:sub(1, 200) .. "..." end
  local tail = (r.stderr ~= "" and r.stderr or r.stdout):sub(-500)
  errors.raise("CommandFailedError", string.format("%s: %s failed (%s)%s", op, shown, how,
               tail ~= "" and (": " .. tail) or ""),
    { backend = backend, op = op, context = { result = r, argv = argv, exit_code = r.exit_code,
      signal = r.signal, timed_out = r.timed_out } })
end

local Process = {}
Process.__index = Process
M.Process = Process

---Wrap the provider's process handle `p` of a background process.
---f: backend, opts (its on_stdout/on_stderr), stream (pump them), check
---(the argv, for check = true), done = fn(process) once it was waited for.
function M.new(p, f)
  local bp = setmetatable({ pid = p.pid, _p = p, _backend = f.backend, _check = f.check, _done = f.done }, Process)
  if f.stream then bp._pump = loop.spawn(M.pump, p, f.opts) end
  return bp
end

---Release the process (its sandbox is going): kills what still runs.
function M.close(bp) pcall(bp._p.close, bp._p) end

---Is the process still running? (No method of API.md's Process: for sbxlua's own checks.)
function M.running(bp) return bp._p:running() end

function Process:write(data)
  if type(data) ~= "string" then check.bad("write", "data must be a string") end
  local ok, err = self._p:write(data)
  if not ok then
    errors.raise("SandboxExecutionError", err, { backend = self._backend, op = "write" })
  end
end

function Process:close_stdin() self._p:close_stdin() end

local SIGNALS = { SIGHUP = 1, SIGINT = 2, SIGQUIT = 3, SIGKILL = 9, SIGUSR1 = 10,
                  SIGUSR2 = 12, SIGTERM = 15, SIGCONT = 18, SIGSTOP = 19 }

---Send a signal (name or number; default SIGKILL, which takes the whole tree).
function Process:kill(sig)
  local n = sig == nil and 9 or SIGNALS[sig]
  if not n and type(sig) == "number" then n = check.number(sig, "kill", "signal", { integer = true, min = 1, max = 64 }) end
  if not n then check.bad("kill", "unknown signal " .. tostring(sig)) end
  if self._p:running() then self._p:kill(n) end
end

---Wait for the process; past `timeout` seconds its tree is killed (timed_out = true).
function Process:wait(timeout)
  local timer
  if timeout ~= nil then
    check.seconds(timeout, "wait", "timeout", true)
    timer = loop.spawn(function() loop.sleep(timeout); self._p:expire() end)
  end
  local ok, err = pcall(function()
    if self._pump then
      local pok, perr = self._pump:join()
      if not pok then error(perr, 0) end
    end
  end)
  if not ok then self._p:kill() end
  local r = self._p:wait()
  if timer then timer:cancel() end
  if self._done then self._done(self) end
  if not ok then error(err, 0) end
  if self._check then return M.checked(self._backend, r, self._check, "wait") end
  return r
end

return M
