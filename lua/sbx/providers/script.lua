--- The restricted environment provider scripts run in (API.md, "Provider
--- scripts"; docs/providers.md, "The script environment").
---
--- A provider file is compiled text-only into a fresh environment of its
--- own, in the host's Lua state (its operations wait on HTTP and timers,
--- which yield to the event loop). What it gets: the safe base library,
--- copies of string/table/math/utf8, os.time/clock/date/difftime, and
--- http, json, base64, stream, timer, errors, agentlink, process_handle,
--- cloud, host, bridge, owner, env(), config(), builtin(), hostname(), random_hex() and
--- agent_binary(). Reading any other global (io, require, debug, load,
--- package, ...) or os.execute raises ConfigError naming file:line.
local errors = require "sbx.core.errors"
local contract = require "sbx.providers.contract"

local M = {}

M.LOAD_INSTRUCTIONS = 10000000   -- the most a file's top level may run

local SAFE = { "assert", "error", "ipairs", "next", "pairs", "pcall", "rawequal", "rawget", "rawlen",
               "rawset", "select", "tonumber", "tostring", "type", "xpcall", "setmetatable", "_VERSION" }

local WHY = {
  io = "use the contract's file operations; a provider never touches the host's files",
  require = "the modules a provider may use are globals already: http, json, base64, stream, "
            .. "timer, errors, agentlink, process_handle, cloud, host, bridge, owner",
  os = "only os.time, os.clock, os.date and os.difftime are there; use env() for credentials",
  debug = "not available to provider scripts", package = "not available to provider scripts",
  load = "provider scripts cannot compile code", loadfile = "provider scripts cannot load files",
  dofile = "provider scripts cannot load files",
}

-- A ConfigError at the script line that made the call `level` up.
local function refuse(level, what, why)
  local info = debug.getinfo(level + 1, "Sl")
  local src = info and info.source:sub(1, 1) == "@" and info.source:sub(2) or (info and info.short_src)
  local where = info and info.currentline and info.currentline > 0
                and (src .. ":" .. info.currentline .. ": ") or ""
  errors.raise("ConfigError", where .. what .. (why and (" (" .. why .. ")") or ""),
               { op = "provider script", file = src, line = info and info.currentline })
end

local function copy(t, skip)
  local out = {}
  for k, v in pairs(t) do if not (skip and skip[k]) then out[k] = v end end
  return out
end

local function guarded(t, name)
  return setmetatable(t, { __index = function(_, k)
    refuse(2, name .. "." .. tostring(k) .. " is not available to provider scripts", WHY[name])
  end })
end

