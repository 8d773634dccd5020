--- The `local` backend: host processes in a private directory.
---
--- It isolates files (the file API is jailed beneath the directory) and the
--- environment (built from scratch), and contains process trees in a cgroup
--- where one is writable. It is NOT a security boundary: commands run as
--- your user on the host and can read host paths. Use bwrap or docker for
--- untrusted code.
local fs = require "sbx.fs"
local proc = require "sbx.proc"
local cgroup = require "sbx.cgroup"
local errors = require "sbx.core.errors"
local owner = require "sbx.state.owner"
local host = require "sbx.providers.builtin.host"

local M = {}

M.descriptor = {
  name = "local",
  description = "host processes in a private directory (no security boundary)",
  isolation = "process",
  capabilities = { "exec", "files", "streaming", "background", "resume", "network" },
  -- create options it honours beyond the ones every backend takes
  options = { workdir = true },
  price = { per_hour = 0, per_vcpu_hour = 0, per_gib_hour = 0 },
  regions = {},
  limits = {},
}

---Where sandboxes' cgroups go, or nil and why not: sbx.host's (kept here
---for callers of old).
M.containment = host.containment

function M.available() return true end

local function fail(msg, code, op)
  errors.core(msg, code, "local", op)
end

local function sandboxes_dir(session) return owner.state_dir() .. "/local/" .. session end

-- Destroyed sandboxes' directories, emptied and kept in <state>/local/.spare
-- (not a session name: gc never lists it) to be renamed into the next
-- sandbox's name. On ext4 a mkdir and an rmdir cost more than the rest of
-- a create and a destroy (fs.spare_dir says why). `names` is this
-- process's view; another process may take one first (take_dir fails, the
-- next is tried), so the bound is approximate. 1024: a job of 1,000
-- sandboxes at once finds its directories there on its next run (each spare
-- is an empty directory: an inode and a block).
local SPARES = math.tointeger(tonumber(os.getenv("SBX_LOCAL_SPARES") or "")) or 1024
local spares = { dir = nil, names = {} }

local function spare_list()
  local dir = owner.state_dir() .. "/local/.spare"
  if spares.dir ~= dir then
    local names = fs.list_host(dir)
    if not names then fs.mkdir_host(dir) end
    spares.dir, spares.names = dir, names or {}
  end
  return spares
end

local function new_dir(spec)
  local s, parent = spare_list(), sandboxes_dir(spec.session)
  while #s.names > 0 do
    local d = fs.take_dir(s.dir .. "/" .. table.remove(s.names), parent, spec.id .. ".")
    if d then return d end
  end
  return fs.mkdtemp(parent, spec.id .. ".")
end

