--- The docker provider's agent link: one `sbx-agent serve` per container
--- over a hijacked exec stream, opened in a task of its own at create and
--- again on demand, and spawn(), which falls back to the engine's exec.
local demux = require "sbx.demux"
local loop = require "sbx.loop"
local errors = require "sbx.core.errors"
local paths = require "sbx.core.paths"
local agentlink = require "sbx.daemon.link"
local common = require "sbx.providers.builtin.docker.common"
local engine = require "sbx.providers.builtin.docker.engine"
local engine_exec = require "sbx.providers.builtin.docker.engine_exec"

local M = {}
local api, field, q, hijack = engine.api, engine.field, engine.q, engine.hijack

-- Every operation goes through one `sbx-agent serve` per container, started
-- once over a hijacked exec stream: a command then costs a frame each way
-- instead of an engine exec (a new runc process each time). The engine's
-- own exec and archive endpoints remain the fallback: SBX_DOCKER_EXEC=engine
-- (or exec_mode) forces it, and an agent that cannot start selects it
-- for that sandbox, remembered in common.fallback for `sbxlua doctor`.

-- The agent's protocol bytes are the exec's stdout; its stderr is kept for
-- the message when the link fails.
local function transport(s, pending)
  local d = demux.new()
  local t = { diag = "" }
  function t.read()
    while true do
      local chunk, msg = pending, nil
      pending = nil
      if not chunk or chunk == "" then chunk, msg = s:read() end
      if not chunk then return nil, msg or (t.diag ~= "" and t.diag) or nil end
      local frames, ferr = d:feed(chunk)
      if not frames then return nil, ferr end
      local out = {}
      for _, f in ipairs(frames) do
        if f.stream == 1 then out[#out + 1] = f.data
        else t.diag = (t.diag .. f.data):sub(-2000) end
      end
      if #out > 0 then return table.concat(out) end
    end
  end
  function t.write(data) return s:write(data) end
  function t.close() s:close() end
  return t
end

local function open_link(h)
  local res = api("POST", "/containers/" .. q(h.cid) .. "/exec", { 201 }, { op = "exec",
    body = { AttachStdout = true, AttachStderr = true, AttachStdin = true, Tty = false,
             Cmd = common.SERVE or { h.agent or common.AGENT, "serve" } },
    conflict = "SandboxNotFoundError" })
  local s, pending = hijack(field(res, "Id", "string", { op = "exec" }), "exec")
  return agentlink.open(transport(s, pending), 15)
end

---The sandbox's agent link, (re)opened on demand; nil when this sandbox
---uses the engine's exec path.
-- Open the agent link of h (in a task of its own: see link_of).
local function open_into(h)
  local ok, link, why = pcall(open_link, h)
  if ok and link then
    h.link = link
  elseif not ok and errors.is(link, "SandboxNotFoundError") then
    h.open_error = link
  elseif not errors.is(link, "Cancelled") then
    h.no_agent = "sbx-agent serve did not start: " .. tostring(ok and why or (type(link) == "table" and link.message or link))
    common.note_fallback(h.no_agent)
  end
end

---The sandbox's agent link, (re)opened on demand; nil when this sandbox
---uses the engine's exec path. One task opens it, however many wait.
local function link_of(h)
  if h.link and not h.link.broken then return h.link end
  if common.mode() == "engine" or h.no_agent then return nil end
  if not h.opener or h.opener:status() == "done" then h.opener = loop.spawn(open_into, h) end
  h.opener:join()
  local err = h.open_error
  h.open_error = nil
  if err then error(err, 0) end
  return h.link and not h.link.broken and h.link or nil
end
M.link_of = link_of

---Start a command through sbx-agent. req: argv, env, cwd, stdin, keep_stdin,
---timeout, max_output, stream.
function M.spawn(h, req)
  local link = link_of(h)
  if link then
    return link:spawn{ argv = req.argv, env = req.env, stdin = req.stdin, keep_stdin = req.keep_stdin,
      cwd = paths.resolve(common.WORKDIR, req.cwd or common.WORKDIR, "exec"), timeout = req.timeout,
      max_output = req.max_output, stream = req.stream, want_pid = req.want_pid }
  end
  return engine_exec.spawn(h, req)
end

M.open_into = open_into

---Open the first link of h on the container's own stdio (attached before
---its start; `sbx-agent sleep --serve` serves it): no engine exec. When it
---fails, one over an exec instead, as before.
function M.open_attached(h, s, pending)
  local ok, link = pcall(agentlink.open, transport(s, pending), 15)
  if ok and link then h.link = link return end
  s:close()
  if not ok and errors.is(link, "Cancelled") then error(link, 0) end
  open_into(h)
end

return M
