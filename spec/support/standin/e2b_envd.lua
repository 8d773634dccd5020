-- The in-sandbox half of the E2B stand-in (spec/support/standin/e2b.lua):
-- envd's API as the SDKs and providers/e2b.lua speak it (NOTES.md, "E2B";
-- e2b-envd.yaml for /files). Connect RPCs over HTTP/1.1 with the JSON codec:
-- process.Process/Start (server-streaming: envelopes [flags u8][len u32 BE]
-- [JSON], which may span or share chunks), SendSignal, SendInput,
-- CloseStdin, List; filesystem.Filesystem/Stat, ListDir, MakeDir, Remove,
-- Move; and the plain /files download and upload (raw or multipart).
-- Each call runs for real in the sandbox's sbx sandbox (`box.sb`).
local loop = require "sbx.loop"
local json = require("cjson.safe").new()
local b64 = require("sbx.providers.script").base64

local M = {}

M.HOME = "/home/user"           -- envd's user and the directory relative paths start from
M.MAX_ENVELOPE = 16 << 20

-- Connect error code -> HTTP status (unary calls answer with it).
local STATUS = { invalid_argument = 400, unauthenticated = 401, permission_denied = 403, not_found = 404,
                 already_exists = 409, resource_exhausted = 429, canceled = 499, unknown = 500,
                 internal = 500, unavailable = 503, deadline_exceeded = 504, failed_precondition = 400 }

