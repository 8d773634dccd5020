-- One file (~430 lines): the control plane; the daemon is tensorlake_daemon.lua.
-- A stand-in for Tensorlake's sandbox API on loopback: the control plane
-- (tensorlakeai/tensorlake crates/cloud-sdk/src/sandboxes/, SandboxesClient:
-- flat /sandboxes... as api.tensorlake.ai serves it, and the namespaced
-- /v1/namespaces/{ns}/sandboxes... the SDK uses for a localhost API URL) and
-- each sandbox's in-sandbox API (tensorlake_daemon.lua), routed by
-- `Host: {id}.local` or `X-Tensorlake-Sandbox-Id: {id}` at the `sandbox_url`
-- a running sandbox reports (never the create answer: it comes late, once
-- the sandbox runs). Every sandbox is a real sbx sandbox (bwrap; local where
-- bwrap is missing, whose commands see the host's / : enough for the SDK's
-- smoke test, not for the conformance suite, which is gated on bwrap). Requests are checked strictly: an unknown field or a
-- missing required one is a 400. Errors of the control plane are text, as
-- the real one's, which the SDK shows as `(status N): <body>`.
--
-- As a separate process (its sandboxes in its own SBX_STATE_DIR):
--   SBX_STATE_DIR=D build/sbxlua spec/support/standin/tensorlake.lua --port-file F
--     [--api-key K] [--backend bwrap|local] [--max-sandboxes N] [--pending-secs S] [--block-secs S]
--     [--creates-per-sec R] [--light]
-- (pending: the least time a sandbox stays pending; block: how long a
-- blocking create waits for it before answering pending, default 0;
-- creates-per-sec: past that rate a create is a 429 with Retry-After;
-- light: no process behind a sandbox, for scale runs: tensorlake_light.lua)
-- In a spec: local TL = require "spec.support.standin.tensorlake"; local s = TL.serve{...}
-- Faults: the http.lua fault API (s.srv:fault{...}, or POST /_standin/faults).
-- GET /_tensorlake/sandboxes lists every sandbox ever created with its status.
local MODNAME = ...
local H = require "spec.support.standin.http"
local D = require "spec.support.standin.tensorlake_daemon"
local loop = require "sbx.loop"
local json = require "cjson"

local M = {}

M.KEY = "tl-standin-key"

local function text(status, msg) return status, msg, { ["Content-Type"] = "text/plain; charset=utf-8" } end

local function check(raw, fields, required, where)
  local ok, v = pcall(json.decode, raw ~= "" and raw or "null")
  if not ok or type(v) ~= "table" then return nil, "Failed to parse the request body as JSON" end
  for k, val in pairs(v) do
    local want = fields[k]
    if not want then
      return nil, string.format("Failed to deserialize the JSON body into the target type: %sunknown field `%s`",
                                where or "", tostring(k))
    end
    if type(want) == "table" then
      if type(val) ~= "table" then return nil, "invalid type for `" .. k .. "`: expected an object" end
      local sub, why = check(json.encode(val), want.fields, want.required, (where or "") .. k .. ".")
      if not sub then return nil, why end
    elseif want ~= "any" and val ~= json.null and type(val) ~= want then
      return nil, string.format("Failed to deserialize the JSON body into the target type: %s%s: invalid type, expected %s",
                                where or "", k, want)
    end
  end
  for _, k in ipairs(required or {}) do
    if v[k] == nil then
      return nil, "Failed to deserialize the JSON body into the target type: " .. (where or "") .. "missing field `" .. k .. "`"
    end
  end
  return v
end

local CREATE = {
  image = "string", timeout_secs = "number", entrypoint = "table", snapshot_id = "string", name = "string",
  file_systems = "table", allow_unauthenticated_access = "boolean", exposed_ports = "table",
  auto_resume = "boolean", wait = "boolean", max_pending_secs = "number",
  resources = { required = { "cpus", "memory_mb" }, fields = { cpus = "number", memory_mb = "number",
                disk_mb = "number", ephemeral_disk_mb = "number", gpus = "table" } },
  network = { fields = { allow_internet_access = "boolean", allow_out = "table", deny_out = "table" } },
}

local Standin = {}
Standin.__index = Standin

local function new_id() return require("sbx.proc").random_hex(10) end

