--- Resource limits (cpu, memory_mb, pids) for sandboxes made of host
--- processes (bwrap), through cgroup controllers.
---
--- cgroup v2 first: when the machine gives our cgroup the controllers, the
--- limits sit on the sandbox's own cgroup, which every command's cgroup is
--- under. Else the cgroup v1 hierarchies a hybrid host mounts beside v2
--- (Debian with systemd.unified_cgroup_hierarchy=0, many VMs): a group per
--- sandbox in each, which the sandbox's processes join in the child before
--- exec (proc.spawn's `join`), so no descendant starts outside. Killing
--- stays with the v2 cgroup (cgroup.kill); v1 groups only limit, and are
--- removed once it is empty. A controller neither has is not offered: the
--- backend does not claim the option and routing skips it (G10).
local cgroup = require "sbx.cgroup"
local fs = require "sbx.fs"

local M = {}

M.CONTROLLERS = { "pids", "memory", "cpu" }
M.PIDS = 1024            -- default pids.max, as the docker backend's PidsLimit
M.CPU_PERIOD = 100000    -- microseconds

local function read(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

-- Write one control file; nil and a message naming it on failure.
local function put(path, value)
  local f, err = io.open(path, "w")
  if not f then return nil, err end
  local ok, werr = f:write(value)
  local cok, cerr = f:close()
  if not ok or not cok then return nil, path .. ": " .. tostring(werr or cerr) end
  return true
end

local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() end
  return f ~= nil
end

local function is_dir(path) return fs.list_host(path) ~= nil end

local function words(s)
  local set = {}
  for w in (s or ""):gmatch("[^%s,]+") do set[w] = true end
  return set
end

-- v1 hierarchies: controller -> our directory in it (<mount><own>/sbxlua),
-- from the texts of /proc/self/mountinfo and /proc/self/cgroup.
local function v1_dirs(mountinfo, selfcg)
  local own = {}
  for line in (selfcg or ""):gmatch("[^\n]+") do
    local ctrls, path = line:match("^%d+:([^:]*):(.*)$")
    for c in (ctrls or ""):gmatch("[^,]+") do own[c] = path end
  end
  local dirs = {}
  for line in (mountinfo or ""):gmatch("[^\n]+") do
    local root, mnt, rest = line:match("^%S+ %S+ %S+ (%S+) (%S+) .- %- (.*)$")
    local fstype, opts = (rest or ""):match("^(%S+) %S+ (%S+)")
    if fstype == "cgroup" and root == "/" then
      local set = words(opts)
      for _, c in ipairs(M.CONTROLLERS) do
        if set[c] and own[c] and not dirs[c] then
          dirs[c] = mnt .. (own[c] == "/" and "" or own[c]) .. "/sbxlua"
        end
      end
    end
  end
  return dirs
end

-- v2: the controllers our base may hand to its children, enabled in its
-- subtree_control (asking its parent first when the parent has them).
local function v2_controllers(base)
  local parent = base:match("^(.*)/[^/]+$")
  local up = words(parent and read(parent .. "/cgroup.controllers"))
  local have = words(read(base .. "/cgroup.controllers"))
  for _, c in ipairs(M.CONTROLLERS) do
    if not have[c] and up[c] then put(parent .. "/cgroup.subtree_control", "+" .. c) end
  end
  have = words(read(base .. "/cgroup.controllers"))   -- with what the parent gave
  local got = {}
  for _, c in ipairs(M.CONTROLLERS) do
    if have[c] and put(base .. "/cgroup.subtree_control", "+" .. c) then got[c] = true end
  end
  return got
end

---Which controllers limit sandboxes under v2 cgroup `base`, given the
---texts of /proc/self/mountinfo and /proc/self/cgroup (v2 first).
---@return table controller -> { v = 1 or 2, dir = base directory }
function M.detect(base, mountinfo, selfcg)
  local out = {}
  if not base then return out end            -- no v2 cgroup to kill through
  for c in pairs(v2_controllers(base)) do out[c] = { v = 2, dir = base } end
  for c, dir in pairs(v1_dirs(mountinfo, selfcg)) do
    if not out[c] and cgroup.create(dir) and exists(dir .. "/cgroup.procs") then
      out[c] = { v = 1, dir = dir }
    end
  end
  return out
end

local found   -- controller -> { v = 1|2, dir = }, once detected

---Which controllers limit sandboxes here, and how (detected once).
---@return table controller -> { v = 1 or 2, dir = base directory }
function M.controllers()
  if not found then
    found = M.detect(require("sbx.providers.builtin.host").containment(),
                     read("/proc/self/mountinfo"), read("/proc/self/cgroup"))
  end
  return found
end

---Replace what was detected (specs: a stand-in tree); nil detects again.
function M.use(controllers) found = controllers end

---What the sandbox options name, as controllers: option -> controller.
M.OPTION = { cpu = "cpu", memory_mb = "memory" }

---The files and values a request sets, per controller.
local function settings(c, v, want)
  if c == "pids" then return { { "pids.max", tostring(want.pids) } } end
  if c == "memory" then
    local bytes = tostring(math.floor(want.memory_mb * 1048576))
    if v == 2 then return { { "memory.max", bytes }, { "memory.swap.max", "0", optional = true } } end
    -- memsw (memory + swap) after the memory limit it must not be below
    return { { "memory.limit_in_bytes", bytes }, { "memory.memsw.limit_in_bytes", bytes, optional = true } }
  end
  local quota = tostring(math.max(1000, math.floor(want.cpu * M.CPU_PERIOD)))
  if v == 2 then return { { "cpu.max", quota .. " " .. M.CPU_PERIOD } } end
  return { { "cpu.cfs_period_us", tostring(M.CPU_PERIOD) }, { "cpu.cfs_quota_us", quota } }
end

-- The directory that limits sandbox `id` through controller `c`: its v2
-- cgroup (the controller enabled for it), or a v1 group of its own, whose
-- cgroup.procs goes on `join`. nil and why on failure.
local function group(c, how, session, id, cg, join)
  if how.v == 2 then
    local ok, err = put(cg:match("^(.*)/[^/]+$") .. "/cgroup.subtree_control", "+" .. c)
    if not ok then return nil, "cannot enable " .. c .. " for the session: " .. err end
    return cg
  end
  local dir = how.dir .. "/" .. session .. "/" .. id
  if not (cgroup.create(how.dir .. "/" .. session) and cgroup.create(dir)) then
    return nil, "cannot create " .. dir
  end
  join[#join + 1] = dir .. "/cgroup.procs"
  return dir
end

---Set `want` ({ pids=, memory_mb=, cpu= }, each optional) on sandbox `id`
---of `session`, whose v2 cgroup is `cg`.
---@return table|nil { join = { cgroup.procs paths } }, or nil and why
function M.apply(session, id, cg, want)
  local out = { join = {} }
  for _, c in ipairs(M.CONTROLLERS) do
    local key = c == "memory" and "memory_mb" or c
    local how = want[key] and M.controllers()[c]
    if want[key] and not how then return nil, "no " .. c .. " controller" end
    local dir, err = how and group(c, how, session, id, cg, out.join)
    if how and not dir then return nil, err end
    for _, s in ipairs(how and settings(c, how.v, want) or {}) do
      local path = dir .. "/" .. s[1]
      if not (s.optional and not exists(path)) then
        local ok, perr = put(path, s[2])
        if not ok then return nil, "cannot set " .. perr end
      end
    end
  end
  return out
end

---The pids in use and the pids limit of sandbox `id` (v2 cgroup `cg`), or
---nil when no pids controller limits it.
---@return integer|nil current, integer|nil max
function M.pids(session, id, cg)
  local how = M.controllers().pids
  if not how then return nil end
  local dir = how.v == 2 and cg or (how.dir .. "/" .. session .. "/" .. id)
  if not dir then return nil end
  local cur = tonumber((read(dir .. "/pids.current") or ""):match("%d+"))
  local max = tonumber((read(dir .. "/pids.max") or ""):match("%d+"))
  return cur, max
end

-- Remove a v1 group (its processes are dead: the v2 cgroup was killed).
local function rmdir(dir)
  local ok, err = os.remove(dir)
  if ok or not is_dir(dir) then return true end
  return nil, err
end

---Remove sandbox `id`'s v1 groups (after its v2 cgroup was removed).
function M.remove(session, id)
  for _, how in pairs(M.controllers()) do
    if how.v == 1 then rmdir(how.dir .. "/" .. session .. "/" .. id) end
  end
end

---Remove a dead session's v1 groups, and any sandbox group left in them.
function M.forget_session(session)
  for _, how in pairs(M.controllers()) do
    if how.v == 1 then
      local top = how.dir .. "/" .. session
      for _, name in ipairs(fs.list_host(top) or {}) do
        if is_dir(top .. "/" .. name) then rmdir(top .. "/" .. name) end
      end
      rmdir(top)
    end
  end
end

---One line for doctor: what is limited here, and how.
function M.describe()
  local parts = {}
  for _, c in ipairs(M.CONTROLLERS) do
    local how = M.controllers()[c]
    local name = c == "memory" and "memory_mb" or c
    parts[#parts + 1] = name .. (how and (" (cgroup v" .. how.v .. (c == "pids" and (", pids.max " .. M.PIDS) or "") .. ")")
                                 or ": not enforced")
  end
  return table.concat(parts, ", ")
end

return M
