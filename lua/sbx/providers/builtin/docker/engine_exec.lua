--- The docker provider's engine-exec path: one engine exec per command,
--- supervised by `sbx-agent run` (SBX_DOCKER_EXEC=engine, or a container
--- whose agent link did not start), and the short agent commands (ls, rm,
--- mkdir, kill) the file operations use without the link.
local demux = require "sbx.demux"
local loop = require "sbx.loop"
local paths = require "sbx.core.paths"
local hex = require("sbx.proc").random_hex
local common = require "sbx.providers.builtin.docker.common"
local engine = require "sbx.providers.builtin.docker.engine"

local M = {}
local fail, api, field, q, hijack = common.fail, engine.api, engine.field, engine.q, engine.hijack

local function exec_create(h, cmd, env, op)
  local res = api("POST", "/containers/" .. q(h.cid) .. "/exec", { 201 }, { op = op,
    body = { AttachStdout = true, AttachStderr = true, AttachStdin = false, Tty = false,
             Cmd = cmd, Env = (env and #env > 0) and env or nil },
    conflict = "SandboxNotFoundError" })
  return field(res, "Id", "string", { op = op })
end

-- A short agent command (ls, rm, mkdir, kill): stdout, stderr, exit code.
local function agent(h, args, op)
  local cmd = { h.agent or common.AGENT }
  for _, a in ipairs(args) do cmd[#cmd + 1] = a end
  local eid = exec_create(h, cmd, {}, op)
  local s, pending = hijack(eid, op)
  local d, out, err = demux.new(), {}, {}
  local chunk, msg = pending, nil
  while true do
    if not chunk or chunk == "" then chunk, msg = s:read(120) end
    if not chunk then break end
    local frames, ferr = d:feed(chunk)
    if not frames then msg = ferr break end
    for _, f in ipairs(frames) do
      local t = f.stream == 1 and out or err
      t[#t + 1] = f.data
    end
    chunk = nil
  end
  s:close()
  if msg then fail("SandboxExecutionError", op .. ": " .. msg, { op = op }) end
  local info = api("GET", "/exec/" .. eid .. "/json", { 200 }, { op = op })
  return table.concat(out), table.concat(err), math.tointeger(field(info, "ExitCode", "number", { op = op }))
end

-- The engine path's command: a ProcessHandle on the base (process_handle.lua)
-- over one hijacked exec stream.
local process_handle = require "sbx.providers.process_handle"
local Handle = process_handle.class()

---The fallback: one engine exec per command, supervised by `sbx-agent run`.
function M.spawn(h, req)
  local nonce = hex(16)
  local pidfile = common.RUNDIR .. "/" .. nonce .. ".pid"
  local cmd = { h.agent or common.AGENT, "run", "--pidfile", pidfile, "--stdin", "-",
                "--cwd", paths.resolve(common.WORKDIR, req.cwd or common.WORKDIR, "exec") }
  if req.timeout then
    cmd[#cmd + 1] = "--timeout"
    cmd[#cmd + 1] = string.format("%.3f", req.timeout)
  end
  cmd[#cmd + 1] = "--"
  for _, a in ipairs(req.argv) do cmd[#cmd + 1] = a end
  local res = api("POST", "/containers/" .. q(h.cid) .. "/exec", { 201 }, { op = "exec",
    body = { AttachStdout = true, AttachStderr = true, AttachStdin = true, Tty = false,
             Cmd = cmd, Env = (req.env and #req.env > 0) and req.env or nil },
    conflict = "SandboxNotFoundError" })
  local eid = field(res, "Id", "string", { op = "exec" })
  local e = process_handle.new(Handle, req,
    { h = h, eid = eid, pidfile = pidfile, held = "", d = demux.new() })
  e.s, e.pending = hijack(eid, "exec")
  if req.want_pid then           -- background processes show a pid; commands need none
    local ok, info = pcall(api, "GET", "/exec/" .. eid .. "/json", { 200 }, { op = "exec" })
    e.pid = ok and type(info.json) == "table" and math.tointeger(info.json.Pid) or nil
  end
  if req.stdin then
    -- written by a task of its own: a command that answers while it reads
    -- must not deadlock against us
    e.writer = loop.spawn(function()
      -- the command may end (or time out) before it read everything: then
      -- the stream is closed under us, which is no error of the caller's
      pcall(function()
        if #req.stdin > 0 then e.s:write(req.stdin) end
        e.s:shutdown()
      end)
    end)
  elseif not req.keep_stdin then
    e.s:shutdown()
  end
  return e
end

-- The agent's status record is the last bytes of stderr: hold back a tail.
local HOLD = 64

function Handle:_take(f)
  if f.stream == 1 then return self:_deliver(1, f.data) end
  local s = self.held .. f.data
  if #s > HOLD then
    self:_deliver(2, s:sub(1, -HOLD - 1))
    s = s:sub(-HOLD)
  end
  self.held = s
end

function Handle:_finish()
  if self.status then return end
  self:_ended()
  local i, kind, n = self.held:match("()%zSBXAGENT1 (%a+) (%-?%d+)\n$")
  if i then
    self:_deliver(2, self.held:sub(1, i - 1))
    self.status = { kind = kind, n = tonumber(n) }
  else
    self:_deliver(2, self.held)
    self.status = { kind = "lost", broken = self.read_failed }   -- the engine's stream broke
  end
  self.held = ""
end

-- Read one chunk from the engine; false at the end.
function Handle:_more()
  if self.eof then return false end
  local chunk, msg = self.pending, nil
  self.pending = nil
  if not chunk or chunk == "" then chunk, msg = self.s:read() end
  if not chunk then
    self.eof = true
    self.failure, self.read_failed = msg, msg ~= nil
    self.s:close()
    local ok, ferr = self.d:finish()
    if not ok and not msg then self.failure = ferr end
    self:_finish()
    return false
  end
  local frames, ferr = self.d:feed(chunk)
  if not frames then
    self.eof, self.failure = true, ferr
    self.s:close()
    self:_finish()
    return false
  end
  for _, f in ipairs(frames) do self:_take(f) end
  return true
end

-- The caller raised mid-wait (after the kill): the stream goes too.
function Handle:_abandon() self.s:close() end

function Handle:_status()
  self.status.why = self.failure
  return self.status
end

function Handle:running() return not self.eof end

function Handle:kill()
  if self.eof or self.killing then return end
  self.killing = true
  local ok, err = pcall(agent, self.h, { "kill", self.pidfile }, "kill")
  self.killing = false
  if not ok then error(err, 0) end
end

function Handle:_write(data) return self.s:write(data) end

function Handle:_end_stdin() self.s:shutdown() end

function Handle:_release()
  self.eof = true
  self.s:close()
end

M.agent = agent

return M
