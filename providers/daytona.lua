-- Daytona (daytona.io): sandboxes through its REST API and the toolbox API
-- inside each sandbox (../shared/specs/NOTES.md, "Daytona";
-- docs/providers.md is the contract). One file, as every provider is.
--
-- Commands run through the toolbox's sessions (runAsync, then polls of the
-- command and its logs: stdout and stderr apart) under `sbx-agent run`,
-- uploaded once per sandbox: it makes the argv exact (`env -i` + the
-- request's environment), reports a missing program or cwd, kills the
-- whole tree on a timeout or a kill (setsid children included), and says
-- how the command ended as the last bytes of stderr. Input for a command
-- that keeps stdin open goes through the session's input endpoint as
-- base64 lines to a small decoder in front of the command (the endpoint
-- has no end of input; a "." line is it).
local SDK_VERSION = "0.190.0"     -- >= 0.167.0: the toolbox splits stdout and stderr
local DEFAULT_URL = "https://app.daytona.io/api"
local DIR = "/tmp/.sbxlua"        -- the agent and its pid/stdin files, inside the sandbox
-- Daytona's quota answers: "Total CPU limit exceeded. Maximum allowed: N." (and
-- memory, disk); a 429's "rate limit exceeded" is no quota
local QUOTA = { "limit exceeded. maximum allowed" }
local P = "daytona"

local SCHEMA = {
  api_key_env = { type = "env", default = "DAYTONA_API_KEY", help = "the variable holding the API key" },
  api_url_env = { type = "env", default = "DAYTONA_API_URL", help = "the variable holding the API's base URL" },
  api_url = { type = "string", help = "the API's base URL (over $DAYTONA_API_URL; default " .. DEFAULT_URL .. ")" },
  target = { type = "string", help = "the region sandboxes are made in when the request names none" },
  snapshot = { type = "string", help = "the snapshot a sandbox starts from when the request names no image" },
  image = { type = "string", default = "daytonaio/sandbox:0.4.3", help = "the image for requests with resources" },
  auto_delete_minutes = { type = "integer", default = 0, help = "Daytona's autoDeleteInterval (0: when stopped)" },
  create_timeout = { type = "number", default = 300, help = "seconds a create may take, polls included" },
  request_timeout = { type = "number", default = 60, help = "seconds per HTTP request" },
  deadline = { type = "number", default = 120, help = "seconds an idempotent call may take, retries included" },
}

-- This provider's settings, the schema's defaults under what the config sets.
local defaulted                  -- config() is the same table until the settings change
local function settings()
  local c = config()
  if c ~= defaulted then
    for k, v in pairs(SCHEMA) do if c[k] == nil then c[k] = v.default end end
    defaulted = c
  end
  return c
end

local function fail(kind, msg, op, extra)
  local f = { backend = P, op = op }
  for k, v in pairs(extra or {}) do f[k] = v end
  errors.raise(kind, "daytona: " .. (op and (op .. ": ") or "") .. msg, f)
end

local function key()
  local c = settings()
  local k = env(c.api_key_env)
  if not k or k == "" then fail("AuthenticationError", "$" .. c.api_key_env .. " is not set") end
  return k
end

local function base_url()
  local c = settings()
  return c.api_url or env(c.api_url_env) or DEFAULT_URL
end

local function headers()
  return { authorization = "Bearer " .. key(), ["x-daytona-sdk-version"] = SDK_VERSION,
           ["x-daytona-source"] = "sbxlua" }
end

local function api()
  local c = settings()
  return cloud.client{ provider = P, base = base_url(), headers = headers(), timeout = c.request_timeout,
                       deadline = c.deadline, quota = QUOTA }
end

-- The toolbox of sandbox h ({toolboxProxyUrl}/{id}).
local function toolbox(h)
  local c = settings()
  return cloud.client{ provider = P, base = h.tb .. "/" .. h.sid, headers = headers(),
                       timeout = c.request_timeout, deadline = c.deadline, quota = QUOTA }
end

