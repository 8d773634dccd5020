-- A stand-in for Daytona's API (control plane) and its toolbox (the
-- in-sandbox API behind toolboxProxyUrl) on one loopback port, each "cloud
-- sandbox" backed for real by an sbx sandbox (bwrap; local where bwrap is
-- missing). Every request is checked against the published OpenAPI
-- documents (../shared/specs/daytona-api.json, daytona-toolbox.json): an
-- unknown field or a missing required one is a 400 as from a strict
-- server. What it keeps of Daytona (../shared/specs/NOTES.md, "Daytona"):
-- the error bodies {path,timestamp,statusCode,error,message} (the toolbox's
-- with source "DAYTONA_DAEMON"), creating -> starting -> started over
-- several polls, labels and their filter, the 400 "Total CPU limit
-- exceeded. Maximum allowed: N.", the 400 for resources with a snapshot,
-- 409 for a delete during a state change, a stop with autoDeleteInterval 0
-- destroys, bearer auth. Faults per route come from http.lua (429 with
-- Retry-After-<bucket>, cuts, delays, a create that succeeds behind a 504).
--
-- In a spec:   local D = require "spec.support.standin.daytona"
--              local s = D.start{ key = "k", max_cpu = 8 }   -- s.url, s.api, s.srv
-- As a process (its own SBX_STATE_DIR keeps its sandboxes out of the
-- tested process's session):
--   SBX_STATE_DIR=... build/sbxlua spec/support/standin/daytona.lua --port-file F
--       [--key K] [--max-cpu N] [--polls N] [--backend bwrap|local|light] [--parent PID]
-- --backend light: no process behind a sandbox (daytona_light.lua answers
-- the commands the clients send), for runs that measure the clients.
-- The port file is written once the server listens; SIGTERM ends it and
-- destroys every backing sandbox.
local root = (arg and arg[0] or ""):match("^(.*)/spec/support/standin/daytona%.lua$")
if root and not package.path:find(root .. "/?.lua", 1, true) then
  package.path = root .. "/?.lua;" .. package.path
end

local loop = require "sbx.loop"
local json = require "cjson"
local H = require "spec.support.standin.http"
local openapi = require "spec.support.standin.openapi"
local toolbox = require "spec.support.standin.daytona_toolbox"

local M = {}

M.SPECS = os.getenv("SBX_SPECS_DIR")

local function specs_dir(src)
  if M.SPECS then return M.SPECS end
  for _, d in ipairs{ (src or ".") .. "/../shared/specs", (src or ".") .. "/../../shared/specs", "/work/shared/specs" } do
    local f = io.open(d .. "/daytona-api.json")
    if f then f:close() return d end
  end
  error("daytona stand-in: daytona-api.json not found (set SBX_SPECS_DIR)")
end

local function load_doc(path)
  local f = assert(io.open(path, "rb"))
  local doc = json.decode(f:read("a"))
  f:close()
  return doc
end

---The two validators: the control plane's and the toolbox's, with the
---fields the official SDK sends beyond the spec (NOTES.md: kvm, queueTimeout).
function M.documents(src)
  local dir = specs_dir(src)
  local api = openapi.new(load_doc(dir .. "/daytona-api.json"), { null = json.null })
  api:extend("CreateSandbox", { kvm = { type = "boolean" }, queueTimeout = { type = "integer" } })
  api:extend("Sandbox", { kvm = { type = "boolean" } })     -- the SDK requires it in answers
  local tb = openapi.new(load_doc(dir .. "/daytona-toolbox.json"), { null = json.null })
  return api, tb
end

local function now_iso() return os.date("!%Y-%m-%dT%H:%M:%S.000Z") end

local function uuid()
  local h = require("sbx.proc").random_hex(32)
  return h:sub(1, 8) .. "-" .. h:sub(9, 12) .. "-" .. h:sub(13, 16) .. "-" .. h:sub(17, 20) .. "-" .. h:sub(21, 32)
end

local ERROR_NAME = { [400] = "Bad Request", [401] = "Unauthorized", [403] = "Forbidden", [404] = "Not Found",
                     [408] = "Request Timeout", [409] = "Conflict", [429] = "Too Many Requests",
                     [500] = "Internal Server Error" }

-- The API's error body (NestJS's shape).
function M.api_error(req, status, message)
  return status, { path = req.target, timestamp = now_iso(), statusCode = status,
                   error = ERROR_NAME[status] or "Error", message = message }
