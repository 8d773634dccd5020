--- The bwrap provider's commands: the agent link per sandbox (one bwrap
--- running `sbx-agent serve` in the holder's namespaces), and spawn, which
--- sends a command to it or, without it (SBX_BWRAP_EXEC=direct, rlimits, an
--- agent that did not start), runs a bwrap per command.
local proc = require "sbx.proc"
local native = require "sbx.bwrap"
local agentlink = require "sbx.daemon.link"
local limits = require "sbx.providers.builtin.limits"
local host = require "sbx.providers.builtin.host"
local common = require "sbx.providers.builtin.bwrap.common"
local layout = require "sbx.providers.builtin.bwrap.layout"
local holder = require "sbx.providers.builtin.bwrap.holder"
local probe = require "sbx.providers.builtin.bwrap.probe"
local files = require "sbx.providers.builtin.bwrap.files"

local M = {}
local fail, core_fail, own, holder_of = common.fail, common.core_fail, holder.own, holder.holder_of
local command_line, agent_file = layout.command_line, layout.agent_file
local resolve, not_found = files.resolve, files.not_found

-- ------------------------------------------------------------- commands

local function executable(h, p)
  local ok, t = pcall(resolve, h, p, "exec", true)
  if not ok or t.kind ~= "mount" then return false end
  local st = native.lookup(t.dir, t.rel)
  return st ~= nil and st.type == "file" and st.mode & tonumber("111", 8) ~= 0
end

local function find_program(h, name, env, cwd)
  if name:find("/", 1, true) then
    return executable(h, name:sub(1, 1) == "/" and name or (cwd .. "/" .. name))
  end
  local pathvar = host.DEFAULT_PATH
  for _, kv in ipairs(env) do
    if kv:sub(1, 5) == "PATH=" then pathvar = kv:sub(6) end
  end
  for dir in pathvar:gmatch("[^:]+") do
    if dir:sub(1, 1) == "/" and executable(h, dir .. "/" .. name) then return true end
  end
  return false
end

-- Before bwrap mounts over the root's entries: recreate missing ones, and
-- refuse a mount point that is no longer a directory (it cannot change
-- while any command runs: the kernel keeps mount points busy).
local function check_root(h)
  local ok, err = native.populate(h.dir, h.top)
  if not ok then fail("SandboxExecutionError", "the sandbox root is damaged: " .. err, { op = "exec" }) end
  if h.uid then own(h, "workspace") own(h, "tmp") end
  for _, e in ipairs(h.top) do
    if e.mount then
      local st = native.lookup(h.dir, e.name)
      if not st or st.type ~= "dir" then
        fail("SandboxExecutionError", "the sandbox replaced its mount point /" .. e.name
             .. " with a " .. (st and st.type or "missing entry") .. "; refusing to mount over it", { op = "exec" })
      end
    end
  end
end

local function transport(p)
  local t = { diag = "" }
  function t.read()
    while true do
      local which, chunk = p:read()
      if not which then return nil, t.diag ~= "" and ("the agent ended: " .. t.diag) or nil end
      if which == "stdout" then return chunk end
      t.diag = (t.diag .. chunk):sub(-2000)
    end
  end
  function t.write(data) return p:write(data) end
  function t.close() p:close() end
  return t
end

local function open_link(h)
  local file, ferr = agent_file()
  if not file then return nil, "cannot write the agent: " .. tostring(ferr) end
  -- the bind names a host path: it goes with the options through --args
  local ns = holder_of(h)
  local argv, fds = command_line(h, { extra = { "--ro-bind", ns and h.uid and common.VIEW .. "/agent" or file, common.AGENT_IN } })
  for _, x in ipairs{ "--chdir", "/", "--" } do argv[#argv + 1] = x end
  for _, x in ipairs{ common.AGENT_IN, "serve" } do argv[#argv + 1] = x end
  local p, err = proc.spawn{ argv = argv, env = {}, keep_stdin = true, stream = true, max_output = 0,
                             cgroup = h.cg, join = h.join, fds = fds, rlimits = h.rlimits, setns = ns }
  if not p then return nil, err end
  return agentlink.open(transport(p), 10)
end

local function plain_rlimits(r)
  for k in pairs(r or {}) do if k ~= "core" then return false end end
  return true
end

---The sandbox's agent link, opened on first use; nil: a bwrap per command.
local function link_of(h)
  if h.link and not h.link.broken then return h.link end
  if common.mode() == "direct" or h.no_agent or not plain_rlimits(h.rlimits) then return nil end
  local link, why = open_link(h)
  if link then
    h.link = link
    return link
  end
  h.no_agent = "sbx-agent serve did not start: " .. tostring(why)
  common.note_fallback(h.no_agent)
  return nil
end
M.link_of = link_of

---Start a process. req: argv, env (list), cwd, stdin, keep_stdin, timeout,
---max_output, stream. Returns a sbx.Proc (of bwrap, whose tree is the command's).
function M.spawn(h, req)
  if not h.root then fail("SandboxNotFoundError", "the sandbox was destroyed", { op = "exec" }) end
  local ready = probe.probe()        -- a resumed sandbox may be this process's first
  if not ready.ok then fail("BackendNotInstalledError", "bwrap: " .. tostring(ready.reason), { op = "exec" }) end
  check_root(h)
  local t = resolve(h, req.cwd or common.WORKDIR, "exec", true)
  local cwd = t.path
  if t.kind == "mount" then
    local st, err, code = native.lookup(t.dir, t.rel)
    if not st then core_fail("exec", "cwd " .. (req.cwd or common.WORKDIR), err, code) end
    if st.type ~= "dir" then fail("PathError", "cwd " .. req.cwd .. " is not a directory", { op = "exec" }) end
  elseif t.kind ~= "virtual" then
    not_found("exec", "cwd " .. tostring(req.cwd or common.WORKDIR))
  end
  local cur, max = limits.pids(h.session, h.id, h.cg)
  if cur and max and cur >= max then
    fail("SandboxExecutionError", "the sandbox reached its process limit (" .. max .. "); destroy it or"
         .. " kill its processes", { op = "exec", code = "EAGAIN" })
  end
  local link = link_of(h)
  local prog = req.argv[1]
  -- the agent looks the program up itself, inside (this lookup from the
  -- host was most of the host's time per command)
  if not link and not find_program(h, prog, req.env, cwd) then
    fail("SandboxExecutionError", "spawn: " .. prog .. ": No such file or directory", { op = "exec", code = "ENOENT" })
  end
  if link then
    return link:spawn{ argv = req.argv, env = req.env, cwd = cwd, stdin = req.stdin,
      keep_stdin = req.keep_stdin, timeout = req.timeout, max_output = req.max_output,
      stream = req.stream, want_pid = req.want_pid }
  end
  local ns = holder_of(h)
  local argv, fds = command_line(h, { env = req.env })
  if argv[2] ~= "--args" then
    fail("SandboxExecutionError", "the command's environment is over 64 KiB with the options", { op = "exec", code = "E2BIG" })
  end
  argv[#argv + 1] = "--chdir"; argv[#argv + 1] = cwd
  argv[#argv + 1] = "--"
  for _, a in ipairs(req.argv) do argv[#argv + 1] = a end
  local p, err, code = proc.spawn{
    argv = argv, env = {}, stdin = req.stdin, keep_stdin = req.keep_stdin, timeout = req.timeout,
    max_output = req.max_output, stream = req.stream, cgroup = h.cg, join = h.join, fds = fds,
    rlimits = h.rlimits, setns = ns,
  }
  if not p then fail("SandboxExecutionError", err, { op = "exec", code = code }) end
  return p
end

return M
