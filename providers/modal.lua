-- providers/modal.lua: sandboxes on Modal (modal.com).
--
-- Modal has no HTTP API, only gRPC: this file talks to sbx-modal-bridge
-- (bridge/modal/, the official Go SDK pinned in its go.mod), which sbxlua
-- starts on a unix socket on first use. One JSON line per request, one
-- answer line: create, list (by tags), alive, terminate, snapshot. "agent"
-- turns the connection into the byte stream of one `sbx-agent serve` Exec
-- in the sandbox, so commands and files go through the agent protocol
-- (its timeouts, tree kill, separate streams). docs/modal.md.
--
-- One file (~450 lines): a provider script cannot `require`, so the bridge
-- client, the lifecycle and the files stay in this one file.

local NAME = "modal"
local BRIDGE = "sbx-modal-bridge"

-- providers.modal of sbx.yaml
local SCHEMA = {
  token_id_env = { type = "env", default = "MODAL_TOKEN_ID", help = "the variable holding the token id" },
  token_secret_env = { type = "env", default = "MODAL_TOKEN_SECRET", help = "the variable holding the token secret" },
  server_url = { type = "string", help = "the API's URL (default Modal's; http://... is plaintext)" },
  server_url_env = { type = "env", default = "MODAL_SERVER_URL", help = "the variable that may hold the API's URL" },
  environment = { type = "string", help = "the Modal environment (default the workspace's)" },
  app = { type = "string", default = "sbxlua", help = "the app sandboxes are created in" },
  image = { type = "string", default = "python:3.12-slim-bookworm", help = "the registry image of a sandbox" },
  workdir = { type = "string", default = "/workspace", help = "where commands start" },
  bridge = { type = "string", help = "the path of " .. BRIDGE .. " (default: next to sbxlua, or on $PATH)" },
}

-- every error names the provider, in its fields and its message
local fail = errors.raiser(NAME, NAME .. ": ")