local function envelope(flags, v)
  local body = type(v) == "string" and v or assert(json.encode(v))
  return string.pack(">B I4", flags, #body) .. body
end
M.envelope = envelope

-- Every envelope of a request body: list of decoded messages, or nil, why.
function M.envelopes(body)
  local out, i = {}, 1
  while i <= #body do
    if #body - i + 1 < 5 then return nil, "truncated envelope header" end
    local flags, len = string.unpack(">B I4", body, i)
    if len > M.MAX_ENVELOPE then return nil, "envelope too large" end
    if #body - i - 4 < len then return nil, "truncated envelope" end
    local v, why = json.decode(body:sub(i + 5, i + 4 + len))
    if type(v) ~= "table" then return nil, "envelope is not a JSON object: " .. tostring(why) end
    out[#out + 1] = { flags = flags, msg = v }
    i = i + 5 + len
  end
  return out
end

-- The request messages, as proto3 JSON: known fields only (strict).
local FIELDS = {
  start = { process = { cmd = "string", args = "list", envs = "map", cwd = "string" }, stdin = "boolean",
            tag = "string", pty = "table" },
  signal = { process = { pid = "number", tag = "string" }, signal = "string" },
  input = { process = { pid = "number", tag = "string" }, input = { stdin = "string", pty = "string" } },
  close = { process = { pid = "number", tag = "string" } },
  list = {},
  path = { path = "string", username = "string" },
  listdir = { path = "string", depth = "number" },
  move = { source = "string", destination = "string" },
}

local function shape(v, want, at)
  for k, val in pairs(v) do
    local w = want[k]
    if w == nil then return at .. ": unknown field '" .. tostring(k) .. "'" end
    if type(w) == "table" then
      if type(val) ~= "table" then return at .. "." .. k .. ": expected an object" end
      local why = shape(val, w, at .. "." .. k)
      if why then return why end
    elseif w == "list" or w == "map" then
      if type(val) ~= "table" then return at .. "." .. k .. ": expected " .. w end
      for _, x in pairs(val) do if type(x) ~= "string" then return at .. "." .. k .. ": strings only" end end
    elseif w == "number" then
      if tonumber(val) == nil then return at .. "." .. k .. ": expected a number" end
    elseif type(val) ~= w then
      return at .. "." .. k .. ": expected " .. w
    end
  end
end

local function path_of(p)
  if type(p) ~= "string" or p == "" then return M.HOME end
  if p:sub(1, 1) ~= "/" then p = M.HOME .. "/" .. p end
  return p
end

local function kind(err) return type(err) == "table" and err.kind or "Error" end
local function text(err) return type(err) == "table" and err.message or tostring(err) end

local function connect_error(res, code, msg)
  return res:send(STATUS[code] or 500, { code = code, message = msg })
end

-- ------------------------------------------------------------ processes

local function end_event(r)
  if r.signal then
    local name = r.signal == "SIGKILL" and "killed" or r.signal:lower():gsub("^sig", "")
    return { event = { ["end"] = { exitCode = -1, status = "signal: " .. name, error = "signal: " .. name } } }
  end
  local e = { exited = true, status = "exit status " .. r.exit_code }
  if r.exit_code ~= 0 then e.exitCode, e.error = r.exit_code, e.status end
  return { event = { ["end"] = e } }
end

local function start(box, req, res)
  local msgs, why = M.envelopes(req.body)
  if not msgs or #msgs ~= 1 then return connect_error(res, "invalid_argument", why or "one message expected") end
  local m = msgs[1].msg
  why = shape(m, FIELDS.start, "StartRequest")
  if why or type(m.process) ~= "table" or type(m.process.cmd) ~= "string" then
    return connect_error(res, "invalid_argument", why or "StartRequest.process.cmd is required")
  end
  local tmo = req.headers["connect-timeout-ms"]
  if tmo and not tmo:match("^%d%d?%d?%d?%d?%d?%d?%d?%d?%d?$") then
    return connect_error(res, "invalid_argument", "bad Connect-Timeout-Ms")
  end
  local ping = tonumber(req.headers["keepalive-ping-interval"] or "")
  res:start(200, { ["Content-Type"] = "application/connect+json" })
  -- split: every envelope goes out in pieces, and pieces of two envelopes share a
  -- chunk (as proxies deliver them): the client must reassemble across chunks
  local held = ""
  local function send(v, flags)
    local e = held .. envelope(flags or 0, v)
    if not box.split then return res:write(e) end
    local cut = math.max(1, #e - 3)
    held = e:sub(cut + 1)
    res:write(e:sub(1, 2))
    res:write(e:sub(3, cut))
    if flags == 2 then res:write(held) held = "" end
  end
  local env = {}
  for k, v in pairs(m.process.envs or {}) do env[k] = v end
  local function out(which) return function(c) send{ event = { data = { [which] = b64.encode(c) } } } end end
  local ok, p = pcall(box.sb.spawn, box.sb, m.process.cmd, m.process.args or {}, {
    env = env, cwd = path_of(m.process.cwd), stdin = (not m.stdin) and "" or nil, max_output_bytes = 0,
    on_stdout = out("stdout"), on_stderr = out("stderr"), timeout = 86400 })
  if not ok then
    if kind(p) == "SandboxExecutionError" then     -- as envd's sh: not found, 127
      box.seq = box.seq + 1
      send{ event = { start = { pid = 100000 + box.seq } } }
      send{ event = { data = { stderr = b64.encode("/bin/sh: 1: exec: " .. m.process.cmd .. ": not found\n") } } }
      send(end_event{ exit_code = 127 })
      send({}, 2)
    else
      send({ error = { code = "internal", message = "error starting process: " .. text(p) } }, 2)
    end
    return res:finish()
  end
  box.procs[p.pid] = p
  send{ event = { start = { pid = p.pid } } }
  local pinger = ping and ping > 0 and loop.spawn(function()
    while true do loop.sleep(ping) send{ event = { keepalive = {} } } end
  end)
  local r = p:wait(tmo and tonumber(tmo) / 1000 or nil)
  if pinger then pinger:cancel() end
  box.procs[p.pid] = nil
  if r.timed_out then
    send({ error = { code = "deadline_exceeded", message = "context deadline exceeded" } }, 2)
  else
    send(end_event(r))
    send({}, 2)
  end
  res:finish()
end

local SIGNALS = { SIGNAL_SIGKILL = "SIGKILL", SIGNAL_SIGTERM = "SIGTERM", SIGNAL_SIGINT = "SIGINT",
                  SIGNAL_SIGHUP = "SIGHUP" }

local function process_of(box, m)
  local pid = m.process and tonumber(m.process.pid)
  return pid and box.procs[math.tointeger(pid)], pid
end

local UNARY = {}
function UNARY.SendSignal(box, m, res)
  local p, pid = process_of(box, m)
  if not p then return connect_error(res, "not_found", "process with pid " .. tostring(pid) .. " not found") end
  local sig = SIGNALS[m.signal]
  if not sig then return connect_error(res, "invalid_argument", "unknown signal " .. tostring(m.signal)) end
  p:kill(sig)
  return res:send(200, {})
end
function UNARY.SendInput(box, m, res)
  local p, pid = process_of(box, m)
  if not p then return connect_error(res, "not_found", "process with pid " .. tostring(pid) .. " not found") end
  local data = b64.decode(m.input and m.input.stdin or "")
  if not data then return connect_error(res, "invalid_argument", "input.stdin is not base64") end
  local ok, why = pcall(p.write, p, data)
  if not ok then return connect_error(res, "failed_precondition", "stdin: " .. text(why)) end
  return res:send(200, {})
end
function UNARY.CloseStdin(box, m, res)
  local p, pid = process_of(box, m)
  if not p then return connect_error(res, "not_found", "process with pid " .. tostring(pid) .. " not found") end
  p:close_stdin()
  return res:send(200, {})
end
function UNARY.List(box, _, res)
  local list = {}
  for pid in pairs(box.procs) do list[#list + 1] = { pid = pid, config = { cmd = "" } } end
  return res:send(200, { processes = list })
end

-- ------------------------------------------------------------ filesystem

local TYPES = { file = "FILE_TYPE_FILE", dir = "FILE_TYPE_DIRECTORY", link = "FILE_TYPE_SYMLINK" }

-- What find says of entries: type, mode, size, mtime, name, link target
-- (one command per call, so modes and symlink targets are the real ones).
local FIND = '[ -e "$1" ] || [ -L "$1" ] || exit 2; if [ "$2" = list ]; then [ -d "$1" ] || exit 20; '
  .. 'exec find "$1" -mindepth 1 -maxdepth 1 -printf "%y %m %s %T@ %f\\0%l\\0"; fi; '
  .. 'exec find "$1" -maxdepth 0 -printf "%y %m %s %T@ %f\\0%l\\0"'
local YTYPE = { f = "FILE_TYPE_FILE", d = "FILE_TYPE_DIRECTORY", l = "FILE_TYPE_SYMLINK" }

-- entries of `path` (how = "list") or the entry itself: list | nil, code, message
local function find(box, path, how)
  local r = box.sb:execute_command("sh", { "-c", FIND, "sh", path, how })
  if r.exit_code == 2 then return nil, "not_found", "path not found: " .. path end
  if r.exit_code == 20 then return nil, "invalid_argument", "path is not a directory: " .. path end
  if r.exit_code ~= 0 then return nil, "internal", r.stderr end
  local out, parts = {}, {}
  for field in r.stdout:gmatch("([^%z]*)%z") do parts[#parts + 1] = field end
  for i = 1, #parts - 1, 2 do
    local y, mode, size, t, name = parts[i]:match("^(%a) (%d+) (%d+) ([%d%.]+) (.*)$")
    if y then
      local full = how == "list" and ((path == "/" and "" or path) .. "/" .. name) or path
      local e = { name = full:match("[^/]+$") or "", type = YTYPE[y] or "FILE_TYPE_UNSPECIFIED", path = full,
                  size = size, mode = tonumber(mode, 8), owner = "user", group = "user",
                  modifiedTime = os.date("!%Y-%m-%dT%H:%M:%SZ", math.floor(tonumber(t))) }
      if y == "l" then e.symlinkTarget = parts[i + 1] end
      out[#out + 1] = e
    end
  end
  return out
end

local function stat(box, path)
  local list = find(box, path, "one")
  return list and list[1]
end

local function fs_failed(res, err, path)
  if kind(err) == "FileNotFoundError" then return connect_error(res, "not_found", "path not found: " .. path) end
  return connect_error(res, "invalid_argument", text(err))
end

function UNARY.Stat(box, m, res)
  local path = path_of(m.path)
  local e = stat(box, path)
  if not e then return connect_error(res, "not_found", "file not found: " .. path) end
  return res:send(200, { entry = e })
end
function UNARY.ListDir(box, m, res)
  local path = path_of(m.path)
  local list, code, msg = find(box, path, "list")
  if not list then return connect_error(res, code, msg) end
  return res:send(200, { entries = list })
end
function UNARY.MakeDir(box, m, res)
  local path = path_of(m.path)
  if stat(box, path) then return connect_error(res, "already_exists", "directory already exists: " .. path) end
  local ok, err = pcall(box.sb.mkdir, box.sb, path)
  if not ok then return fs_failed(res, err, path) end
  return res:send(200, { entry = stat(box, path) })
end
function UNARY.Remove(box, m, res)          -- RemoveAll: a missing path is fine
  local path = path_of(m.path)
  local ok, err = pcall(box.sb.remove, box.sb, path, { recursive = true })
  if not ok and kind(err) ~= "FileNotFoundError" then return fs_failed(res, err, path) end
  return res:send(200, {})
end
function UNARY.Move(box, m, res)
  local src, dst = path_of(m.source), path_of(m.destination)
  local r = box.sb:execute_command("mv", { "--", src, dst })
  if r.exit_code ~= 0 then return connect_error(res, "invalid_argument", r.stderr) end
  return res:send(200, { entry = stat(box, dst) })
end

local SHAPE = { SendSignal = "signal", SendInput = "input", CloseStdin = "close", List = "list", Stat = "path",
                ListDir = "listdir", MakeDir = "path", Remove = "path", Move = "move" }

local function unary(box, name, req, res)
  local fn = UNARY[name]
  if not fn then return connect_error(res, "unimplemented", "no procedure " .. req.path) end
  local ct = (req.headers["content-type"] or ""):lower()
  if not ct:find("application/json", 1, true) then
    return res:send(415, { code = "invalid_argument", message = "unary calls take application/json" })
  end
  local m = json.decode(req.body ~= "" and req.body or "{}")
  if type(m) ~= "table" then return connect_error(res, "invalid_argument", "the body is not a JSON object") end
  local why = shape(m, FIELDS[SHAPE[name]], name .. "Request")
  if why then return connect_error(res, "invalid_argument", why) end
  return fn(box, m, res)
end

-- ------------------------------------------------------------ /files

-- The parts of a multipart/form-data body: { name =, filename =, data = }.
local function multipart(body, ctype)
  local boundary = ctype:match('boundary="([^"]+)"') or ctype:match("boundary=([^;%s]+)")
  if not boundary then return nil, "multipart without a boundary" end
  local sep = "--" .. boundary
  local parts, i = {}, body:find(sep, 1, true)
  if not i then return nil, "no multipart boundary in the body" end
  while true do
    i = i + #sep
    if body:sub(i, i + 1) == "--" then break end
    local hend = body:find("\r\n\r\n", i, true)
    if not hend then return nil, "truncated multipart headers" end
    local head = body:sub(i, hend - 1)
    local nxt = body:find("\r\n" .. sep, hend + 4, true)
    if not nxt then return nil, "truncated multipart part" end
    parts[#parts + 1] = { name = head:match('name="([^"]*)"'), filename = head:match('filename="([^"]*)"'),
                          data = body:sub(hend + 4, nxt - 1) }
    i = nxt + 2
  end
  return parts
end

local function files(box, req, res)
  local path = req.query.path and path_of(req.query.path)
  if req.method == "GET" then
    if not path then return res:send(400, { message = "path is required", code = 400 }) end
    local ok, data = pcall(box.sb.read_file, box.sb, path)
    if ok then return res:send(200, data, { ["Content-Type"] = "application/octet-stream" }) end
    if kind(data) == "FileNotFoundError" then
      return res:send(404, { message = "path '" .. path .. "' does not exist", code = 404 })
    end
    return res:send(400, { message = "path '" .. path .. "' is not a file: " .. text(data), code = 400 })
  elseif req.method == "POST" then
    local ct = req.headers["content-type"] or ""
    local items = {}
    if ct:find("multipart/form-data", 1, true) then
      local parts, why = multipart(req.body, ct)
      if not parts then return res:send(400, { message = why, code = 400 }) end
      for _, p in ipairs(parts) do
        if p.name == "file" then items[#items + 1] = { path = path or path_of(p.filename), data = p.data } end
      end
      if #items == 0 then return res:send(400, { message = "no 'file' field in the form", code = 400 }) end
    else
      if not path then return res:send(400, { message = "path is required", code = 400 }) end
      items[1] = { path = path, data = req.body }
    end
    local out = {}
    for _, it in ipairs(items) do
      local ok, err = pcall(box.sb.write_file, box.sb, it.path, it.data)
      if not ok then return res:send(400, { message = text(err), code = 400 }) end
      out[#out + 1] = { path = it.path, name = it.path:match("[^/]+$"), type = "file" }
    end
    return res:send(200, out)
  end
  return res:send(405, { message = "method not allowed", code = 405 })
end

---Answer an envd request for sandbox `box`.
function M.handle(box, req, res)
  local svc, name = req.path:match("^/([%w%.]+)/(%w+)$")
  if svc == "process.Process" and name == "Start" then return start(box, req, res) end
  if svc == "process.Process" or svc == "filesystem.Filesystem" then return unary(box, name, req, res) end
  if req.path == "/files" then return files(box, req, res) end
  if req.path == "/health" then return res:send(204, "") end
  if req.path == "/envs" then return res:send(200, box.env or {}) end
  return res:send(404, { message = "no route " .. req.path, code = 404 })
end

return M
