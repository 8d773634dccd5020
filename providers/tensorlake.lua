-- One file (~710 lines): a provider script cannot `require`; the contract is one file per provider.
-- Tensorlake sandboxes (microVMs) over their HTTP API: the control plane at
-- TENSORLAKE_API_URL (https://api.tensorlake.ai) creates, polls, snapshots
-- and deletes; each running sandbox's daemon at the `sandbox_url` the
-- control plane reports once it runs (never in the create answer) runs
-- processes and serves files. Wire reference: the official SDK's source,
-- tensorlakeai/tensorlake crates/cloud-sdk/src/sandboxes/.
--
-- What Tensorlake cannot do, and how this file deals with it:
-- - no labels: sbxlua's journal is the owner record; gc reaps what a dead
--   session's journal names (reap). Each sandbox is named with sbxlua's id,
--   so a create that timed out or got a 5xx is looked up by that name
--   before it is sent again (a repeated name is a 409), and gc finds a
--   sandbox whose create never answered. Every sandbox has a provider-side
--   timeout of its TTL (at which Tensorlake suspends a named sandbox).
-- - output is line-based (each line one event, its newline dropped, bytes
--   that are not UTF-8 replaced): a command whose output is not streamed
--   writes stdout and stderr to files in the sandbox, read back exactly
--   after it ends; streamed output is delivered line by line, each with a
--   newline (a missing last newline and non-UTF-8 bytes do not survive).
-- - no sandbox-level environment: every process gets req.env.
-- - no mkdir or chmod in the file API: a command does them.
-- (One file over 400 lines: a provider is one file, docs/providers.md.)
local NAME = "tensorlake"
local DEFAULT_URL = "https://api.tensorlake.ai"
local HOME = "/workspace"

-- Runs before the command: cd, check the program exists, say "go", redirect.
-- $1 marker, $2 cwd, $3 stdin file, $4 stdout file, $5 stderr file ("-": none)
local WRAP = 'm=$1 d=$2 i=$3 o=$4 e=$5; shift 5; '
  .. '[ -e "$d" ] || { printf "%s nocwd\\n" "$m"; exit 126; }; '
  .. 'cd -- "$d" 2>/dev/null || { printf "%s notdir\\n" "$m"; exit 126; }; '
  .. 'command -v -- "$1" >/dev/null 2>&1 || { printf "%s noexec\\n" "$m"; exit 127; }; '
  .. 'printf "%s go\\n" "$m"; '
  .. '[ "$i" = - ] || exec <"$i"; [ "$o" = - ] || exec >"$o"; [ "$e" = - ] || exec 2>"$e"; exec "$@"'

local POOLED_MAX = 1 << 20   -- output files bigger than this are removed, not kept for reuse

local SIGNO = { SIGHUP = 1, SIGINT = 2, SIGQUIT = 3, SIGKILL = 9, SIGUSR1 = 10, SIGUSR2 = 12,
                SIGPIPE = 13, SIGALRM = 14, SIGTERM = 15, SIGCONT = 18, SIGSTOP = 19 }


-- every error names the provider, in its fields and its message
local fail = errors.raiser(NAME, NAME .. ": ")

local SCHEMA     -- config_schema, below
local cfg = config

local function settings()
  local c = cfg()
  local key = env(c.api_key_env)
  local url = c.api_url or env(c.api_url_env) or DEFAULT_URL
  return c, key, url
end

local function control()
  local c, key, url = settings()
  if not key or key == "" then fail("AuthenticationError", "set " .. c.api_key_env, { op = "auth" }) end
  local headers = { authorization = "Bearer " .. key }
  if c.organization_id then headers["x-forwarded-organization-id"] = c.organization_id end
  if c.project_id then headers["x-forwarded-project-id"] = c.project_id end
  return cloud.client{ provider = NAME, base = url, headers = headers, timeout = c.request_timeout,
                       deadline = c.request_timeout * 2,
                       quota = { "quota exceeded", "maximum number of" } }
end

-- The daemon of a running sandbox: at a loopback sandbox_url the SDK names
-- the sandbox by Host ({id}.local), elsewhere by X-Tensorlake-Sandbox-Id.
local function daemon(h)
  if h.api then return h.api end
  local _, key = settings()
  local headers = { authorization = "Bearer " .. (key or ""), ["x-tensorlake-sandbox-id"] = h.id }
  local host = h.url:match("^%a+://%[?([^/%]:]+)")
  if host == "localhost" or host == "127.0.0.1" or host == "::1" then headers.host = h.id .. ".local" end
  h.api = cloud.client{ provider = NAME, base = h.url, headers = headers, timeout = cfg().request_timeout,
                        deadline = cfg().request_timeout * 2 }
  return h.api
end

-- ------------------------------------------------------------ paths

local function resolve(h, path, op)
  if type(path) ~= "string" then fail("PathError", op .. ": the path must be a string", { op = op }) end
  local full = path:sub(1, 1) == "/" and path or (HOME .. "/" .. path)
  local parts = {}
  for part in full:gmatch("[^/]+") do
    if part == ".." then
      if #parts == 0 then fail("PathError", op .. ": " .. path .. " leaves the sandbox's root", { op = op, path = path }) end
      parts[#parts] = nil
    elseif part ~= "." then
      parts[#parts + 1] = part
    end
  end
  return "/" .. table.concat(parts, "/")
end

-- A daemon answer that is not 2xx: the typed error (404 a missing file, a
-- JSON 403 a path the daemon refuses; the rest as cloud maps them).
local function file_error(res, op, path)
  local v = json.decode(res.body or "")
  local said = type(v) == "table" and v.error or cloud.message_of(res.body) or ""
  if res.status == 404 and not tostring(said):find("sandbox not found", 1, true) then
    fail("FileNotFoundError", op .. ": " .. path .. ": " .. said, { op = op, path = path, status = 404 })
  end
  if res.status == 403 and type(v) == "table" and v.error then
    fail("PathError", op .. ": " .. path .. ": " .. said, { op = op, path = path, status = 403 })
  end
  error(cloud.error_for(NAME, op, res, nil, nil, {}), 0)
end

local function file_call(h, method, route, path, op, o)
  o = o or {}
  o.query, o.op, o.ok = { path = path }, op, { [403] = true, [404] = true }
  local res = daemon(h):request(method, route, o)
  if res.status >= 400 then file_error(res, op, path) end
  return res
end

-- ------------------------------------------------------------ events

-- An SSE reader over a streaming answer: next() -> the decoded JSON of the
-- next `data:` event (comments and heartbeats skipped), nil at the end.
local MAX_EVENT = 64 << 20
local function events(res)
  local buf, done, from = "", false, 1
  return function()
    while true do
      local i, j = buf:find("\r?\n\r?\n", from)
      if i then
        local block = buf:sub(1, i - 1)
        buf, from = buf:sub(j + 1), 1
        local data = {}
        for line in (block .. "\n"):gmatch("([^\n]*)\n") do
          line = line:gsub("\r$", "")
          local d = line:match("^data: ?(.*)$")
          if d then data[#data + 1] = d end
        end
        if #data > 0 then
          local v = json.decode(table.concat(data, "\n"))
          if type(v) == "table" then return v end
        end
      elseif done then
        return nil
      else
        local chunk = res:read()
        if not chunk then done = true
        else
          from = math.max(1, #buf - 3)       -- a long line is scanned once, not once per chunk
          buf = buf .. chunk
          if #buf > MAX_EVENT then
            fail("SandboxConnectionError", "exec: an event of the output stream is over " .. MAX_EVENT .. " bytes",
                 { op = "exec" })
          end
        end
      end
    end
  end
end

-- ------------------------------------------------------------ processes

local function random_tag() return random_hex(16) end

-- A short helper command (mkdir, chmod, rm): its exit code and stderr.
local function run_cmd(h, argv, what)
  local res = daemon(h):request("POST", "/api/v1/processes/run", {
    op = what, idempotent = false, headers = { accept = "text/event-stream" },
    json = { command = argv[1], args = { table.unpack(argv, 2) }, working_dir = "/" } })
  local body = res.body or ""
  local next_event = events{ read = function() local b = body body = nil return b end }
  local code, err = nil, {}
  for v in next_event do
    if v.line and v.stream == "stderr" then err[#err + 1] = v.line end
    if v.exit_code ~= nil and v.exit_code ~= json.null then code = v.exit_code end
  end
  return code, table.concat(err, "\n")
end

local Run = process_handle.class{
  _more = function(self)
    if self.status then return false end
    local v = self.next()
    if not v then
      self.status = self.status or { kind = "lost", broken = true, why = "the event stream ended without an exit event" }
      return self:_finish()
    end
    if v.line ~= nil then
      local which = v.stream == "stderr" and 2 or 1
      if not self.started then
        local tag, word = tostring(v.line):match("^(%x+) (%a+)$")
        if tag == self.tag then
          if word == "go" then self.started = true
          else self.refused = word end
          return true
        end
      end
      if not self.redirected then self:_deliver(which, v.line .. "\n") end
    elseif v.pid ~= nil and v.exit_code == nil and v.signal == nil then
      self.pid = math.tointeger(v.pid) or self.pid
    elseif v.exit_code ~= nil or v.signal ~= nil or v.reason ~= nil then
      self.status = self:_exit_status(v)
      return self:_finish()
    end
    return true
  end,
  _exit_status = function(self, v)
    if v.reason == "timed_out" then return { kind = "timeout" } end
    if self.expired then return { kind = "killed" } end      -- our kill at the caller's deadline
    if v.signal ~= nil and v.signal ~= json.null and (v.exit_code == nil or v.exit_code == json.null or v.exit_code < 0) then
      return { kind = "signal", n = math.tointeger(v.signal) }
    end
    if v.exit_code ~= nil and v.exit_code ~= json.null then return { kind = "exit", n = math.tointeger(v.exit_code) } end
    return { kind = "lost", why = "the exit event has neither an exit code nor a signal" }
  end,
  -- The end: the prelude's refusal, or the redirected output read back exactly.
  _finish = function(self)
    if self.res then self.res:close() self.res = nil end
    if self.refused == "noexec" then self.status = { kind = "noexec", n = 2 }
    elseif self.refused == "nocwd" then self.status = { kind = "nocwd", n = 2 }
    elseif self.refused == "notdir" then self.status = { kind = "nocwd", n = 20 } end
    if self.redirected and not self.refused and self.status.kind ~= "lost" then
      local function fetch(f)          -- both files at once: one round trip, not two
        return function()
          return daemon(self.h):request("GET", "/api/v1/files", { query = { path = f }, op = "exec output",
            ok = { [404] = true }, max_body = self.max + 1 })
        end
      end
      local outs = { cloud.all(fetch(self.files.out), fetch(self.files.err)) }
      for which, res in ipairs(outs) do
        if res.status == 200 and res.body ~= "" then self:_deliver(which, res.body) end
        if res.truncated then self.truncated = true end
      end
    end
    self:_cleanup()
    self:_ended()
    return false
  end,
  -- The output files go back to the sandbox's pool for the next command
  -- (its redirect truncates them: no DELETE per command); large ones and
  -- those of a command that may still write go.
  _cleanup = function(self)
    local f = self.files
    self.files = nil
    if not f then return end
    local keep = f.out and self.status and self.status.kind ~= "lost" and self.status.kind ~= "killed"
                 and not self.truncated and self.outn + self.errn < POOLED_MAX and #self.h.pool < 8
    for k, path in pairs(f) do
      if not keep or k == "in" then
        pcall(daemon(self.h).request, daemon(self.h), "DELETE", "/api/v1/files",
              { query = { path = path }, op = "exec cleanup", ok = { [404] = true } })
      end
    end
    if keep then self.h.pool[#self.h.pool + 1] = { out = f.out, err = f.err } end
  end,
  _status = function(self) return self.status end,
  running = function(self) return self.status == nil end,
  kill = function(self, sig)
    if self.status or not self.pid then return end
    sig = SIGNO[sig] or tonumber(sig) or 9
    daemon(self.h):request("POST", "/api/v1/processes/" .. self.pid .. "/signal",
      { json = { signal = sig }, op = "signal", ok = { [404] = true } })
  end,
  _write = function(self, data)
    if not self.piped then return nil, "write: stdin is closed", "EPIPE" end
    local ok, err = pcall(daemon(self.h).request, daemon(self.h), "POST", "/api/v1/processes/" .. self.pid .. "/stdin",
      { body = data, op = "stdin", idempotent = false, headers = { ["content-type"] = "application/octet-stream" } })
    if not ok then return nil, "write: " .. tostring(type(err) == "table" and err.message or err), "EPIPE" end
    return true
  end,
  _end_stdin = function(self)
    if self.piped then
      pcall(daemon(self.h).request, daemon(self.h), "POST", "/api/v1/processes/" .. self.pid .. "/stdin/close",
            { op = "stdin close" })
    end
  end,
  _release = function(self)
    if self.res then self.res:close() self.res = nil end
    self.status = self.status or { kind = "killed" }
    pcall(self._cleanup, self)
  end,
  _abandon = function(self) if self.res then self.res:close() self.res = nil end end,
}

local function spawn(h, req)
  if type(req.argv) ~= "table" or #req.argv == 0 then fail("ConfigError", "exec: empty argv", { op = "exec" }) end
  local api = daemon(h)
  local tag = random_tag()
  local cwd = resolve(h, req.cwd or HOME, "exec")
  local base = "/tmp/.sbxlua-" .. tag
  local files, fin, fout, ferr = {}, "-", "-", "-"
  local redirected = not req.stream
  if redirected then
    h.pool = h.pool or {}
    local slot = table.remove(h.pool) or { out = base .. ".out", err = base .. ".err" }
    fout, ferr = slot.out, slot.err
    files.out, files.err = fout, ferr
  end
  if not req.keep_stdin then
    fin = "/dev/null"
    if req.stdin and req.stdin ~= "" then
      fin = base .. ".in"
      files["in"] = fin
      file_call(h, "PUT", "/api/v1/files", fin, "exec stdin", { body = req.stdin })
    end
  end
  local args = { "-c", WRAP, "sbxlua", tag, cwd, fin, fout, ferr }
  for _, a in ipairs(req.argv) do args[#args + 1] = a end
  local envmap = {}
  for _, kv in ipairs(req.env or {}) do
    local k, v = kv:match("^([^=]+)=(.*)$")
    if k then envmap[k] = v end
  end
  local body = { command = "sh", args = args, env = envmap, working_dir = "/" }
  if next(envmap) == nil then body.env = nil end
  local wait = (req.timeout or 86400) + 60
  local hd = process_handle.new(Run, req,
    { h = h, tag = tag, files = files, redirected = redirected, piped = req.keep_stdin })
  if req.keep_stdin then
    body.stdin_mode = "pipe"
    local info = api:json("POST", "/api/v1/processes", { json = body, op = "spawn", idempotent = false })
    hd.pid = math.tointeger(info.pid)
    hd.res = api:request("GET", "/api/v1/processes/" .. hd.pid .. "/output/follow",
      { op = "exec output", stream = true, timeout = wait, headers = { accept = "text/event-stream" } })
    local next_event = events(hd.res)
    hd.next = function()
      local v = next_event()
      if v then return v end
      -- the output ended with the process: its status
      local st = api:json("GET", "/api/v1/processes/" .. hd.pid, { op = "exec status" })
      for _ = 1, 100 do
        if st.status ~= "running" then break end
        timer.sleep(0.05)
        st = api:json("GET", "/api/v1/processes/" .. hd.pid, { op = "exec status" })
      end
      if st.status == "running" then return nil end
      hd.next = function() return nil end
      return { exit_code = st.exit_code, signal = st.signal, reason = st.status }
    end
  else
    if req.timeout then body.timeout = req.timeout end
    hd.res = api:request("POST", "/api/v1/processes/run", { json = body, op = "exec", idempotent = false,
      stream = true, timeout = wait, headers = { accept = "text/event-stream" } })
    hd.next = events(hd.res)
  end
  -- the first event names the pid (a kill needs it)
  while not hd.pid and hd:_more() do end
  return hd
end

-- ------------------------------------------------------------ lifecycle

local function poll_running(api, id, deadline)
  local pause = 0.05
  while true do
    local info = api:json("GET", "/sandboxes/" .. id, { op = "create" })
    if info.status == "running" and type(info.sandbox_url) == "string" and info.sandbox_url ~= "" then
      return info
    end
    if info.status == "failed" or info.status == "terminated" or info.status == "timeout" then
      local why = info.error_details ~= json.null and info.error_details and json.encode(info.error_details)
                  or tostring(info.termination_reason)
      fail("SandboxCreationError", "create: sandbox " .. id .. " ended " .. info.status .. " before it ran (" .. why .. ")",
           { op = "create" })
    end
    if timer.now() + pause > deadline then
      fail("SandboxCreationError", "create: sandbox " .. id .. " was still " .. tostring(info.status)
           .. " after " .. cfg().create_timeout .. " s", { op = "create", retryable = true })
    end
    timer.sleep(pause)
    pause = math.min(pause * 2, 1)
  end
end

-- The sandbox named `name`, or nil (after a create whose answer never came).
local function by_name(api, name)
  local res = api:request("GET", "/sandboxes/" .. http.escape(name), { op = "create (lookup)", ok = { [404] = true } })
  if res.status == 404 then return nil end
  local v = json.decode(res.body or "")
  return type(v) == "table" and type(v.sandbox_id or v.id) == "string" and v or nil
end

local function create(spec)
  local c = cfg()
  local api = control()
  if spec.image ~= nil and type(spec.image) ~= "string" then fail("ConfigError", "create: image must be a string") end
  local body = { resources = { cpus = spec.cpu or c.default_cpu, memory_mb = math.tointeger(spec.memory_mb or c.default_memory_mb) },
                 timeout_secs = math.tointeger(math.ceil(spec.ttl or 3600)),
                 network = { allow_internet_access = spec.allow_internet ~= false } }
  if not body.resources.memory_mb then fail("ConfigError", "create: memory_mb must be an integer", { op = "create" }) end
  body.image = spec.image or c.image
  if spec.disk_mb then body.resources.disk_mb = math.tointeger(spec.disk_mb) end
  if spec.snapshot_id then body.snapshot_id = tostring(spec.snapshot_id) end
  for k, v in pairs(type(spec.backend_options) == "table" and spec.backend_options or {}) do body[k] = v end
  -- sbxlua's id names it: a create sent again after a broken answer finds
  -- the first one (a repeated name is a 409) instead of making a second
  body.name = spec.id
  local deadline = timer.now() + c.create_timeout
  local id, info
  for attempt = 1, 3 do
    local ok, v = pcall(api.json, api, "POST", "/sandboxes", { json = body, op = "create", idempotent = false,
                                                                ok = { [504] = true } })
    if ok and type(v) == "table" and type(v.sandbox_id) == "string" then
      id = v.sandbox_id
      if v.status == "running" and type(v.sandbox_url) == "string" then info = v end
      break
    end
    local err = v
    if ok then    -- a 504 that names no sandbox
      err = errors.new("SandboxConnectionError", NAME .. ": create: HTTP 504: the answer named no sandbox",
                       { backend = NAME, op = "create", retryable = true, status = 504 })
    end
    local conflict = errors.is(err, "SandboxCreationError") and type(err.context) == "table" and err.context.status == 409
    if not conflict and not errors.is(err, "SandboxConnectionError") then error(err, 0) end
    -- the create may have happened behind the broken answer: look before sending it again
    local found = by_name(api, spec.id)
    if found then id = found.sandbox_id or found.id break end
    if conflict or attempt == 3 or timer.now() > deadline then error(err, 0) end
    timer.sleep(0.2 * attempt)
  end
  if not info then
    local ok, v = pcall(poll_running, api, id, deadline)
    if not ok then
      local gone = pcall(api.request, api, "DELETE", "/sandboxes/" .. id, { op = "destroy", ok = { [404] = true } })
      if not gone then spec.left = true end
      error(v, 0)
    end
    info = v
  end
  local h = { id = id, url = info.sandbox_url }
  -- the working directory: made when the image has none (a listing is
  -- cheaper than the sandbox's first process)
  local okl, res = pcall(daemon(h).request, daemon(h), "GET", "/api/v1/files/list",
                         { query = { path = HOME }, op = "create", ok = { [404] = true } })
  local okm, code = okl, 0
  if not okl or res.status == 404 then okm, code = pcall(run_cmd, h, { "mkdir", "-p", HOME }, "create") end
  if not okm or code ~= 0 then
    pcall(api.request, api, "DELETE", "/sandboxes/" .. id, { op = "destroy", ok = { [404] = true } })
    if not okm then error(code, 0) end
    fail("SandboxCreationError", "create: mkdir " .. HOME .. " failed in the new sandbox", { op = "create" })
  end
  return h
end

local function destroy(h)
  if h.destroyed then return end
  control():request("DELETE", "/sandboxes/" .. h.id, { op = "destroy", ok = { [404] = true } })
  h.destroyed = true
end

local function resume(state)
  if type(state) ~= "table" or type(state.sandbox_id) ~= "string" then
    fail("SandboxNotFoundError", "resume: the state names no Tensorlake sandbox", { op = "resume" })
  end
  local api = control()
  local res = api:request("GET", "/sandboxes/" .. state.sandbox_id, { op = "resume" })
  local info = json.decode(res.body) or {}
  if info.status == "suspended" or info.status == "suspending" then     -- past its timeout: wake it
    api:request("POST", "/sandboxes/" .. state.sandbox_id .. "/resume", { op = "resume", idempotent = true })
    info = poll_running(api, state.sandbox_id, timer.now() + cfg().create_timeout)
  end
  if info.status ~= "running" or type(info.sandbox_url) ~= "string" then
    fail("SandboxNotFoundError", "resume: sandbox " .. state.sandbox_id .. " is " .. tostring(info.status),
         { op = "resume" })
  end
  return { id = state.sandbox_id, url = info.sandbox_url }
end

local function is_alive(h)
  if h.destroyed then return false end
  local ok, info = pcall(function() return control():json("GET", "/sandboxes/" .. h.id, { op = "is_alive", deadline = 5 }) end)
  return ok and type(info) == "table" and info.status == "running"
end

local function snapshot(h)
  local api = control()
  local v = api:json("POST", "/sandboxes/" .. h.id .. "/snapshot", { json = { snapshot_type = "filesystem" },
                                                                       op = "snapshot", idempotent = false })
  local sid = v and v.snapshot_id
  if type(sid) ~= "string" then fail("SandboxExecutionError", "snapshot: the answer named no snapshot", { op = "snapshot" }) end
  local stop, pause = timer.now() + cfg().create_timeout, 0.05
  while true do
    local s = api:json("GET", "/snapshots/" .. sid, { op = "snapshot" })
    if s.status == "completed" or s.status == "local_ready" then return { snapshot_id = sid } end
    if s.status == "failed" then
      fail("SandboxExecutionError", "snapshot " .. sid .. " failed: " .. tostring(s.error), { op = "snapshot" })
    end
    if timer.now() > stop then fail("SandboxExecutionError", "snapshot " .. sid .. " is not done", { op = "snapshot" }) end
    timer.sleep(pause)
    pause = math.min(pause * 2, 1)
  end
end

-- ------------------------------------------------------------ files

local function read_file(h, path, max)
  local p = resolve(h, path, "read_file")
  local res = file_call(h, "GET", "/api/v1/files", p, "read_file", { max_body = max })
  return res.body or ""
end

local function write_file(h, path, data, mode)
  local p = resolve(h, path, "write_file")
  file_call(h, "PUT", "/api/v1/files", p, "write_file",
            { body = data, headers = { ["content-type"] = "application/octet-stream" } })
  if mode and mode ~= 420 then
    local code, err = run_cmd(h, { "chmod", string.format("%o", mode & 4095), p }, "write_file")
    if code ~= 0 then fail("SandboxExecutionError", "write_file: chmod " .. p .. ": " .. err, { op = "write_file" }) end
  end
end

local function list_files(h, path)
  local p = resolve(h, path or ".", "list_files")
  local res = file_call(h, "GET", "/api/v1/files/list", p, "list_files")
  local v = json.decode(res.body or "")
  if type(v) ~= "table" or type(v.entries) ~= "table" then
    fail("SandboxConnectionError", "list_files: the answer is not a directory listing", { op = "list_files" })
  end
  local out = {}
  for _, e in ipairs(v.entries) do
    out[#out + 1] = { name = e.name, type = e.is_dir and "dir" or "file", is_dir = e.is_dir and true or false,
                      size = math.tointeger(e.size) or 0,
                      mtime = type(e.modified_at) == "number" and math.tointeger(e.modified_at > 1e11 and e.modified_at // 1000
                                                                                 or e.modified_at // 1) or nil }
  end
  table.sort(out, function(a, b) return a.name < b.name end)
  return out
end

local function helper(h, argv, op, path)
  local code, err = run_cmd(h, argv, op)
  if code == 0 then return end
  if err:find("No such file", 1, true) then fail("FileNotFoundError", op .. ": " .. path .. ": " .. err, { op = op, path = path }) end
  if err:find("Directory not empty", 1, true) or err:find("Is a directory", 1, true) then
    fail("PathError", op .. ": " .. path .. ": " .. err, { op = op, path = path })
  end
  fail("SandboxExecutionError", op .. ": " .. path .. ": " .. err, { op = op, path = path })
end

local function mkdir(h, path)
  local p = resolve(h, path, "mkdir")
  helper(h, { "mkdir", "-p", "--", p }, "mkdir", p)
end

local function remove(h, path, recursive)
  local p = resolve(h, path, "remove")
  if p == "/" then fail("PathError", "remove: refusing to remove /", { op = "remove" }) end
  if recursive then
    file_call(h, "DELETE", "/api/v1/files", p, "remove")
  else
    helper(h, { "rm", "-d", "--", p }, "remove", p)
  end
end

-- ------------------------------------------------------------ trees

local PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

-- A command whose output must come back exactly (through files).
local function exact(h, argv, op)
  local hd = spawn(h, { argv = argv, env = { PATH }, max_output = 64 << 20 })
  local r = hd:wait()
  hd:close()
  if r.exit_code ~= 0 then
    if r.stderr:find("No such file or directory", 1, true) then
      fail("FileNotFoundError", op .. ": " .. r.stderr:gsub("%s+$", ""), { op = op })
    end
    fail("SandboxExecutionError", op .. ": " .. argv[1] .. " exited " .. tostring(r.exit_code or r.signal)
         .. ": " .. r.stderr, { op = op })
  end
  return r.stdout
end

local function join(a, b) return a:gsub("/+$", "") .. "/" .. b end

-- Whether a link at `rel` (inside the tree) to `target` points out of it.
local function link_escapes(rel, target)
  if target:sub(1, 1) == "/" then return true end
  local depth = 0
  for _ in rel:gmatch("/") do depth = depth + 1 end
  for part in target:gmatch("[^/]+") do
    if part == ".." then depth = depth - 1 if depth < 0 then return true end
    elseif part ~= "." then depth = depth + 1 end
  end
  return false
end

-- download_dir: one listing (types, modes, link targets), then each file.
local function get_tree(h, dir)
  local d = resolve(h, dir, "download_dir")
  local listing = exact(h, { "find", d, "-mindepth", "1", "-printf", "%y %m %P\\0%l\\0" }, "download_dir")
  local entries, rejected = {}, {}
  for kind, mode, rel, target in listing:gmatch("(%a) (%d+) ([^%z]*)%z([^%z]*)%z") do
    if kind == "d" then entries[#entries + 1] = { path = rel, type = "dir", mode = tonumber(mode, 8) }
    elseif kind == "f" then
      entries[#entries + 1] = { path = rel, type = "file", mode = tonumber(mode, 8), data = read_file(h, join(d, rel)) }
    elseif kind == "l" then
      if link_escapes(rel, target) then rejected[#rejected + 1] = { path = rel, reason = "symlink out of the directory" }
      else entries[#entries + 1] = { path = rel, type = "symlink" } end
    else
      entries[#entries + 1] = { path = rel, type = "other" }
    end
  end
  if #listing > 0 and #entries + #rejected == 0 then
    fail("SandboxExecutionError", "download_dir: find's listing could not be read", { op = "download_dir" })
  end
  return entries, rejected
end

-- upload_dir: one mkdir for every directory, a PUT per file, one command
-- for the modes that are not the defaults.
local function put_tree(h, dir, entries)
  local d = resolve(h, dir, "upload_dir")
  local dirs, modes = { "mkdir", "-p", "--", d }, {}
  for _, e in ipairs(entries) do
    if e.type == "dir" then dirs[#dirs + 1] = join(d, e.path) end
  end
  helper(h, dirs, "upload_dir", d)
  for _, e in ipairs(entries) do
    local p = join(d, e.path)
    if e.type == "file" then
      local data = e.data
      if data == nil and e.src then
        local parts, off = {}, 0
        repeat
          local chunk, err = e.src:read_at(e.path, off, 1 << 20)
          if not chunk then fail("FileNotFoundError", "upload_dir: " .. tostring(err), { op = "upload_dir" }) end
          parts[#parts + 1] = chunk
          off = off + #chunk
        until #chunk < (1 << 20)
        data = table.concat(parts)
      end
      file_call(h, "PUT", "/api/v1/files", p, "upload_dir",
                { body = data or "", headers = { ["content-type"] = "application/octet-stream" } })
    end
    local default = e.type == "dir" and 493 or 420
    if e.mode and e.mode & 4095 ~= default and (e.type == "file" or e.type == "dir") then
      modes[#modes + 1] = string.format("%o", e.mode & 4095)
      modes[#modes + 1] = p
    end
  end
  for i = 1, #modes, 400 do
    local argv = { "sh", "-c", 'while [ $# -gt 1 ]; do chmod -- "$1" "$2" || exit 1; shift 2; done', "sh" }
    for j = i, math.min(i + 399, #modes) do argv[#argv + 1] = modes[j] end
    helper(h, argv, "upload_dir", d)
  end
end

-- ------------------------------------------------------------ the provider

SCHEMA = {
    api_key_env = { type = "env", default = "TENSORLAKE_API_KEY", help = "the variable holding the API key" },
  api_url_env = { type = "env", default = "TENSORLAKE_API_URL", help = "the variable holding the API's base URL" },
  api_url = { type = "string", help = "the API's base URL (over $TENSORLAKE_API_URL)" },
  organization_id = { type = "string", help = "X-Forwarded-Organization-Id, for personal tokens" },
  project_id = { type = "string", help = "X-Forwarded-Project-Id, for personal tokens" },
  image = { type = "string", help = "the image of sandboxes whose request names none" },
  default_cpu = { type = "number", default = 1 },
  default_memory_mb = { type = "integer", default = 1024 },
  create_timeout = { type = "number", default = 300, help = "seconds a create may take until the sandbox runs" },
  request_timeout = { type = "number", default = 30, help = "seconds per HTTP request" },
}

return {
  descriptor = {
    name = NAME, description = "Tensorlake sandboxes (microVMs) over their HTTP API",
    isolation = "microvm",
    capabilities = { "exec", "files", "streaming", "background", "resume", "snapshot", "network" },
    options = { image = true, cpu = true, memory_mb = true, disk_mb = true, allow_internet = true,
                snapshot_id = true, backend_options = true },
    price = { per_vcpu_hour = 0.05, per_gib_hour = 0.015 },
  },
  config_schema = SCHEMA,
  available = function()
    local c, key = settings()
    if not key or key == "" then return false, "set " .. c.api_key_env end
    return true
  end,
  doctor = function()
    local c, key, url = settings()
    if not key or key == "" then
      return { { ok = false, what = "tensorlake", detail = "$" .. c.api_key_env .. " is not set",
                 fix = "set " .. c.api_key_env } }
    end
    local ok, err = pcall(function() return control():json("GET", "/sandboxes", { op = "list", deadline = 10 }) end)
    return { { ok = ok, what = "tensorlake", detail = ok and ("the API at " .. url .. " answers")
               or tostring(type(err) == "table" and err.message or err),
               fix = not ok and ("check $" .. c.api_key_env .. " and the API URL " .. url) or nil } }
  end,
  create = create,
  destroy = destroy,
  spawn = spawn,
  session_state = function(h) return { sandbox_id = h.id, sandbox_url = h.url } end,
  resume = resume,
  is_alive = is_alive,
  home = function() return HOME end,
  read_file = read_file,
  write_file = write_file,
  list_files = list_files,
  mkdir = mkdir,
  remove = remove,
  snapshot = snapshot,
  put_tree = put_tree,
  get_tree = get_tree,
  -- gc: what a dead session's journal names, by its sandbox id, or by
  -- its name (sbxlua's id) when the session died before the create answered
  reap = function(entry)
    local id = type(entry.state) == "table" and entry.state.sandbox_id or entry.id
    control():request("DELETE", "/sandboxes/" .. http.escape(id), { op = "gc", ok = { [404] = true } })
  end,
}
