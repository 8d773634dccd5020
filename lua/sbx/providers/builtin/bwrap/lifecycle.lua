--- The bwrap provider's lifecycle: create (the sandbox's root directory,
--- cgroup, limits and layout), resume, is_alive, destroy, and gc (reap,
--- list_owned, forget_session).
local fs = require "sbx.fs"
local cgroup = require "sbx.cgroup"
local native = require "sbx.bwrap"
local errors = require "sbx.core.errors"
local owner = require "sbx.state.owner"
local limits = require "sbx.providers.builtin.limits"
local host = require "sbx.providers.builtin.host"
local common = require "sbx.providers.builtin.bwrap.common"
local layout = require "sbx.providers.builtin.bwrap.layout"
local holder = require "sbx.providers.builtin.bwrap.holder"
local blimits = require "sbx.providers.builtin.bwrap.limits"

local M = {}
local fail, own, kill_holder = common.fail, holder.own, holder.kill_holder
local check_options, set_limits = blimits.check_options, blimits.set_limits
local mounts_of, top_entries = layout.mounts_of, layout.top_entries

local function sandboxes_dir(session) return owner.state_dir() .. "/bwrap/" .. session end

local function handle(st)
  local L = layout.layout()
  local h = { id = st.id, dir = st.dir, workdir = st.workdir, own = st.own, cg = st.cg, join = st.join,
              session = st.session, net = st.net and common.slirp ~= nil or false,
              rlimits = st.rlimits or { core = 0 }, roots = {} }
  if holder.as_root() then h.uid, h.gid = holder.ids() end
  h.resolv = h.net and layout.resolv_target() or nil
  h.mounts = mounts_of(L, h.dir, h.workdir)
  h.top = top_entries(L, h.workdir)
  local root, rerr, rcode = fs.open_root(h.dir)
  if not root then                 -- e.g. out of fds (EMFILE), or gone
    fail(rcode == "ENOENT" and "SandboxNotFoundError" or "SandboxCreationError",
          "cannot open the sandbox directory " .. h.dir .. ": " .. tostring(rerr),
          { code = rcode })
  end
  h.root = root
  return h
end

---@param spec table id=, session=, workdir=, allow_internet=, backend_options=, cpu=, memory_mb=
function M.create(spec)
  local rlim = check_options(spec)
  if spec.allow_internet == true and not common.slirp then
    fail("FeatureNotSupportedError", "allow_internet = true needs slirp4netns (apt-get install slirp4netns):"
         .. " without it bwrap sandboxes have no network", { op = "create" })
  end
  if spec.workdir then
    local root = fs.open_root(spec.workdir)
    if not root then
      fail("ConfigError", "workdir " .. spec.workdir .. " is not an existing directory",
            { op = "create" })
    end
    root:close()
  end
  local d, err = fs.mkdtemp(sandboxes_dir(spec.session), spec.id .. ".")
  if not d then fail("SandboxCreationError", "cannot create the sandbox directory: " .. err, { op = "create" }) end
  local cg = host.create_sandbox_cgroup(spec.session, spec.id)
  local h = handle{ id = spec.id, dir = d, own = true, cg = cg, session = spec.session,
                    workdir = spec.workdir and native.realpath(spec.workdir) or nil,
                    net = spec.allow_internet ~= false, rlimits = rlim }
  local lok, join, lerr = pcall(set_limits, spec, cg)
  if not lok or lerr then        -- refuse rather than run without the limits asked for
    M.destroy(h)
    if not lok then error(join, 0) end
    fail("SandboxCreationError", "cannot set the sandbox's limits: " .. lerr, { op = "create" })
  end
  h.join = join
  local ok, perr = native.populate(d, h.top)
  if not ok then
    M.destroy(h)
    fail("SandboxCreationError", "cannot lay out the sandbox root: " .. perr, { op = "create" })
  end
  local cok, cerr = pcall(function() for _, e in ipairs{ "", "workspace", "tmp" } do own(h, e) end end)
  if not cok then M.destroy(h) error(cerr, 0) end
  return h
end

function M.session_state(h)
  return { dir = h.dir, own = h.own, cg = h.cg, session = h.session, workdir = h.workdir,
           net = h.net, rlimits = h.rlimits, join = h.join }
end

function M.resume(state)
  require("sbx.state.claims").resume("bwrap", state)   -- an owned dir, a cgroup: sbxlua's own only
  if type(state.dir) ~= "string" then
    fail("ConfigError", "session state for bwrap has no 'dir'", { op = "resume" })
  end
  local root = fs.open_root(state.dir)
  if not root then fail("SandboxNotFoundError", "the sandbox directory " .. state.dir .. " is gone", { op = "resume" }) end
  root:close()
  if state.workdir then      -- its working directory is a host directory too (workdir =)
    local wd = fs.open_root(state.workdir)
    if not wd then
      fail("SandboxNotFoundError", "the sandbox's working directory " .. state.workdir .. " is gone", { op = "resume" })
    end
    wd:close()
  end
  return handle(state)
end

M.is_alive = host.dir_alive

local function close_roots(h)
  for _, r in pairs(h.roots or {}) do r:close() end
  h.roots = {}
  if h.root then h.root:close() end
  h.root = nil
end

function M.destroy(h)
  if h.link then h.link:close() end
  kill_holder(h)
  if h.cg then
    cgroup.remove(h.cg)
    limits.remove(h.session, h.id)   -- v1 groups, now empty
  end
  close_roots(h)
  if h.own then
    local ok, err = fs.rmtree(h.dir)
    if not ok then errors.core(err, "EIO", "bwrap", "destroy") end
  end
end

---Destroy what a dead session left, from its journal entry or a listing.
function M.reap(entry)
  entry = require("sbx.state.claims").reap_entry("bwrap", entry)   -- no path or cgroup the journal merely claims
  local _, dir, cg = host.left_by(entry)
  local failed
  if cg then
    local ok, err = cgroup.remove(cg)
    if not ok then failed = err end
  end
  if entry.session then limits.remove(entry.session, entry.id) end
  if dir and dir:find(owner.state_dir() .. "/bwrap/", 1, true) == 1 then
    local ok, err = fs.rmtree(dir)
    if not ok then failed = err end
  end
  -- reported, so gc keeps the session's journal and the next gc tries again
  if failed then errors.core(failed, "EBUSY", "bwrap", "gc") end
end

---Sandbox directories on disk, grouped by session (the list gc trusts).
function M.list_owned() return owner.sandbox_dirs("bwrap") end

function M.forget_session(session)
  os.remove(sandboxes_dir(session))
  limits.forget_session(session)
end

M.home = function() return common.WORKDIR end

return M