M.base64 = require "sbx.core.base64"   -- (copied into each script's env below)

-- The operations of a built-in backend, for a script that wraps one.
local BUILTIN = { ["local"] = "sbx.providers.builtin.local", bwrap = "sbx.providers.builtin.bwrap", docker = "sbx.providers.builtin.docker" }
M.BUILTIN = BUILTIN
local function builtin(name)
  local mod = BUILTIN[name]
  if not mod then
    refuse(2, "builtin('" .. tostring(name) .. "'): no built-in provider of that name", "local, bwrap, docker")
  end
  local p = require(mod)
  local out = {}
  for _, op in ipairs(contract.REQUIRED) do out[op] = p[op] end
  for _, op in ipairs(contract.OPTIONAL) do out[op] = p[op] end
  for _, k in ipairs(contract.FLAGS) do out[k] = p[k] end
  out.descriptor = copy(p.descriptor)
  for k, v in pairs(out.descriptor) do if type(v) == "table" then out.descriptor[k] = copy(v) end end
  return out
end

---A fresh environment for the provider `name` (whose config it reads).
function M.environment(name)
  local cjson = require("cjson.safe").new()
  local http = require "sbx.http"
  local loop = require "sbx.loop"
  local env = {}
  for _, k in ipairs(SAFE) do env[k] = _G[k] end
  env.getmetatable = function(v) if type(v) ~= "string" then return getmetatable(v) end end
  env.string = copy(string, { dump = true })
  env.table, env.math, env.utf8 = copy(table), copy(math), copy(utf8)
  env.os = guarded({ time = os.time, clock = os.clock, date = os.date, difftime = os.difftime }, "os")
  env.http = { request = http.request, escape = http.escape }
  env.json = { encode = cjson.encode, decode = cjson.decode, null = cjson.null }
  env.base64 = copy(M.base64)
  local sstream = require "sbx.stream"
  env.stream = { connect = sstream.connect, listen = sstream.listen }
  -- For providers whose sandboxes dial back (ray): who this host is, secrets
  -- from the kernel's random pool, and this build's sbx-agent to ship.
  env.hostname = require("sbx.state.owner").hostname
  env.random_hex = require("sbx.proc").random_hex
  env.agent_binary = function()
    local blob = require "sbx.agentbin"
    return blob, require("sbx.daemon.link").hash(blob)
  end
  env.timer = { sleep = loop.sleep, now = loop.now }
  env.errors = { raise = errors.raise, is = errors.is, new = errors.new, raiser = errors.raiser }
  local agentlink = require "sbx.daemon.link"
  env.agentlink = { open = agentlink.open, result = agentlink.result }
  -- The base of a ProcessHandle (output caps, read queue, result, close).
  local handle = require "sbx.providers.process_handle"
  env.process_handle = { class = handle.class, new = handle.new, result = handle.result,
                         MAX_OUTPUT = handle.MAX_OUTPUT }
  -- HTTP APIs: typed errors, retries, JSON, ownership labels (lua/sbx/providers/cloud.lua).
  local cloud = require "sbx.providers.cloud"
  env.cloud = { client = cloud.client, error_for = cloud.error_for, labels = cloud.labels,
                retry_after = cloud.retry_after, message_of = cloud.message_of,
                multipart = cloud.multipart, agent = cloud.agent, all = cloud.all }
  env.builtin = builtin
  -- The host, for a provider that wraps a host program (safehouse): its
  -- kernel name, and the absolute path of an executable regular file, a
  -- bare name looked up on `path` (colon-separated) or an absolute path.
  local proc = require "sbx.proc"
  env.host = { os = function() return (proc.uname()) end, which = function(name, path)
    if type(name) ~= "string" or name == "" then return nil end
    if name:sub(1, 1) == "/" then
      local dir, base = name:match("^(.*)/([^/]+)$")
      return base and proc.which(base, dir == "" and "/" or dir) or nil
    end
    if name:find("/", 1, true) then return nil end       -- relative to what?
    return proc.which(name, path)
  end }
  -- A bridge program (sbx.bridge): the socket of this process's one, started on first use.
  local bridge = require "sbx.providers.bridge"
  env.bridge = { socket = bridge.socket, find = bridge.find, status = bridge.status }
  -- Whose sandboxes these are: the sbxlua.host and sbxlua.lock labels of create.
  local owner = require "sbx.state.owner"
  env.owner = { hostname = owner.hostname, lock_path = owner.lock_path }
  -- Its own settings (providers.NAME in sbx.yaml, with the schema's defaults):
  -- the script's own copy, the same table until the settings change (a
  -- cloud provider reads them on every request).
  local config = require "sbx.core.config"
  local seen, mine, creds
  local function settings()
    local p = config.provider(name)
    if p ~= seen then seen, mine, creds = p, copy(p), nil end
    return p
  end
  env.config = function() settings() return mine end
  -- Only the variables its config names as credentials (type "env" keys).
  env.env = function(var)
    local p = settings()
    if not creds then
      creds = {}
      for _, v in pairs(require("sbx.providers").credentials(name, p)) do creds[v] = true end
    end
    if creds[var] then return os.getenv(var) end
    refuse(2, "env('" .. tostring(var) .. "'): not a variable this provider's config names",
           "declare a key of type \"env\" in config_schema, e.g. api_key_env")
  end
  return setmetatable(env, { __index = function(_, k)
    refuse(2, "undefined global '" .. tostring(k) .. "'",
           WHY[k] or "provider scripts run in a restricted environment; see docs/providers.md")
  end, __newindex = function(_, k)
    refuse(2, "assignment to global '" .. tostring(k) .. "' (use local)")
  end })
end

---Compile a provider script and check it against the contract; returns
---the provider table or raises ConfigError naming file:line.
-- Lua shortens a long chunk name to "...tail" in its messages: say the whole path.
local function full_path(msg, file)
  msg = tostring(msg)
  local short, rest = msg:match("^%.%.%.([^:]*)(:%d+:.*)$")
  if short and file:sub(-#short) == short then return file .. rest end
  return msg
end

function M.compile(source, file, name)
  local env = M.environment(name)
  local chunk, err = load(source, "@" .. file, "t", env)
  if not chunk then errors.raise("ConfigError", full_path(err, file), { file = file, op = "provider script" }) end
  -- The top level only declares: it runs in a coroutine of its own with an
  -- instruction budget, and a yield out of it is refused.
  local co = coroutine.create(chunk)
  debug.sethook(co, function()
    local info = debug.getinfo(2, "Sl")
    error((info and info.currentline and (file .. ":" .. info.currentline .. ": ") or "")
          .. "the top level ran past " .. M.LOAD_INSTRUCTIONS .. " instructions (an endless loop?)", 0)
  end, "", M.LOAD_INSTRUCTIONS)
  local ok, p = coroutine.resume(co)
  if ok and coroutine.status(co) ~= "dead" then
    coroutine.close(co)
    errors.raise("ConfigError", file .. ": the top level yielded; a provider file only declares "
                 .. "when it loads, its operations act", { file = file })
  end
  if not ok then
    if type(p) == "table" and p.kind then error(p, 0) end
    errors.raise("ConfigError", full_path(p, file), { file = file, op = "provider script" })
  end
  contract.check(p, file, name, source)
  return p
end

return M
