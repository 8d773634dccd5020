--- The `docker` backend: containers on a Docker engine, spoken to through
--- the Engine API (no docker CLI). Every container gets sbx-agent (uploaded
--- at create through the archive endpoint) as its first process and as the
--- supervisor of each command, which gives exec what the Engine API lacks:
--- timeouts that kill the whole tree, a reported timeout distinct from exit
--- 124, and commands that end when they exit even if a daemon they started
--- keeps their output open.
local http = require "sbx.http"
local stream = require "sbx.stream"
local tar = require "sbx.tar"
local demux = require "sbx.demux"
local json = require "cjson.safe"
local loop = require "sbx.loop"
local meter = require "sbx.meter"
local fs = require "sbx.fs"
local errors = require "sbx.errors"
local owner = require "sbx.owner"
local claims = require "sbx.claims"
local paths = require "sbx.paths"
local agentlink = require "sbx.agentlink"
local hex = require("sbx.proc").random_hex

local M = {}

M.WORKDIR = "/workspace"
M.AGENT = "/.sbx/bin/sbx-agent"
M.RUNDIR = "/.sbx/run"
-- The capabilities a container keeps (all others are dropped): enough for
-- package managers and ordinary tools running as root inside.
M.CAPS = { "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
           "NET_BIND_SERVICE" }
M.DEFAULTS = { pids = 1024 }

M.descriptor = {
  name = "docker",
  description = "containers on a Docker engine (Engine API over its socket)",
  isolation = "container",
  capabilities = { "exec", "files", "streaming", "background", "snapshot", "resume", "network" },
  options = { image = true, cpu = true, memory_mb = true, allow_internet = true,
              snapshot_id = true, backend_options = true },
  price = { per_hour = 0, per_vcpu_hour = 0, per_gib_hour = 0 },
  -- what a container gets when the request names no cpu/memory_mb: the
  -- create, the meter's ledger and the price displays all read this
  defaults = { cpu = 1, memory_mb = 2048 },
  regions = {},
  limits = {},
}

-- Its keys under providers.docker in sbx.yaml (read through config.provider).
M.config_schema = {
  host = { type = "string", help = "the engine: unix:///path or tcp://host:port (after $DOCKER_HOST)" },
  image = { type = "string", help = "the image of a create that names none (before $SBX_DOCKER_IMAGE)" },
}

-- providers.docker of the config; a broken config reads as none.
local function settings()
  local ok, c = pcall(require("sbx.config").provider, "docker")
  return ok and c or {}
end

local API_MAX = 1.43          -- newest Engine API version this code speaks

local function fail(kind, msg, fields)
  fields = fields or {}
  fields.backend = "docker"
  errors.raise(kind, msg, fields)
end

-- -------------------------------------------------------------- transport

local conn                    -- { socket=, base=, prefix= }

local function endpoint()
  local host = os.getenv("DOCKER_HOST")
  if not host or host == "" then host = settings().host or "unix:///var/run/docker.sock" end
  if host:match("^unix://") then return { socket = host:sub(8), base = "http://docker", host = host } end
  local hp = host:match("^tcp://(.+)$") or host:match("^http://(.+)$")
  if hp then return { base = "http://" .. hp, host = host } end
  return nil, "unsupported DOCKER_HOST '" .. host .. "' (use unix:///path or tcp://host:port)"
end

-- Transport failures, in the words of someone fixing their machine.
local function why_unreachable(ep, msg, code)
  if code == "ENOENT" then
    return "no Docker socket at " .. tostring(ep.socket) .. " (install docker.io and start dockerd)"
  elseif code == "EACCES" then
    return "permission denied on " .. tostring(ep.socket) .. " (add the user to the docker group, or run as root)"
  elseif code == "ECONNREFUSED" then
    return "the Docker engine at " .. ep.host .. " is not running (start dockerd)"
  elseif code == "ETIMEDOUT" then
    return "the Docker engine at " .. ep.host .. " did not answer in time"
  end
  return "cannot reach the Docker engine at " .. ep.host .. ": " .. tostring(msg)
end

local function raw(ep, method, path, o)
  return http.request{
    url = ep.base .. path, unix_socket = ep.socket, method = method,
    headers = o.headers, body = o.body, timeout = o.timeout or 60,
    connect_timeout = 5, max_body = o.max_body, stream = o.stream,
  }
end

-- One call per key at a time, shared: tasks asking while it runs wait for
-- its answer (32 creates issued at once make one engine ping, one image
-- check and one agent-volume check, not 32 of each); later asks make their
-- own. A leader cancelled meanwhile leaves its followers to ask again.
local flights = {}
local function shared(key, fn, ...)
  while flights[key] do
    local f = flights[key]
    f.ev:wait()
    if f.done then
      if f.ok then return table.unpack(f.res, 1, f.res.n) end
      error(f.res[1], 0)
    end
  end
  local f = { ev = loop.event() }
  flights[key] = f
  local res = table.pack(pcall(fn, ...))
  flights[key] = nil
  f.done = not (not res[1] and errors.is(res[2], "Cancelled"))
  f.ok, f.res = res[1], table.pack(table.unpack(res, 2, res.n))
  f.ev:notify()
  if not f.ok then error(f.res[1], 0) end
  return table.unpack(f.res, 1, f.res.n)
end

---Connect (once): find the engine and agree on an API version.
local function connect_now()
  if conn then return conn end
  local ep, err = endpoint()
  if not ep then fail("BackendNotInstalledError", err) end
  local res, msg, code = raw(ep, "GET", "/_ping", { timeout = 5 })
  if not res then fail("BackendNotInstalledError", why_unreachable(ep, msg, code)) end
  if res.status ~= 200 then
    fail("BackendNotInstalledError", "the Docker engine answered /_ping with HTTP " .. res.status)
  end
  local v = tonumber(res.headers["api-version"] or "") or 1.41
  ep.prefix = string.format("/v%.2f", math.min(v, API_MAX))
  conn = ep
  return conn
end
local function connect() return conn or shared("connect", connect_now) end

local IDEMPOTENT = { GET = true, HEAD = true, DELETE = true, PUT = true }

-- The engine's error message: always a string, whatever the body holds.
local function message_of(res)
  local body = json.decode(res.body or "")
  local m = type(body) == "table" and body.message
  if type(m) == "string" then return m end
  return (res.body or ""):sub(1, 300)
end

