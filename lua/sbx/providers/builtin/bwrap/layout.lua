--- The bwrap provider's host layout and command line: what of the host
--- every sandbox binds (computed once per process), the mounts as the file
--- API sees them, the top-level entries of a sandbox root, the bwrap
--- options of a command (through --args, never on its command line), the
--- sandbox's resolv.conf with the internet, and the embedded agent as a
--- host file bwrap can bind.
local fs = require "sbx.fs"
local proc = require "sbx.proc"
local native = require "sbx.bwrap"
local owner = require "sbx.state.owner"
local agentlink = require "sbx.daemon.link"
local host = require "sbx.providers.builtin.host"
local common = require "sbx.providers.builtin.bwrap.common"

local M = {}

local function dirname(p) return p:match("^(.*)/[^/]*$") or "" end
local function basename(p) return p:match("([^/]*)$") end

-- Lexical normalization where ".." at the root stays there (as the kernel
-- does inside the sandbox); returns the list of segments.
local function segments(p)
  local parts = {}
  for seg in p:gmatch("[^/]+") do
    if seg == ".." then parts[#parts] = nil
    elseif seg ~= "." then parts[#parts + 1] = seg end
  end
  return parts
end

local function readable(st)
  return st and (st.type == "file" or st.type == "dir") and st.mode & 4 ~= 0
         and (st.type ~= "dir" or st.mode & 1 ~= 0)
end

local function under(p, top) return p == top or p:sub(1, #top + 1) == top .. "/" end

local layout_cache
---The host-dependent part of every sandbox, computed once per process:
---binds (read-only; dir=true for directories), hidden (beneath filtered
---binds), mirrored top-level links, tmpfs tops and the virtual directories
---(tmpfs tops and the parents of the binds inside them).
function M.layout()
  if layout_cache then return layout_cache end
  local L = { binds = {}, hidden = {}, links = {}, tmpfs = {}, virtual = {}, proc = {} }
  -- a look that failed for want of fds or memory says nothing about the
  -- host: such a layout is used once, not kept (a probe under EMFILE
  -- would otherwise leave every later sandbox without /usr)
  local transient = false
  local function lookup(dir, name)
    local st, _, code = native.lookup(dir, name)
    if not st and code ~= "ENOENT" and code ~= "ENOTDIR" then transient = true end
    return st
  end
  for name, how in pairs(common.PROC) do
    local st = lookup("/proc", name)
    if st then L.proc[#L.proc + 1] = { name = "/proc/" .. name, how = how, dir = st.type == "dir" } end
  end
  table.sort(L.proc, function(a, b) return a.name < b.name end)
  for _, name in ipairs(common.SYSTEM) do
    local st = lookup("/", name)
    if st and st.type == "link" then
      L.links[#L.links + 1] = { name = name, target = st.target }
    elseif readable(st) and st.type == "dir" then
      L.binds[#L.binds + 1] = { src = "/" .. name, dest = "/" .. name, dir = true }
    end
  end
  for _, t in ipairs(common.TMPFS) do
    L.tmpfs[#L.tmpfs + 1] = t
    L.virtual[t] = true
  end
  for _, top in ipairs(common.FILTERED) do
    local st = lookup("/", top:sub(2))
    if readable(st) and st.type == "dir" then
      L.binds[#L.binds + 1] = { src = top, dest = top, dir = true }
      local hid = native.hidden(top)
      if not hid then transient = true end
      for _, e in ipairs(hid or {}) do L.hidden[#L.hidden + 1] = e end
      -- links of its top level into a tmpfs (resolv.conf -> /run/...): bind their targets
      local names = fs.list_host(top)
      if not names then transient = true end
      for _, name in ipairs(names or {}) do
        local l = lookup(top, name)
        local real = l and l.type == "link" and native.realpath(top .. "/" .. name)
        local rst = real and lookup("/", real:sub(2))
        for _, t in ipairs(L.tmpfs) do
          if real and under(real, t) and real ~= t and readable(rst) and rst.type == "file" then
            L.binds[#L.binds + 1] = { src = real, dest = real, dir = false, inner = t }
            local parent = dirname(real)
            while parent ~= t do L.virtual[parent] = true; parent = dirname(parent) end
          end
        end
      end
    end
  end
  if not transient then layout_cache = L end
  return L
end

-- The sandbox's mounts as the file API sees them, longest path first:
-- { path=, dir= (host dir), name= (file binds), ro=, tmpfs= }
local function mounts_of(L, root, workdir)
  local ms = { { path = "/", dir = root } }
  if workdir then ms[#ms + 1] = { path = common.WORKDIR, dir = workdir } end
  for _, b in ipairs(L.binds) do
    if b.dir then ms[#ms + 1] = { path = b.dest, dir = b.src, ro = true }
    else ms[#ms + 1] = { path = b.dest, dir = dirname(b.src), name = basename(b.src), ro = true } end
  end
  for _, t in ipairs(L.tmpfs) do ms[#ms + 1] = { path = t, tmpfs = true, ro = true } end
  table.sort(ms, function(a, b) return #a.path > #b.path end)
  return ms
end

-- Top-level entries of a sandbox root: what bwrap mounts over (dirs that
-- must never turn into symlinks) and the mirrored system links.
local function top_entries(L, workdir)
  local e = { { name = "workspace", type = "dir" }, { name = "tmp", type = "dir", mode = tonumber("1777", 8) },
              { name = "proc", type = "dir", mount = true }, { name = "dev", type = "dir", mount = true } }
  if workdir then e[1].mount = true end
  for _, b in ipairs(L.binds) do
    if not b.inner then e[#e + 1] = { name = b.dest:sub(2), type = "dir", mount = true } end
  end
  for _, t in ipairs(L.tmpfs) do e[#e + 1] = { name = t:sub(2), type = "dir", mount = true } end
  for _, l in ipairs(L.links) do e[#e + 1] = { name = l.name, type = "link", target = l.target } end
  return e
end

local SECCOMP = native.seccomp()

local function bwrap_path() return proc.which("bwrap", host.DEFAULT_PATH) end

-- The bwrap options shared by every command of sandbox h (h.root nil:
-- a throwaway tmpfs root, for the probe).
local function base_args(h, o)
  local L = M.layout()
  local a = { "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
              "--unshare-cgroup-try" }
  local function add(...) for _, x in ipairs{ ... } do a[#a + 1] = x end end
  -- always an own network namespace: the holder's (internet through
  -- slirp4netns), or a new one
  if not (h.ns and h.net) then add("--unshare-net") end
  if not (o and o.no_disable_userns) and not common.no_disable_userns then add("--disable-userns") end
  -- in the holder's user namespace (without root) we are its uid 0: the
  -- sandbox keeps seeing our own ids, as with a user namespace of bwrap's
  if h.ns and not h.uid then
    local u, g = native.getuid()
    add("--uid", tostring(u), "--gid", tostring(g))
  end
  add("--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", common.HOSTNAME)
  local view = h.ns and h.uid       -- the holder's mount view (sbxlua as root)
  if h.root then add("--bind", view and common.VIEW .. "/root" or h.dir, "/") end
  if h.workdir then add("--bind", view and common.VIEW .. "/work" or h.workdir, common.WORKDIR) end
  for _, b in ipairs(L.binds) do
    if not b.inner then add("--ro-bind", b.src, b.dest) end
  end
  for _, e in ipairs(L.hidden) do
    if e.dir then add("--perms", "0700", "--tmpfs", e.path) else add("--ro-bind", "/dev/null", e.path) end
  end
  if not h.root then
    for _, l in ipairs(L.links) do add("--symlink", l.target, "/" .. l.name) end
  end
  for _, t in ipairs(L.tmpfs) do
    add("--perms", "0755", "--tmpfs", t)
    local vdirs = {}
    for v in pairs(L.virtual) do if v ~= t and under(v, t) then vdirs[#vdirs + 1] = v end end
    table.sort(vdirs)
    for _, v in ipairs(vdirs) do add("--perms", "0755", "--dir", v) end
    for _, b in ipairs(L.binds) do
      if b.inner == t then add("--ro-bind", b.src, b.dest) end
    end
  end
  add("--proc", "/proc")
  for _, m in ipairs(L.proc) do
    if m.how == "ro" then add("--ro-bind", m.name, m.name)
    elseif m.dir then add("--perms", "0555", "--tmpfs", m.name, "--remount-ro", m.name)
    else add("--ro-bind", "/dev/null", m.name) end
  end
  if h.net and h.resolv then add("--ro-bind-data", "5", h.resolv) end
  add("--dev", "/dev", "--seccomp", "3", "--clearenv")
  for _, x in ipairs(o and o.extra or {}) do add(x) end
  -- a command's environment (a bwrap per command) goes with the options
  -- through --args, never on bwrap's command line (/proc/<pid>/cmdline)
  for _, kv in ipairs(o and o.env or {}) do
    local k, v = kv:match("^([^=]*)=(.*)$")
    add("--setenv", k, v)
  end
  return a
end

-- The start of a command line and the fds it needs: the shared options go
-- through --args on fd 4 (bwrap is pid 1 inside, and its command line would
-- show the sandbox host paths), the seccomp program on fd 3.
local function command_line(h, o)
  local opts = base_args(h, o)
  local blob = table.concat(opts, "\0") .. "\0"
  local fds = { SECCOMP, blob, h.net and h.resolv and M.resolv_data() or nil }
  if #blob <= 65536 then return { common.bwrap, "--args", "4" }, fds end
  table.insert(opts, 1, common.bwrap)
  fds[2] = ""
  return opts, fds
end

-- ------------------------------------------------------------ the network

-- Where a sandbox's resolv.conf must name slirp4netns's DNS forwarder: the
-- host's names a loopback resolver (systemd-resolved's 127.0.0.53), which
-- the sandbox's own network namespace does not reach. nil: keep the host's.
function M.resolv_target()
  local data = fs.read_host("/etc/resolv.conf", 65536) or ""
  local loopback = false
  for ns in data:gmatch("nameserver%s+(%S+)") do
    if ns:match("^127%.") or ns == "::1" then loopback = true end
  end
  if not loopback then return nil end
  local real = native.realpath("/etc/resolv.conf")
  if real and real ~= "/etc/resolv.conf" then
    for _, b in ipairs(M.layout().binds) do if b.dest == real then return real end end
  end
  return "/etc/resolv.conf"
end

function M.resolv_data()
  local out = { "nameserver " .. common.SLIRP_DNS }
  for line in (fs.read_host("/etc/resolv.conf", 65536) or ""):gmatch("[^\n]+") do
    if line:match("^%s*search%s") or line:match("^%s*options%s") then out[#out + 1] = line end
  end
  return table.concat(out, "\n") .. "\n"
end

-- The embedded agent as a host file bwrap can bind: written once per build
-- (checked before each namespace: another build's sbxlua may prune it).
-- Agents of other builds unused for a day are removed meanwhile; running
-- namespaces keep theirs (a bind holds the file, not its name).
local agent_path
local PRUNE_AFTER = 86400

local function prune(root, keep)
  for _, e in ipairs(root:list(".") or {}) do
    local name = e.name or e.path
    if name ~= keep and name:match("^sbx%-agent%-") and e.mtime and os.time() - e.mtime > PRUNE_AFTER then
      root:remove(name)
    end
  end
end

local function agent_file()
  if agent_path then
    local f = io.open(agent_path, "rb")
    if f then f:close() return agent_path end
  end
  local blob = require "sbx.agentbin"
  local dir = owner.state_dir() .. "/agent"
  local name = "sbx-agent-" .. agentlink.hash(blob)
  local ok, err = fs.mkdir_host(dir)
  if not ok then return nil, err end
  local root, rerr = fs.open_root(dir)
  if not root then return nil, rerr end
  local st = root:stat(name)
  if not st or st.size ~= #blob then
    local tmp = name .. "." .. proc.random_hex(8)
    local wok, werr = root:write(tmp, blob, tonumber("755", 8))
    if not wok then root:close() return nil, werr end
    os.rename(dir .. "/" .. tmp, dir .. "/" .. name)      -- atomic: racing writers agree
  end
  pcall(prune, root, name)
  root:close()
  agent_path = dir .. "/" .. name
  return agent_path
end

M.dirname, M.basename, M.segments, M.under = dirname, basename, segments, under
M.mounts_of, M.top_entries, M.command_line, M.bwrap_path = mounts_of, top_entries, command_line, bwrap_path
M.SECCOMP, M.agent_file = SECCOMP, agent_file

return M
