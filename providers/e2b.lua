-- One file (~590 lines): a provider script cannot `require`; the contract is one file per provider.
-- E2B (https://e2b.dev): Firecracker microVMs from templates, driven over
-- its two HTTP APIs (../docs/providers.md; wire facts in NOTES.md, "E2B"):
-- the control plane (E2B_API_URL, X-API-Key) creates, lists, snapshots
-- and kills sandboxes; each sandbox's envd (E2B_SANDBOX_URL with the
-- E2b-Sandbox-Id/-Port headers, else https://49983-<id>.<domain>) runs
-- commands (Connect server-streaming, JSON codec) and moves files.
--
-- Commands run as `/bin/sh -c WRAP sbx CWD ARGV...`: WRAP changes to the
-- working directory and checks the program first, so a missing program or
-- working directory is told apart from a command's own exit 127 (a marker
-- on stderr that never reaches the caller). A timeout kills on the
-- provider: envd ends the stream at Connect-Timeout-Ms, and the client
-- sends SIGKILL itself when its own clock runs out first (closing the
-- stream does not kill the command on E2B).
--
-- cpu and memory are per template on E2B: asking for them is a
-- FeatureNotSupportedError (the descriptor does not list them).
local DEFAULT_API = "https://api.e2b.app"
local ENVD_PORT = "49983"
local MARK = "\0sbxe2b:"
local MAX_ENVELOPE = 64 << 20
local CHUNK = 1 << 20                   -- stdin per SendInput call

local WRAP = 'd=$1; shift; m() { printf "\\000sbxe2b:%s:%s\\n" "$1" "$2" >&2; exit 127; }\n'
  .. 'if [ -n "$d" ]; then [ -e "$d" ] || m nocwd 2; [ -d "$d" ] || m nocwd 20; cd -- "$d" || m nocwd 13; fi\n'
  .. 'case $1 in */*) [ -e "$1" ] || m noexec 2; [ -x "$1" ] && [ ! -d "$1" ] || m noexec 13;;\n'
  .. '*) command -v -- "$1" >/dev/null 2>&1 || m noexec 2;; esac\n'
  .. 'exec "$@"'

local SIGNUM = { SIGHUP = 1, SIGINT = 2, SIGQUIT = 3, SIGKILL = 9, SIGUSR1 = 10, SIGUSR2 = 12, SIGTERM = 15 }
local SIGNAME = { [1] = "SIGNAL_SIGHUP", [2] = "SIGNAL_SIGINT", [9] = "SIGNAL_SIGKILL", [15] = "SIGNAL_SIGTERM" }
local FILE_TYPE = { FILE_TYPE_FILE = "file", FILE_TYPE_DIRECTORY = "dir", FILE_TYPE_SYMLINK = "link" }

local P = {}

-- config() over the schema's defaults (a config given as a table may leave keys out)
local function cfg()
  local c = config()
  for k, v in pairs(P.config_schema) do if c[k] == nil then c[k] = v.default end end
  return c
end

-- A variable the config names (nil when this config does not name it).
local function var(name)
  local ok, v = pcall(env, name)
  if ok and v ~= "" then return v end
end

local function settings()
  local c = cfg()
  return c, var(c.api_key_env), var(c.api_url_env) or c.api_url or DEFAULT_API, var(c.sandbox_url_env) or c.sandbox_url
end

local clients = {}
local function control()
  local c, key, base = settings()
  if not key or key == "" then
    errors.raise("AuthenticationError", "e2b: set " .. c.api_key_env, { backend = "e2b", op = "create" })
  end
  local id = base .. "\0" .. key
  if not clients[id] then
    clients[id] = cloud.client{ provider = "e2b", base = base, timeout = c.request_timeout,
      deadline = c.request_timeout * 2, headers = { ["x-api-key"] = key },
      quota = { "maximum number of concurrent" }, not_found = { "sandbox was not found", "doesn't exist" } }
  end
  return clients[id]
end

