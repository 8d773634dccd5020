-- A stand-in for E2B (NOTES.md, "E2B"): its control plane (e2b-openapi.yml)
-- and the envd of every sandbox (e2b_envd.lua) on one loopback port, each
-- "cloud sandbox" backed for real by an sbx sandbox (bwrap, else local).
-- Every control-plane request is checked against the OpenAPI document
-- (unknown fields and missing required ones are a 400, as E2B's server
-- does), with E2B's error shapes, its default 15 s lifetime, pause/connect,
-- snapshots, the v2 listing by metadata with X-Next-Token pages, and the
-- faults of spec/support/standin/http.lua per route.
--
-- How a client reaches a sandbox's envd: E2B names a host per sandbox,
-- <port>-<sandboxID>.<domain>; the SDKs, with E2B_SANDBOX_URL set, send
-- every envd request to that one URL with the headers E2b-Sandbox-Id and
-- E2b-Sandbox-Port instead (as E2B's own proxy takes them). The stand-in
-- routes on those headers (or on such a Host), so E2B_API_URL and
-- E2B_SANDBOX_URL are both http://127.0.0.1:PORT.
--
-- In a spec:      local E = require "spec.support.standin.e2b"
--                 local srv = assert(E.serve{ api_key = "e2b_test" })
-- As a process:   build/sbxlua spec/support/standin/e2b.lua --port-file F
--                 [--api-key K] [--scale] [--rate N] [--max-concurrent N]
--                 [--backend bwrap|local]   (give it its own SBX_STATE_DIR)
-- --split-envelopes: Connect envelopes in pieces across chunks, two sharing one.
-- --scale: sandboxes with no process behind them (e2b_scale.lua answers
-- their commands and keeps their files in memory), for thousands at once.
local H = require "spec.support.standin.http"
local O = require "spec.support.standin.e2b_openapi"
local envd = require "spec.support.standin.e2b_envd"
local loop = require "sbx.loop"
local json = require("cjson.safe").new()

local M = {}

M.SPECS = (os.getenv("SBX_SPECS_DIR") or "/work/shared/specs")
M.DEFAULT_TIMEOUT = 15            -- seconds, when a create names none (the spec's default)
M.ENVD_VERSION = "0.5.7"
M.DOMAIN = "e2b.local"

local function rid(n) return require("sbx.proc").random_hex(n) end
local function iso(t) return os.date("!%Y-%m-%dT%H:%M:%SZ", math.floor(t)) end
local function fail(res, status, msg, extra)
  local body = { code = status, message = msg }
  for k, v in pairs(extra or {}) do body[k] = v end
  return res:send(status, body)
end

local Standin = {}
Standin.__index = Standin

-- ------------------------------------------------------------ sandboxes

function Standin:backing(box, n)
  if self.scale then return require("spec.support.standin.e2b_scale").box() end
  local sbx = require "sbx"
  local sb = sbx.sandbox(self.backend, { env_vars = n.envVars, allow_internet = n.allow_internet_access,
                                         command_timeout_secs = 86400, labels = { e2b = box.id } })
  sb:mkdir(envd.HOME)
  if box.snapshot then sb:upload_dir(box.snapshot, "/workspace") end
  return sb
end

function Standin:arm(box)      -- the sandbox's lifetime: killed at endAt, unless paused
  if box.timer then box.timer:cancel() end
  box.timer = loop.spawn(function()
    while box.state == "running" do
      local left = box.end_at - os.time()
      if left <= 0 then return self:kill(box) end
      loop.sleep(math.min(left, 1))
    end
  end)
end

function Standin:kill(box)
  if self.boxes[box.id] ~= box then return end
  self.boxes[box.id] = nil
  self.live = self.live - 1
  box.state = "killed"
  for _, p in pairs(box.procs) do pcall(p.kill, p, "SIGKILL") end
  if box.timer and box.timer ~= loop.current() then box.timer:cancel() end
  if box.sb then pcall(box.sb.destroy, box.sb) end
end

local function sandbox_json(box, extra)
  local v = { templateID = box.template, sandboxID = box.id, clientID = "standin", envdVersion = M.ENVD_VERSION,
              envdAccessToken = box.token, domain = json.null, alias = box.alias,
              startedAt = iso(box.started), endAt = iso(box.end_at), cpuCount = 2, memoryMB = 512,
              diskSizeMB = 1024, metadata = box.metadata, state = box.state, trafficAccessToken = json.null,
              allowInternetAccess = box.internet == nil and json.null or box.internet }
  for k, x in pairs(extra or {}) do if x == false then v[k] = nil else v[k] = x end end
  return v
end

-- A create token per 1/rate s (429 with Retry-After past it).
function Standin:rate_limited()
  if not self.rate then return false end
  local now = loop.now()
  self.tokens = math.min(self.rate, (self.tokens or self.rate) + (now - (self.last or now)) * self.rate)
  self.last = now
  if self.tokens >= 1 then self.tokens = self.tokens - 1 return false end
  return math.max(1, math.ceil((1 - self.tokens) / self.rate))
end

function Standin:create(req, res, n)
  local wait = self:rate_limited()
  if wait then
    self.limited = self.limited + 1
    return res:send(429, { code = 429, message = "Rate limit exceeded, please try again later." },
                    { ["Retry-After"] = tostring(wait), ["RateLimit-Limit"] = tostring(self.rate) })
  end
  if self.max_concurrent and self.live >= self.max_concurrent then
    return fail(res, 429, string.format("You have reached the maximum number of concurrent E2B sandboxes (%d). "
      .. "If you need more, please contact us at 'https://e2b.dev/docs/getting-help'", self.max_concurrent))
  end
  local tpl, snap = n.templateID, self.snapshots[n.templateID]
  if not (self.templates[tpl] or snap) then return fail(res, 404, "template '" .. tpl .. "' not found") end
  local timeout = n.timeout or (req.path:match("^/v2/") and 300 or M.DEFAULT_TIMEOUT)
  local box = { id = "i" .. rid(19), template = tpl, alias = self.templates[tpl] and tpl or nil,
                metadata = n.metadata or {}, env = n.envVars or {}, started = os.time(),
                internet = n.allow_internet_access,
                end_at = os.time() + timeout, state = "running", procs = {}, seq = 0,
                token = (n.secure or req.path:match("^/v2/")) and rid(16) or nil,
                snapshot = snap and snap.dir, split = self.split }
  self.live = self.live + 1
  self.boxes[box.id] = box
  local ok, sb = pcall(self.backing, self, box, n)
  if not ok then
    self.boxes[box.id], self.live = nil, self.live - 1
    return fail(res, 500, "sandbox_create_failed: " .. tostring(type(sb) == "table" and sb.message or sb),
                { error_code = "sandbox_create_failed" })
  end
  if self.boxes[box.id] ~= box then pcall(sb.destroy, sb) return fail(res, 500, "the sandbox died at create") end
  box.sb = sb
  self.created = self.created + 1
  self:arm(box)
  return res:send(201, sandbox_json(box, { startedAt = false, endAt = false, cpuCount = false, memoryMB = false,
                                           diskSizeMB = false, metadata = false, state = false,
                                           allowInternetAccess = false }))
end

-- "k=v&k2=v2", keys and values URL-encoded (the SDK encodes them twice).
local function unescape(s) return (s:gsub("+", " "):gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end)) end
local function metadata_filter(q)
  local want = {}
  if not q or q == "" then return want end
  for pair in q:gmatch("[^&]+") do
    local k, v = pair:match("^([^=]*)=(.*)$")
    if not k then return nil end
    want[unescape(k)] = unescape(v)
  end
  return want
end

function Standin:list(req, res)
  local want = metadata_filter(req.query.metadata)
  if not want then return fail(res, 400, "invalid metadata query") end
  local states = {}
  for s in (req.query.state or "running,paused"):gmatch("[^,]+") do states[s] = true end
  local limit = math.tointeger(tonumber(req.query.limit or "100")) or 100
  local all = {}
  for _, box in pairs(self.boxes) do
    local ok = states[box.state]
    for k, v in pairs(want) do ok = ok and box.metadata[k] == v end
    if ok then all[#all + 1] = box end
  end
  table.sort(all, function(a, b) if a.started ~= b.started then return a.started > b.started end return a.id < b.id end)
  local from = 1
  if req.query.nextToken then
    for i, b in ipairs(all) do if b.id == req.query.nextToken then from = i end end
  end
  local page = {}
  for i = from, math.min(#all, from + limit - 1) do
    page[#page + 1] = sandbox_json(all[i], { envdAccessToken = false, domain = false, trafficAccessToken = false,
                                             allowInternetAccess = false })
  end
  local headers = { ["Content-Type"] = "application/json", ["X-Total-Running"] = tostring(self.live) }
  if from + limit <= #all then headers["X-Next-Token"] = all[from + limit].id end
  return res:send(200, #page == 0 and "[]" or json.encode(page), headers)
end

-- ------------------------------------------------------------ routing

function Standin:control(req, res)
  if req.path == "/standin/e2b" then     -- for specs in another process: what is alive
    return res:send(200, { live = self.live, created = self.created, limited = self.limited,
                           envd_calls = self.envd_calls })
  end
  local key = req.headers["x-api-key"]
  if key ~= self.api_key then
    return fail(res, 401, "Invalid API key, it must start with 'e2b_' prefix and be valid")
  end
  -- the SDK's v2 create/connect take the documented bodies
  -- (the spec has GET /v2/sandboxes; the SDK also creates with POST /v2/sandboxes
  -- and connects with POST /v2/sandboxes/{id}/connect, not in the spec)
  local path = req.path
  if req.method == "POST" then
    path = path:gsub("^/v2/sandboxes$", "/sandboxes"):gsub("^/v2/(sandboxes/[^/]+/connect)$", "/%1")
  end
  local op, params = self.api:match(req.method, path)
  if not op then return fail(res, 404, "no route " .. req.method .. " " .. req.path) end
  local why = self.api:check(op, req.query, req.body)
  if why then return fail(res, 400, why) end
  local body = req.body ~= "" and json.decode(req.body) or {}
  local id = params.sandboxID
  local box = id and self.boxes[id]
  local r = op.route
  if r == "POST /sandboxes" then return self:create(req, res, body) end
  if r == "GET /v2/sandboxes" or r == "GET /sandboxes" then return self:list(req, res) end
  if r == "POST /sandboxes/{sandboxID}/snapshots" and box then return self:snapshot(box, res, body) end
  if r == "DELETE /templates/{templateID}" then
    local s = self.snapshots[params.templateID]
    if not s then return fail(res, 404, "template '" .. params.templateID .. "' not found") end
    self.snapshots[params.templateID] = nil
    if s.dir then require("sbx.fs").rmtree(s.dir) end
    return res:send(204, "")
  end
  if id and not box then
    return fail(res, 404, "Sandbox \"" .. id .. "\" doesn't exist or you don't have access to it")
  end
  if r == "GET /sandboxes/{sandboxID}" then return res:send(200, sandbox_json(box)) end
  if r == "DELETE /sandboxes/{sandboxID}" then self:kill(box) return res:send(204, "") end
  if r == "POST /sandboxes/{sandboxID}/pause" then
    if box.state == "paused" then return fail(res, 409, "Sandbox \"" .. id .. "\" is already paused") end
    box.state = "paused"
    return res:send(204, "")
  end
  if r == "POST /sandboxes/{sandboxID}/connect" or r == "POST /sandboxes/{sandboxID}/resume" then
    local was = box.state
    box.state = "running"
    box.end_at = math.max(box.end_at, os.time() + (body.timeout or M.DEFAULT_TIMEOUT))
    self:arm(box)
    return res:send(was == "paused" and 201 or 200, sandbox_json(box, { startedAt = false, endAt = false,
      cpuCount = false, memoryMB = false, diskSizeMB = false, metadata = false, state = false,
      allowInternetAccess = false }))
  end
  if r == "POST /sandboxes/{sandboxID}/timeout" then
    box.end_at = os.time() + body.timeout
    return res:send(204, "")
  end
  return fail(res, 501, "the stand-in does not serve " .. r)
end

-- A snapshot keeps the sandbox's /workspace (what a restore brings back).
function Standin:snapshot(box, res, body)
  local sid = "snap_" .. rid(8)
  local s = { names = { body.name or sid } }
  if box.sb and box.sb.download_dir then
    s.dir = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/e2b-snapshot-" .. sid
    local ok, err = pcall(box.sb.download_dir, box.sb, "/workspace", s.dir)
    if not ok then return fail(res, 500, "snapshot failed: " .. tostring(type(err) == "table" and err.message or err)) end
  end
  self.snapshots[sid] = s
  return res:send(201, { snapshotID = sid, names = s.names })
end

function Standin:handler(req, res)
  local sid = req.headers["e2b-sandbox-id"]
  local port
  if not sid then port, sid = (req.headers.host or ""):match("^(%d+)%-([%w]+)%.") end
  if not sid then return self:control(req, res) end
  if req.headers["e2b-sandbox-port"] and req.headers["e2b-sandbox-port"] ~= "49983" then
    return res:send(502, { sandboxId = sid, message = "The sandbox is running but port is not open", code = 502 })
  end
  local box = self.boxes[sid]
  if not box or box.state ~= "running" or not box.sb then
    return res:send(502, { sandboxId = sid, message = "The sandbox was not found", code = 502 })
  end
  if box.token and req.headers["x-access-token"] ~= box.token then
    return res:send(401, { code = 401, message = "unauthorized access, please provide a valid access token or "
                           .. "method signing if supported" })
  end
  self.envd_calls = self.envd_calls + 1
  return envd.handle(box, req, res)
end

---serve{ port = 0, api_key = "e2b_standin", backend = "bwrap"|"local", scale =,
---rate = creates per second, max_concurrent = } -> stand-in (srv.url, srv.port,
---srv:fault{...}, srv:count(), srv:close()) | nil, why
function M.serve(o)
  o = o or {}
  local api, why = O.load(M.SPECS .. "/e2b-openapi.yml")
  if not api then return nil, why end
  local backend = o.backend
  if not backend and not o.scale then
    backend = require("sbx.providers.builtin.bwrap").available() and "bwrap" or "local"
  end
  local self = setmetatable({ api = api, api_key = o.api_key or "e2b_standin", backend = backend,
                              scale = o.scale, rate = o.rate, split = o.split, max_concurrent = o.max_concurrent,
                              boxes = {}, live = 0, created = 0, limited = 0, envd_calls = 0, snapshots = {},
                              templates = { base = true, ["code-interpreter-v1"] = true } }, Standin)
  local srv, err = H.serve{ port = o.port or 0, handler = function(req, res) return self:handler(req, res) end }
  if not srv then return nil, err end
  self.srv, self.url, self.port = srv, srv.url, srv.port
  return self
end

function Standin:fault(f) return self.srv:fault(f) end
function Standin:clear_faults() return self.srv:clear_faults() end
---Sandboxes alive on the stand-in (running or paused).
function Standin:count() return self.live end

function Standin:close()
  for _, box in pairs(self.boxes) do self:kill(box) end
  for _, snap in pairs(self.snapshots) do if snap.dir then require("sbx.fs").rmtree(snap.dir) end end
  self.srv:close()
end

-- Run as a process: serve until SIGTERM, the port in --port-file.
local function main(argv)
  local o, i = {}, 1
  while argv[i] do
    local a = argv[i]
    if a == "--scale" then o.scale = true
    elseif a == "--split-envelopes" then o.split = true
    elseif a == "--port-file" then o.port_file, i = argv[i + 1], i + 1
    elseif a == "--api-key" then o.api_key, i = argv[i + 1], i + 1
    elseif a == "--backend" then o.backend, i = argv[i + 1], i + 1
    elseif a == "--port" then o.port, i = tonumber(argv[i + 1]), i + 1
    elseif a == "--rate" then o.rate, i = tonumber(argv[i + 1]), i + 1
    elseif a == "--max-concurrent" then o.max_concurrent, i = tonumber(argv[i + 1]), i + 1
    else error("e2b stand-in: unknown argument " .. a) end
    i = i + 1
  end
  local s = assert(M.serve(o))
  if o.port_file then
    local tmp = o.port_file .. ".tmp"
    local f = assert(io.open(tmp, "w"))
    f:write(tostring(s.port), "\n")
    f:close()
    assert(os.rename(tmp, o.port_file))
  end
  io.stderr:write("e2b stand-in on ", s.url, "\n")
  local ok, err = pcall(function() while true do loop.sleep(3600) end end)
  s:close()
  if not ok then error(err, 0) end
end

if ... ~= "spec.support.standin.e2b" then main(arg or {}) end

return M