-- true, or nil and why: the directory emptied and spared, else removed
-- (what the sandbox changed on it, a symlink in its place, a mount inside:
-- rmtree decides as before).
local function remove_dir(dir)
  local s = spare_list()
  if #s.names < SPARES then
    local name = proc.random_hex(8)
    if fs.spare_dir(dir, s.dir .. "/" .. name) then
      s.names[#s.names + 1] = name
      return true
    end
  end
  return fs.rmtree(dir)
end

---@param spec table id=, session=, workdir=
function M.create(spec)
  local dir, own = spec.workdir, false
  if dir then
    local root = fs.open_root(dir)
    if not root then
      errors.raise("ConfigError", "workdir " .. dir .. " is not an existing directory",
                   { backend = "local", op = "create" })
    end
    root:close()
  else
    local d, err = new_dir(spec)
    if not d then
      errors.raise("SandboxCreationError", "cannot create the sandbox directory: " .. err,
                   { backend = "local", op = "create" })
    end
    dir, own = d, true
  end
  local h = { id = spec.id, dir = dir, own = own, session = spec.session }
  h.cg = host.create_sandbox_cgroup(spec.session, spec.id)
  local root, rerr, rcode = fs.open_root(dir)
  if not root then                 -- e.g. out of fds (EMFILE): fail whole
    if h.cg then cgroup.remove(h.cg) end
    if own then fs.rmtree(dir) end
    errors.raise("SandboxCreationError", "cannot open the sandbox directory: " .. tostring(rerr),
                 { backend = "local", op = "create", code = rcode, retryable = rcode == "EMFILE" })
  end
  h.root = root
  return h
end

function M.session_state(h)
  return { dir = h.dir, own = h.own, cg = h.cg, session = h.session }
end

function M.resume(state)
  require("sbx.state.claims").resume("local", state)   -- an owned dir, a cgroup: sbxlua's own only
  if type(state.dir) ~= "string" then
    errors.raise("ConfigError", "session state for local has no 'dir'", { backend = "local", op = "resume" })
  end
  local root = fs.open_root(state.dir)
  if not root then
    errors.raise("SandboxNotFoundError", "the sandbox directory " .. state.dir .. " is gone",
                 { backend = "local", op = "resume" })
  end
  return { id = state.id, dir = state.dir, own = state.own, cg = state.cg,
           session = state.session, root = root }
end

M.is_alive = host.dir_alive

-- Kill every process of the sandbox: its cgroup, or (no cgroup) every
-- process whose working directory is inside its own private directory
-- (never a user-given workdir: the user's shell may sit there).
local function kill_all(dir, cg, own)
  if cg then
    local ok = cgroup.remove(cg)
    if ok then return end
  end
  for _ = 1, own and 3 or 0 do
    local pids = cgroup.pids_in_dir(dir)
    if #pids == 0 then break end
    for _, pid in ipairs(pids) do cgroup.kill_tree(pid) end
  end
end

function M.destroy(h)
  kill_all(h.dir, h.cg, h.own)
  if h.root then h.root:close() end
  h.root = nil
  if h.own then
    local ok, err = remove_dir(h.dir)
    if not ok then fail(err, "EIO", "destroy") end
  end
end

---Destroy what a dead session left, from its journal entry or a listing.
function M.reap(entry)
  entry = require("sbx.state.claims").reap_entry("local", entry)   -- no path or cgroup the journal merely claims
  local st, dir, cg = host.left_by(entry)
  local own = st.own ~= false and dir ~= nil
              and dir:find(owner.state_dir() .. "/local/", 1, true) == 1
  if dir then kill_all(dir, cg, own) elseif cg then cgroup.remove(cg) end
  if own then   -- reported, so gc keeps the session's journal and the next gc tries again
    local ok, err = fs.rmtree(dir)
    if not ok then fail(err, "EBUSY", "gc") end
  end
end

---Resources on disk, grouped by session (the provider's own list for gc).
function M.list_owned() return owner.sandbox_dirs("local") end

---Remove a dead session's now-empty containers (directory, cgroup).
function M.forget_session(session)
  os.remove(sandboxes_dir(session))
  local base = host.containment()
  if base then    -- each try waits up to 2 s for dying members; then say so
    local ok, err
    for _ = 1, 3 do
      ok, err = cgroup.remove(base .. "/" .. session)
      if ok then return end
    end
    fail(err, "EBUSY", "gc")
  end
end

-- ------------------------------------------------------------- commands

local function host_cwd(h, cwd)
  if cwd == nil then return h.dir end
  local st, err, code = h.root:stat(cwd)
  if not st then fail("cwd " .. cwd .. ": " .. err, code, "exec") end
  if st.type ~= "dir" then
    errors.raise("PathError", "cwd " .. cwd .. " is not a directory", { backend = "local", op = "exec" })
  end
  local path, rerr, rcode = h.root:resolve(cwd)
  if not path then fail(rerr, rcode, "exec") end
  return path
end

---Start a process. req: argv, env (list), cwd, stdin, keep_stdin, timeout,
---max_output, stream. Returns a sbx.Proc.
function M.spawn(h, req)
  local p, err, code = proc.spawn{
    argv = req.argv, env = req.env, cwd = host_cwd(h, req.cwd),
    stdin = req.stdin, keep_stdin = req.keep_stdin, timeout = req.timeout,
    max_output = req.max_output, stream = req.stream, cgroup = h.cg,
  }
  if not p then
    errors.raise("SandboxExecutionError", err, { backend = "local", op = "exec", code = code })
  end
  return p
end

-- ---------------------------------------------------------------- files

local function call(h, op, method, ...)
  local r, err, code = h.root[method](h.root, ...)
  if r == nil then fail(err, code, op) end
  return r
end

function M.read_file(h, path, max) return call(h, "read_file", "read", path, max) end
function M.write_file(h, path, data, mode) call(h, "write_file", "write", path, data, mode) end
function M.list_files(h, path) return call(h, "list_files", "list", path) end
function M.mkdir(h, path) call(h, "mkdir", "mkdir", path) end
function M.remove(h, path, recursive) call(h, "remove", "remove", path, recursive) end

M.home = function(h) return h.dir end
-- The file API's "/" is the working directory (commands see host paths).
M.rooted_at_workdir = true

local function join(a, b) return (a == "" or a == ".") and b or (a:gsub("/+$", "") .. "/" .. b) end

---Write a tree of host entries (transfer.read_host_tree) under dir, each
---file copied root to root through a small buffer.
function M.put_tree(h, dir, entries)
  call(h, "upload_dir", "mkdir", dir)
  for _, e in ipairs(entries) do
    local p = join(dir, e.path)
    if e.type == "dir" then call(h, "upload_dir", "mkdir", p)
    elseif e.type == "file" then require("sbx.core.transfer").copy_in(e, h.root, p) end
  end
end

---Read the tree under dir: entries, and the rejected ones (jailed reads
---never leave the sandbox; links are not followed).
function M.get_tree(h, dir)
  local entries, rejected = {}, {}
  local function walk(rel)
    for _, it in ipairs(call(h, "download_dir", "list", rel == "" and dir or join(dir, rel))) do
      local r = rel == "" and it.name or rel .. "/" .. it.name
      local full = join(dir, r)
      if it.type == "dir" then
        entries[#entries + 1] = { path = r, type = "dir", mode = call(h, "download_dir", "stat", full).mode }
        walk(r)
      elseif it.type == "file" then
        local root = h.root     -- copied at write time, through a small buffer
        entries[#entries + 1] = { path = r, type = "file", mode = call(h, "download_dir", "stat", full).mode,
                                  copy = function(dst, rel, mode) return root:copy(full, dst, rel, mode) end }
      elseif it.type == "link" then
        -- never followed; one that points out of the directory is hostile
        local target = fs.readlink(h.dir .. "/" .. full:gsub("^/+", "")) or "/"
        if require("sbx.core.paths").link_escapes(r, target) then rejected[#rejected + 1] = { path = r, reason = "symlink out of the directory" }
        else entries[#entries + 1] = { path = r, type = "symlink" } end
      else
        entries[#entries + 1] = { path = r, type = it.type }
      end
    end
  end
  walk("")
  return entries, rejected
end

return M
