--- The docker provider's agent volume: the read-only volume holding this
--- build's sbx-agent that every container mounts, filled once per engine
--- and agent build through a helper container, checked again before use,
--- and gc of the volumes other builds left (prune).
local json = require "cjson.safe"
local tar = require "sbx.tar"
local loop = require "sbx.loop"
local owner = require "sbx.state.owner"
local agentlink = require "sbx.daemon.link"
local hex = require("sbx.proc").random_hex
local common = require "sbx.providers.builtin.docker.common"
local engine = require "sbx.providers.builtin.docker.engine"

local M = {}
local call, api, expect, field, q = engine.call, engine.api, engine.expect, engine.field, engine.q
local create_container = engine.create_container

local agent_volume, agent_created, agent_path

local agent_hash = agentlink.hash

-- The volume holds each upload under a name of its own and, last, a
-- symlink `current` to a complete one (a file naming it, filled by builds
-- before 2026-12-02): an upload cut short (its sbxlua killed, the engine
-- restarted) can never leave a partial agent under the name the containers
-- run, even while another process fills the same volume.

local b64decode = require("sbx.core.base64").decode

-- A path's stat as HEAD answers it (X-Docker-Container-Path-Stat: base64
-- JSON, a symlink not followed) without the engine packing a tar of it:
-- 3-7 ms where a GET of the same small file took 65-80 here. nil where
-- the engine answers no stat (the path is missing, or an engine without it).
local function stat_path(cid, path)
  local res = call("HEAD", "/containers/" .. q(cid) .. "/archive?path=" .. q(path),
                   { op = "create", timeout = 60 })
  local raw = res.status == 200 and res.headers["x-docker-container-path-stat"]
  local st = type(raw) == "string" and json.decode(b64decode(raw) or "")
  return type(st) == "table" and st or nil
end

local function get_one(cid, path, max)
  local res = call("GET", "/containers/" .. q(cid) .. "/archive?path=" .. q(path),
                   { op = "create", timeout = 60, max_body = max })
  return res.status == 200 and not res.truncated and res.body or nil
end

-- The agent named: there, a plain file (no type or set-id bits), whole.
local function whole(cid, name, size)
  local path = common.AGENT_DIR .. "/" .. name
  local st = stat_path(cid, path)
  if st then
    local mode = math.tointeger(st.mode)
    return math.tointeger(st.size) == size and mode ~= nil and mode & ~0x1FF == 0
  end
  local list = tar.list(get_one(cid, path, size + 65536) or "")
  return list and #list == 1 and list[1].type == "file" and list[1].size == size
end

local function put_entry(cid, entry)
  local archive = assert(tar.pack({ entry }, { parents = false }))
  api("PUT", "/containers/" .. q(cid) .. "/archive?path=" .. q(common.AGENT_DIR), { 200 },
      { op = "create", body = archive, headers = { ["Content-Type"] = "application/x-tar" },
        kind = "SandboxCreationError" })
end

local function read_current(cid, size)
  local st, name = stat_path(cid, common.AGENT_DIR .. "/current")
  local link = st and type(st.linkTarget) == "string" and st.linkTarget ~= ""
  if link then
    name = st.linkTarget:match("([^/]+)$")         -- the engine answers it resolved
  else                                              -- a file naming it, or no stat
    name = tar.read_one(get_one(cid, common.AGENT_DIR .. "/current", 65536) or "", { max_bytes = 256 })
  end
  name = type(name) == "string" and name:match("^sbx%-agent%-%x+$") or nil
  -- the file it names must be there, whole (a volume another process or a
  -- gc damaged is filled again rather than handed to every container)
  if not (name and whole(cid, name, size)) then return nil end
  -- an older fill's file: the symlink from now on, for the next processes
  if st and not link then pcall(put_entry, cid, { path = "current", type = "symlink", target = name }) end
  return name
end

---The volume holding this build's sbx-agent, filled through a helper
---container (created, never started) on first use; returns the volume's
---name and the agent's path inside containers.
local function agent_volume_name() return common.VOLUME_PREFIX .. agent_hash(require "sbx.agentbin") end

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
    HostConfig = { Mounts = { { Type = "volume", Source = name, Target = common.AGENT_DIR } } } },
    { volumes = false }), { 201 }, { op = "create", kind = "SandboxCreationError", not_found = "SandboxCreationError" })
  res.json = json.decode(res.body or "")
  local cid = field(res, "Id", "string", { op = "create", kind = "SandboxCreationError" })
  local ok, file = pcall(function()
    local have = read_current(cid, #blob)
    if have then return have end
    local file = "sbx-agent-" .. agent_hash(blob) .. hex(6)
    put_entry(cid, { path = file, data = blob, mode = tonumber("755", 8) })
    put_entry(cid, { path = "current", type = "symlink", target = file })
    return file
  end)
  pcall(call, "DELETE", "/containers/" .. q(cid) .. "?force=true&v=false", { op = "create" })
  if not ok then error(file, 0) end
  agent_volume, agent_created, agent_path = name, created, common.AGENT_DIR .. "/" .. file
  return agent_volume, agent_path
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
      return agent_volume, agent_path
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
  local mine, n, prefix = agent_volume_name(), 0, common.VOLUME_PREFIX
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

M.ensure = ensure_agent_volume

return M