function Standin:info(s)
  local running = s.status == "running"
  return {
    sandbox_id = s.id, namespace = s.namespace, status = s.status, image = s.image or json.null,
    resources = { cpus = s.cpus, memory_mb = s.memory_mb, disk_mb = s.disk_mb, ephemeral_disk_mb = s.disk_mb },
    timeout_secs = s.timeout_secs or json.null, name = s.name or json.null,
    network = { allow_internet_access = s.internet, allow_out = D.arr({}),
                deny_out = D.arr({}) },
    auto_resume = s.auto_resume, created_at = s.created_at, terminated_at = s.terminated_at or json.null,
    termination_reason = s.termination_reason or json.null, outcome = json.null,
    sandbox_url = running and self.srv.url or json.null,
    error_details = s.error_details or json.null,
  }
end

-- Bring the sandbox up behind the pending answer; later polls see it run.
function Standin:boot(s)
  local t0 = loop.now()
  local sbx = require "sbx"
  local ok, sb
  if self.light then
    ok, sb = true, require("spec.support.standin.tensorlake_light").new()
  else
    ok, sb = pcall(sbx.sandbox, self.backend, { allow_internet = s.internet, timeout_secs = (s.timeout_secs or 3600) + 120 })
  end
  if ok and s.snapshot then
    local up = pcall(sb.upload_dir, sb, s.snapshot.dir, "/workspace")
    if not up then pcall(sb.destroy, sb) ok, sb = false, "the snapshot could not be restored" end
  end
  if not ok then
    s.status, s.termination_reason, s.error_details = "failed", "startup_failed", { message = tostring(sb) }
    s.booted:notify()
    return
  end
  local wait = self.pending - (loop.now() - t0)
  if wait > 0 then loop.sleep(wait) end
  if s.status ~= "pending" then pcall(sb.destroy, sb) return end      -- deleted while pending
  s.sb, s.box, s.status = sb, D.new_box(sb), "running"
  s.booted:notify()
  if s.timeout_secs and s.timeout_secs > 0 then
    s.reaper = loop.spawn(function()
      loop.sleep(s.timeout_secs)
      -- a named sandbox suspends at its timeout; an unnamed one ends
      if s.name and s.status == "running" then s.status = "suspended"
      else self:terminate(s, "timeout") end
    end)
  end
end

function Standin:terminate(s, reason)
  if s.status == "terminated" then return end
  s.status, s.termination_reason, s.terminated_at = "terminated", reason, os.time()
  if s.reaper and reason ~= "timeout" then s.reaper:cancel() end
  for _, pr in pairs(s.box and s.box.procs or {}) do
    if pr.status == "running" then pcall(pr.p.kill, pr.p, 9) end
  end
  if s.sb then pcall(s.sb.destroy, s.sb) end
  s.sb = nil
end

-- A sandbox by id, or by the name it was created with.
function Standin:find(key)
  return self.sandboxes[key] or (self.names[key] and self.sandboxes[self.names[key]])
end

function Standin:live_count()
  local n = 0
  for _, s in pairs(self.sandboxes) do if s.status == "pending" or s.status == "running" then n = n + 1 end end
  return n
end

