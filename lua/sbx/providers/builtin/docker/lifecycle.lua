--- The docker provider's lifecycle: availability and doctor, create (image
--- check and pull, agent volume, the container's body, create and start),
--- resume, is_alive, destroy, snapshot, and gc (list_owned, reap,
--- reap_snapshots).
local json = require "cjson.safe"
local loop = require "sbx.loop"
local meter = require "sbx.routing.meter"
local fs = require "sbx.fs"
local errors = require "sbx.core.errors"
local owner = require "sbx.state.owner"
local claims = require "sbx.state.claims"
local common = require "sbx.providers.builtin.docker.common"
local engine = require "sbx.providers.builtin.docker.engine"
local volume = require "sbx.providers.builtin.docker.volume"
local link = require "sbx.providers.builtin.docker.link"

local M = {}
local fail, mode = common.fail, common.mode
local connect, shared, call, expect, api = engine.connect, engine.shared, engine.call, engine.expect, engine.api
local field, message_of, q, remove_container = engine.field, engine.message_of, engine.q, engine.remove_container
local create_container = engine.create_container

-- ------------------------------------------------------------ availability

function M.available()
  local ok, err = pcall(connect)
  if ok then return true end
  if errors.is(err, "Cancelled") then error(err, 0) end   -- the caller's, not the engine's
  return false, type(err) == "table" and err.message or tostring(err)
end

function M.home() return common.WORKDIR end

---Is `image` on this engine? true | false | nil, why (no engine).
function M.has_image(image)
  local ok, res = pcall(call, "GET", "/images/" .. q(image) .. "/json", { op = "doctor", timeout = 10 })
  if not ok then return nil, type(res) == "table" and res.message or tostring(res) end
  return res.status == 200
end

function M.doctor()
  local out = {}
  local ok, ep = pcall(connect)
  out[1] = { ok = ok, what = "engine", detail = ok and (ep.host .. ", API " .. ep.prefix:sub(3))
             or (type(ep) == "table" and ep.message or tostring(ep)),
             fix = "apt-get install docker.io and start dockerd (or set DOCKER_HOST)" }
  if ok then
    local image = common.default_image()
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
    or ("one sbx-agent stream per container (protocol " .. require("sbx.daemon.wire").VERSION
        .. "); the engine's exec is the fallback for a container where the agent cannot start") }
  if common.fallback then
    out[#out + 1] = { ok = false, what = "fallback used", detail = common.fallback,
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
  local stage <close> = require("sbx.core.progress").start("pull " .. repo .. ":" .. tag,
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

local function create_body(spec)
  local cpu, mb = meter.resources(spec, common.descriptor.defaults)
  local mem = math.floor(mb * 1024 * 1024)
  local labels = {
    ["sbxlua.host"] = owner.hostname(), ["sbxlua.session"] = spec.session,
    ["sbxlua.created"] = tostring(os.time()), ["sbxlua.ttl"] = tostring(spec.ttl or 3600),
    ["sbxlua.id"] = spec.id, ["sbxlua.lock"] = owner.lock_path(),
  }
  for k, v in pairs(spec.labels or {}) do labels[k] = tostring(v) end
  local body = {
    Image = spec.snapshot_id or spec.image or common.default_image(),
    Entrypoint = { spec.agent_path }, Cmd = spec.attach and { "sleep", "--serve" } or { "sleep" },
    WorkingDir = common.WORKDIR, Labels = labels,
    -- the first agent link is the container's own stdio (attached before
    -- the start), closed for good when that link ends (StdinOnce)
    OpenStdin = spec.attach or nil, StdinOnce = spec.attach or nil,
    AttachStdin = spec.attach or nil, AttachStdout = spec.attach or nil, AttachStderr = spec.attach or nil,
    HostConfig = {
      CapDrop = { "ALL" }, CapAdd = common.CAPS, SecurityOpt = { "no-new-privileges" },
      PidsLimit = common.DEFAULTS.pids, Memory = mem, MemorySwap = mem,
      -- the attached agent is the first process itself: it reaps orphans as
      -- an init does, and no init holds its stdio open past its server
      NanoCpus = math.floor(cpu * 1e9), Init = not spec.attach,
      -- (the attached agent's protocol bytes are its stdout: never logged)
      LogConfig = spec.attach and { Type = "none" }
                  or { Type = "json-file", Config = { ["max-size"] = "1m", ["max-file"] = "1" } },
      NetworkMode = spec.allow_internet == false and "none" or nil,
      Mounts = { { Type = "volume", Source = spec.agent_volume, Target = common.AGENT_DIR, ReadOnly = true } },
      Tmpfs = { [common.RUNDIR] = "rw,mode=0700,size=65536k" },
    },
  }
  if spec.allow_internet == false then body.NetworkDisabled = true end
  if spec.backend_options then merge(body, spec.backend_options) end
  return body
end

---@param spec table id, session, ttl, labels, image, cpu, memory_mb, allow_internet, snapshot_id, backend_options
function M.create(spec)
  connect()
  local image = spec.snapshot_id or spec.image or common.default_image()
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
  spec.agent_volume, spec.agent_path = shared("agent volume", volume.ensure, image)
  spec.attach = mode() ~= "engine" and not common.SERVE   -- (SERVE: a test's own server, over an exec)
  local body = create_body(spec)
  local name = "sbxlua-" .. spec.id
  local cid, s, pending
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
    if spec.attach then       -- no link this way: the first operation opens one over an exec
      local aok, a, rest = pcall(engine.attach, cid, "create")
      if aok then s, pending = a, rest elseif errors.is(a, "Cancelled") then error(a, 0) end
    end
    api("POST", "/containers/" .. cid .. "/start", { 204, 304 }, { op = "create", kind = "SandboxCreationError",
        bad_request = "SandboxCreationError", conflict = "SandboxCreationError" })
  end)
  if not ok then      -- spec.left: create_on keeps the journal's line for gc
    if s then s:close() end
    if not pcall(remove_container, cid or name) then spec.left = true end
    if errors.is(err, "SandboxError") or errors.is(err, "Cancelled") then error(err, 0) end
    fail("SandboxCreationError", "create: " .. tostring(err), { op = "create" })
  end
  local h = { cid = cid, id = spec.id, session = spec.session, agent = spec.agent_path }
  -- the agent starts meanwhile: create does not wait for it (an engine exec
  -- costs ~40 ms), the first operation does if it comes sooner
  if s then h.opener = loop.spawn(link.open_attached, h, s, pending)
  elseif mode() ~= "engine" then h.opener = loop.spawn(link.open_into, h) end
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
           agent = type(ep) == "string" and ep or common.AGENT }
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

return M
