--- Bridge programs: a helper a provider script talks to over a unix socket
--- when the service it drives has no HTTP API (Modal speaks only gRPC:
--- providers/modal.lua and bridge/modal/, the official Go SDK). sbxlua
--- starts one per process on first use, on a socket in its state
--- directory, with this build's sbx-agent in a file next to it; the bridge
--- ends when its stdin does (this process went), and logs to a file there.
local proc = require "sbx.proc"
local fs = require "sbx.fs"
local loop = require "sbx.loop"
local owner = require "sbx.state.owner"

local M = {}

-- Which program serves which bridge name (no other name can be started).
M.PROGRAMS = { modal = "sbx-modal-bridge" }
M.START_SECS = 20        -- how long a bridge may take to say "ready"

local running = {}       -- name -> { p =, socket = } of this process
local starting = {}      -- name -> the task starting it

local function executable(path)
  local st = path and fs.stat_host(path)
  return st and st.type == "file" and path or nil
end

-- The directory of the running sbxlua (the build directory, or bin/ of an install).
local function own_dir()
  local exe = fs.readlink("/proc/self/exe")
  return exe and exe:match("^(.*)/[^/]+$")
end

---The bridge program for `name`: `configured` (the provider's config), else
---next to the sbxlua binary, else on $PATH. path or nil, why.
function M.find(name, configured)
  local program = M.PROGRAMS[name]
  if not program then return nil, "no bridge program is known for '" .. tostring(name) .. "'" end
  if configured and configured ~= "" then
    if executable(configured) then return configured end
    return nil, program .. " not found at " .. configured
  end
  local dir = own_dir()
  local found = dir and executable(dir .. "/" .. program)
  for d in (os.getenv("PATH") or ""):gmatch("[^:]+") do
    found = found or executable(d .. "/" .. program)
  end
  if found then return found end
  return nil, program .. " is not built (next to " .. tostring(dir and (dir .. "/sbxlua") or "sbxlua")
              .. " or on $PATH)"
end

-- This build's sbx-agent as a file of the state directory, named by its hash.
local function agent_file(dir)
  local blob = require "sbx.agentbin"
  local path = dir .. "/sbx-agent-" .. require("sbx.daemon.link").hash(blob)
  local st = fs.stat_host(path)
  if st and st.size == #blob then return path end
  local tmp = path .. ".tmp" .. proc.getpid()
  local f, err = io.open(tmp, "wb")
  if not f then return nil, err end
  local ok, werr = f:write(blob)
  f:close()
  if not ok then os.remove(tmp) return nil, werr end
  fs.chmod_host(tmp, tonumber("755", 8))
  local rok, rerr = os.rename(tmp, path)
  if not rok then os.remove(tmp) return nil, rerr end
  return path
end

local function start(name, o)
  local bin, why = M.find(name, o.path)
  if not bin then return nil, why end
  local dir = owner.state_dir() .. "/bridges"
  local made, merr = fs.mkdir_host(dir)
  if not made then return nil, "bridge: " .. tostring(merr) end
  -- what bridges of processes gone left (a SIGKILLed sbxlua): their socket and log
  for _, f in ipairs(fs.list_host(dir) or {}) do
    local pid = f:match("^%w+%-(%d+)%-%x+%.[a-z]+$")
    if pid and not fs.stat_host("/proc/" .. pid) then os.remove(dir .. "/" .. f) end
  end
  local agent, aerr = agent_file(dir)
  if not agent then return nil, "bridge: writing sbx-agent: " .. tostring(aerr) end
  local tag = name .. "-" .. proc.getpid() .. "-" .. proc.random_hex(4)
  local socket, log = dir .. "/" .. tag .. ".sock", dir .. "/" .. tag .. ".log"
  if #socket > 100 then       -- a unix socket's path has room for 107 bytes
    local tmp, terr = fs.mkdtemp(os.getenv("TMPDIR") or "/tmp", "sbx-bridge-")
    if not tmp then return nil, "bridge: " .. tostring(terr) end
    socket = tmp .. "/" .. name .. ".sock"
  end
  local env = {}
  for _, kv in ipairs(o.env or {}) do env[#env + 1] = kv end
  local p, err = proc.spawn{ argv = { bin, "--socket", socket, "--agent", agent, "--log", log },
                             env = env, keep_stdin = true, stream = true, max_output = 0 }
  if not p then return nil, "bridge: starting " .. bin .. ": " .. tostring(err) end
  -- its first line on stdout is "ready" once it listens
  local got, said = "", nil
  local timer = loop.spawn(function()
    loop.sleep(M.START_SECS)
    said = said or ("it did not say ready within " .. M.START_SECS .. " s")
    p:kill(9)
  end)
  while not got:find("\n") do
    local which, chunk = p:read()
    if not which then break end
    if which == "stdout" then got = got .. chunk end
  end
  timer:cancel()
  if got:match("^ready\n") then
    running[name] = { p = p, socket = socket, log = log, bin = bin }
    return running[name]
  end
  pcall(p.kill, p, 9)
  pcall(p.close, p)
  local tail = (fs.read_host(log, 4096) or ""):gsub("%s+$", "")
  os.remove(log)
  return nil, "bridge " .. bin .. " did not start: " .. (said or (tail ~= "" and tail) or "it exited")
end

---The socket of this process's bridge `name`, started on first use (one
---task starts it, the others wait). o: path (the program, optional), env
---(a list of K=V: its whole environment). socket or nil, why.
function M.socket(name, o)
  o = o or {}
  local b = running[name]
  if b and b.p:running() then return b.socket end
  running[name] = nil
  if not starting[name] then
    local res = {}
    res.task = loop.spawn(function() res.b, res.why = start(name, o) end)
    starting[name] = res
  end
  local t = starting[name]
  t.task:join()
  if starting[name] == t then starting[name] = nil end
  if not t.b then return nil, t.why end
  return t.b.socket
end

---The bridge of this process, for doctor: { bin, socket, log } or nil.
function M.status(name)
  local b = running[name]
  return b and b.p:running() and { bin = b.bin, socket = b.socket, log = b.log } or nil
end

return M
