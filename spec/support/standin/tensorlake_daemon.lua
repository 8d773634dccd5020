-- The in-sandbox API of the Tensorlake stand-in (spec/support/standin/
-- tensorlake.lua): what the sandbox daemon serves at a sandbox's
-- `sandbox_url` (tensorlakeai/tensorlake crates/cloud-sdk/src/sandboxes/,
-- SandboxProxyClient), over a real sbx sandbox `box.sb`:
--   POST /api/v1/processes/run            SSE: {pid,started_at}, {line,timestamp,stream}..., exit event
--   POST|GET /api/v1/processes, GET|DELETE /api/v1/processes/{pid}
--   POST /api/v1/processes/{pid}/signal|stdin|stdin/close
--   GET  /api/v1/processes/{pid}/stdout|stderr|output[/follow]
--   GET|PUT|DELETE /api/v1/files?path=, GET /api/v1/files/list?path=
--   GET /api/v1/health, /api/v1/info
-- Output is line-based as the daemon's is: each line of a stream is one
-- event (the newline dropped; bytes that are not UTF-8 replaced), so binary
-- output and a missing last newline do not survive. Errors are JSON
-- {"error","code"}; a path with a `..` component is 403.
local loop = require "sbx.loop"
local json = require "cjson"

local M = {}

M.HEARTBEAT = 1          -- seconds between SSE comments while a stream is idle

local SIGNO = { SIGHUP = 1, SIGINT = 2, SIGQUIT = 3, SIGKILL = 9, SIGUSR1 = 10, SIGSEGV = 11,
                SIGUSR2 = 12, SIGPIPE = 13, SIGALRM = 14, SIGTERM = 15 }

-- cjson 2.1 has no array marker: an empty list goes out as this and
-- M.encode turns it into [].
local EMPTY = "\0empty-array\0"
function M.arr(t) return #t == 0 and EMPTY or t end
function M.encode(v)
  return (json.encode(v):gsub('"\\u0000empty%-array\\u0000"', "[]"))
end

local function fail(status, code, msg) return status, { error = msg, code = code } end