local function shq(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- A sandbox path: absolute, normalized; PathError when it climbs above "/".
local function resolve(h, path, op)
  if path == nil or path == "" or path == "." then return h.home end
  if path:sub(1, 1) ~= "/" then path = h.home .. "/" .. path end
  local out = {}
  for part in path:gmatch("[^/]+") do
    if part == ".." then
      if #out == 0 then fail("PathError", path .. " leaves the sandbox's root", op) end
      out[#out] = nil
    elseif part ~= "." then
      out[#out + 1] = part
    end
  end
  return "/" .. table.concat(out, "/")
end

-- ------------------------------------------------------------ sandboxes

local function get(id, op)
  return api():json("GET", "/sandbox/" .. id, { op = op })
end

-- Wait until the sandbox is started; raise with its errorReason when it failed.
local function await_started(sb, op, deadline)
  local wait = 0.05
  while sb.state ~= "started" do
    if sb.state == "error" or sb.state == "build_failed" or sb.state == "destroyed" then
      fail("SandboxCreationError", "sandbox " .. sb.id .. " is " .. sb.state
           .. (type(sb.errorReason) == "string" and (": " .. sb.errorReason) or ""), op)
    end
    if timer.now() > deadline then
      fail("SandboxTimeoutError", "sandbox " .. sb.id .. " is still " .. tostring(sb.state), op)
    end
    timer.sleep(wait)
    wait = math.min(wait * 1.5, 1)
    sb = get(sb.id, op)
  end
  return sb
end

local function handle(sb, id)
  local h = { sid = sb.id, id = id, tb = sb.toolboxProxyUrl:gsub("/+$", "") }
  h.home = toolbox(h):json("GET", "/user-home-dir", { op = "create" }).dir
  return h
end

-- The sandbox made for our id, if any (a create whose answer was lost).
local function find_by_id(id)
  local v = api():json("GET", "/sandbox", { op = "create", query = { labels = json.encode{ ["sbxlua.id"] = id },
                                                                     limit = 1 } })
  return v and v.items and v.items[1]
end

local function body_for(spec)
  local c = settings()
  local labels = {}
  for k, v in pairs(spec.labels or {}) do labels[k] = tostring(v) end
  for k, v in pairs(cloud.labels(spec)) do labels[k] = v end
  local b = { name = spec.id, labels = labels, networkBlockAll = spec.allow_internet == false,
              autoStopInterval = 0, autoDeleteInterval = c.auto_delete_minutes,
              ttlMinutes = math.max(1, math.ceil((spec.ttl or 3600) / 60)), target = spec.region or c.target }
  local resources = spec.cpu or spec.memory_mb or spec.disk_mb
  if spec.cpu then b.cpu = math.ceil(spec.cpu) end
  if spec.memory_mb then b.memory = math.ceil(spec.memory_mb / 1024) end
  if spec.disk_mb then b.disk = math.ceil(spec.disk_mb / 1024) end
  if spec.snapshot_id then
    if resources then
      fail("FeatureNotSupportedError", "cpu, memory_mb and disk_mb cannot be set with snapshot_id "
           .. "(a Daytona snapshot fixes its resources)", "create")
    end
    b.snapshot = spec.snapshot_id
  elseif spec.image or (resources and not c.snapshot) then
    b.buildInfo = { dockerfileContent = "FROM " .. (spec.image or c.image) .. "\n" }
  elseif c.snapshot then
    if resources then b.buildInfo = { dockerfileContent = "FROM " .. c.image .. "\n" } else b.snapshot = c.snapshot end
  end
  return b
end

local function create(spec)
  local c = settings()
  local body = body_for(spec)
  local stop = timer.now() + c.create_timeout
  local sb
  -- a create is not idempotent: one whose answer was lost (a broken link,
  -- a 5xx) is looked up by its sbxlua.id label before it is sent again
  for attempt = 1, 4 do
    local ok, v = pcall(api().json, api(), "POST", "/sandbox", { json = body, op = "create",
                                                                 timeout = c.request_timeout })
    if ok then sb = v break end
    -- the name is our id: "already exists" is an earlier attempt of ours that got through
    if type(v) == "table" and v.context and v.context.status == 409
       and tostring(v.message):find("already exists", 1, true) then
      sb = get(spec.id, "create")
      break
    end
    if not (errors.is(v, "SandboxConnectionError") and attempt < 4 and timer.now() < stop) then error(v, 0) end
    sb = find_by_id(spec.id)
    if sb then break end
    timer.sleep(0.2 * attempt)
  end
  local ok, h = pcall(function() return handle(await_started(sb, "create", stop), spec.id) end)
  if not ok then                 -- it never became usable: it goes (gc finds it by label otherwise)
    pcall(api().request, api(), "DELETE", "/sandbox/" .. sb.id, { op = "create", ok = { [404] = true } })
    error(h, 0)
  end
  return h
end

local function destroy(h)
  local a = api()
  for _ = 1, 40 do
    local res = a:request("DELETE", "/sandbox/" .. h.sid, { op = "destroy", ok = { [404] = true, [409] = true } })
    if res.status ~= 409 then return end
    timer.sleep(0.25)          -- "Sandbox state change in progress"
  end
  fail("SandboxExecutionError", "sandbox " .. h.sid .. " stayed in a state change", "destroy")
end

local function resume(state)
  if type(state) ~= "table" or type(state.sid) ~= "string" then
    fail("SandboxNotFoundError", "the state names no Daytona sandbox", "resume")
  end
  local sb = get(state.sid, "resume")
  if sb.state == "stopped" or sb.state == "paused" or sb.state == "archived" then
    sb = api():json("POST", "/sandbox/" .. sb.id .. "/start", { op = "resume" })
  end
  if sb.state == "destroyed" or sb.state == "destroying" then
    fail("SandboxNotFoundError", "sandbox " .. sb.id .. " is " .. sb.state, "resume")
  end
  sb = await_started(sb, "resume", timer.now() + settings().create_timeout)
  local h = { sid = sb.id, id = state.id, tb = sb.toolboxProxyUrl:gsub("/+$", ""), home = state.home,
              agent = state.agent, session = state.session }
  if not h.home then h.home = toolbox(h):json("GET", "/user-home-dir", { op = "resume" }).dir end
  return h
end

-- A toolbox answer of 400 may mean the sandbox is gone (the proxy's answer
-- for an unknown one): ask the API, which says so with a 404.
local function gone_check(h, op)
  local ok, sb = pcall(get, h.sid, op)
  if not ok and errors.is(sb, "SandboxNotFoundError") then error(sb, 0) end
  if ok and sb.state ~= "started" then fail("SandboxNotFoundError", "sandbox " .. h.sid .. " is " .. sb.state, op) end
end

-- A toolbox call whose 400/404 answers the caller reads itself.
local function tb(h, method, path, o)
  o.ok = { [400] = true, [404] = true, [409] = true, [410] = true }
  local res = toolbox(h):request(method, path, o)
  if res.status == 400 and (cloud.message_of(res.body) or ""):find("not running or does not exist", 1, true) then
    gone_check(h, o.op)
  end
  return res
end

local function tb_fail(h, res, op, path)
  local said = cloud.message_of(res.body) or ("HTTP " .. res.status)
  if res.status == 404 then fail("FileNotFoundError", path .. ": " .. said, op, { status = 404 }) end
  gone_check(h, op)
  fail("PathError", path .. ": " .. said, op, { status = res.status })
end

-- ------------------------------------------------------------ files

local function upload(h, path, data, op)
  local body, ctype = cloud.multipart{ { name = "file", filename = path:match("[^/]*$"), data = data } }
  local res = tb(h, "POST", "/files/upload-v2", { query = { path = path }, body = body, op = op,
                 headers = { ["content-type"] = ctype }, idempotent = true })
  if res.status >= 400 then tb_fail(h, res, op, path) end
end

local function chmod(h, path, mode, op)
  local res = tb(h, "POST", "/files/permissions", { query = { path = path, mode = string.format("%o", mode) }, op = op,
                 idempotent = true })
  if res.status >= 400 then tb_fail(h, res, op, path) end
end

local function write_file(h, path, data, mode)
  path = resolve(h, path, "write_file")
  upload(h, path, data, "write_file")
  if mode then chmod(h, path, mode, "write_file") end
end

local function read_file(h, path, max)
  path = resolve(h, path, "read_file")
  local res = tb(h, "GET", "/files/download", { query = { path = path }, op = "read_file", max_body = max })
  if res.status >= 400 then tb_fail(h, res, "read_file", path) end
  local data = res.body or ""
  if max and #data > max then data = data:sub(1, max) end
  return data
end

local TYPES = { d = "dir", L = "link", ["-"] = "file", p = "fifo", S = "socket", c = "device", b = "device" }

local function iso_time(s)
  local y, mo, d, hh, mm, ss = tostring(s):match("^(%d+)%-(%d+)%-(%d+)T(%d+):(%d+):(%d+)")
  if not y then return 0 end
  local t = os.time{ year = tonumber(y), month = tonumber(mo), day = tonumber(d), hour = tonumber(hh),
                     min = tonumber(mm), sec = tonumber(ss), isdst = false }
  return math.tointeger(t + (os.time() - os.time(os.date("!*t")))) or 0
end

local function entry_of(f)
  local t = TYPES[(f.mode or ""):sub(1, 1)] or (f.isDir and "dir" or "file")
  return { name = f.name, type = t, is_dir = t == "dir", size = math.tointeger(f.size) or 0,
           mtime = iso_time(f.modifiedAt), mode = tonumber(f.permissions or "", 8) }
end

local function list_files(h, path)
  path = resolve(h, path, "list_files")
  local res = tb(h, "GET", "/files", { query = { path = path }, op = "list_files" })
  if res.status >= 400 then tb_fail(h, res, "list_files", path) end
  local out = {}
  for _, f in ipairs(json.decode(res.body) or {}) do out[#out + 1] = entry_of(f) end
  table.sort(out, function(a, b) return a.name < b.name end)
  return out
end

local function stat(h, path)
  path = resolve(h, path, "stat")
  local res = tb(h, "GET", "/files/info", { query = { path = path }, op = "stat" })
  if res.status >= 400 then tb_fail(h, res, "stat", path) end
  return entry_of(json.decode(res.body))
end

local function mkdir(h, path)
  path = resolve(h, path, "mkdir")
  local res = tb(h, "POST", "/files/folder", { query = { path = path, mode = "0755" }, op = "mkdir", idempotent = true })
  if res.status >= 400 then tb_fail(h, res, "mkdir", path) end
end

local function remove(h, path, recursive)
  path = resolve(h, path, "remove")
  local res = tb(h, "DELETE", "/files", { query = { path = path, recursive = recursive and "true" or "false" },
                 op = "remove" })
  if res.status == 404 then return end
  if res.status >= 400 then tb_fail(h, res, "remove", path) end
end

-- One shell command through the toolbox's execute endpoint (the stand-in
-- and Daytona both run it under sh): its merged output and exit code.
local function execute(h, script, op)
  local v = toolbox(h):json("POST", "/process/execute", { json = { command = "sh -c " .. shq(script), timeout = 120 },
                                                           op = op })
  return v.result or "", math.tointeger(v.exitCode) or 0
end

-- upload_dir: the directories made, the files sent in bulk uploads of at
-- most BULK bytes, then every mode set by one command.
local BULK = 8 << 20
local function put_tree(h, dir, entries)
  dir = resolve(h, dir, "upload_dir")
  mkdir(h, dir)
  local modes, parts, size = {}, {}, 0
  local function flush()
    if #parts == 0 then return end
    local body, ctype = cloud.multipart(parts)
    local res = tb(h, "POST", "/files/bulk-upload", { body = body, headers = { ["content-type"] = ctype },
                   op = "upload_dir", idempotent = true })
    if res.status >= 400 then tb_fail(h, res, "upload_dir", dir) end
    parts, size = {}, 0
  end
  for _, e in ipairs(entries) do
    local path = dir .. "/" .. e.path
    if e.type == "dir" then
      mkdir(h, path)
    elseif e.type == "file" then
      local data = e.data
      if not data then                         -- a host file (upload_dir): its bytes, a piece at a time
        local pieces, off = {}, 0
        repeat
          local chunk = assert(e.src:read_at(e.path, off, 1 << 20))
          pieces[#pieces + 1] = chunk
          off = off + #chunk
        until #chunk < (1 << 20)
        data = table.concat(pieces)
      end
      local i = #parts // 2
      parts[#parts + 1] = { name = "files[" .. i .. "].path", data = path }
      parts[#parts + 1] = { name = "files[" .. i .. "].file", filename = e.path:match("[^/]*$"), data = data }
      size = size + #data
      if size >= BULK then flush() end
    end
    if e.mode and e.type ~= "link" then modes[#modes + 1] = "chmod " .. string.format("%o", e.mode) .. " " .. shq(path) end
  end
  flush()
  if #modes > 0 then
    local out, code = execute(h, table.concat(modes, " && "), "upload_dir")
    if code ~= 0 then fail("PathError", "setting modes under " .. dir .. ": " .. out, "upload_dir") end
  end
end

-- A link's target from its directory, and whether it stays under the root.
local function inside(rel_dir, target)
  if target:sub(1, 1) == "/" then return false end
  local depth = 0
  for part in (rel_dir .. "/" .. target):gmatch("[^/]+") do
    if part == ".." then depth = depth - 1 elseif part ~= "." then depth = depth + 1 end
    if depth < 0 then return false end
  end
  return true
end

-- download_dir: the tree listed by one find (types, modes, link targets),
-- links that leave it rejected, each file read.
local function get_tree(h, dir)
  dir = resolve(h, dir, "download_dir")
  local out, code = execute(h, "cd " .. shq(dir) .. " && find . -mindepth 1 -printf '%y\\t%m\\t%l\\t%P\\0'",
                            "download_dir")
  if code ~= 0 then
    stat(h, dir)                                   -- FileNotFoundError when it is not there
    fail("PathError", dir .. ": " .. out, "download_dir")
  end
  local entries, rejected = {}, {}
  for rec in out:gmatch("([^%z]+)%z") do
    local y, mode, target, rel = rec:match("^(%a)\t(%d+)\t([^\t]*)\t(.*)$")
    if y == "d" then
      entries[#entries + 1] = { path = rel, type = "dir", mode = tonumber(mode, 8) }
    elseif y == "f" then
      entries[#entries + 1] = { path = rel, type = "file", mode = tonumber(mode, 8),
                                data = read_file(h, dir .. "/" .. rel) }
    elseif y == "l" then
      if inside(rel:match("^(.*)/[^/]*$") or "", target) then
        entries[#entries + 1] = { path = rel, type = "link" }
      else
        rejected[#rejected + 1] = { path = rel, reason = "a symlink out of the directory (" .. target .. ")" }
      end
    elseif y then
      entries[#entries + 1] = { path = rel, type = "other" }
    end
  end
  return entries, rejected
end

-- ------------------------------------------------------------ commands

-- The agent in the sandbox (uploaded once; one upload at a time) and the
-- session commands run in.
local function ready(h)
  while h.preparing do timer.sleep(0.01) end
  if h.agent and h.session then return end
  h.preparing = true
  local ok, err = pcall(function()
    if not h.agent then
      local bytes, id = cloud.agent()
      local path = DIR .. "/sbx-agent-" .. id
      upload(h, path, bytes, "exec")
      chmod(h, path, tonumber("755", 8), "exec")
      h.agent = path
    end
    if not h.session then
      local sid = "sbxlua-" .. random_hex(16)
      local res = tb(h, "POST", "/process/session", { json = { sessionId = sid }, op = "exec" })
      if res.status >= 400 then tb_fail(h, res, "exec", "session") end
      h.session = sid
    end
  end)
  h.preparing = false
  if not ok then error(err, 0) end
end

-- The agent's status record is the last bytes of stderr: hold back a tail.
local HOLD = 64

-- fn() again after a 429 (a refused request never ran: safe to send again,
-- even a command's), waiting what it asks or a backoff, within `deadline`.
local function unrefused(deadline, fn)
  local stop, wait = timer.now() + deadline, 0.2
  while true do
    local ok, v = pcall(fn)
    if ok then return v end
    if not errors.is(v, "RateLimitError") then error(v, 0) end
    local pause = math.min(math.max(v.context.retry_after or 0, wait), 5)
    if timer.now() + pause >= stop then error(v, 0) end
    timer.sleep(pause)
    wait = math.min(wait * 2, 5)
  end
end

-- The agent's status record ending stderr: the output before it, the status.
local function split_status(err, exit_code)
  local i, kind, n = err:match("()%zSBXAGENT1 (%a+) (%-?%d+)\n$")
  if i then return err:sub(1, i - 1), { kind = kind, n = tonumber(n) } end
  return err, { kind = "lost", why = "the command ended (exit " .. tostring(exit_code) .. ") without its agent's status" }
end

-- A command ends: the rest of stderr (its status record taken off) and the status.
-- The command's pid file slot is free again (once it is known to be over).
local function free(self)
  if self.slot then
    local slots = self.h.slots
    slots[#slots + 1], self.slot = self.slot, nil
  end
end

local function finish(self, err, exit_code)
  local rest, st = split_status(err:sub(self.errseen + 1), exit_code)
  self:_deliver(2, rest)
  self.errseen, self.status, self.done = #err, st, true
  self:_ended()
  free(self)
  return false
end

local function lost(self, e)
  self.done, self.status = true, { kind = "lost", broken = errors.is(e, "SandboxConnectionError"),
                                   why = type(e) == "table" and e.message or tostring(e) }
  self:_ended()
  -- the command may still run behind a broken link: its agent is told to end it
  pcall(self.kill_now, self)
  return false
end

-- How much of a running command's log is settled: the logs are JSON text,
-- and a character cut at the end is sent as U+FFFD until the rest of it
-- arrives, so neither a partial UTF-8 sequence nor trailing U+FFFD is
-- delivered before the command ends.
local function settled(s)
  local n = #s
  for _ = 1, 3 do
    if s:sub(n - 2, n) == "\xEF\xBF\xBD" then n = n - 3 else break end
  end
  for k = 1, math.min(3, n) do                     -- a lead byte whose sequence is not complete
    local b = s:byte(n - k + 1)
    if b >= 0xC0 then
      local need = b >= 0xF0 and 4 or b >= 0xE0 and 3 or 2
      if need > k then n = n - k end
      break
    elseif b < 0x80 then
      break
    end
  end
  return n
end

local Cmd = process_handle.class{
  -- one request: the session runs the command and answers with its output
  -- (no streaming, no input after the start)
  _once = function(self)
    local ok, v = pcall(unrefused, settings().deadline, function()
      local t = toolbox(self.h)
      return t:json("POST", "/process/session/" .. self.h.session .. "/exec",
        { json = { command = self.command, runAsync = false }, op = "exec", idempotent = false,
          timeout = (self.limit or 7 * 86400) + 60 })
    end)
    if not ok and errors.is(v, "RateLimitError") then error(v, 0) end   -- it never ran
    if not ok then return lost(self, v) end
    self:_deliver(1, v.stdout or "")
    return finish(self, v.stderr or "", v.exitCode)
  end,
  _more = function(self)
    if self.done then return false end
    if self.once then return self:_once() end
    local t = toolbox(self.h)
    local base = "/process/session/" .. self.h.session .. "/command/" .. self.cid
    timer.sleep(self.pause)
    self.pause = math.min(self.pause * 1.5, 0.2)
    local ok, v = pcall(t.json, t, "GET", base, { op = "exec" })
    if not ok then return lost(self, v) end
    local ended = v.exitCode ~= nil and v.exitCode ~= json.null
    if not (ended or self.streaming) then return true end
    local lok, logs = pcall(t.json, t, "GET", base .. "/logs", { op = "exec" })
    if not lok then return lost(self, logs) end
    local out, err = (logs or {}).stdout or "", (logs or {}).stderr or ""
    local upto = ended and #out or settled(out)
    if upto > self.outseen then self:_deliver(1, out:sub(self.outseen + 1, upto)) self.outseen = upto end
    if ended then return finish(self, err, v.exitCode) end
    local keep = #err - HOLD                       -- the status record may be arriving
    if keep > self.errseen then
      self:_deliver(2, err:sub(self.errseen + 1, keep))
      self.errseen = keep
    end
    return true
  end,
  _status = function(self) return self.status end,
  running = function(self) return not self.done end,
  kill_now = function(self)
    local t = toolbox(self.h)
    t:json("POST", "/process/execute", { json = { command = shq(self.h.agent) .. " kill " .. shq(self.pidfile),
                                                  timeout = 30 }, op = "kill" })
  end,
  kill = function(self)
    if self.done or self.killing then return end
    self.killing = true
    local ok, err = pcall(self.kill_now, self)
    self.killing = false
    if not ok then error(err, 0) end
  end,
  _write = function(self, data)
    if #data == 0 then return true end
    local res = tb(self.h, "POST", "/process/session/" .. self.h.session .. "/command/" .. self.cid .. "/input",
                   { json = { data = base64.encode(data) .. "\n" }, op = "write" })
    if res.status >= 400 then return nil, "write: " .. (cloud.message_of(res.body) or res.status), "EPIPE" end
    return true
  end,
  _end_stdin = function(self)
    pcall(tb, self.h, "POST", "/process/session/" .. self.h.session .. "/command/" .. self.cid .. "/input",
          { json = { data = ".\n" }, op = "write" })
  end,
  _release = function(self) self.done, self.status = true, self.status or { kind = "killed" } end,
}

-- Reads base64 lines from the session's input and decodes them into the
-- command; a "." line ends its input.
local FEEDER = [[while IFS= read -r l; do [ "$l" = . ] && break; printf %s "$l" | base64 -d; done]]

local function spawn(h, req)
  ready(h)
  local nonce = random_hex(16)
  -- pid files are slots of the sandbox, reused once their command ended
  -- (the agent rewrites its file; nothing is removed after each command)
  h.slots, h.nslots = h.slots or {}, h.nslots or 0
  local slot = table.remove(h.slots)
  if not slot then h.nslots = h.nslots + 1 slot = h.nslots end
  local pidfile = DIR .. "/slot-" .. slot .. ".pid"
  local cwd = resolve(h, req.cwd, "exec")
  local run = { "env", "-i" }
  for _, e in ipairs(req.env or {}) do run[#run + 1] = shq(e) end
  for _, a in ipairs{ h.agent, "run", "--pidfile", pidfile, "--cwd", cwd } do run[#run + 1] = shq(a) end
  if req.timeout then run[#run + 1] = "--timeout " .. string.format("%.3f", req.timeout) end
  local cleanup = {}
  local script
  local fifo
  if req.keep_stdin and not req.stdin then
    fifo = DIR .. "/" .. nonce .. ".in"
    run[#run + 1] = "--stdin " .. shq(fifo)
  elseif req.stdin and #req.stdin > 0 and #req.stdin <= 32768 then
    run[#run + 1] = "--stdin -"
    script = "printf %s " .. shq(base64.encode(req.stdin)) .. " | base64 -d | "
  elseif req.stdin and #req.stdin > 0 then
    local inpath = DIR .. "/" .. nonce .. ".in"
    upload(h, inpath, req.stdin, "exec")
    run[#run + 1] = "--stdin " .. shq(inpath)
    cleanup[#cleanup + 1] = shq(inpath)
  end
  run[#run + 1] = "--"
  for _, a in ipairs(req.argv) do run[#run + 1] = shq(a) end
  local line = table.concat(run, " ")
  if fifo then
    -- the decoder ends with the command, whether or not its input did
    -- (an asynchronous list's stdin is /dev/null unless redirected: fd 3 is ours)
    line = "mkfifo -m 600 " .. shq(fifo) .. " && { (" .. FEEDER .. ") <&3 > " .. shq(fifo) .. " & " .. line
      .. " 3<&-; kill $! 2>/dev/null; } 3<&0"
    cleanup[#cleanup + 1] = shq(fifo)
  elseif script then line = script .. line end
  -- straight into the session's shell: nothing in it exits that shell or
  -- leaves state in it (NOTES.md: a bare exit would end the session)
  local command = #cleanup > 0 and (line .. "; rm -f " .. table.concat(cleanup, " ")) or line
  local fields = { h = h, pidfile = pidfile, slot = slot, outseen = 0, errseen = 0, pause = 0.005, limit = req.timeout,
                   command = command }
  -- a command that neither streams, nor takes input, nor runs in the
  -- background is one request, sent by the first read or wait
  if not req.stream and not fifo and not req.want_pid then
    fields.once = true
    return process_handle.new(Cmd, req, fields)
  end
  local res = unrefused(settings().deadline, function()
    return tb(h, "POST", "/process/session/" .. h.session .. "/exec",
              { json = { command = command, runAsync = true }, op = "exec" })
  end)
  if res.status >= 400 then tb_fail(h, res, "exec", "session " .. h.session) end
  fields.cid = json.decode(res.body).cmdId
  local p = process_handle.new(Cmd, req, fields)
  if req.want_pid then
    for _ = 1, 50 do
      local r = tb(h, "GET", "/files/download", { query = { path = pidfile }, op = "exec" })
      p.pid = r.status == 200 and math.tointeger(tonumber((r.body or ""):match("%d+"))) or nil
      if p.pid or not p:running() then break end
      timer.sleep(0.02)
    end
  end
  return p
end

-- ------------------------------------------------------------ gc

local function list_owned()
  local c = settings()
  if not env(c.api_key_env) then fail("BackendNotInstalledError", "$" .. c.api_key_env .. " is not set", "gc") end
  local out, cursor = {}, nil
  repeat
    local q = { labels = json.encode{ ["sbxlua.host"] = cloud.labels({})["sbxlua.host"] }, limit = 200,
                includeErroredDeleted = "true" }
    if cursor then q.cursor = cursor end
    local ok, v = pcall(api().json, api(), "GET", "/sandbox", { op = "gc", query = q,
                                                                deadline = math.min(c.deadline, 15) })
    if not ok then
      -- gc says it could not ask, and goes on with the other backends
      if errors.is(v, "SandboxConnectionError") or errors.is(v, "AuthenticationError") then
        fail("BackendNotInstalledError", "cannot list sandboxes at " .. base_url() .. ": " .. tostring(v.message), "gc")
      end
      error(v, 0)
    end
    for _, it in ipairs(v.items or {}) do
      local l = it.labels or {}
      if l["sbxlua.id"] then
        out[#out + 1] = { id = l["sbxlua.id"], session = l["sbxlua.session"], lock = l["sbxlua.lock"],
                          sid = it.id, state = it.state }
      end
    end
    cursor = v.nextCursor ~= json.null and v.nextCursor or nil
  until not cursor
  return out
end

local function reap(entry)
  local sid = type(entry.state) == "table" and entry.state.sid
  if not sid then
    local sb = find_by_id(entry.id)
    if not sb then return end
    sid = sb.id
  end
  destroy({ sid = sid })
end

return {
  descriptor = {
    name = "daytona", description = "Daytona cloud sandboxes (REST API and in-sandbox toolbox)",
    isolation = "container",
    capabilities = { "exec", "files", "streaming", "background", "resume", "snapshot", "network" },
    options = { image = true, cpu = true, memory_mb = true, disk_mb = true, snapshot_id = true, allow_internet = true },
    price = { per_vcpu_hour = 0.0504, per_gib_hour = 0.0162 },
    regions = { "us", "eu" },
  },
  config_schema = SCHEMA,

  available = function()
    local c = settings()
    if not env(c.api_key_env) or env(c.api_key_env) == "" then return false, "set " .. c.api_key_env end
    return true
  end,
  doctor = function()
    local c = settings()
    if not env(c.api_key_env) then
      return { { ok = false, what = "credentials", detail = "$" .. c.api_key_env .. " is not set",
                 fix = "set " .. c.api_key_env .. " (an API key from the Daytona dashboard)" } }
    end
    local ok, err = pcall(function() api():json("GET", "/sandbox", { op = "doctor", query = { limit = 1 }, deadline = 10 }) end)
    return { { ok = ok, what = "api", detail = base_url() .. (ok and ": answers" or (": " .. tostring(err.message or err))),
               fix = not ok and "check $" .. c.api_key_env .. " and the API URL" or nil } }
  end,
  create = create,
  destroy = destroy,
  spawn = spawn,
  session_state = function(h) return { sid = h.sid, home = h.home, tb = h.tb, agent = h.agent } end,
  resume = resume,
  is_alive = function(h)
    local ok, sb = pcall(get, h.sid, "is_alive")
    return ok and sb.state == "started"
  end,
  home = function(h) return h.home end,
  read_file = read_file, write_file = write_file, list_files = list_files, stat = stat,
  mkdir = mkdir, remove = remove, put_tree = put_tree, get_tree = get_tree,
  snapshot = function(h)
    local name = "sbxlua-" .. h.id .. "-" .. random_hex(8)
    api():json("POST", "/sandbox/" .. h.sid .. "/snapshot", { json = { name = name }, op = "snapshot" })
    await_started(get(h.sid, "snapshot"), "snapshot", timer.now() + settings().create_timeout)
    return { snapshot_id = name }
  end,
  list_owned = list_owned,
  reap = reap,
}