function Standin:create(req, ns)
  local v, why = check(req.body, CREATE, { "resources" })
  if not v then return text(400, why) end
  if self.rate then    -- a token bucket of creates per second: past it, 429 with Retry-After
    local now = loop.now()
    self.tokens = math.min(self.rate, (self.tokens or self.rate) + (now - (self.filled or now)) * self.rate)
    self.filled = now
    if self.tokens < 1 then
      local wait = math.ceil((1 - self.tokens) / self.rate)
      return 429, "rate limit exceeded: at most " .. self.rate .. " creates per second",
             { ["Content-Type"] = "text/plain; charset=utf-8", ["Retry-After"] = tostring(wait) }
    end
    self.tokens = self.tokens - 1
  end
  if self.max and self:live_count() >= self.max then
    return text(403, string.format("sandbox quota exceeded: the namespace already runs %d sandboxes (limit %d)",
                                   self:live_count(), self.max))
  end
  if v.name then
    local other = self:find(v.name)
    if other and other.status ~= "terminated" and other.status ~= "failed" then
      return text(409, "a sandbox named " .. v.name .. " already exists: " .. other.id)
    end
  end
  local snap
  if v.snapshot_id then
    snap = self.snapshots[v.snapshot_id]
    if not snap or snap.status ~= "completed" then return text(404, "snapshot not found: " .. v.snapshot_id) end
  end
  local net = v.network or {}
  local s = { id = new_id(), namespace = ns, status = "pending", image = v.image or snap and snap.base_image,
              cpus = v.resources.cpus, memory_mb = math.floor(v.resources.memory_mb),
              disk_mb = math.floor(v.resources.disk_mb or v.resources.ephemeral_disk_mb or 10240),
              timeout_secs = v.timeout_secs and math.floor(v.timeout_secs) or nil, name = v.name,
              internet = net.allow_internet_access ~= false, created_at = os.time(), snapshot = snap,
              auto_resume = v.auto_resume ~= false, booted = loop.event() }
  self.sandboxes[s.id] = s
  if s.name then self.names[s.name] = s.id end
  self.order[#self.order + 1] = s.id
  loop.spawn(self.boot, self, s)
  -- the blocking create (wait unset) waits for the sandbox at most block
  -- seconds; wait = false answers at once. Either may answer pending, with
  -- no sandbox_url yet: that comes later, in GET /sandboxes/{id}.
  if v.wait ~= false and self.block > 0 and s.status == "pending" then s.booted:wait(self.block) end
  if s.status == "running" then
    return 200, { sandbox_id = s.id, status = "running", sandbox_url = self.srv.url, name = s.name or json.null }
  end
  return v.wait == false and 202 or 200, { sandbox_id = s.id, status = "pending", pending_reason = "scheduling",
                                           name = s.name or json.null }
end

function Standin:snapshot(s, req, ns)
  local v, why = check(req.body, { snapshot_type = "string" }, {})
  if not v then return text(400, why) end
  if s.status ~= "running" then return text(409, "sandbox is not running: " .. s.status) end
  local snap = { id = new_id(), namespace = ns, sandbox_id = s.id, status = "in_progress", base_image = s.image,
                 snapshot_type = v.snapshot_type or "filesystem", created_at = os.time() }
  self.snapshots[snap.id] = snap
  snap.dir = require("sbx.fs").mkdtemp(self.state .. "/", "snap-")
  s.status = "snapshotting"
  loop.spawn(function()
    local ok, err = pcall(s.sb.download_dir, s.sb, "/workspace", snap.dir .. "/w")
    snap.dir = snap.dir .. "/w"
    snap.status, snap.error = ok and "completed" or "failed", (not ok) and tostring(err) or nil
    if s.status == "snapshotting" then s.status = "running" end
  end)
  return 202, { snapshot_id = snap.id, status = "in_progress" }
end

local function snap_info(snap)
  return { snapshot_id = snap.id, namespace = snap.namespace, sandbox_id = snap.sandbox_id, status = snap.status,
           base_image = snap.base_image or json.null, error = snap.error or json.null,
           snapshot_type = snap.snapshot_type, created_at = snap.created_at, size_bytes = json.null }
end

function Standin:control(req, res)
  local auth = req.headers.authorization
  if not auth then return text(401, "missing bearer token") end
  if auth ~= "Bearer " .. self.key then return text(401, "invalid API key") end
  local ns, rest = req.path:match("^/v1/namespaces/([^/]+)(/.*)$")
  if not ns then ns, rest = "default", req.path end
  local m = req.method
  if rest == "/sandboxes" and m == "POST" then return self:create(req, ns) end
  if rest == "/sandboxes" and m == "GET" then
    local out = {}
    for _, id in ipairs(self.order) do
      local s = self.sandboxes[id]
      if s.status ~= "terminated" and s.namespace == ns then out[#out + 1] = self:info(s) end
    end
    return 200, { sandboxes = D.arr(out) }
  end
  if rest == "/snapshots" and m == "GET" then
    local out = {}
    for _, snap in pairs(self.snapshots) do out[#out + 1] = snap_info(snap) end
    return 200, { snapshots = D.arr(out) }
  end
  local sid = rest:match("^/snapshots/([^/]+)$")
  if sid then
    local snap = self.snapshots[sid]
    if not snap then return text(404, "snapshot not found: " .. sid) end
    if m == "GET" then return 200, snap_info(snap) end
    if m == "DELETE" then self.snapshots[sid] = nil return 200, "" end
  end
  local id, op = rest:match("^/sandboxes/([^/]+)(.*)$")
  local s = id and self:find(id)
  if id and not s then return text(404, "sandbox not found: " .. id) end
  if s and op == "" and m == "GET" then return 200, self:info(s) end
  if s and op == "" and m == "DELETE" then self:terminate(s, "deleted") return 200, "" end
  if s and op == "/snapshot" and m == "POST" then return self:snapshot(s, req, ns) end
  if s and op == "/suspend" and m == "POST" then
    if not s.name then return text(400, "only named sandboxes can be suspended") end
    if s.status == "running" then s.status = "suspended" end
    return 202, ""
  end
  if s and op == "/resume" and m == "POST" then
    if s.status == "suspended" then s.status = "running" end
    return 202, ""
  end
  return text(404, "no route " .. m .. " " .. req.path)
end

function Standin:route(req, res)
  local host = (req.headers.host or ""):match("^([%w%-]+)%.local")
  local id = req.headers["x-tensorlake-sandbox-id"] or host
  if req.path == "/_tensorlake/sandboxes" then
    local out = {}
    for _, sid in ipairs(self.order) do out[#out + 1] = { id = sid, status = self.sandboxes[sid].status } end
    return 200, #out == 0 and "[]" or out, { ["Content-Type"] = "application/json" }
  end
  if id and req.path:sub(1, 8) == "/api/v1/" then
    local s = self.sandboxes[id]
    if s and s.status == "suspended" and s.auto_resume then s.status = "running" end   -- traffic wakes it
    if not s or s.status == "terminated" or s.status == "failed" then
      return 404, { error = "sandbox not found: " .. id, code = "SANDBOX_NOT_FOUND" }
    end
    if s.status ~= "running" and s.status ~= "snapshotting" then
      return 503, { error = "sandbox is " .. s.status, code = "SANDBOX_NOT_READY" }
    end
    if req.headers.authorization ~= "Bearer " .. self.key then return text(401, "invalid API key") end
    return D.handle(s.box, req, res)
  end
  return self:control(req, res)
end

function Standin:handle(req, res)
  local status, body, headers = self:route(req, res)
  if type(body) == "table" then
    headers = headers or {}
    headers["Content-Type"] = "application/json"
    body = D.encode(body)
  end
  return status, body, headers
end

---serve{ port =, key =, backend =, max_sandboxes =, pending = seconds, state = dir } -> standin
function M.serve(o)
  o = o or {}
  local st = setmetatable({ key = o.key or M.KEY, sandboxes = {}, order = {}, snapshots = {}, names = {},
                            block = o.block or 0, rate = o.creates_per_sec, light = o.light,
                            max = o.max_sandboxes, pending = o.pending or 0.05,
                            state = o.state or os.getenv("SBX_STATE_DIR") or "/tmp" }, Standin)
  if not o.backend then
    local ok, bw = pcall(require, "sbx.providers.builtin.bwrap")
    st.backend = (ok and bw.available()) and "bwrap" or "local"
  else
    st.backend = o.backend
  end
  local srv, err = H.serve{ port = o.port or 0, handler = function(req, res) return st:handle(req, res) end }
  if not srv then return nil, err end
  st.srv, st.url, st.port = srv, srv.url, srv.port
  return st
end

function Standin:close()
  for _, s in pairs(self.sandboxes) do self:terminate(s, "shutdown") end
  self.srv:close()
end

-- ------------------------------------------------------------ in a process of its own

local Child = {}
Child.__index = Child

---start{ args = { "--max-sandboxes", "2", ... }, name = } -> the stand-in as a separate
---sbxlua process with its own SBX_STATE_DIR (its sandboxes stay out of the
---caller's session): { url, port, key, state, stop(), fault(f), clear_faults(),
---sandboxes() (every sandbox it made, with its status) }.
function M.start(o)
  o = o or {}
  local proc, fs, http = require "sbx.proc", require "sbx.fs", require "sbx.http"
  local base = (os.getenv("SBX_STATE_DIR") or "/tmp")
  assert(fs.mkdir_host(base))
  local dir = assert(fs.mkdtemp(base .. "/", "tl-standin-"))
  local port_file = dir .. "/port"
  local argv = { os.getenv("SBX_BIN") or "build/sbxlua", (os.getenv("SBX_SOURCE_DIR") or ".") .. "/spec/support/standin/tensorlake.lua",
                 "--port-file", port_file }
  for _, a in ipairs(o.args or {}) do argv[#argv + 1] = a end
  local env = { "PATH=/usr/local/bin:/usr/bin:/bin", "SBX_STATE_DIR=" .. dir .. "/state", "HOME=" .. dir }
  for _, k in ipairs{ "SBX_MODULE_DIR", "SBX_SOURCE_DIR" } do
    if os.getenv(k) then env[#env + 1] = k .. "=" .. os.getenv(k) end
  end
  local p = assert(proc.spawn{ argv = argv, env = env, cwd = os.getenv("SBX_SOURCE_DIR") or ".", max_output = 65536 })
  local port
  for _ = 1, 600 do
    local f = io.open(port_file)
    if f then port = tonumber(f:read("l")) f:close() end
    if port or not p:running() then break end
    loop.sleep(0.02)
  end
  if not port then
    local r = p:running() and (p:kill(9) or p:wait()) or p:wait()
    error("the tensorlake stand-in did not start: " .. tostring(r and r.stderr), 0)
  end
  local c = setmetatable({ p = p, port = port, url = "http://127.0.0.1:" .. port, key = M.KEY, dir = dir,
                           http = http }, Child)
  c.gc = setmetatable({}, { __gc = function() c:stop() end })
  return c
end

function Child:admin(method, path, body)
  local res, err = self.http.request{ method = method, url = self.url .. path, body = body and json.encode(body) or nil,
                                      timeout = 10 }
  assert(res, err)
  return res
end

---fault{ route =, status =, ... } (http.lua's fields)
function Child:fault(f) assert(self:admin("POST", "/_standin/faults", f).status == 201) end
function Child:clear_faults() self:admin("DELETE", "/_standin/faults") end
function Child:requests() return json.decode(self:admin("GET", "/_standin/requests").body) end
function Child:sandboxes() return json.decode(self:admin("GET", "/_tensorlake/sandboxes").body) end
function Child:live()
  local n = 0
  for _, s in ipairs(self:sandboxes()) do if s.status ~= "terminated" and s.status ~= "failed" then n = n + 1 end end
  return n
end

---stop(): SIGTERM (the stand-in destroys its sandboxes as any sbxlua job does) and wait.
function Child:stop()
  if self.stopped then return end
  self.stopped = true
  if self.p:running() then self.p:kill(15) end
  local ok = pcall(self.p.wait, self.p)
  pcall(self.p.close, self.p)
  if ok then require("sbx.fs").rmtree(self.dir) end     -- its sandboxes went with it
end

-- ------------------------------------------------------------ as a process

local function main(argv)
  local o, port_file = {}, nil
  local i = 1
  while argv[i] do
    local a, v = argv[i], argv[i + 1]
    if a == "--port-file" then port_file = v
    elseif a == "--port" then o.port = tonumber(v)
    elseif a == "--api-key" then o.key = v
    elseif a == "--backend" then o.backend = v
    elseif a == "--max-sandboxes" then o.max_sandboxes = tonumber(v)
    elseif a == "--pending-secs" then o.pending = tonumber(v)
    elseif a == "--block-secs" then o.block = tonumber(v)
    elseif a == "--creates-per-sec" then o.creates_per_sec = tonumber(v)
    elseif a == "--light" then o.light = true i = i - 1
    else io.stderr:write("tensorlake stand-in: unknown argument " .. a .. "\n") os.exit(2) end
    i = i + 2
  end
  local st = assert(M.serve(o))
  if port_file then
    local f = assert(io.open(port_file .. ".tmp", "w"))
    f:write(st.port, "\n")
    f:close()
    assert(os.rename(port_file .. ".tmp", port_file))
  end
  io.stderr:write("tensorlake stand-in on " .. st.url .. " (" .. (st.light and "light" or st.backend) .. ")\n")
  while true do loop.sleep(3600) end
end

if MODNAME ~= "spec.support.standin.tensorlake" and arg and arg[0] and arg[0]:match("tensorlake%.lua$") then main(arg) end

return M