-- A field of the engine's JSON answer that must be there (an id, a list);
-- a body without it is a broken engine, not a crash of ours.
local function field(res, name, want, o)
  local v = type(res.json) == "table" and res.json[name]
  if type(v) ~= want then
    fail(o.kind or "SandboxExecutionError", o.op .. ": the engine's answer has no " .. name
         .. " (HTTP " .. tostring(res.status) .. ", " .. #(res.body or "") .. " bytes)", { op = o.op })
  end
  return v
end

---One Engine API call, with a deadline; idempotent calls retry transport
---errors and 5xx/429 (at most 3 tries, jittered, honouring Retry-After).
---@return table res { status, headers, body, json }
local function call(method, path, o)
  o = o or {}
  local ep = connect()
  local body, headers = o.body, o.headers or {}
  if type(body) == "table" then
    body = json.encode(body)
    headers["Content-Type"] = "application/json"
  end
  local tries = IDEMPOTENT[method] and 3 or 1
  for attempt = 1, tries do
    local res, msg, code = raw(ep, method, ep.prefix .. path,
      { headers = headers, body = body, timeout = o.timeout, max_body = o.max_body, stream = o.stream })
    local again = attempt < tries and (not res or res.status >= 500 or res.status == 429)
    if not again then
      if not res then       -- the engine could not be reached (retryable: routing fails over),
        conn = nil          -- or answered with something that is not HTTP (EPROTO)
        fail(code == "ETIMEDOUT" and "SandboxTimeoutError" or code == "EPROTO" and "SandboxExecutionError"
             or "SandboxConnectionError",
             o.op .. ": " .. why_unreachable(ep, msg, code), { op = o.op, retryable = true, code = code })
      end
      return res
    end
    local wait = 0.1 * 2 ^ attempt * (0.5 + math.random())
    local ra = res and tonumber(res.headers["retry-after"] or "")
    if ra then wait = math.min(ra, 5) end
    if res and res.stream then res:close() end
    loop.sleep(wait)
  end
end

---call() that expects one of `ok` statuses; maps the rest to typed errors.
local function expect(res, ok, o)
  for _, s in ipairs(ok) do if res.status == s then return res end end
  local msg = o.op .. ": " .. message_of(res)
  if res.status == 404 then fail(o.not_found or "SandboxNotFoundError", msg, { op = o.op }) end
  if res.status == 409 then fail(o.conflict or "SandboxExecutionError", msg, { op = o.op }) end
  if res.status == 400 then fail(o.bad_request or "SandboxExecutionError", msg, { op = o.op }) end
  fail(o.kind or "SandboxExecutionError", msg .. " (HTTP " .. res.status .. ")",
       { op = o.op, retryable = res.status >= 500 })
end

local function api(method, path, ok, o)
  o = o or {}
  local res = expect(call(method, path, o), ok, o)
  if not o.stream and (res.headers["content-type"] or ""):find("json", 1, true) then
    res.json = json.decode(res.body)
  end
  return res
end

local function q(s) return http.escape(s) end

-- ------------------------------------------------------------ availability

function M.available()
  local ok, err = pcall(connect)
  if ok then return true end
  if errors.is(err, "Cancelled") then error(err, 0) end   -- the caller's, not the engine's
  return false, type(err) == "table" and err.message or tostring(err)
end

function M.home() return M.WORKDIR end

---The image of a create that names none: sbx.yaml's docker.image, else
---$SBX_DOCKER_IMAGE, else python:3.12-slim.
function M.default_image()
  return settings().image or os.getenv("SBX_DOCKER_IMAGE") or "python:3.12-slim"
end

---Is `image` on this engine? true | false | nil, why (no engine).
function M.has_image(image)
  local ok, res = pcall(call, "GET", "/images/" .. q(image) .. "/json", { op = "doctor", timeout = 10 })
  if not ok then return nil, type(res) == "table" and res.message or tostring(res) end
  return res.status == 200
end

-- "agent" (one sbx-agent stream per container) or "engine" (the fallback).
M.exec_mode = nil
local function mode()
  return M.exec_mode or os.getenv("SBX_DOCKER_EXEC") or "agent"
end

function M.doctor()
  local out = {}
  local ok, ep = pcall(connect)
  out[1] = { ok = ok, what = "engine", detail = ok and (ep.host .. ", API " .. ep.prefix:sub(3))
             or (type(ep) == "table" and ep.message or tostring(ep)),
             fix = "apt-get install docker.io and start dockerd (or set DOCKER_HOST)" }
  if ok then
    local image = M.default_image()
    local has = M.has_image(image)
    out[#out + 1] = { ok = has == true, what = "default image",
      detail = image .. (has and " is present locally"
               or " is not present locally: a create without an image pulls it from its registry"),
      fix = "docker pull " .. image .. ", or name an image you have in sbx.yaml (docker.image), "
            .. "$SBX_DOCKER_IMAGE or --image" }
  end
  local m = mode()
  out[#out + 1] = { what = "exec path", detail = m == "engine"
    and "engine exec per command (SBX_DOCKER_EXEC=engine): about 100 ms a command"
    or ("one sbx-agent stream per container (protocol " .. require("sbx.wire").VERSION
        .. "); the engine's exec is the fallback for a container where the agent cannot start") }
  if M.fallback then
    out[#out + 1] = { ok = false, what = "fallback used", detail = M.fallback,
               fix = "check that the image can run a static x86_64/aarch64 program from /.sbx/bin" }
  end
  return out
end

-- ---------------------------------------------------------------- create

local function merge(into, from)
  for k, v in pairs(from) do
    if type(v) == "table" and type(into[k]) == "table" and #v == 0 then merge(into[k], v)
    else into[k] = v end
  end
  return into
end

local function pull(image)
  local repo, tag = image:match("^(.-):([^:/]+)$")
  repo, tag = repo or image, tag or "latest"
  local stage <close> = require("sbx.progress").start("pull " .. repo .. ":" .. tag,
                                                     function() return "pulling" end)
  local res = call("POST", "/images/create?fromImage=" .. q(repo) .. "&tag=" .. q(tag),
                   { op = "pull", timeout = 600, max_body = 16 * 1024 * 1024 })
  local err = res.status ~= 200 and message_of(res) or nil
  for line in (not err and res.body or ""):gmatch("[^\r\n]+") do
    local ev = json.decode(line)
    if type(ev) == "table" and ev.error then err = tostring(ev.error) break end
  end
  stage:done(err and "failed" or "pulled")
  return err == nil, err
end

-- Gone, or going (another gc got there first): both are success.
local function remove_container(cid, volumes)
  local ok, res = pcall(call, "DELETE", "/containers/" .. q(cid) .. "?force=true&v=" .. (volumes == false and "false" or "true"),
                        { op = "destroy", timeout = 60 })
  local going = ok and res.status == 409 and message_of(res):find("already in progress", 1, true)
  if ok and res.status ~= 204 and res.status ~= 404 and not going then
    fail("SandboxExecutionError", "destroy: " .. message_of(res), { op = "destroy" })
  elseif not ok then
    error(res, 0)
  end
end

-- POST /containers/create?name=<name> in a task of its own: a cancel of the
-- caller (SIGINT) must not cut the call short, or the engine makes a
-- container nobody hears of. A caller cancelled first leaves: the task then
-- removes the container by name once the engine has answered (or failed to),
-- and the session waits for it at exit (owner.hold). Raises what call does.
local function create_container(name, body, o)
  local abandoned = false
  local t = loop.spawn(function()
    local ok, res = pcall(call, "POST", "/containers/create?name=" .. q(name),
                          { op = "create", body = body, timeout = o.timeout or 120 })
    if abandoned or not ok then pcall(remove_container, name, o.volumes) end
    if not ok then error(res, 0) end
    return res
  end)
  owner.hold(t)
  local jok, ok, res = pcall(t.join, t)
  if not jok then          -- cancelled: wait for the engine's answer; the task removes what it made
    abandoned = true
    pcall(t.join, t)
    error(ok, 0)
  end
  if not ok then error(res, 0) end
  return res
end

-- The agent reaches containers through a read-only volume filled once per
-- engine and agent build: uploading it into every container cost an extra
-- archive call (~50 ms: the engine re-executes itself to chroot for each).
M.AGENT_DIR = "/.sbx/bin"
local agent_volume, agent_created

local agent_hash = agentlink.hash

-- The volume holds each upload under a name of its own and, last, a file
-- `current` naming a complete one: an upload cut short (its sbxlua killed,
-- the engine restarted) can never leave a partial agent under the name the
-- containers run, even while another process fills the same volume.
local function read_current(cid, size)
  local res = call("GET", "/containers/" .. q(cid) .. "/archive?path=" .. q(M.AGENT_DIR .. "/current"),
                   { op = "create", timeout = 60, max_body = 65536 })
  if res.status ~= 200 then return nil end
  local name = tar.read_one(res.body or "", { max_bytes = 256 })
  name = type(name) == "string" and name:match("^sbx%-agent%-%x+$") or nil
  if not name then return nil end
  -- the file it names must be there, whole (a volume another process or a
  -- gc damaged is filled again rather than handed to every container)
  local got = call("GET", "/containers/" .. q(cid) .. "/archive?path=" .. q(M.AGENT_DIR .. "/" .. name),
                   { op = "create", timeout = 60, max_body = size + 65536 })
  local list = got.status == 200 and not got.truncated and tar.list(got.body or "")
  if not (list and #list == 1 and list[1].type == "file" and list[1].size == size) then return nil end
  return name
end

---The volume holding this build's sbx-agent, filled through a helper
---container (created, never started) on first use; returns the volume's
---name and the agent's path inside containers.
M.VOLUME_PREFIX = "sbxlua-agent-"
local function agent_volume_name() return M.VOLUME_PREFIX .. agent_hash(require "sbx.agentbin") end

-- What tells one volume of a name from another made later under it: its
-- CreatedAt (whole seconds on some engines) and the session that made it
-- (a volume removed and made again within the same second differs there).
local function volume_stamp(v)
  if type(v) ~= "table" or type(v.CreatedAt) ~= "string" then return nil end
  local session = type(v.Labels) == "table" and v.Labels["sbxlua.session"]
  return v.CreatedAt .. "|" .. (type(session) == "string" and session or "")
end

local function fill_agent_volume(image)
  local blob = require "sbx.agentbin"
  local name = agent_volume_name()
  -- labelled with this host and session: gc removes another build's volume
  -- only when that session is dead and no container uses it (M.prune)
  local vol = api("POST", "/volumes/create", { 201, 200 }, { op = "create", kind = "SandboxCreationError",
      body = { Name = name, Labels = { ["sbxlua.agent"] = "1", ["sbxlua.host"] = owner.hostname(),
                                       ["sbxlua.session"] = owner.session_id(),
                                       ["sbxlua.lock"] = owner.lock_path() } } })
  local created = volume_stamp(vol.json)
  local res = expect(create_container("sbx-agent-fill-" .. hex(6), {
    Image = image, Entrypoint = { "/nonexistent" },
    Labels = { ["sbxlua.helper"] = "agent-volume", ["sbxlua.host"] = owner.hostname(),
               ["sbxlua.session"] = owner.session_id(), ["sbxlua.lock"] = owner.lock_path(),
               ["sbxlua.id"] = "agent-helper" },
    HostConfig = { Mounts = { { Type = "volume", Source = name, Target = M.AGENT_DIR } } } },
    { volumes = false }), { 201 }, { op = "create", kind = "SandboxCreationError", not_found = "SandboxCreationError" })
  res.json = json.decode(res.body or "")
  local cid = field(res, "Id", "string", { op = "create", kind = "SandboxCreationError" })
  local ok, file = pcall(function()
    local have = read_current(cid, #blob)
    if have then return have end
    local file = "sbx-agent-" .. agent_hash(blob) .. hex(6)
    for _, entry in ipairs{ { path = file, data = blob, mode = tonumber("755", 8) },
                            { path = "current", data = file, mode = tonumber("644", 8) } } do
      local archive = assert(tar.pack({ entry }, { parents = false }))
      api("PUT", "/containers/" .. q(cid) .. "/archive?path=" .. q(M.AGENT_DIR), { 200 },
          { op = "create", body = archive, headers = { ["Content-Type"] = "application/x-tar" },
            kind = "SandboxCreationError" })
    end
    return file
  end)
  pcall(call, "DELETE", "/containers/" .. q(cid) .. "?force=true&v=false", { op = "create" })
  if not ok then error(file, 0) end
  agent_volume, agent_created, M.agent_path = name, created, M.AGENT_DIR .. "/" .. file
  return agent_volume, M.agent_path
end

-- One fill per process however many creates wait for it (a single-flight):
-- a task of its own, so a create cancelled meanwhile leaves it to finish
-- (and to remove its helper container); the session waits for it at exit.
local filling

local function ensure_agent_volume(image)
  if agent_volume then
    -- still there? (`docker volume prune`, or gc of another build, may have
    -- removed it; a container would then get an empty one and no agent)
    -- And the same volume: one removed and filled again by another process
    -- holds its agent under another name (the container exited 127).
    local res = agent_volume == agent_volume_name()
                and call("GET", "/volumes/" .. q(agent_volume), { op = "create" })
    local v = res and res.status == 200 and json.decode(res.body or "")
    if type(v) == "table" and (agent_created == nil or volume_stamp(v) == agent_created) then
      return agent_volume, M.agent_path
    end
    agent_volume = nil
  end
  if not filling or filling:status() == "done" then
    filling = loop.spawn(fill_agent_volume, image)
    owner.hold(filling)
  end
  local ok, name, path = filling:join()
  if not ok then error(name, 0) end
  return name, path
end

local function create_body(spec)
  local cpu, mb = meter.resources(spec, M.descriptor.defaults)
  local mem = math.floor(mb * 1024 * 1024)
  local labels = {
    ["sbxlua.host"] = owner.hostname(), ["sbxlua.session"] = spec.session,
    ["sbxlua.created"] = tostring(os.time()), ["sbxlua.ttl"] = tostring(spec.ttl or 3600),
    ["sbxlua.id"] = spec.id, ["sbxlua.lock"] = owner.lock_path(),
  }
  for k, v in pairs(spec.labels or {}) do labels[k] = tostring(v) end
  local body = {
    Image = spec.snapshot_id or spec.image or M.default_image(),
    Entrypoint = { spec.agent_path }, Cmd = { "sleep" },
    WorkingDir = M.WORKDIR, Labels = labels,
    HostConfig = {
      CapDrop = { "ALL" }, CapAdd = M.CAPS, SecurityOpt = { "no-new-privileges" },
      PidsLimit = M.DEFAULTS.pids, Memory = mem, MemorySwap = mem,
      NanoCpus = math.floor(cpu * 1e9), Init = true,
      LogConfig = { Type = "json-file", Config = { ["max-size"] = "1m", ["max-file"] = "1" } },
      NetworkMode = spec.allow_internet == false and "none" or nil,
      Mounts = { { Type = "volume", Source = spec.agent_volume, Target = M.AGENT_DIR, ReadOnly = true } },
      Tmpfs = { [M.RUNDIR] = "rw,mode=0700,size=65536k" },
    },
  }
  if spec.allow_internet == false then body.NetworkDisabled = true end
  if spec.backend_options then merge(body, spec.backend_options) end
  return body
end


local open_into     -- below, with the agent link

---@param spec table id, session, ttl, labels, image, cpu, memory_mb, allow_internet, snapshot_id, backend_options
function M.create(spec)
  connect()
  local image = spec.snapshot_id or spec.image or M.default_image()
  local res0 = shared("image " .. image, call, "GET", "/images/" .. q(image) .. "/json", { op = "create", timeout = 30 })
  if res0.status == 404 and spec.snapshot_id then
    fail("SandboxCreationError", "snapshot '" .. spec.snapshot_id .. "' does not exist on this engine", { op = "create" })
  elseif res0.status == 404 then
    local ok, why = shared("pull " .. image, pull, image)
    if not ok then
      fail("SandboxCreationError", "image '" .. image .. "' is not available locally and pulling it failed: "
           .. tostring(why), { op = "create" })
    end
  end
  spec.agent_volume, spec.agent_path = shared("agent volume", ensure_agent_volume, image)
  local body = create_body(spec)
  local name = "sbxlua-" .. spec.id
  local cid
  -- From the create call on, a failure or a cancel undoes the create: the
  -- container may exist even when its reply was lost (it has our name).
  local ok, err = pcall(function()
    -- a task of its own: a cancel waits for the engine's answer and removes
    -- what it made (create_container)
    local res = create_container(name, body, {})
    res = expect(res, { 201 }, { op = "create", kind = "SandboxCreationError",
                                 bad_request = "SandboxCreationError", conflict = "SandboxCreationError" })
    res.json = json.decode(res.body)
    cid = field(res, "Id", "string", { op = "create", kind = "SandboxCreationError" })
    api("POST", "/containers/" .. cid .. "/start", { 204, 304 }, { op = "create", kind = "SandboxCreationError",
        bad_request = "SandboxCreationError", conflict = "SandboxCreationError" })
  end)
  if not ok then      -- spec.left: create_on keeps the journal's line for gc
    if not pcall(remove_container, cid or name) then spec.left = true end
    if errors.is(err, "SandboxError") or errors.is(err, "Cancelled") then error(err, 0) end
    fail("SandboxCreationError", "create: " .. tostring(err), { op = "create" })
  end
  local h = { cid = cid, id = spec.id, session = spec.session, agent = spec.agent_path }
  -- the agent starts meanwhile: create does not wait for it (an engine exec
  -- costs ~40 ms), the first operation does if it comes sooner
  if mode() ~= "engine" then h.opener = loop.spawn(open_into, h) end
  return h
end

function M.session_state(h) return { container = h.cid, session = h.session } end

local function inspect(cid, op)
  local res = api("GET", "/containers/" .. q(cid) .. "/json", { 200 }, { op = op })
  field(res, "State", "table", { op = op })
  return res.json
end

function M.resume(state)
  if type(state.container) ~= "string" then
    fail("ConfigError", "session state for docker has no 'container'", { op = "resume" })
  end
  local info = inspect(state.container, "resume")
  local mine, why = claims.container(type(info.Config) == "table" and info.Config.Labels, state.id, state.session)
  if not mine then fail("ConfigError", "session state for docker: container " .. state.container .. ": " .. why, { op = "resume" }) end
  if not (info.State and info.State.Running) then
    fail("SandboxNotFoundError", "container " .. state.container .. " is not running", { op = "resume" })
  end
  -- the agent this container runs is its entrypoint
  local ep = type(info.Config) == "table" and type(info.Config.Entrypoint) == "table" and info.Config.Entrypoint[1]
  return { cid = state.container, id = state.id, session = state.session,
           agent = type(ep) == "string" and ep or M.AGENT }
end

function M.is_alive(h)
  local ok, info = pcall(inspect, h.cid, "is_alive")
  return ok and info.State.Running == true or false
end

function M.destroy(h)
  if h.opener and h.opener:status() ~= "done" then h.opener:cancel() end
  if h.link then h.link:close() end
  remove_container(h.cid)
end

function M.list_owned()
  local filters = json.encode{ label = { "sbxlua.host=" .. owner.hostname() } }
  local res = api("GET", "/containers/json?all=true&filters=" .. q(filters), { 200 }, { op = "gc" })
  local found = {}
  for _, c in ipairs(type(res.json) == "table" and res.json or {}) do
    local l = type(c) == "table" and type(c.Labels) == "table" and c.Labels or {}
    local function str(v) return type(v) == "string" and v or nil end
    if type(c) == "table" and str(c.Id) then
      found[#found + 1] = { session = str(l["sbxlua.session"]), id = str(l["sbxlua.id"]), container = c.Id,
                            lock = str(l["sbxlua.lock"]) }
    end
  end
  return found
end

---Destroy what a dead session left. The container a journal names is
---removed only if it carries this host's labels for that sandbox and
---session (inspected first); else the engine's labelled list is asked.
function M.reap(entry)
  local cid = type(entry.state) == "table" and entry.state.container or entry.container
  if type(cid) == "string" then
    local res = call("GET", "/containers/" .. q(cid) .. "/json", { op = "gc" })
    local info = res.status == 200 and json.decode(res.body or "")
    local ok, why = claims.container(type(info) == "table" and type(info.Config) == "table"
                                     and info.Config.Labels, entry.id, entry.session)
    if res.status ~= 200 and res.status ~= 404 then
      fail("SandboxExecutionError", "gc: inspecting " .. cid .. ": " .. message_of(res), { op = "gc" })
    elseif res.status == 200 and not ok then
      claims.warn("gc: docker ", tostring(entry.id), ": not removing container ", cid, ": ", why)
    end
    if not ok then cid = nil end
  else
    cid = nil
  end
  for _, c in ipairs(cid and {} or M.list_owned()) do
    if c.id == entry.id and (entry.session == nil or c.session == entry.session) then cid = c.container end
  end
  if cid then remove_container(cid) end
  -- a transfer's spool files (a SIGKILLed sbxlua leaves them): <id>-<hex>
  local dir = owner.state_dir() .. "/spool"
  for _, name in ipairs(entry.id and fs.list_host(dir) or {}) do
    if name:sub(1, #entry.id + 1) == entry.id .. "-" then os.remove(dir .. "/" .. name) end
  end
end

function M.snapshot(h)
  local labels = { ["sbxlua.snapshot"] = h.id, ["sbxlua.host"] = owner.hostname(),
                   ["sbxlua.session"] = h.session }
  local tag = h.id .. "-" .. os.time()
  local res = api("POST", "/commit?container=" .. q(h.cid) .. "&repo=sbxlua-snapshot&tag=" .. q(tag)
                  .. "&pause=true", { 201 }, { op = "snapshot", body = { Labels = labels }, timeout = 600 })
  return { snapshot_id = field(res, "Id", "string", { op = "snapshot" }) }
end

---Agent volumes of other sbxlua builds (each build fills its own) that
---this host's sbxlua filled in a session now dead, and that no container
---uses. A volume another process is filling is its live session's, so
---kept; so is one of another host on a shared engine, or unlabelled. A
---process of that build still running notices at its next create and
---fills its volume again.
---@return integer removed (or, with dry_run, that would be)
function M.prune(dry_run)
  local filters = json.encode{ label = { "sbxlua.agent", "sbxlua.host=" .. owner.hostname() },
                               dangling = { "true" } }
  local res = api("GET", "/volumes?filters=" .. q(filters), { 200 }, { op = "gc" })
  local mine, n, prefix = agent_volume_name(), 0, M.VOLUME_PREFIX
  local list = type(res.json) == "table" and type(res.json.Volumes) == "table" and res.json.Volumes or {}
  for _, v in ipairs(list) do
    local name = type(v) == "table" and type(v.Name) == "string" and v.Name or nil
    local l = type(v) == "table" and type(v.Labels) == "table" and v.Labels or {}
    local session, lock = l["sbxlua.session"], l["sbxlua.lock"]
    if name and name ~= mine and name:sub(1, #prefix) == prefix and name:sub(#prefix + 1):match("^%x+$")
       and l["sbxlua.host"] == owner.hostname() and type(session) == "string" and type(lock) == "string"
       and not owner.session_alive(session, lock) then
      if dry_run then
        io.stdout:write("would remove docker volume ", name, " (the agent of another sbxlua build)\n")
        n = n + 1
      elseif api("DELETE", "/volumes/" .. q(name), { 204, 404, 409 }, { op = "gc" }).status == 204 then
        n = n + 1             -- 409: a container took it meanwhile
      end
    end
  end
  return n
end

---Remove the snapshot images of dead session `session` that it never
---heard back about (not in `keep`): a commit its sbxlua was killed in.
---@return integer removed
function M.reap_snapshots(session, keep, dry_run)
  local filters = json.encode{ label = { "sbxlua.snapshot", "sbxlua.session=" .. session } }
  local res = api("GET", "/images/json?filters=" .. q(filters), { 200 }, { op = "gc" })
  local n = 0
  for _, img in ipairs(type(res.json) == "table" and res.json or {}) do
    local id = type(img) == "table" and type(img.Id) == "string" and img.Id or nil
    if id and not keep[id] then
      if dry_run then
        io.stdout:write("would remove docker snapshot image ", id, " (session ", session, ")\n")
        n = n + 1
      else  -- 409: a container runs from it, so somebody uses it: kept
        local del = api("DELETE", "/images/" .. q(id) .. "?force=true", { 200, 404, 409 }, { op = "gc" })
        if del.status == 200 then n = n + 1 end
      end
    end
  end
  return n
end

-- ----------------------------------------------------------------- exec

local function exec_create(h, cmd, env, op)
  local res = api("POST", "/containers/" .. q(h.cid) .. "/exec", { 201 }, { op = op,
    body = { AttachStdout = true, AttachStderr = true, AttachStdin = false, Tty = false,
             Cmd = cmd, Env = (env and #env > 0) and env or nil },
    conflict = "SandboxNotFoundError" })
  return field(res, "Id", "string", { op = op })
end

-- A short agent command (ls, rm, mkdir, kill): stdout, stderr, exit code.
local hijack

local function agent(h, args, op)
  local cmd = { h.agent or M.AGENT }
  for _, a in ipairs(args) do cmd[#cmd + 1] = a end
  local eid = exec_create(h, cmd, {}, op)
  local s, pending = hijack(eid, op)
  local d, out, err = demux.new(), {}, {}
  local chunk, msg = pending, nil
  while true do
    if not chunk or chunk == "" then chunk, msg = s:read(120) end
    if not chunk then break end
    local frames, ferr = d:feed(chunk)
    if not frames then msg = ferr break end
    for _, f in ipairs(frames) do
      local t = f.stream == 1 and out or err
      t[#t + 1] = f.data
    end
    chunk = nil
  end
  s:close()
  if msg then fail("SandboxExecutionError", op .. ": " .. msg, { op = op }) end
  local info = api("GET", "/exec/" .. eid .. "/json", { 200 }, { op = op })
  return table.concat(out), table.concat(err), math.tointeger(field(info, "ExitCode", "number", { op = op }))
end

-- The engine path's command: a ProcessHandle on the base (process_handle.lua)
-- over one hijacked exec stream.
local process_handle = require "sbx.process_handle"
local Exec = process_handle.class()


-- Start an exec on a hijacked connection (HTTP upgrade to a raw stream):
-- its output arrives multiplexed, and what we write is the command's stdin.
function hijack(eid, op)
  local ep = connect()
  local s, err, code
  if ep.socket then
    s, err, code = stream.connect{ unix = ep.socket, timeout = 10 }
  else
    local host, port = ep.base:match("^http://%[?([^%]/]-)%]?:(%d+)$")
    s, err, code = stream.connect{ host = host or ep.base:sub(8), port = port or "2375", timeout = 10 }
  end
  if not s then
    fail(code == "ETIMEDOUT" and "SandboxTimeoutError" or "SandboxConnectionError",
         op .. ": " .. why_unreachable(ep, err, code), { op = op, code = code })
  end
  local body = '{"Detach":false,"Tty":false}'
  local ok, werr = s:write("POST " .. ep.prefix .. "/exec/" .. eid .. "/start HTTP/1.1\r\n"
    .. "Host: docker\r\nContent-Type: application/json\r\nConnection: Upgrade\r\n"
    .. "Upgrade: tcp\r\nContent-Length: " .. #body .. "\r\n\r\n" .. body)
  local head = ""
  while ok and not head:find("\r\n\r\n", 1, true) and #head < 65536 do
    local chunk, rerr = s:read(30)
    if not chunk then ok, werr = false, rerr or "the engine closed the connection" break end
    head = head .. chunk
  end
  local i = head:find("\r\n\r\n", 1, true)
  local status = tonumber(head:match("^HTTP/1%.%d (%d%d%d)") or "")
  if not ok or not i or not status then
    s:close()
    fail("SandboxExecutionError", op .. ": starting the command failed: " .. tostring(werr or "bad answer"), { op = op })
  end
  local rest = head:sub(i + 4)
  if status ~= 101 and status ~= 200 then
    s:close()
    local msg = message_of{ body = rest }
    fail(status == 404 and "SandboxNotFoundError" or "SandboxExecutionError", op .. ": " .. msg, { op = op })
  end
  return s, rest
end

-- ------------------------------------------------------- the agent link

-- Every operation goes through one `sbx-agent serve` per container, started
-- once over a hijacked exec stream: a command then costs a frame each way
-- instead of an engine exec (a new runc process each time). The engine's
-- own exec and archive endpoints remain the fallback: SBX_DOCKER_EXEC=engine
-- (or M.exec_mode) forces it, and an agent that cannot start selects it
-- for that sandbox, remembered in M.fallback for `sbxlua doctor`.

-- The agent's protocol bytes are the exec's stdout; its stderr is kept for
-- the message when the link fails.
local function transport(s, pending)
  local d = demux.new()
  local t = { diag = "" }
  function t.read()
    while true do
      local chunk, msg = pending, nil
      pending = nil
      if not chunk or chunk == "" then chunk, msg = s:read() end
      if not chunk then return nil, msg or (t.diag ~= "" and t.diag) or nil end
      local frames, ferr = d:feed(chunk)
      if not frames then return nil, ferr end
      local out = {}
      for _, f in ipairs(frames) do
        if f.stream == 1 then out[#out + 1] = f.data
        else t.diag = (t.diag .. f.data):sub(-2000) end
      end
      if #out > 0 then return table.concat(out) end
    end
  end
  function t.write(data) return s:write(data) end
  function t.close() s:close() end
  return t
end

local function open_link(h)
  local res = api("POST", "/containers/" .. q(h.cid) .. "/exec", { 201 }, { op = "exec",
    body = { AttachStdout = true, AttachStderr = true, AttachStdin = true, Tty = false,
             Cmd = M.SERVE or { h.agent or M.AGENT, "serve" } },
    conflict = "SandboxNotFoundError" })
  local s, pending = hijack(field(res, "Id", "string", { op = "exec" }), "exec")
  return agentlink.open(transport(s, pending), 15)
end

---The sandbox's agent link, (re)opened on demand; nil when this sandbox
---uses the engine's exec path.
-- Open the agent link of h (in a task of its own: see link_of).
function open_into(h)
  local ok, link, why = pcall(open_link, h)
  if ok and link then
    h.link = link
  elseif not ok and errors.is(link, "SandboxNotFoundError") then
    h.open_error = link
  elseif not errors.is(link, "Cancelled") then
    h.no_agent = "sbx-agent serve did not start: " .. tostring(ok and why or (type(link) == "table" and link.message or link))
    M.fallback = h.no_agent
  end
end

---The sandbox's agent link, (re)opened on demand; nil when this sandbox
---uses the engine's exec path. One task opens it, however many wait.
local function link_of(h)
  if h.link and not h.link.broken then return h.link end
  if mode() == "engine" or h.no_agent then return nil end
  if not h.opener or h.opener:status() == "done" then h.opener = loop.spawn(open_into, h) end
  h.opener:join()
  local err = h.open_error
  h.open_error = nil
  if err then error(err, 0) end
  return h.link and not h.link.broken and h.link or nil
end
M.link_of = link_of

---Start a command through sbx-agent. req: argv, env, cwd, stdin, keep_stdin,
---timeout, max_output, stream.
function M.spawn(h, req)
  local link = link_of(h)
  if link then
    return link:spawn{ argv = req.argv, env = req.env, stdin = req.stdin, keep_stdin = req.keep_stdin,
      cwd = paths.resolve(M.WORKDIR, req.cwd or M.WORKDIR, "exec"), timeout = req.timeout,
      max_output = req.max_output, stream = req.stream, want_pid = req.want_pid }
  end
  return M.engine_spawn(h, req)
end

---The fallback: one engine exec per command, supervised by `sbx-agent run`.
function M.engine_spawn(h, req)
  local nonce = hex(16)
  local pidfile = M.RUNDIR .. "/" .. nonce .. ".pid"
  local cmd = { h.agent or M.AGENT, "run", "--pidfile", pidfile, "--stdin", "-",
                "--cwd", paths.resolve(M.WORKDIR, req.cwd or M.WORKDIR, "exec") }
  if req.timeout then
    cmd[#cmd + 1] = "--timeout"
    cmd[#cmd + 1] = string.format("%.3f", req.timeout)
  end
  cmd[#cmd + 1] = "--"
  for _, a in ipairs(req.argv) do cmd[#cmd + 1] = a end
  local res = api("POST", "/containers/" .. q(h.cid) .. "/exec", { 201 }, { op = "exec",
    body = { AttachStdout = true, AttachStderr = true, AttachStdin = true, Tty = false,
             Cmd = cmd, Env = (req.env and #req.env > 0) and req.env or nil },
    conflict = "SandboxNotFoundError" })
  local eid = field(res, "Id", "string", { op = "exec" })
  local e = process_handle.new(Exec, req,
    { h = h, eid = eid, pidfile = pidfile, held = "", d = demux.new() })
  e.s, e.pending = hijack(eid, "exec")
  if req.want_pid then           -- background processes show a pid; commands need none
    local ok, info = pcall(api, "GET", "/exec/" .. eid .. "/json", { 200 }, { op = "exec" })
    e.pid = ok and type(info.json) == "table" and math.tointeger(info.json.Pid) or nil
  end
  if req.stdin then
    -- written by a task of its own: a command that answers while it reads
    -- must not deadlock against us
    e.writer = loop.spawn(function()
      -- the command may end (or time out) before it read everything: then
      -- the stream is closed under us, which is no error of the caller's
      pcall(function()
        if #req.stdin > 0 then e.s:write(req.stdin) end
        e.s:shutdown()
      end)
    end)
  elseif not req.keep_stdin then
    e.s:shutdown()
  end
  return e
end

-- The agent's status record is the last bytes of stderr: hold back a tail.
local HOLD = 64

function Exec:_take(f)
  if f.stream == 1 then return self:_deliver(1, f.data) end
  local s = self.held .. f.data
  if #s > HOLD then
    self:_deliver(2, s:sub(1, -HOLD - 1))
    s = s:sub(-HOLD)
  end
  self.held = s
end

function Exec:_finish()
  if self.status then return end
  self:_ended()
  local i, kind, n = self.held:match("()%zSBXAGENT1 (%a+) (%-?%d+)\n$")
  if i then
    self:_deliver(2, self.held:sub(1, i - 1))
    self.status = { kind = kind, n = tonumber(n) }
  else
    self:_deliver(2, self.held)
    self.status = { kind = "lost", broken = self.read_failed }   -- the engine's stream broke
  end
  self.held = ""
end

-- Read one chunk from the engine; false at the end.
function Exec:_more()
  if self.eof then return false end
  local chunk, msg = self.pending, nil
  self.pending = nil
  if not chunk or chunk == "" then chunk, msg = self.s:read() end
  if not chunk then
    self.eof = true
    self.failure, self.read_failed = msg, msg ~= nil
    self.s:close()
    local ok, ferr = self.d:finish()
    if not ok and not msg then self.failure = ferr end
    self:_finish()
    return false
  end
  local frames, ferr = self.d:feed(chunk)
  if not frames then
    self.eof, self.failure = true, ferr
    self.s:close()
    self:_finish()
    return false
  end
  for _, f in ipairs(frames) do self:_take(f) end
  return true
end

-- The caller raised mid-wait (after the kill): the stream goes too.
function Exec:_abandon() self.s:close() end

function Exec:_status()
  self.status.why = self.failure
  return self.status
end

function Exec:running() return not self.eof end

function Exec:kill()
  if self.eof or self.killing then return end
  self.killing = true
  local ok, err = pcall(agent, self.h, { "kill", self.pidfile }, "kill")
  self.killing = false
  if not ok then error(err, 0) end
end

function Exec:_write(data) return self.s:write(data) end

function Exec:_end_stdin() self.s:shutdown() end

function Exec:_release()
  self.eof = true
  self.s:close()
end

-- ---------------------------------------------------------------- files

local function abs(path, op) return paths.resolve(M.WORKDIR, path, op) end

-- A failed agent file operation as the typed error of the facade.
local function file_error(op, p, errno, msg)
  local code = agentlink.ERRNO[errno]
  if errno == agentlink.BROKEN then fail("SandboxConnectionError", op .. ": " .. tostring(msg), { op = op }) end
  if errno == 2 then fail("FileNotFoundError", op .. ": " .. p .. ": No such file or directory", { op = op, errno = code }) end
  if errno == 27 then fail("SandboxExecutionError", op .. ": " .. msg, { op = op, code = "ETOOBIG", errno = code }) end
  if errno == 20 or errno == 21 or errno == 39 or errno == 17 then
    fail("PathError", op .. ": " .. msg, { op = op, code = code })
  end
  fail("SandboxExecutionError", op .. ": " .. tostring(msg), { op = op, code = code })
end

local function dirname(p) return p:match("^(.*)/[^/]*$") end

function M.write_file(h, path, data, mode)
  local p = abs(path, "write_file")
  mode = mode or tonumber("644", 8)
  if p == "/" then fail("PathError", "write_file: / is a directory", { op = "write_file" }) end
  local link = link_of(h)
  if link then
    local ok, errno, msg = link:write_file(p, data, mode)
    if not ok and errno == 2 then           -- like the archive path: parents are made
      local dok, derr, dmsg = link:mkdir(dirname(p))
      if not dok then file_error("write_file", p, derr, dmsg) end
      ok, errno, msg = link:write_file(p, data, mode)
    end
    if not ok then file_error("write_file", p, errno, msg) end
    return
  end
  local archive, err = tar.pack({ { path = p:sub(2), data = data, mode = mode } },
                                { parents = false })
  if not archive then fail("PathError", "write_file: " .. err, { op = "write_file" }) end
  api("PUT", "/containers/" .. q(h.cid) .. "/archive?path=/", { 200 },
      { op = "write_file", body = archive, headers = { ["Content-Type"] = "application/x-tar" },
        bad_request = "PathError", timeout = 300 })
end

-- A file of the state directory that data from the sandbox goes through
-- when it is too big to gather in memory piece by piece: add(chunk), then
-- path() (for tar) or read(max), and close() (removes it; idempotent).
local function spool(h, op)
  local dir = owner.state_dir() .. "/spool"
  local made, merr = fs.mkdir_host(dir)
  local root = made and fs.open_root(dir)
  if not root then fail("SandboxExecutionError", op .. ": spool: " .. tostring(merr), { op = op }) end
  local name, first = h.id .. "-" .. hex(6), true
  local sp = {}
  function sp.add(chunk)
    local ok, err = (first and root.write or root.append)(root, name, chunk)
    if not ok then fail("SandboxExecutionError", op .. ": spool: " .. tostring(err), { op = op }) end
    first = false
  end
  function sp.path()
    if first then sp.add("") end
    return dir .. "/" .. name
  end
  function sp.read(max)
    if first then return "" end
    local data, err = root:read(name, max)
    if not data then fail("SandboxExecutionError", op .. ": spool: " .. tostring(err), { op = op }) end
    return data
  end
  function sp.close()
    if not root then return end
    root:remove(name)
    root:close()
    root = nil
  end
  return sp
end

M.SPOOL_ABOVE = 4 * 1024 * 1024   -- read_file: bigger files come through a spool file

local function too_big(p, max)
  fail("SandboxExecutionError", "read_file: " .. p .. " is larger than the cap of " .. max .. " bytes",
       { op = "read_file", code = "ETOOBIG" })
end

---A file's data, its size cap checked before any of it is gathered; a big
---one peaks at twice its size (the gathered bytes, and the string Lua
---makes of them), not at a multiple of frames, buffers and copies.
function M.read_file(h, path, max)
  local p = abs(path, "read_file")
  max = max or 256 * 1024 * 1024
  local link = link_of(h)
  if link then
    local st = link:stat(p)              -- nil: read_file says why
    if st and st.type == "file" and st.size > max then too_big(p, max) end
    local data, errno, msg
    if st and st.type == "file" and st.size > M.SPOOL_ABOVE then
      local sp = spool(h, "read_file")
      local ok, err = pcall(function()
        data, errno, msg = link:read_to(p, max, sp.add)
        if data then data = sp.read(max) end
      end)
      sp.close()
      if not ok then error(err, 0) end
    else
      data, errno, msg = link:read_file(p, max)
    end
    if not data and errno == 27 then too_big(p, max) end
    if not data then file_error("read_file", p, errno, msg) end
    return data
  end
  local sp = spool(h, "read_file")
  local ok, data, err, code = pcall(function()
    local res = call("GET", "/containers/" .. q(h.cid) .. "/archive?path=" .. q(p),
                     { op = "read_file", stream = true, timeout = 300 })
    local rok, rerr = pcall(function()
      if res.status ~= 200 then
        local body = res:read() or ""
        expect({ status = res.status, headers = res.headers, body = body }, { 200 },
               { op = "read_file", not_found = "FileNotFoundError", bad_request = "PathError" })
      end
      local n = 0
      while true do
        local chunk, cerr = res:read()
        if not chunk then
          if cerr then fail("SandboxConnectionError", "read_file: " .. tostring(cerr), { op = "read_file", retryable = true }) end
          break
        end
        n = n + #chunk
        if n > max + 1024 * 1024 then too_big(p, max) end   -- headers and padding aside
        sp.add(chunk)
      end
    end)
    res:close()
    if not rok then error(rerr, 0) end
    return tar.read_one(nil, { file = sp.path(), max_bytes = max })
  end)
  sp.close()
  if not ok then error(data, 0) end
  if not data then
    if code == "EISDIR" then fail("PathError", "read_file: " .. p .. " is a directory", { op = "read_file" }) end
    if code == "ETOOBIG" then fail("SandboxExecutionError", "read_file: " .. err, { op = "read_file", code = code }) end
    fail("PathError", "read_file: " .. p .. ": " .. tostring(err), { op = "read_file", code = code })
  end
  return data
end

function M.list_files(h, path)
  local p = abs(path, "list_files")
  local link = link_of(h)
  if link then
    local entries, errno, msg = link:list(p)
    if not entries then file_error("list_files", p, errno, msg) end
    local prefix = path == "" and "" or (path:sub(-1) == "/" and path or path .. "/")
    for _, e in ipairs(entries) do
      e.path, e.is_dir = prefix .. e.name, e.type == "dir"
      e.size, e.mtime = math.tointeger(e.size), math.tointeger(e.mtime)
    end
    table.sort(entries, function(a, b) return a.name < b.name end)
    return entries
  end
  local out, err, code = agent(h, { "ls", p }, "list_files")
  if code == 3 then fail("FileNotFoundError", "list_files: " .. p .. ": No such file or directory", { op = "list_files" }) end
  if code == 4 then fail("PathError", "list_files: " .. p .. ": Not a directory", { op = "list_files" }) end
  if code ~= 0 then fail("SandboxExecutionError", "list_files: " .. err, { op = "list_files" }) end
  local list, fields = {}, {}
  for field in out:gmatch("([^%z]*)%z") do
    fields[#fields + 1] = field
    if #fields == 4 then
      local name = fields[4]
      local prefix = path == "" and "" or (path:sub(-1) == "/" and path or path .. "/")
      list[#list + 1] = { name = name, path = prefix .. name, type = fields[1], is_dir = fields[1] == "dir",
                          size = math.tointeger(tonumber(fields[2])), mtime = math.tointeger(tonumber(fields[3])) }
      fields = {}
    end
  end
  table.sort(list, function(a, b) return a.name < b.name end)
  return list
end

M.MAX_TREE_BYTES = 1 << 36     -- a download_dir archive spooled to disk stops here (64 GiB)
M.MAX_ARCHIVE_UPLOAD = 1 << 30 -- upload_dir without the agent: one archive in memory

---Write a tree of host entries (transfer.read_host_tree) under dir: through
---the agent link a chunk at a time; without it, one archive upload.
function M.put_tree(h, dir, entries)
  local transfer = require "sbx.transfer"
  local p = abs(dir, "upload_dir")
  M.mkdir(h, p)
  local link = link_of(h)
  if link then
    for _, e in ipairs(entries) do
      local dest = p .. "/" .. e.path
      if e.type == "dir" then
        M.mkdir(h, dest)
      elseif e.type == "file" then
        local ok, errno, msg = link:write_stream(dest, e.mode or tonumber("644", 8), transfer.chunks(e))
        if not ok then file_error("upload_dir", dest, errno, msg) end
      end
    end
    return
  end
  local list, total = {}, 0
  for _, e in ipairs(entries) do
    if e.type == "file" then
      total = total + (e.size or 0)
      if total > M.MAX_ARCHIVE_UPLOAD then
        fail("SandboxExecutionError", "upload_dir: more than " .. M.MAX_ARCHIVE_UPLOAD
             .. " bytes without the agent link (one archive in memory)", { op = "upload_dir", code = "ETOOBIG" })
      end
    end
  end
  for _, e in ipairs(entries) do
    local data
    if e.type == "file" then
      local parts = {}
      for _, chunk in transfer.chunks(e) do parts[#parts + 1] = chunk end
      data = table.concat(parts)
    end
    list[#list + 1] = { path = e.path, type = e.type, data = data, mode = e.mode }
  end
  if #list == 0 then return end
  local archive, err = tar.pack(list)
  if not archive then fail("PathError", "upload_dir: " .. err, { op = "upload_dir" }) end
  api("PUT", "/containers/" .. q(h.cid) .. "/archive?path=" .. q(p), { 200 },
      { op = "upload_dir", body = archive, headers = { ["Content-Type"] = "application/x-tar" },
        not_found = "FileNotFoundError", bad_request = "PathError", timeout = 600 })
end

-- The engine's archive of p, written to a spool file as it arrives (its
-- size costs no memory); returns the spool (path(), close()).
local function spool_archive(h, p, op)
  local res = call("GET", "/containers/" .. q(h.cid) .. "/archive?path=" .. q(p),
                   { op = op, stream = true, timeout = 600 })
  local sp
  local ok, err = pcall(function()
    if res.status ~= 200 then            -- the engine's message: a small body
      local body = res:read() or ""
      expect({ status = res.status, headers = res.headers, body = body }, { 200 },
             { op = op, not_found = "FileNotFoundError", bad_request = "PathError" })
    end
    sp = spool(h, op)
    local n = 0
    while true do
      local chunk, rerr = res:read()
      if not chunk then
        -- the engine's reply broke off mid-body: the link broke, not the command
        if rerr then fail("SandboxConnectionError", op .. ": " .. tostring(rerr), { op = op, retryable = true }) end
        break
      end
      n = n + #chunk
      if n > M.MAX_TREE_BYTES then
        fail("SandboxExecutionError", op .. ": " .. p .. " is larger than " .. M.MAX_TREE_BYTES .. " bytes",
             { op = op, code = "ETOOBIG" })
      end
      sp.add(chunk)
    end
    sp.size = n
  end)
  res:close()
  if not ok then
    if sp then sp.close() end
    error(err, 0)
  end
  return sp
end

---The tree under dir from one archive download, spooled to disk and read
---twice as hostile: first its entries (entries relative to dir, and the
---rejected ones), then, through the returned stream, its file data.
function M.get_tree(h, dir)
  local p = abs(dir, "download_dir")
  local sp = spool_archive(h, p, "download_dir")
  local file = sp.path()
  local ok, out, rejected, map = pcall(function()
    -- no tree holds more data than its archive: a bigger size is a lie
    local entries, rej = tar.extract(nil, { file = file, skip_unsafe = true, data = false,
                                            max_bytes = sp.size })
    if not entries then fail("SandboxExecutionError", "download_dir: " .. tostring(rej), { op = "download_dir" }) end
    local base = p == "/" and "" or p:match("[^/]+$")
    local res, by = {}, {}
    rej = rej or {}
    for _, e in ipairs(entries) do
      local rel = base == "" and e.path or (e.path == base and "" or e.path:match("^" .. base:gsub("%p", "%%%0") .. "/(.*)$"))
      if rel == nil then
        rej[#rej + 1] = { path = e.path, reason = "outside the requested directory" }
      elseif rel ~= "" then
        -- `escapes` is judged from the archive's root, the parent of `dir`
        if e.type == "symlink" and (e.escapes or paths.link_escapes(rel, e.target or "")) then
          rej[#rej + 1] = { path = rel, reason = "symlink out of the directory" }
        else
          res[#res + 1] = { path = rel, type = e.type, mode = e.mode }
          if e.type == "file" then by[e.path] = rel end
        end
      end
    end
    return res, rej, by
  end)
  if not ok then sp.close() error(out, 0) end
  local stream = {
    run = function(sink)
      local done, err = tar.extract(nil, { file = file, skip_unsafe = true, max_bytes = sp.size,
        sink = function(ap, chunk) local rel = map[ap] if rel then sink(rel, chunk) end end })
      if not done then fail("SandboxExecutionError", "download_dir: " .. tostring(err), { op = "download_dir" }) end
    end,
    close = sp.close,
  }
  return out, rejected, stream
end

function M.mkdir(h, path)
  local p = abs(path, "mkdir")
  local link = link_of(h)
  if link then
    local ok, errno, msg = link:mkdir(p)
    if not ok then file_error("mkdir", p, errno, msg) end
    return
  end
  local _, err, code = agent(h, { "mkdir", p }, "mkdir")
  if code == 4 then fail("PathError", "mkdir: " .. err, { op = "mkdir" }) end
  if code ~= 0 then fail("SandboxExecutionError", "mkdir: " .. err, { op = "mkdir" }) end
end

function M.remove(h, path, recursive)
  local p = abs(path, "remove")
  if p == "/" then fail("PathError", "remove: refusing to remove /", { op = "remove" }) end
  local link = link_of(h)
  if link then
    local ok, errno, msg = link:remove(p, recursive)
    if not ok and errno == 39 then fail("PathError", "remove: " .. p .. ": directory not empty", { op = "remove" }) end
    if not ok then file_error("remove", p, errno, msg) end
    return
  end
  local args = recursive and { "rm", "-r", p } or { "rm", p }
  local _, err, code = agent(h, args, "remove")
  if code == 3 then fail("FileNotFoundError", "remove: " .. p .. ": No such file or directory", { op = "remove" }) end
  if code == 4 then fail("PathError", "remove: " .. p .. ": directory not empty", { op = "remove" }) end
  if code ~= 0 then fail("SandboxExecutionError", "remove: " .. err, { op = "remove" }) end
end

return M
