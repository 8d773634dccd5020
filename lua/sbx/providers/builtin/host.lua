--- What the built-in backends (local, bwrap) and the commands compute about
--- this host, once: the default PATH of commands (and of the host programs
--- sbxlua looks up: bwrap, slirp4netns, python3), and containment, the
--- cgroup where each sandbox's processes go.
local M = {}

-- The PATH of every command that sets none, and where host programs are looked up.
M.DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

local cg_base, cg_reason
---Where sandboxes' cgroups go, or nil and why not (then: process groups).
---@return string|nil base, string|nil why
function M.containment()
  if cg_base == nil and cg_reason == nil then
    local base, err = require("sbx.cgroup").base()
    if base then cg_base = base else cg_reason = err end
  end
  return cg_base, cg_reason
end

---The cgroup of sandbox `id` of `session` (its path whether or not it
---exists), or nil without containment.
function M.sandbox_cgroup(session, id)
  local base = M.containment()
  return base and base .. "/" .. session .. "/" .. id or nil
end

---Create the cgroup of sandbox `id` of `session` (and its session's);
---its path, or nil without containment or when the kernel refuses.
function M.create_sandbox_cgroup(session, id)
  local base = M.containment()
  if not base then return nil end
  local scg = base .. "/" .. session
  local cgroup = require "sbx.cgroup"
  if cgroup.create(scg) and cgroup.create(scg .. "/" .. id) then return scg .. "/" .. id end
  return nil
end

---What the journal entry (or gc listing) `entry` of a dead session names
---on this host: its state, its directory, and its cgroup (containment's
---for that sandbox when the state names none).
---@return table state, string|nil dir, string|nil cgroup
function M.left_by(entry)
  local st = entry.state or {}
  local cg = st.cg
  if not cg and entry.session then cg = M.sandbox_cgroup(entry.session, entry.id) end
  return st, st.dir or entry.dir, cg
end

---is_alive of a sandbox made of a host directory (local, bwrap): its
---handle is open and its directory still there.
function M.dir_alive(h)
  if not h.root then return false end
  local r = require("sbx.fs").open_root(h.dir)
  if r then r:close() end
  return r ~= nil
end

return M