-- The envd client of handle h (made once per handle).
local function envd(h)
  if h.envd then return h.envd end
  local c, _, _, sandbox_url = settings()
  local headers = { ["x-access-token"] = h.token }
  local base = sandbox_url
  if base then
    headers["e2b-sandbox-id"], headers["e2b-sandbox-port"] = h.sandbox_id, ENVD_PORT
  else
    base = "https://" .. ENVD_PORT .. "-" .. h.sandbox_id .. "." .. (h.domain or c.domain)
  end
  h.envd = cloud.client{ provider = "e2b", base = base, timeout = c.request_timeout,
    deadline = c.request_timeout * 2, headers = headers, not_found = { "sandbox was not found" } }
  return h.envd
end

-- ------------------------------------------------------------ paths

-- An absolute, normalized path for `path` (relative to home); PathError
-- when `..` climbs above the root.
local function resolve(path, op)
  if path == nil or path == "" then path = "." end
  if path:sub(1, 1) ~= "/" then path = cfg().workdir .. "/" .. path end
  local out = {}
  for seg in path:gmatch("[^/]+") do
    if seg == ".." then
      if #out == 0 then errors.raise("PathError", "e2b: " .. op .. ": " .. path .. " climbs above /", { backend = "e2b", op = op }) end
      out[#out] = nil
    elseif seg ~= "." then
      out[#out + 1] = seg
    end
  end
  return "/" .. table.concat(out, "/")
end

local function rpc(h, name, body, op, ok)
  local ok_ = ok or { [400] = true, [404] = true, [409] = true }
  local v, res = envd(h):json("POST", "/" .. name, { json = body, op = op, ok = ok_, idempotent = true,
    headers = { ["connect-protocol-version"] = "1" } })
  return v or {}, res.status
end

local function fs_error(status, v, op, path)
  local msg = "e2b: " .. op .. ": " .. path .. ": " .. tostring(v.message or ("HTTP " .. status))
  if status == 404 then errors.raise("FileNotFoundError", msg, { backend = "e2b", op = op, status = status }) end
  errors.raise("PathError", msg, { backend = "e2b", op = op, status = status })
end

-- ------------------------------------------------------------ commands

local function envelope(v)
  local s = json.encode(v)
  return string.pack(">B I4", 0, #s) .. s
end

local Proc = process_handle.class{}

-- Take every whole envelope from the buffer.
function Proc:_envelopes()
  while #self.buf - self.at + 1 >= 5 do
    local flags, len = string.unpack(">B I4", self.buf, self.at)
    if len > MAX_ENVELOPE then return self:_lost("an envelope of " .. len .. " bytes", true) end
    if #self.buf - self.at + 1 < 5 + len then break end
    local msg = json.decode(self.buf:sub(self.at + 5, self.at + 4 + len))
    self.at = self.at + 5 + len
    if type(msg) ~= "table" then return self:_lost("an envelope that is not JSON", true) end
    if flags & 2 ~= 0 then return self:_eos(msg) end
    self:_event(type(msg.event) == "table" and msg.event or {})
  end
  if self.at > 65536 then self.buf, self.at = self.buf:sub(self.at), 1 end
end

function Proc:_event(e)
  if e.start then
    self.pid = math.tointeger(tonumber(e.start.pid))
  elseif e.data then
    for which, key in ipairs{ "stdout", "stderr" } do
      local d = e.data[key] and base64.decode(e.data[key])
      if d then
        if which == 2 and not self.seen_err and d:sub(1, #MARK) == MARK then
          local what, n = d:match("^%z*sbxe2b:(%w+):(%d+)")
          self.pre = { kind = what, n = tonumber(n) }
        else
          self:_deliver(which, d)
        end
        if which == 2 then self.seen_err = true end
      end
    end
  elseif e["end"] then
    local st, code = e["end"].status or "", tonumber(e["end"].exitCode or 0)
    local sig = st:match("^signal: (%a+)")
    if self.pre and code == 127 then
      self.result = self.pre
    elseif self.timed or self.expired then
      self.result = { kind = "timeout" }
    elseif sig then
      self.result = { kind = "signal", n = sig == "killed" and 9 or SIGNUM["SIG" .. sig:upper()] or 15 }
    else
      self.result = { kind = "exit", n = math.tointeger(code) or 0 }
    end
  end
end

function Proc:_eos(msg)
  local err = type(msg.error) == "table" and msg.error or nil
  if err and err.code == "deadline_exceeded" then
    self.result = { kind = "timeout" }
  elseif err and not self.result then
    self.result = { kind = "lost", why = tostring(err.code) .. ": " .. tostring(err.message) }
  end
  self:_finish()
end

function Proc:_lost(why, broken)
  if not self.result then self.result = { kind = "lost", why = why, broken = broken } end
  self:_finish()
end

function Proc:_finish()
  if not self.result then self.result = { kind = "lost", why = "the stream ended without the command's end", broken = true } end
  self.over = true
  if self.res then self.res:close() self.res = nil end
  self:_ended()
end

function Proc:_more()
  if self.over then return false end
  local chunk, why, code = self.res:read()
  if not chunk then
    if self.deadline and timer.now() >= self.deadline - 0.05 then
      self.timed = true
      pcall(self.kill, self, 9)          -- closing the stream does not kill it on E2B
      self.result = { kind = "timeout" }
    end
    self:_lost(why or "the stream ended early", true)
    return false
  end
  self.buf = self.buf .. chunk
  self:_envelopes()
  return not self.over
end

function Proc:_status() return self.result end
function Proc:running() return not self.over end

function Proc:kill(sig)
  if self.over or not self.pid then return end
  sig = SIGNUM[sig] or tonumber(sig) or 9
  rpc(self.h, "process.Process/SendSignal", { process = { pid = self.pid }, signal = SIGNAME[sig] or "SIGNAL_SIGKILL" },
      "kill", { [404] = true })
end

function Proc:_write(data)
  for i = 1, #data, CHUNK do
    local ok, err = pcall(rpc, self.h, "process.Process/SendInput",
      { process = { pid = self.pid }, input = { stdin = base64.encode(data:sub(i, i + CHUNK - 1)) } }, "write", {})
    if not ok then return nil, "write: " .. tostring(type(err) == "table" and err.message or err), "EPIPE" end
  end
  return true
end

function Proc:_end_stdin()
  pcall(rpc, self.h, "process.Process/CloseStdin", { process = { pid = self.pid } }, "close_stdin", { [404] = true })
end

function Proc:_release()
  if not self.result then self.result = { kind = "killed" } end
  self.over = true
  if self.res then self.res:close() self.res = nil end
end

function Proc:_abandon() if self.res then self.res:close() self.res = nil end end

function P.spawn(h, req)
  local cwd = resolve(req.cwd or cfg().workdir, "exec")
  local args = { "-c", WRAP, "sbx", cwd }
  for _, a in ipairs(req.argv) do args[#args + 1] = a end
  local envs = {}
  for _, kv in ipairs(req.env or {}) do
    local k, v = kv:match("^([^=]+)=(.*)$")
    if k then envs[k] = v end
  end
  local stdin = req.keep_stdin or req.stdin ~= nil
  local headers = { ["content-type"] = "application/connect+json", ["connect-protocol-version"] = "1",
                    ["keepalive-ping-interval"] = "50" }
  local wait = req.timeout and req.timeout > 0 and req.timeout or 7 * 86400
  if req.timeout and req.timeout > 0 then
    headers["connect-timeout-ms"] = tostring(math.floor((req.timeout + 2) * 1000))
  end
  local res = envd(h):request("POST", "/process.Process/Start", {
    body = envelope{ process = { cmd = "/bin/sh", args = args, envs = envs }, stdin = stdin },
    headers = headers, stream = true, idempotent = false, op = "exec", timeout = wait, deadline = wait })
  local p = process_handle.new(Proc, req, { h = h, res = res, buf = "", at = 1,
                                            deadline = req.timeout and timer.now() + wait })
  while not p.pid and not p.over do p:_more() end       -- the start event: the pid
  if p.pid and req.stdin ~= nil then
    if #req.stdin > 0 then p:_write(req.stdin) end
    p:close_stdin()
  end
  return p
end

-- ------------------------------------------------------------ files

function P.home() return cfg().workdir end

function P.read_file(h, path, max)
  local abs = resolve(path, "read_file")
  local res = envd(h):request("GET", "/files", { query = { path = abs }, op = "read_file", ok = { [400] = true, [404] = true } })
  if res.status >= 400 then fs_error(res.status, json.decode(res.body or "") or {}, "read_file", abs) end
  local data = res.body or ""
  if max and #data > max then data = data:sub(1, max) end
  return data
end

function P.write_file(h, path, data, mode)
  local abs = resolve(path, "write_file")
  local res = envd(h):request("POST", "/files", { query = { path = abs }, body = data, op = "write_file",
    headers = { ["content-type"] = "application/octet-stream" }, idempotent = true, ok = { [400] = true } })
  if res.status >= 400 then fs_error(res.status, json.decode(res.body or "") or {}, "write_file", abs) end
  if mode and mode ~= 420 then            -- envd writes 0644; other modes through chmod
    local p <close> = P.spawn(h, { argv = { "chmod", string.format("%o", mode), "--", abs }, timeout = 60 })
    local r = p:wait()
    if r.exit_code ~= 0 then errors.raise("PathError", "e2b: write_file: chmod " .. abs .. ": " .. r.stderr, { backend = "e2b", op = "write_file" }) end
  end
end

local function mtime(s)
  local y, mo, d, hh, mm, ss = tostring(s or ""):match("^(%d+)-(%d+)-(%d+)T(%d+):(%d+):(%d+)")
  if not y then return 0 end
  local t = os.time{ year = tonumber(y), month = tonumber(mo), day = tonumber(d), hour = tonumber(hh),
                     min = tonumber(mm), sec = tonumber(ss), isdst = false }
  local now = os.time()
  return math.tointeger(t + (now - os.time(os.date("!*t", now)))) or 0
end

local function entry(e)
  local t = FILE_TYPE[e.type] or "other"
  return { name = e.name, type = t, is_dir = t == "dir", target = e.symlinkTarget, size = math.tointeger(tonumber(e.size or 0)) or 0,
           mode = math.tointeger(tonumber(e.mode or 0)), mtime = mtime(e.modifiedTime) }
end

function P.list_files(h, path)
  local abs = resolve(path, "list_files")
  local v, status = rpc(h, "filesystem.Filesystem/ListDir", { path = abs, depth = 1 }, "list_files")
  if status >= 400 then fs_error(status, v, "list_files", abs) end
  local out = {}
  for _, e in ipairs(v.entries or {}) do out[#out + 1] = entry(e) end
  table.sort(out, function(a, b) return a.name < b.name end)
  return out
end

function P.stat(h, path)
  local abs = resolve(path, "stat")
  local v, status = rpc(h, "filesystem.Filesystem/Stat", { path = abs }, "stat")
  if status >= 400 then fs_error(status, v, "stat", abs) end
  return entry(v.entry or {})
end

function P.mkdir(h, path)
  local abs = resolve(path, "mkdir")
  local v, status = rpc(h, "filesystem.Filesystem/MakeDir", { path = abs }, "mkdir")
  if status == 409 then
    if P.stat(h, abs).type ~= "dir" then fs_error(400, { message = "exists and is not a directory" }, "mkdir", abs) end
  elseif status >= 400 then
    fs_error(status, v, "mkdir", abs)
  end
end

function P.remove(h, path, recursive)
  local abs = resolve(path, "remove")
  if abs == "/" then fs_error(400, { message = "refusing to remove /" }, "remove", abs) end
  local st = P.stat(h, abs)                       -- FileNotFoundError when missing
  if st.type == "dir" and not recursive and #P.list_files(h, abs) > 0 then
    fs_error(400, { message = "directory not empty (use recursive)" }, "remove", abs)
  end
  local v, status = rpc(h, "filesystem.Filesystem/Remove", { path = abs }, "remove")
  if status >= 400 then fs_error(status, v, "remove", abs) end
end

local function join(a, b) return (a:gsub("/+$", "")) .. "/" .. b end

-- upload_dir: each file in one upload, then one chmod for the modes envd does not set.
function P.put_tree(h, dir, entries)
  local base = resolve(dir, "upload_dir")
  P.mkdir(h, base)
  local chmod = {}
  for _, e in ipairs(entries) do
    local path = join(base, e.path)
    if e.type == "dir" then
      P.mkdir(h, path)
      if e.mode and e.mode ~= 493 then chmod[#chmod + 1] = { e.mode, path } end
    elseif e.type == "file" then
      local data = e.data
      if not data and e.src then
        local parts, off = {}, 0
        repeat
          local c, err = e.src:read_at(e.path, off, CHUNK)
          if not c then errors.raise("PathError", "e2b: upload_dir: " .. tostring(err), { backend = "e2b", op = "upload_dir" }) end
          parts[#parts + 1], off = c, off + #c
        until #c < CHUNK
        data = table.concat(parts)
      end
      P.write_file(h, path, data or "")
      if e.mode and e.mode ~= 420 then chmod[#chmod + 1] = { e.mode, path } end
    end
  end
  if #chmod > 0 then
    local script, argv = 'while [ $# -gt 0 ]; do chmod "$1" -- "$2" || exit 1; shift 2; done', { "sh", "-c" }
    argv[3], argv[4] = script, "sh"
    for _, m in ipairs(chmod) do argv[#argv + 1] = string.format("%o", m[1]) argv[#argv + 1] = m[2] end
    local p <close> = P.spawn(h, { argv = argv, cwd = "/", timeout = 120 })
    local r = p:wait()
    if r.exit_code ~= 0 then errors.raise("PathError", "e2b: upload_dir: chmod: " .. r.stderr, { backend = "e2b", op = "upload_dir" }) end
  end
end

-- download_dir: a walk over ListDir; a link is rejected when it leads out of `dir`.
function P.get_tree(h, dir)
  local base = resolve(dir, "download_dir")
  local entries, rejected = {}, {}
  local function walk(rel)
    for _, it in ipairs(P.list_files(h, rel == "" and base or join(base, rel))) do
      local r = rel == "" and it.name or rel .. "/" .. it.name
      if it.type == "dir" then
        entries[#entries + 1] = { path = r, type = "dir", mode = it.mode }
        walk(r)
      elseif it.type == "file" then
        entries[#entries + 1] = { path = r, type = "file", mode = it.mode, data = P.read_file(h, join(base, r)) }
      elseif it.type == "link" then
        local t = it.target or ""
        local at = t:sub(1, 1) == "/" and t or join(rel == "" and base or join(base, rel), t)
        local ok, abs = pcall(resolve, at, "download_dir")
        if not ok or (abs ~= base and abs:sub(1, #base + 1) ~= base .. "/") then
          rejected[#rejected + 1] = { path = r, reason = "a link out of the directory" }
        end
      end
    end
  end
  walk("")
  return entries, rejected
end

-- ------------------------------------------------------------ lifecycle

local function handle(sb, spec_id)
  return { sandbox_id = sb.sandboxID, token = sb.envdAccessToken ~= json.null and sb.envdAccessToken or nil,
           domain = sb.domain ~= json.null and sb.domain or nil, id = spec_id }
end

-- Every sandbox whose metadata has all of `want` (running and paused).
local function listed(want)
  local q = {}
  for k, v in pairs(want) do q[#q + 1] = http.escape(k) .. "=" .. http.escape(v) end
  table.sort(q)
  local out, token = {}, nil
  for _ = 1, 1000 do
    local list, res = control():json("GET", "/v2/sandboxes", { op = "list", query = { metadata = table.concat(q, "&"),
      state = "running,paused", limit = 100, nextToken = token } })
    for _, s in ipairs(list or {}) do out[#out + 1] = s end
    token = res.headers["x-next-token"]
    if not token or token == "" then break end
  end
  return out
end

local function connect(sandbox_id, ttl, spec_id)
  local sb = control():json("POST", "/sandboxes/" .. sandbox_id .. "/connect",
    { json = { timeout = math.max(1, math.floor(ttl or 300)) }, op = "resume", idempotent = true })
  return handle(sb, spec_id)
end

function P.create(spec)
  local c = cfg()
  if spec.cpu or spec.memory_mb then
    errors.raise("FeatureNotSupportedError", "e2b: cpu and memory come with the template (build one with the "
      .. "resources you need and pass it as image)", { backend = "e2b", op = "create" })
  end
  local ttl = math.max(1, math.ceil(spec.ttl and spec.ttl > 0 and spec.ttl or 3600))
  local labels = cloud.labels(spec, spec.labels)
  local body = { templateID = spec.snapshot_id or spec.image or c.template, timeout = ttl, secure = true,
                 allow_internet_access = spec.allow_internet ~= false, metadata = labels, autoPause = false }
  if spec.env_vars and next(spec.env_vars) then body.envVars = spec.env_vars end
  local api = control()
  local stop, wait = timer.now() + c.create_deadline, 0.5
  local h
  while not h do
    local ok, sb = pcall(api.json, api, "POST", "/sandboxes", { json = body, op = "create", idempotent = false,
                                                                timeout = c.create_timeout })
    if ok then
      h = handle(sb, spec.id)
    elseif not errors.is(sb, "SandboxConnectionError") then
      error(sb, 0)
    else
      -- a create that timed out or failed behind a 5xx may have happened: look before sending it again
      local found = listed{ ["sbxlua.id"] = spec.id }
      if found[1] then
        h = connect(found[1].sandboxID, ttl, spec.id)
        for i = 2, #found do api:request("DELETE", "/sandboxes/" .. found[i].sandboxID, { op = "destroy", ok = { [404] = true } }) end
      elseif timer.now() + wait >= stop then
        error(sb, 0)
      else
        timer.sleep(wait)
        wait = math.min(wait * 2, 5)
      end
    end
  end
  h.ttl = ttl
  if c.workdir ~= "/home/user" then   -- the working directory, made once (as root where the user cannot)
    local ok, err = pcall(function()
      local p <close> = P.spawn(h, { argv = { "sh", "-c", 'mkdir -p "$1" 2>/dev/null || { sudo mkdir -p "$1" && '
        .. 'sudo chown "$(id -u):$(id -g)" "$1"; }', "sh", c.workdir }, cwd = "/", timeout = 60 })
      local r = p:wait()
      if r.exit_code ~= 0 then error("mkdir " .. c.workdir .. ": " .. r.stderr) end
    end)
    if not ok then
      pcall(P.destroy, h)
      errors.raise("SandboxCreationError", "e2b: create: the working directory: " ..
        tostring(type(err) == "table" and err.message or err), { backend = "e2b", op = "create" })
    end
  end
  return h
end

function P.destroy(h)
  control():request("DELETE", "/sandboxes/" .. h.sandbox_id, { op = "destroy", ok = { [404] = true } })
end

function P.is_alive(h)
  local ok, res = pcall(control().request, control(), "GET", "/sandboxes/" .. h.sandbox_id,
                        { op = "is_alive", ok = { [404] = true }, deadline = 10 })
  if not ok or res.status ~= 200 then return false end
  local v = json.decode(res.body or "")
  return type(v) == "table" and (v.state == "running" or v.state == "paused")
end

function P.session_state(h)
  return { sandbox_id = h.sandbox_id, token = h.token, domain = h.domain, ttl = h.ttl }
end

function P.resume(state)
  if type(state) ~= "table" or type(state.sandbox_id) ~= "string" then
    errors.raise("SandboxNotFoundError", "e2b: resume: the state names no sandbox", { backend = "e2b", op = "resume" })
  end
  local h = connect(state.sandbox_id, state.ttl, state.id)
  h.ttl = state.ttl
  return h
end

function P.snapshot(h)
  local v = control():json("POST", "/sandboxes/" .. h.sandbox_id .. "/snapshots", { json = {}, op = "snapshot" })
  return { snapshot_id = v.snapshotID }
end

-- gc: what this host owns on E2B, by metadata (paused ones too: they have no TTL).
function P.list_owned()
  if not select(2, settings()) then return {} end   -- no key: E2B is not in use here (gc stays quiet)
  local ok, list = pcall(listed, { ["sbxlua.host"] = cloud.labels({})["sbxlua.host"] })
  if not ok then
    if errors.is(list, "AuthenticationError") then errors.raise("BackendNotInstalledError", list.message, { backend = "e2b" }) end
    error(list, 0)
  end
  local out = {}
  for _, s in ipairs(list) do
    local md = type(s.metadata) == "table" and s.metadata or {}
    if md["sbxlua.id"] then
      out[#out + 1] = { id = md["sbxlua.id"], session = md["sbxlua.session"], lock = md["sbxlua.lock"],
                        sandbox_id = s.sandboxID }
    end
  end
  return out
end

function P.reap(entry)
  local ids = {}
  local st = type(entry.state) == "table" and entry.state or {}
  if st.sandbox_id or entry.sandbox_id then
    ids[1] = st.sandbox_id or entry.sandbox_id
  else
    for _, s in ipairs(listed{ ["sbxlua.id"] = entry.id }) do ids[#ids + 1] = s.sandboxID end
  end
  for _, id in ipairs(ids) do
    control():request("DELETE", "/sandboxes/" .. id, { op = "reap", ok = { [404] = true } })
  end
end

function P.available()
  local c, key = settings()
  if not key or key == "" then return false, "set " .. c.api_key_env end
  return true
end

function P.doctor()
  local c, key, base = settings()
  if not key or key == "" then
    return { { ok = false, what = "e2b", detail = "no API key", fix = "set " .. c.api_key_env } }
  end
  local ok, err = pcall(function() control():request("GET", "/v2/sandboxes", { op = "list", query = { limit = 1 }, deadline = 10 }) end)
  return { { ok = ok, what = "e2b", detail = ok and ("API at " .. base .. " answers") or tostring(err.message or err),
             fix = (not ok) and ("check " .. c.api_key_env .. " and " .. c.api_url_env) or nil } }
end

P.descriptor = {
  name = "e2b", description = "Firecracker microVMs on E2B (templates; cpu/memory per template)",
  isolation = "microvm",
  capabilities = { "exec", "files", "streaming", "background", "resume", "snapshot", "network" },
  options = { image = true, snapshot_id = true, allow_internet = true },
  price = { per_vcpu_hour = 0.0504, per_gib_hour = 0.0162 },
}

P.config_schema = {
  api_key_env = { type = "env", default = "E2B_API_KEY", help = "the variable holding the API key" },
  api_url_env = { type = "env", default = "E2B_API_URL", help = "the variable that may hold the API's base URL" },
  sandbox_url_env = { type = "env", default = "E2B_SANDBOX_URL", help = "the variable that may hold envd's URL" },
  api_url = { type = "string", help = "the control plane's base URL (default " .. DEFAULT_API .. ")" },
  sandbox_url = { type = "string", help = "one URL for every sandbox's envd (sent with E2b-Sandbox-Id)" },
  domain = { type = "string", default = "e2b.app", help = "envd at https://49983-<id>.<domain> without sandbox_url" },
  template = { type = "string", default = "base", help = "the template when a request names no image" },
  workdir = { type = "string", default = "/workspace", help = "where commands start and relative paths go" },
  request_timeout = { type = "number", default = 30, help = "seconds per HTTP request" },
  create_timeout = { type = "number", default = 60, help = "seconds one create request may take" },
  create_deadline = { type = "number", default = 120, help = "seconds for a create and its checked retries" },
}

return P