-- Invalid UTF-8 becomes U+FFFD, as a Rust String::from_utf8_lossy does.
local function lossy(s)
  if utf8.len(s) then return s end
  local out, i, n = {}, 1, #s
  while i <= n do
    local ok, nxt = pcall(utf8.offset, s, 2, i)
    local ch = ok and nxt and s:sub(i, nxt - 1)
    if ch and utf8.len(ch) == 1 then out[#out + 1] = ch i = nxt
    else out[#out + 1] = "\239\191\189" i = i + 1 end
  end
  return table.concat(out)
end

-- ------------------------------------------------------------ request checking

-- check(body, { field = "string"|"number"|"table"|"boolean"|"any" }, required) -> value | nil, why
local function check(raw, fields, required)
  local ok, v = pcall(json.decode, raw ~= "" and raw or "null")
  if not ok or type(v) ~= "table" then return nil, "Failed to parse the request body as JSON" end
  for k, val in pairs(v) do
    local want = fields[k]
    if not want then
      local names = {}
      for name in pairs(fields) do names[#names + 1] = "`" .. name .. "`" end
      table.sort(names)
      return nil, string.format("unknown field `%s`, expected one of %s", tostring(k), table.concat(names, ", "))
    end
    if want ~= "any" and val ~= json.null and type(val) ~= want then
      return nil, string.format("invalid type for `%s`: expected %s", k, want)
    end
  end
  for _, k in ipairs(required or {}) do
    if v[k] == nil then return nil, "missing field `" .. k .. "`" end
  end
  return v
end

local PROCESS_FIELDS = { command = "string", args = "table", env = "table", working_dir = "string",
  timeout = "number", user = "any", stdin_mode = "string", stdout_mode = "string", stderr_mode = "string",
  name = "string", restart = "table", health_check = "table" }
local RUN_FIELDS = { command = "string", args = "table", env = "table", working_dir = "string",
  timeout = "number", user = "any" }

-- A path the daemon accepts: absolute, no `..` component.
local function checked_path(p)
  if type(p) ~= "string" or p == "" then return nil, 400, "missing query parameter `path`" end
  for part in p:gmatch("[^/]+") do
    if part == ".." then return nil, 403, "path escapes the sandbox: " .. p end
  end
  if p:sub(1, 1) ~= "/" then p = "/" .. p end
  return p
end

-- ------------------------------------------------------------ processes

local function now_ms() return math.floor(os.time() * 1000) end

local function info(pr)
  return { pid = pr.pid, status = pr.status, exit_code = pr.exit_code == nil and json.null or pr.exit_code,
           signal = pr.signal == nil and json.null or pr.signal, oom_killed = false,
           stdin_writable = pr.stdin_open and pr.status == "running", command = pr.command,
           args = M.arr(pr.args), started_at = pr.started_at,
           ended_at = pr.ended_at or json.null }
end

-- Line-splitting sink for one stream of a process.
local function sink(pr, stream)
  local part = ""
  return function(chunk)
    part = part .. chunk
    while true do
      local i = part:find("\n", 1, true)
      if not i then break end
      pr:emit(stream, part:sub(1, i - 1))
      part = part:sub(i + 1)
    end
  end, function() if part ~= "" then pr:emit(stream, part) part = "" end end
end

local Proc = {}
Proc.__index = Proc

function Proc:emit(stream, line)
  local ev = { line = lossy(line), timestamp = now_ms(), stream = stream }
  if stream == "stdout" and self.discard_out or stream == "stderr" and self.discard_err then return end
  self.lines[#self.lines + 1] = ev
  self:wake()
end

function Proc:wake() self.ev:notify() end

-- Wait for the next line or the end, at most a heartbeat's time.
function Proc:await(seen)
  if #self.lines > seen or self.status ~= "running" then return end
  self.ev:wait(M.HEARTBEAT)
end

local function start(box, v, mode)
  local args = {}
  for i, a in ipairs(v.args or {}) do
    if type(a) ~= "string" then return nil, "invalid type for `args`: expected a list of strings" end
    args[i] = a
  end
  local env = {}
  for k, val in pairs(v.env or {}) do
    if type(k) ~= "string" or type(val) ~= "string" then return nil, "invalid type for `env`: expected a map of strings" end
    env[k] = val
  end
  local pr = setmetatable({ command = v.command, args = args, lines = {}, ev = loop.event(), status = "running",
                            started_at = now_ms(), stdin_open = mode == "pipe",
                            discard_out = v.stdout_mode == "discard", discard_err = v.stderr_mode == "discard" }, Proc)
  local out, flush_out = sink(pr, "stdout")
  local err, flush_err = sink(pr, "stderr")
  local opts = { env = env, cwd = v.working_dir, on_stdout = out, on_stderr = err }
  if mode ~= "pipe" then opts.stdin = "" end
  local ok, p = pcall(box.sb.spawn, box.sb, v.command, args, opts)
  if not ok then return nil, p end
  pr.p, pr.pid = p, p.pid
  pr.flush = function() flush_out() flush_err() end
  box.procs[pr.pid] = pr
  box.total = box.total + 1
  return pr
end

-- Wait for the end (with a timeout: kill the tree at it) and record the status.
local function finish(pr, timeout)
  local ok, r = pcall(pr.p.wait, pr.p, timeout)
  pr.flush()
  pr.ended_at = now_ms()
  if not ok then
    pr.status, pr.exit_code, pr.reason = "exited", -1, "exited"
  elseif r.timed_out then
    pr.status, pr.exit_code, pr.signal, pr.reason = "signaled", -9, 9, "timed_out"
  elseif r.signal then
    pr.status, pr.signal, pr.reason = "signaled", SIGNO[r.signal] or 9, "signaled"
  else
    pr.status, pr.exit_code, pr.reason = "exited", r.exit_code, "exited"
  end
  pcall(pr.p.close, pr.p)
  pr:wake()
end

local function exit_event(pr)
  return { exit_code = pr.exit_code == nil and json.null or pr.exit_code,
           signal = pr.signal == nil and json.null or pr.signal, oom_killed = false, reason = pr.reason }
end

local function sse(res)
  res:start(200, { ["Content-Type"] = "text/event-stream", ["Cache-Control"] = "no-cache" })
  return function(v) return res:write("data: " .. M.encode(v) .. "\n\n") end
end

-- Stream lines of `pr` (those of `which`, or all) from the first until it ends.
local function follow(res, pr, which, send, extra)
  local seen = 0
  while true do
    while seen < #pr.lines do
      seen = seen + 1
      local ev = pr.lines[seen]
      if not which or ev.stream == which then
        if not send(ev) then return false end
      end
    end
    if pr.status ~= "running" then break end
    local before = seen
    pr:await(seen)
    if #pr.lines == before and pr.status == "running" then
      if not res:write(": keep-alive\n\n") then return false end      -- an SSE heartbeat
    end
  end
  if extra then send(extra(pr)) end
  return true
end

local function run(box, req, res)
  if not (req.headers.accept or ""):find("text/event-stream", 1, true) then
    return fail(406, "NOT_ACCEPTABLE", "this endpoint answers text/event-stream only")
  end
  local v, why = check(req.body, RUN_FIELDS, { "command" })
  if not v then return fail(400, "INVALID_REQUEST", why) end
  local pr, err = start(box, v, "closed")
  if not pr then return fail(500, "SPAWN_FAILED", "failed to start process: " .. tostring(err)) end
  local send = sse(res)
  send{ pid = pr.pid, started_at = pr.started_at }
  loop.spawn(finish, pr, v.timeout ~= json.null and v.timeout or nil)
  if not follow(res, pr, nil, send, exit_event) and pr.status == "running" then
    pcall(pr.p.kill, pr.p, 9)       -- the client went away: the run ends with its stream
  end
  res:finish()
end

local function lines_of(pr, which)
  local out = {}
  for _, ev in ipairs(pr.lines) do
    if not which or ev.stream == which then out[#out + 1] = ev.line end
  end
  return { pid = pr.pid, lines = M.arr(out), line_count = #out }
end

local function process_route(box, req, res, pid, rest)
  local pr = box.procs[tonumber(pid) or -1]
  if not pr then return fail(404, "NOT_FOUND", "process not found: " .. pid) end
  local m = req.method
  if rest == "" and m == "GET" then return 200, info(pr)
  elseif rest == "" and m == "DELETE" then
    if pr.status == "running" then pcall(pr.p.kill, pr.p, 9) end
    return 200, ""
  elseif rest == "/signal" and m == "POST" then
    local v, why = check(req.body, { signal = "number" }, { "signal" })
    if not v then return fail(400, "INVALID_REQUEST", why) end
    if pr.status == "running" then pcall(pr.p.kill, pr.p, math.floor(v.signal)) end
    return 200, { success = true }
  elseif rest == "/stdin" and m == "POST" then
    if not (pr.stdin_open and pr.status == "running") then return fail(409, "STDIN_CLOSED", "stdin is not writable") end
    local ok, err = pcall(pr.p.write, pr.p, req.body)
    if not ok then return fail(409, "STDIN_CLOSED", type(err) == "table" and err.message or tostring(err)) end
    return 200, ""
  elseif rest == "/stdin/close" and m == "POST" then
    if pr.stdin_open then pr.stdin_open = false pcall(pr.p.close_stdin, pr.p) end
    return 200, ""
  elseif m == "GET" and (rest == "/stdout" or rest == "/stderr" or rest == "/output") then
    return 200, lines_of(pr, rest ~= "/output" and rest:sub(2) or nil)
  elseif m == "GET" and (rest == "/stdout/follow" or rest == "/stderr/follow" or rest == "/output/follow") then
    local which = rest:match("^/(%a+)/")
    local send = sse(res)
    follow(res, pr, which ~= "output" and which or nil, send)
    res:finish()
    return
  end
  return fail(404, "NOT_FOUND", "no route " .. m .. " " .. req.path)
end

-- ------------------------------------------------------------ files

local function kind_status(err)
  local k = type(err) == "table" and err.kind
  if k == "FileNotFoundError" then return 404, "NOT_FOUND" end
  if k == "PathError" then return 403, "FORBIDDEN" end
  return 500, "INTERNAL"
end

local function files(box, req, res, list)
  local path, st, why = checked_path(req.query.path)
  if not path then return fail(st, st == 403 and "FORBIDDEN" or "INVALID_REQUEST", why) end
  local sb, m = box.sb, req.method
  local ok, v = pcall(function()
    if list and m == "GET" then
      local entries = {}
      for _, e in ipairs(sb:list_files(path)) do
        entries[#entries + 1] = { name = e.name, is_dir = e.is_dir and true or false, size = e.size or 0,
                                  modified_at = e.mtime and math.floor(e.mtime * 1000) or json.null }
      end
      return { path = path, entries = M.arr(entries) }
    elseif list then return false
    elseif m == "GET" then return sb:read_file(path)
    elseif m == "PUT" then sb:write_file(path, req.body) return ""
    elseif m == "DELETE" then
      local parent, name = path:match("^(.*)/([^/]+)$")
      local found
      for _, e in ipairs(sb:list_files(parent == "" and "/" or parent)) do
        if e.name == name then found = e end
      end
      if not found then error({ kind = "FileNotFoundError", message = "no such file: " .. path }) end
      sb:remove(path, { recursive = true })
      return ""
    end
    return false
  end)
  if not ok then
    local s, code = kind_status(v)
    return fail(s, code, type(v) == "table" and (v.message or v.msg) or tostring(v))
  end
  if v == false then return fail(405, "METHOD_NOT_ALLOWED", "method not allowed") end
  if type(v) == "string" then
    if m == "GET" and #v > 0 then return 200, v, { ["Content-Type"] = "application/octet-stream" } end
    return 200, v
  end
  return 200, v
end

-- ------------------------------------------------------------ dispatch

function M.new_box(sb)
  return { sb = sb, procs = {}, total = 0, started = loop.now() }
end

---handle(box, req, res): one request of the in-sandbox API.
function M.handle(box, req, res)
  local p, m = req.path, req.method
  if p == "/api/v1/health" and m == "GET" then return 200, { healthy = true } end
  if p == "/api/v1/info" and m == "GET" then
    local running = 0
    for _, pr in pairs(box.procs) do if pr.status == "running" then running = running + 1 end end
    return 200, { version = "standin-0.1", uptime_secs = math.floor(loop.now() - box.started),
                  running_processes = running, total_processes = box.total }
  end
  if p == "/api/v1/processes/run" and m == "POST" then return run(box, req, res) end
  if p == "/api/v1/processes" and m == "POST" then
    local v, why = check(req.body, PROCESS_FIELDS, { "command" })
    if not v then return fail(400, "INVALID_REQUEST", why) end
    local pr, err = start(box, v, v.stdin_mode == "pipe" and "pipe" or "closed")
    if not pr then return fail(500, "SPAWN_FAILED", "failed to start process: " .. tostring(err)) end
    loop.spawn(finish, pr)
    return 200, info(pr)
  end
  if p == "/api/v1/processes" and m == "GET" then
    local out = {}
    for _, pr in pairs(box.procs) do out[#out + 1] = info(pr) end
    table.sort(out, function(a, b) return a.pid < b.pid end)
    return 200, { processes = M.arr(out) }
  end
  local pid, rest = p:match("^/api/v1/processes/(%d+)(.*)$")
  if pid then return process_route(box, req, res, pid, rest) end
  if p == "/api/v1/files" then return files(box, req, res, false) end
  if p == "/api/v1/files/list" then return files(box, req, res, true) end
  return fail(404, "NOT_FOUND", "no route " .. m .. " " .. p)
end

return M