-- The bridge's whole environment: where the API is, and no config file of
-- the user's (the credentials come with each request, from sbx.yaml's names).
local function bridge_env(c)
  local url = c.server_url or env(c.server_url_env)
  local e = { "MODAL_CONFIG_PATH=/dev/null" }
  if url and url ~= "" then e[#e + 1] = "MODAL_SERVER_URL=" .. url end
  return e
end

-- gRPC codes as the facade's kinds; for create also an HTTP-like status
-- (routing: 429 capacity, 4xx this provider cannot, 5xx retryable).
local STATUS = { ResourceExhausted = 429, InvalidArgument = 400, FailedPrecondition = 400, NotFound = 404,
                 AlreadyExists = 409, Unauthenticated = 401, PermissionDenied = 403 }
local TRANSIENT = { Unavailable = true, Internal = true, Unknown = true, DeadlineExceeded = true, Aborted = true }

local function refused(op, ans)
  local code, msg = ans.code or "Unknown", tostring(ans.error or "the bridge gave no reason")
  if op == "create" then
    fail("SandboxCreationError", "create: " .. msg, { op = op, code = code, status = STATUS[code] or 503,
         retryable = TRANSIENT[code] or nil })
  end
  if code == "NotFound" then fail("SandboxNotFoundError", op .. ": " .. msg, { op = op, code = code }) end
  if code == "Unauthenticated" or code == "PermissionDenied" then
    fail("SandboxExecutionError", op .. ": " .. msg .. " (check $" .. config().token_id_env .. " and $"
         .. config().token_secret_env .. ")", { op = op, code = code })
  end
  if TRANSIENT[code] then fail("SandboxConnectionError", op .. ": " .. msg, { op = op, code = code, retryable = true }) end
  fail("SandboxExecutionError", op .. ": " .. msg, { op = op, code = code })
end

-- Send one request; the stream, the answer, and what came after its line.
local function request(op, body)
  local c = config()
  local socket, why = bridge.socket(NAME, { path = c.bridge, env = bridge_env(c) })
  if not socket then fail("BackendNotInstalledError", "build the bridge: " .. tostring(why), { op = op }) end
  local s, err = stream.connect{ unix = socket }
  if not s then fail("SandboxConnectionError", op .. ": the bridge: " .. tostring(err), { op = op, retryable = true }) end
  body.op, body.environment = op, c.environment
  body.token_id, body.token_secret = env(c.token_id_env), env(c.token_secret_env)
  local pok, ans, rest, werr = pcall(function()   -- a cancel while waiting closes the stream
    local ok, why = s:write(json.encode(body) .. "\n")
    local buf = ""
    while ok do
      local i = buf:find("\n", 1, true)
      if i then
        local a = json.decode(buf:sub(1, i - 1))
        if type(a) ~= "table" then return nil, nil, "a bad answer" end
        return a, buf:sub(i + 1)
      end
      local chunk, rerr = s:read()
      if not chunk then return nil, nil, rerr or "the bridge closed the connection" end
      buf = buf .. chunk
    end
    return nil, nil, why
  end)
  if pok and ans then return s, ans, rest end
  s:close()
  if not pok then error(ans, 0) end
  fail("SandboxConnectionError", op .. ": the bridge did not answer: " .. tostring(werr or "a bad answer"),
       { op = op, retryable = true })
end

local function call(op, body)
  local s, ans = request(op, body)
  s:close()
  if not ans.ok then refused(op, ans) end
  return ans
end

-- ------------------------------------------------------------- agent link

local function open_link(h)
  local s, ans, pending = request("agent", { sandbox_id = h.sandbox })
  if not ans.ok then s:close() refused("agent", ans) end
  local t = {}
  function t.read()
    if pending and pending ~= "" then
      local p = pending
      pending = nil
      return p
    end
    return s:read()
  end
  function t.write(data) return s:write(data) end
  function t.close() s:close() end
  local link, why = agentlink.open(t, 60)
  if not link then fail("SandboxConnectionError", "sbx-agent serve did not start: " .. tostring(why), { op = "exec" }) end
  return link
end

-- One task opens the link, however many wait for it.
local function link_of(h)
  if h.link and not h.link.broken then return h.link end
  while h.opening do timer.sleep(0.02) end
  if h.link and not h.link.broken then return h.link end
  h.opening = true
  local ok, link = pcall(open_link, h)
  h.opening = false
  if not ok then error(link, 0) end
  h.link = link
  return link
end

-- ------------------------------------------------------------------ files

-- The agent link's file operations fail with the agent's errno name, or
-- "REFUSED" (the agent refused the request) or "BROKEN" (the link broke,
-- not the file operation): docs/agent-protocol.md.
local NOT_A_PATH = { ENOTDIR = true, EISDIR = true, ENOTEMPTY = true, EEXIST = true }

local function file_error(op, p, errno, msg)
  local code = errno ~= "REFUSED" and errno ~= "BROKEN" and errno or nil
  if errno == "BROKEN" then fail("SandboxConnectionError", op .. ": " .. tostring(msg), { op = op }) end
  if code == "ENOENT" then fail("FileNotFoundError", op .. ": " .. p .. ": No such file or directory", { op = op, errno = code }) end
  if code == "EFBIG" then fail("SandboxExecutionError", op .. ": " .. tostring(msg), { op = op, code = "ETOOBIG" }) end
  if NOT_A_PATH[code] then
    fail("PathError", op .. ": " .. tostring(msg), { op = op, code = code })
  end
  fail("SandboxExecutionError", op .. ": " .. tostring(msg), { op = op, code = code })
end

local function home() return config().workdir end

-- A path of the sandbox: relative ones from home, . and .. worked out;
-- one that climbs above / is a PathError.
local function abs(path, op)
  path = tostring(path or "")
  local full = path:sub(1, 1) == "/" and path or (home() .. "/" .. path)
  local parts = {}
  for seg in full:gmatch("[^/]+") do
    if seg == ".." then
      if #parts == 0 then fail("PathError", (op or "path") .. ": " .. path .. " climbs above /", { op = op }) end
      parts[#parts] = nil
    elseif seg ~= "." then
      parts[#parts + 1] = seg
    end
  end
  return "/" .. table.concat(parts, "/")
end

-- Whether a link at `rel` (inside a tree) pointing at `target` leaves the
-- tree rooted at `root`.
local function escapes(root, rel, target)
  if target:sub(1, 1) == "/" then
    local t = abs(target)
    return not (t == root or t:sub(1, #root + 1) == root .. "/")
  end
  local depth = 0
  for seg in (rel:match("^(.*)/[^/]*$") or ""):gmatch("[^/]+") do if seg ~= "." then depth = depth + 1 end end
  for seg in target:gmatch("[^/]+") do
    if seg == ".." then depth = depth - 1 elseif seg ~= "." then depth = depth + 1 end
    if depth < 0 then return true end
  end
  return false
end

-- ------------------------------------------------------------- operations

local function tags_of(spec)
  local tags = { ["sbxlua.host"] = owner.hostname(), ["sbxlua.session"] = spec.session,
                 ["sbxlua.created"] = tostring(os.time()), ["sbxlua.ttl"] = tostring(spec.ttl or 3600),
                 ["sbxlua.id"] = spec.id, ["sbxlua.lock"] = owner.lock_path() }
  for k, v in pairs(spec.labels or {}) do tags[k] = tostring(v) end
  return tags
end

local function terminate(id) call("terminate", { sandbox_id = id }) end

local P = {
  descriptor = {
    name = NAME, description = "Modal Sandboxes (gVisor) through sbx-modal-bridge (the official Go SDK)",
    isolation = "gvisor",
    capabilities = { "exec", "files", "streaming", "background", "resume", "snapshot", "network" },
    options = { image = true, cpu = true, memory_mb = true, allow_internet = true, snapshot_id = true },
    -- PRICES.md: $0.00003942 per physical core-second (one core = 2 vCPU), $0.00000672 per GiB-second
    price = { per_vcpu_hour = 0.0710, per_gib_hour = 0.0242 },
  },
  config_schema = SCHEMA,
}

function P.available()
  local c = config()
  local ok, why = bridge.find(NAME, c.bridge)
  if not ok then return false, "modal: build the bridge (" .. why .. "; see docs/modal.md)" end
  if not env(c.token_id_env) or not env(c.token_secret_env) then
    return false, "$" .. c.token_id_env .. " and $" .. c.token_secret_env .. " must be set"
  end
  return true
end

function P.create(spec)
  local c = config()
  if spec.cpu ~= nil and (type(spec.cpu) ~= "number" or spec.cpu <= 0) then
    fail("SandboxCreationError", "create: cpu must be a positive number", { op = "create", status = 400 })
  end
  local ans = call("create", {
    app = c.app, image = spec.snapshot_id or spec.image or c.image,
    cpu = spec.cpu and spec.cpu / 2 or nil,            -- Modal counts physical cores
    memory_mib = spec.memory_mb and math.ceil(spec.memory_mb) or nil,
    timeout_secs = math.ceil(spec.ttl or 3600), env = next(spec.env_vars or {}) and spec.env_vars or nil,
    block_network = spec.allow_internet == false, tags = tags_of(spec), workdir = c.workdir })
  return { sandbox = ans.sandbox_id, id = spec.id, session = spec.session }
end

function P.destroy(h)
  if h.link then h.link:close() end
  terminate(h.sandbox)
end

function P.spawn(h, req)
  return link_of(h):spawn{ argv = req.argv, env = req.env, stdin = req.stdin, keep_stdin = req.keep_stdin,
    cwd = abs(req.cwd or home(), "exec"), timeout = req.timeout, max_output = req.max_output, stream = req.stream,
    want_pid = req.want_pid }
end

function P.session_state(h) return { sandbox = h.sandbox, session = h.session } end

function P.resume(state)
  if type(state.sandbox) ~= "string" then
    fail("ConfigError", "session state for modal has no 'sandbox'", { op = "resume" })
  end
  if not call("alive", { sandbox_id = state.sandbox }).alive then
    fail("SandboxNotFoundError", "sandbox " .. state.sandbox .. " has ended", { op = "resume" })
  end
  return { sandbox = state.sandbox, id = state.id, session = state.session }
end

function P.is_alive(h)
  local ok, ans = pcall(call, "alive", { sandbox_id = h.sandbox })
  return ok and ans.alive == true
end

function P.home() return home() end

function P.read_file(h, path, max)
  local p = abs(path, "read_file")
  max = max or 256 * 1024 * 1024
  local data, errno, msg = link_of(h):read_file(p, max)
  if not data and errno == "EFBIG" then
    fail("SandboxExecutionError", "read_file: " .. p .. " is larger than the cap of " .. tostring(max) .. " bytes",
         { op = "read_file", code = "ETOOBIG" })
  end
  if not data then file_error("read_file", p, errno, msg) end
  return data
end

function P.write_file(h, path, data, mode)
  local p = abs(path, "write_file")
  if p == "/" then fail("PathError", "write_file: / is a directory", { op = "write_file" }) end
  local link = link_of(h)
  mode = mode or tonumber("644", 8)
  local ok, errno, msg = link:write_file(p, data, mode)
  if not ok and errno == "ENOENT" then     -- parents are made
    local dok, derr, dmsg = link:mkdir(p:match("^(.*)/[^/]*$"))
    if not dok then file_error("write_file", p, derr, dmsg) end
    ok, errno, msg = link:write_file(p, data, mode)
  end
  if not ok then file_error("write_file", p, errno, msg) end
end

function P.list_files(h, path)
  local p = abs(path, "list_files")
  local entries, errno, msg = link_of(h):list(p)
  if not entries then file_error("list_files", p, errno, msg) end
  local prefix = (path == "" or path == nil) and "" or (path:sub(-1) == "/" and path or path .. "/")
  for _, e in ipairs(entries) do
    e.path, e.is_dir = prefix .. e.name, e.type == "dir"
    e.size, e.mtime = math.tointeger(e.size), math.tointeger(e.mtime)
  end
  table.sort(entries, function(a, b) return a.name < b.name end)
  return entries
end

function P.stat(h, path)
  local p = abs(path, "stat")
  local st, errno, msg = link_of(h):stat(p)
  if not st then file_error("stat", p, errno, msg) end
  return st
end

function P.mkdir(h, path)
  local p = abs(path, "mkdir")
  local ok, errno, msg = link_of(h):mkdir(p)
  if not ok then file_error("mkdir", p, errno, msg) end
end

function P.remove(h, path, recursive)
  local p = abs(path, "remove")
  if p == "/" then fail("PathError", "remove: refusing to remove /", { op = "remove" }) end
  local ok, errno, msg = link_of(h):remove(p, recursive)
  if not ok and errno == "ENOTEMPTY" then fail("PathError", "remove: " .. p .. ": directory not empty", { op = "remove" }) end
  if not ok then file_error("remove", p, errno, msg) end
end

-- upload_dir: each file a frame at a time from the host root it comes from.
local CHUNK = 1024 * 1024
function P.put_tree(h, dir, entries)
  local p = abs(dir, "upload_dir")
  local link = link_of(h)
  P.mkdir(h, p)
  for _, e in ipairs(entries) do
    local dest = p .. "/" .. e.path
    if e.type == "dir" then
      P.mkdir(h, dest)
    elseif e.type == "file" then
      local off, done = 0, false
      local ok, errno, msg = link:write_stream(dest, e.mode or tonumber("644", 8), function()
        if done then return nil end
        if e.data then done = true return 0, e.data end
        local data, err = e.src:read_at(e.path, off, CHUNK)
        if not data then fail("PathError", "upload_dir: " .. tostring(err), { op = "upload_dir" }) end
        done = #data < CHUNK
        if data == "" and off > 0 then return nil end
        local at = off
        off = off + #data
        return at, data
      end)
      if not ok then file_error("upload_dir", dest, errno, msg) end
    end
  end
end

-- download_dir: a walk through the agent; a symlink that leaves the tree is
-- rejected (the facade then writes nothing), one inside it is not followed.
function P.get_tree(h, dir)
  local root = abs(dir, "download_dir")
  local link = link_of(h)
  local entries, rejected = {}, {}
  local function walk(rel)
    local path = rel == "" and root or (root .. "/" .. rel)
    local list, errno, msg = link:list(path)
    if not list then file_error("download_dir", path, errno, msg) end
    table.sort(list, function(a, b) return a.name < b.name end)
    for _, it in ipairs(list) do
      local r = rel == "" and it.name or (rel .. "/" .. it.name)
      if it.type == "dir" then
        entries[#entries + 1] = { path = r, type = "dir" }
        walk(r)
      elseif it.type == "file" then
        local st = link:stat(root .. "/" .. r)
        local data, ferr, fmsg = link:read_file(root .. "/" .. r, 256 * 1024 * 1024)
        if not data then file_error("download_dir", root .. "/" .. r, ferr, fmsg) end
        entries[#entries + 1] = { path = r, type = "file", data = data, mode = st and st.mode }
      elseif it.type == "link" then
        local res = link:spawn{ argv = { "readlink", "--", root .. "/" .. r }, env = { "PATH=/usr/bin:/bin" },
                                cwd = "/", max_output = 65536 }:wait()
        local target = res.exit_code == 0 and res.stdout:gsub("\n$", "") or nil
        if not target or escapes(root, r, target) then
          rejected[#rejected + 1] = { path = r, reason = "symlink out of the directory" }
        end
      end
    end
  end
  walk("")
  return entries, rejected
end

-- A filesystem snapshot is an image: a later create names it as snapshot_id.
function P.snapshot(h)
  return { snapshot_id = call("snapshot", { sandbox_id = h.sandbox }).image_id }
end

-- gc: what this host owns, found by its tags.
local function listed(tags)
  local ok, ans = pcall(call, "list", { app = config().app, tags = tags })
  if not ok then
    if errors.is(ans, "BackendNotInstalledError") then error(ans, 0) end
    fail("BackendNotInstalledError", "cannot list sandboxes: " .. tostring(ans.message or ans), { op = "gc" })
  end
  return ans.sandboxes or {}
end

-- Without credentials nothing can be listed, and nothing was made: gc stays
-- quiet about a provider never set up.
function P.list_owned()
  local c = config()
  if not (env(c.token_id_env) and env(c.token_secret_env)) then return {} end
  local found = {}
  for _, s in ipairs(listed({ ["sbxlua.host"] = owner.hostname() })) do
    local t = type(s.tags) == "table" and s.tags or {}
    found[#found + 1] = { id = t["sbxlua.id"], session = t["sbxlua.session"], lock = t["sbxlua.lock"],
                          sandbox = s.sandbox_id }
  end
  return found
end

-- A dead session's sandbox: the one its state names, else every sandbox
-- tagged with its id on this host.
function P.reap(entry)
  local id = type(entry.state) == "table" and entry.state.sandbox
  if type(id) == "string" then return terminate(id) end
  for _, s in ipairs(listed({ ["sbxlua.host"] = owner.hostname(), ["sbxlua.id"] = entry.id })) do
    local t = type(s.tags) == "table" and s.tags or {}
    if entry.session == nil or t["sbxlua.session"] == entry.session then terminate(s.sandbox_id) end
  end
end

function P.doctor()
  local c = config()
  local path, why = bridge.find(NAME, c.bridge)
  local lines = { { ok = path ~= nil, what = "modal bridge", detail = path or why,
                    fix = not path and "modal: build the bridge: install Go (./dev does) and rebuild; docs/modal.md" or nil } }
  local creds = env(c.token_id_env) and env(c.token_secret_env)
  lines[#lines + 1] = { ok = creds and true or false, what = "modal credentials",
    detail = "$" .. c.token_id_env .. ", $" .. c.token_secret_env,
    fix = not creds and "set them (modal token new, or the Modal dashboard)" or nil }
  if path and creds then
    local ok, err = pcall(call, "list", { app = c.app, tags = { ["sbxlua.host"] = owner.hostname() } })
    lines[#lines + 1] = { ok = ok, what = "modal API", detail = ok and "answers" or tostring(err.message or err) }
  end
  return lines
end

return P