end

local Standin = {}
Standin.__index = Standin

-- The Sandbox (or SandboxListItem) answer for a record.
function Standin:view(s, list)
  local v = { id = s.id, organizationId = "org-standin", name = s.name, user = "daytona",
    env = s.env, labels = s.labels, public = false, networkBlockAll = s.networkBlockAll, target = s.target,
    cpu = s.cpu, gpu = 0, memory = s.memory, disk = s.disk, state = s.state, desiredState = s.desired,
    errorReason = s.errorReason, recoverable = false, autoStopInterval = s.autoStopInterval,
    autoArchiveInterval = 10080, autoDeleteInterval = s.autoDeleteInterval, snapshot = s.snapshot,
    createdAt = s.createdAt, updatedAt = now_iso(), daemonVersion = "0.190.0", runnerId = "runner-standin",
    toolboxProxyUrl = self.url .. "/toolbox", kvm = false, sandboxClass = "container" }
  if list then v.env, v.kvm = nil, nil end
  return v
end

local function total_cpu(self)
  local n = 0
  for _, s in pairs(self.sandboxes) do
    if s.state ~= "destroyed" and s.state ~= "stopped" then n = n + (s.cpu or 0) end
  end
  return n
end

-- Bring up the backing sbx sandbox of record s (a task of its own).
function Standin:boot(s, snapshot)
  -- on demand (a spec's label): the sandbox ends in Daytona's error state
  if s.labels["standin.error"] then
    loop.sleep(0.1)
    s.state, s.errorReason = "error", s.labels["standin.error"]
    return
  end
  local ok, sb = pcall(self.make_backing, self, s)
  if not ok then
    s.state, s.errorReason = "error", tostring(type(sb) == "table" and sb.message or sb)
    return
  end
  if s.state == "destroyed" then sb:destroy() return end
  s.sb = sb
  if snapshot then
    local ok2, err = pcall(sb.upload_dir, sb, snapshot.dir, sb.workdir)
    if not ok2 then s.state, s.errorReason = "error", "restoring the snapshot failed: " .. tostring(err) return end
  end
  s.booted = true
end

function Standin:make_backing(s)
  if self.backend == "light" then return require("spec.support.standin.daytona_light").new() end
  local o = { allow_internet = false, env_vars = s.env }
  return sbx.sandbox(self.backend, o)
end

-- One GET moves a sandbox along: creating -> starting -> started once its
-- backing sandbox is up and `polls` reads have seen it on the way.
function Standin:advance(s)
  if s.state == "creating" or s.state == "starting" then
    s.seen = s.seen + 1
    if s.seen >= self.polls and s.booted then s.state = "started"
    elseif s.seen >= self.polls // 2 then s.state = "starting" end
  end
end

function Standin:destroy(s)
  s.state, s.desired = "destroyed", "destroyed"
  self.sandboxes[s.id] = nil
  if s.sb then
    local sb = s.sb
    s.sb = nil
    pcall(sb.destroy, sb)
  end
end

local function has_resources(b) return b.cpu or b.memory or b.disk or b.gpu end

function Standin:create(req, b)
  if b.snapshot and has_resources(b) then
    return M.api_error(req, 400, "Cannot specify Sandbox resources when using a snapshot")
  end
  local snapshot
  if b.snapshot then
    snapshot = self.snapshots[b.snapshot]
    if not snapshot and not self.base_snapshots[b.snapshot] then
      return M.api_error(req, 404, "Snapshot " .. b.snapshot .. " not found")
    end
  end
  if b.name then
    local other = self:by_name(b.name)
    if other and other.state ~= "destroyed" then
      return M.api_error(req, 409, "Sandbox with name " .. b.name .. " already exists")
    end
  end
  local cpu = b.cpu or 1
  if total_cpu(self) + cpu > self.max_cpu then
    return M.api_error(req, 400, "Total CPU limit exceeded. Maximum allowed: " .. self.max_cpu .. ".")
  end
  local id = uuid()
  local s = { id = id, name = b.name or id, labels = b.labels or {}, env = b.env or {}, cpu = cpu,
    memory = b.memory or 1, disk = b.disk or 3, networkBlockAll = b.networkBlockAll or false,
    autoStopInterval = b.autoStopInterval or 15, autoDeleteInterval = b.autoDeleteInterval or -1,
    ttlMinutes = b.ttlMinutes, target = b.target or "us", snapshot = b.snapshot or (b.buildInfo and "build-" .. id:sub(1, 8)) or "daytonaio/sandbox:0.4.3",
    state = (b.buildInfo and "pending_build") or "creating", desired = "started", seen = 0,
    createdAt = now_iso(), sessions = {} }
  if s.state == "pending_build" then s.state = "creating" end
  self.sandboxes[id] = s
  self.created = self.created + 1
  loop.spawn(function() self:boot(s, snapshot) end)
  return 200, self:view(s)
end

local function labels_match(s, want)
  for k, v in pairs(want) do if s.labels[k] ~= v then return false end end
  return true
end

function Standin:list(req)
  local want = {}
  if req.query.labels then
    local ok, v = pcall(json.decode, req.query.labels)
    if not ok or type(v) ~= "table" then return M.api_error(req, 400, "labels must be a JSON object") end
    want = v
  end
  local ids = {}
  for id, s in pairs(self.sandboxes) do
    if labels_match(s, want) and (s.state ~= "error" or req.query.includeErroredDeleted == "true") then
      ids[#ids + 1] = id
    end
  end
  table.sort(ids)
  local limit = tonumber(req.query.limit or "100")
  local start = 1
  if req.query.cursor and req.query.cursor ~= "" then
    start = #ids + 1
    for i, id in ipairs(ids) do if id > req.query.cursor then start = i break end end
  end
  local items = {}
  for i = start, math.min(#ids, start + limit - 1) do items[#items + 1] = json.encode(self:view(self.sandboxes[ids[i]], true)) end
  local last = start + limit - 1
  -- by hand: cjson 2.1.0 encodes an empty list as {}
  return 200, '{"items":[' .. table.concat(items, ",") .. '],"nextCursor":'
    .. (last < #ids and json.encode(ids[last]) or "null") .. "}", { ["Content-Type"] = "application/json" }
end

-- The control plane's routes, after validation.
function Standin:api(req, r, params, body)
  local id = params.sandboxIdOrName
  local s = id and (self.sandboxes[id] or self:by_name(id))
  local op = r.op.operationId
  if op == "createSandbox" then return self:create(req, body or {}) end
  if op == "listSandboxes" then return self:list(req) end
  if op == "getConfig" or r.path == "/config" then return 200, {} end
  if id and not s then return M.api_error(req, 404, "Sandbox with ID or name " .. id .. " not found") end
  if op == "getSandbox" then
    self:advance(s)
    return 200, self:view(s)
  elseif op == "deleteSandbox" then
    if s.state == "creating" or s.state == "starting" or s.state == "snapshotting" then
      if not s.booted or s.state == "snapshotting" then
        return M.api_error(req, 409, "Sandbox state change in progress")
      end
    end
    self:destroy(s)
    return 200, self:view(s)
  elseif op == "stopSandbox" then
    if s.autoDeleteInterval == 0 then self:destroy(s) return 200, self:view(s) end
    s.state = "stopped"
    return 200, self:view(s)
  elseif op == "startSandbox" then
    if s.state == "stopped" then s.state, s.seen = "starting", 0 end
    return 200, self:view(s)
  elseif op == "createSandboxSnapshot" then
    return self:snapshot(req, s, body.name)
  elseif op == "replaceLabels" then
    s.labels = body.labels
    return 200, { labels = s.labels }
  elseif op == "getToolboxProxyUrl" then
    return 200, { url = self.url .. "/toolbox" }
  elseif op and op:match("^set%a+Interval$") or op == "setTtl" then
    return 200, self:view(s)
  end
  return M.api_error(req, 501, "the stand-in does not serve " .. r.method .. " " .. r.path)
end

function Standin:by_name(name)
  for _, s in pairs(self.sandboxes) do if s.name == name then return s end end
end

-- A snapshot: the backing sandbox's working directory, kept on the host
-- (bwrap has no image to commit); a create from it restores the tree.
function Standin:snapshot(req, s, name)
  if s.state ~= "started" or not s.sb then return M.api_error(req, 400, "Sandbox is not started") end
  if self.snapshots[name] then return M.api_error(req, 409, "Snapshot " .. name .. " already exists") end
  s.state = "snapshotting"
  local dir = self.state_dir .. "/snapshot-" .. require("sbx.proc").random_hex(8)
  loop.spawn(function()
    local ok, err = pcall(s.sb.download_dir, s.sb, s.sb.workdir, dir)
    if ok then self.snapshots[name] = { dir = dir } else s.errorReason = tostring(err) end
    if s.state == "snapshotting" then s.state = "started" end
  end)
  return 200, self:view(s)
end

local function authorized(self, req)
  local a = req.headers.authorization or ""
  return a == "Bearer " .. self.key
end

function Standin:handle(req, res)
  if req.path == "/health" then return 200, { status = "ok" } end
  -- what the checker refused so far (for specs in another process)
  if req.path == "/_daytona/rejected" then return 200, '[' .. table.concat((function()
    local out = {}
    for i, r in ipairs(self.rejected) do out[i] = json.encode(r) end
    return out
  end)(), ",") .. "]", { ["Content-Type"] = "application/json" } end
  if not authorized(self, req) then return M.api_error(req, 401, "Unauthorized") end
  local sid, rest = req.path:match("^/toolbox/([^/]+)(/.*)$")
  if sid then return toolbox.handle(self, req, res, sid, rest) end
  local r, params = self.apidoc:route(req.method, req.path)
  if not r then return M.api_error(req, 404, "Cannot " .. req.method .. " " .. req.path) end
  local body
  if req.body and req.body ~= "" then
    local ok, v = pcall(json.decode, req.body)
    if not ok then return M.api_error(req, 400, "the body is not JSON") end
    body = v
  end
  local ok, why = self.apidoc:check(r, { query = req.query, headers = req.headers, body = body, params = params })
  if not ok then
    self.rejected[#self.rejected + 1] = req.route .. ": " .. why
    return M.api_error(req, 400, why)
  end
  return self:api(req, r, params, body)
end

---start{ port = 0, key = "standin-key", max_cpu = 16, polls = 3, backend = "bwrap"|"local"|"light", source = }
---  -> the stand-in
function M.start(o)
  o = o or {}
  local apidoc, tbdoc = M.documents(o.source or os.getenv("SBX_SOURCE_DIR") or root)
  local backend = o.backend
  if not backend then
    local ok, b = pcall(require, "sbx.providers.builtin.bwrap")
    backend = (ok and b.available and b.available()) and "bwrap" or "local"
  end
  local self = setmetatable({ key = o.key or "standin-key", max_cpu = o.max_cpu or 16, polls = o.polls or 3,
    backend = backend, sandboxes = {}, snapshots = {}, base_snapshots = { ["daytonaio/sandbox:0.4.3"] = true },
    apidoc = apidoc, tbdoc = tbdoc, rejected = {}, created = 0,
    state_dir = o.state_dir or os.getenv("SBX_STATE_DIR") or "/tmp" }, Standin)
  local srv = assert(H.serve{ port = o.port or 0, handler = function(req, res) return self:handle(req, res) end })
  self.srv, self.url, self.port = srv, srv.url, srv.port
  return self
end

function Standin:close()
  self.srv:close()
  for _, s in pairs(self.sandboxes) do self:destroy(s) end
end

-- As a process: serve until SIGTERM/SIGINT.
if arg and arg[0] and arg[0]:match("standin/daytona%.lua$") and not M.SPECS_ONLY then
  local o, i = {}, 1
  while arg[i] do
    local k, v = arg[i], arg[i + 1]
    if k == "--port-file" then o.port_file = v
    elseif k == "--port" then o.port = tonumber(v)
    elseif k == "--key" then o.key = v
    elseif k == "--max-cpu" then o.max_cpu = tonumber(v)
    elseif k == "--polls" then o.polls = tonumber(v)
    elseif k == "--backend" then o.backend = v
    elseif k == "--parent" then o.parent = v
    else error("daytona stand-in: unknown argument " .. tostring(k)) end
    i = i + 2
  end
  local s = M.start(o)
  if o.port_file then
    local f = assert(io.open(o.port_file .. ".tmp", "w"))
    f:write(tostring(s.port), "\n")
    f:close()
    assert(os.rename(o.port_file .. ".tmp", o.port_file))
  end
  io.stderr:write("daytona stand-in on ", s.url, " (", s.backend, ")\n")
  -- SIGTERM cancels this task; sbxlua then destroys every backing sandbox.
  -- With --parent PID it also ends when that process is gone (a spec that
  -- was killed leaves no stand-in behind).
  while true do
    loop.sleep(o.parent and 0.5 or 3600)
    local f = o.parent and io.open("/proc/" .. o.parent .. "/stat")
    if o.parent and not f then break end
    if f then f:close() end
  end
  s:close()
  return 0
end

return M
