--- The `bwrap` backend: every command runs in fresh bubblewrap namespaces
--- over the sandbox's own root filesystem, a private host directory.
---
--- What a sandbox sees:
---   /             a private host directory (<state>/bwrap/<session>/<id>.*),
---                 read-write and kept between commands (like a container's layer)
---   /workspace    the working directory (the `workdir` option binds a host
---                 directory there instead)
---   /tmp          part of the root: private, kept between commands
---   /usr /bin /sbin /lib*   the host's, read-only (symlinks mirrored)
---   /etc          the host's, read-only, with everything that is not readable
---                 by everyone hidden (shadow, private keys: an empty file or
---                 directory in their place)
---   /run          a tmpfs of each command (plus what /etc links to there,
---                 such as resolv.conf under systemd-resolved)
---   /proc /dev    the sandbox's own (new pid namespace, minimal devices)
--- Nothing else of the host: no /home, /root, /run, /var, /sys.
---
--- Every command is `bwrap --unshare-user --unshare-pid --unshare-ipc
--- --unshare-uts --unshare-cgroup-try [--unshare-net] --disable-userns
--- --die-with-parent --new-session --cap-drop ALL --clearenv ... -- argv`
--- with a seccomp filter (src/seccomp.c) on fd 3, started by sbx.proc in
--- the sandbox's cgroup: timeouts, output caps, streaming and whole-tree
--- kills are those of every backend.
---
--- The file API resolves paths the way the sandbox does: symlinks are
--- followed inside the sandbox's tree, across its mounts, and every access
--- happens beneath the host directory of one mount (openat2
--- RESOLVE_BENEATH), so a link swapped in meanwhile cannot leave it. /proc
--- and /dev are refused; writes to the read-only parts raise PathError.
---
--- Limits: `cpu`, `memory_mb` and a pids limit (limits.PIDS) through the
--- cgroup controllers the machine has (sbx.limits: v2's when delegated, else
--- a hybrid host's v1 hierarchies); an option no controller can enforce is
--- not claimed, so routing skips bwrap for it and a pinned create raises.
--- Per-process rlimits through backend_options.rlimits; core dumps are off.
local fs = require "sbx.fs"
local proc = require "sbx.proc"
local cgroup = require "sbx.cgroup"
local native = require "sbx.bwrap"
local errors = require "sbx.errors"
local owner = require "sbx.owner"
local paths = require "sbx.paths"
local agentlink = require "sbx.agentlink"
local limits = require "sbx.limits"

local M = {}

M.WORKDIR = "/workspace"
M.HOSTNAME = "sandbox"
-- The host's top-level system directories: bound read-only, or mirrored
-- when they are symlinks (merged /usr).
M.SYSTEM = { "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32" }
-- Host directories bound read-only with what others may not read hidden.
M.FILTERED = { "/etc" }
-- tmpfs directories (top level), fresh for each namespace.
M.TMPFS = { "/run" }
-- backend_options.rlimits: per-process limits, name -> { sbx.proc name, unit, minimum }
M.RLIMITS = { as_mb = { "as", 1048576, 16 }, cpu_secs = { "cpu", 1, 1 },
              fsize_mb = { "fsize", 1048576, 1 }, nofile = { "nofile", 1, 16 } }
-- Paths of the sandbox the file API does not reach.
local SPECIAL = { "/proc", "/dev" }
-- Kernel knobs of /proc (Docker's default masked and read-only paths):
-- "ro" bound read-only (/proc/sys is global: kernel.core_pattern there runs
-- a program as host root), "mask" hidden (/dev/null or an empty read-only
-- tmpfs in their place). Only those the host's /proc has.
M.PROC = { sys = "ro", fs = "ro", bus = "ro", irq = "ro", ["sysrq-trigger"] = "mask",
           kcore = "mask", keys = "mask", latency_stats = "mask", timer_list = "mask",
           timer_stats = "mask", sched_debug = "mask", acpi = "mask", asound = "mask", scsi = "mask" }
-- User-mode networking for allow_internet: slirp4netns in the sandbox's
-- own network namespace, with the host's loopback out of reach.
M.SLIRP_ARGS = { "--configure", "--mtu=65520", "--disable-host-loopback", "--enable-sandbox",
                 "--enable-seccomp" }
M.SLIRP_DNS = "10.0.2.3"

M.descriptor = {
  name = "bwrap",
  description = "bubblewrap namespaces (user, pid, ipc, uts, cgroup, net) over a private root directory",
  isolation = "namespace",
  capabilities = { "exec", "files", "streaming", "background", "resume", "network" },  -- network: below
  options = { workdir = true, allow_internet = true, backend_options = true },
  price = { per_hour = 0, per_vcpu_hour = 0, per_gib_hour = 0 },
  regions = {},
  -- what it enforces: cgroup limits where a controller is (below); per-process rlimits on request
  limits = { cpu = false, memory_mb = false, pids = false,
             rlimits = { "as_mb", "cpu_secs", "fsize_mb", "nofile" } },
}
do   -- claim the options this machine's cgroup controllers can enforce
  local ok, ctl = pcall(limits.controllers)
  for opt, c in pairs(limits.OPTION) do
    if ok and ctl[c] then M.descriptor.options[opt], M.descriptor.limits[opt] = true, true end
  end
  M.descriptor.limits.pids = ok and ctl.pids ~= nil or false
end
-- Internet only through slirp4netns: without it no "network" capability,
-- and a create asking for allow_internet = true raises.
M.slirp = proc.which("slirp4netns", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
if not M.slirp then
  local caps = M.descriptor.capabilities
  for i = #caps, 1, -1 do if caps[i] == "network" then table.remove(caps, i) end end
end

local function fail(kind, msg, op, code)
  errors.raise(kind, msg, { backend = "bwrap", op = op, code = code })
end

-- A core failure (nil, msg, code) about sandbox path `path`.
local function core_fail(op, path, err, code)
  local reason = tostring(err):match(": ([^:]*)$") or tostring(err)
  errors.core(op .. ": " .. path .. ": " .. reason, code, "bwrap", op)
end

-- ------------------------------------------------------------ host layout

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
  for name, how in pairs(M.PROC) do
    local st = lookup("/proc", name)
    if st then L.proc[#L.proc + 1] = { name = "/proc/" .. name, how = how, dir = st.type == "dir" } end
  end
  table.sort(L.proc, function(a, b) return a.name < b.name end)
  for _, name in ipairs(M.SYSTEM) do
    local st = lookup("/", name)
    if st and st.type == "link" then
      L.links[#L.links + 1] = { name = name, target = st.target }
    elseif readable(st) and st.type == "dir" then
      L.binds[#L.binds + 1] = { src = "/" .. name, dest = "/" .. name, dir = true }
    end
  end
  for _, t in ipairs(M.TMPFS) do
    L.tmpfs[#L.tmpfs + 1] = t
    L.virtual[t] = true
  end
  for _, top in ipairs(M.FILTERED) do
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
  if workdir then ms[#ms + 1] = { path = M.WORKDIR, dir = workdir } end
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

-- ------------------------------------------------------------ the probe

local SECCOMP = native.seccomp()

local function bwrap_path() return proc.which("bwrap", require("sbx.sandbox").DEFAULT_PATH) end

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
  if not (o and o.no_disable_userns) and not M.no_disable_userns then add("--disable-userns") end
  -- in the holder's user namespace (without root) we are its uid 0: the
  -- sandbox keeps seeing our own ids, as with a user namespace of bwrap's
  if h.ns and not h.uid then
    local u, g = native.getuid()
    add("--uid", tostring(u), "--gid", tostring(g))
  end
  add("--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", M.HOSTNAME)
  local view = h.ns and h.uid       -- the holder's mount view (sbxlua as root)
  if h.root then add("--bind", view and M.VIEW .. "/root" or h.dir, "/") end
  if h.workdir then add("--bind", view and M.VIEW .. "/work" or h.workdir, M.WORKDIR) end
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
  if #blob <= 65536 then return { M.bwrap, "--args", "4" }, fds end
  table.insert(opts, 1, M.bwrap)
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
  local out = { "nameserver " .. M.SLIRP_DNS }
  for line in (fs.read_host("/etc/resolv.conf", 65536) or ""):gmatch("[^\n]+") do
    if line:match("^%s*search%s") or line:match("^%s*options%s") then out[#out + 1] = line end
  end
  return table.concat(out, "\n") .. "\n"
end

-- ------------------------------------------------------------ host root

-- When sbxlua runs as root, no sandbox process is host root: each sandbox
-- has a holder process (created on its first command, again after a
-- resume) owning a user namespace that maps uid and gid 0 onto M.ids()
-- (unprivileged host ids), with its network namespace when the sandbox has
-- the internet (slirp4netns attached once, for every command) and a mount
-- namespace where the sandbox's host directories appear under M.VIEW (the
-- unprivileged uid could not reach them under a state dir like /root's).
-- Every bwrap starts in those namespaces (sbx.proc's setns) as that
-- namespace's root, and its own user namespace nests inside.
M.VIEW = "/run/sbxlua-bwrap"
M.DEFAULT_ID = 100000

local ids_cache
---The host uid and gid sandboxes of root run as: root's first subordinate
---ids (/etc/subuid, /etc/subgid), else M.DEFAULT_ID.
function M.ids()
  if ids_cache then return ids_cache[1], ids_cache[2] end
  local function first(file)
    for line in (fs.read_host(file, 1 << 20) or ""):gmatch("[^\n]+") do
      local who, start = line:match("^([^:]+):(%d+):%d+")
      if who == "root" or who == "0" then return tonumber(start) end
    end
    return M.DEFAULT_ID
  end
  ids_cache = { first("/etc/subuid"), first("/etc/subgid") }
  return ids_cache[1], ids_cache[2]
end

function M.as_root() return native.getuid() == 0 end

-- Give sandbox path rel of the root directory (each component) to the sandbox's ids.
local function own(h, rel)
  if not h.uid then return end
  local ok, err, code = native.chown(h.dir, rel or "", h.uid, h.gid)
  if not ok then errors.core("chown: " .. tostring(err), code, "bwrap", "chown") end
end
M._own = own

local HOLDER = 'set -e; mount -t tmpfs -o mode=0711,size=64k sbx "$1"; mkdir "$1/root" "$1/work";'
  .. ' touch "$1/agent"; mount --bind "$2" "$1/root";'
  .. ' if [ -n "$3" ]; then mount --bind "$3" "$1/work"; fi;'
  .. ' mount --bind "$4" "$1/agent"; mount -o remount,bind,ro "$1/agent";'
  .. ' exec unshare --user $5 sleep infinity'

local agent_file     -- below

local function alive(pid)
  local st = fs.read_host("/proc/" .. pid .. "/stat", 4096)
  return st ~= nil and not st:match("^%d+ %b() [ZX]")
end

local function kill_holder(h)
  local hd = h.holder
  h.holder, h.ns = nil, nil
  if not hd then return end
  for _, p in ipairs{ hd.p, hd.slirp } do pcall(p.kill, p) pcall(p.close, p) end   -- slirp: nil without internet
end

local function holder_fail(h, p, msg)
  local out = ""
  if p then
    pcall(p.kill, p)
    local r = p:wait()
    out = ((r and r.stderr or "") .. (r and r.stdout or "")):gsub("%s+$", "")
    p:close()
  end
  kill_holder(h)
  fail("SandboxExecutionError", "cannot start the sandbox's namespaces: " .. msg
       .. (out ~= "" and (" (" .. out .. ")") or ""), "exec")
end

local function poll(cond, secs)
  local loop = require "sbx.loop"
  for _ = 1, math.floor(secs / 0.002) do
    local v = cond()
    if v ~= nil then return v end
    loop.sleep(0.002)
  end
end

---The sandbox's holder namespaces (files for setns: root's { mnt, net?,
---user }, else { user, net }), started when needed. Without root a holder
---only keeps the network namespace of a sandbox with the internet.
local start_holder

local function holder_of(h)
  if not h.uid and not h.net then return nil end
  -- one start at a time: tasks asking meanwhile wait for it (h.ns is
  -- whole or nil, never a namespace list still being made)
  while h.holder_starting do require("sbx.loop").sleep(0.002) end
  if h.holder and alive(h.holder.p.pid) then return h.ns end
  kill_holder(h)
  h.holder_starting = true
  local ok, ns = pcall(start_holder, h)
  h.holder_starting = nil
  if not ok then error(ns, 0) end
  return ns
end

-- Wait (10 s at most) until holder p is in a user namespace of its own,
-- and with `mapped` until that namespace has its maps (unshare maps our
-- uid itself: before unshare(2), gid_map shows ours, so the namespace comes first).
local function await_userns(h, p, mapped)
  local own_user = native.lookup("/proc/self/ns", "user").target
  local up = poll(function()
    if not alive(p.pid) then return false end
    local st = native.lookup("/proc/" .. p.pid .. "/ns", "user")
    return st ~= nil and st.target ~= own_user
      and (not mapped or (fs.read_host("/proc/" .. p.pid .. "/gid_map", 4096) or "") ~= "") or nil
  end, 10)
  if not up then holder_fail(h, p, up == false and "the holder ended" or "the holder did not start") end
end

function start_holder(h)
  local env = { "PATH=" .. require("sbx.sandbox").DEFAULT_PATH }
  local p, err, pid
  if h.uid then
    local file, ferr = agent_file()
    if not file then holder_fail(h, nil, "cannot write the agent: " .. tostring(ferr)) end
    local ok, merr = fs.mkdir_host(M.VIEW)
    if not ok then holder_fail(h, nil, tostring(merr)) end
    p, err = proc.spawn{ argv = { "unshare", "--mount", "--propagation", "slave", "--", "/bin/sh", "-c",
        HOLDER, "sbx-holder", M.VIEW, h.dir, h.workdir or "", file, h.net and "--net" or "" },
      env = env, max_output = 8192, cgroup = h.cg, join = h.join }
    if not p then holder_fail(h, nil, tostring(err)) end
    pid = p.pid
    await_userns(h, p, false)
    for file_, id in pairs{ uid_map = h.uid, gid_map = h.gid } do
      local f, ferr2 = io.open("/proc/" .. pid .. "/" .. file_, "w")
      local wok, werr = f and f:write("0 " .. id .. " 1\n")
      if f then wok, werr = f:close() end
      if not wok then holder_fail(h, p, file_ .. ": " .. tostring(ferr2 or werr)) end
    end
  else              -- unshare maps our uid to 0 itself
    p, err = proc.spawn{ argv = { "unshare", "--user", "--map-root-user", "--net", "sleep", "infinity" },
      env = env, max_output = 8192, cgroup = h.cg, join = h.join }
    if not p then holder_fail(h, nil, tostring(err)) end
    pid = p.pid
    await_userns(h, p, true)
  end
  local holder = { p = p }
  h.holder = holder            -- killed with the sandbox if what follows fails
  local base = "/proc/" .. pid .. "/ns/"
  local ns = h.uid and { base .. "mnt" } or { base .. "user" }
  if h.net then
    ns[2] = base .. "net"
    -- As root, slirp4netns's --enable-sandbox makes its own mount namespace
    -- from the host's, where mounts are shared: its pivot_root and detach of
    -- the old root then propagated back and unmounted the host's mounts
    -- (docker containers started with an empty rootfs: "sh: not found").
    -- A private copy first keeps all of that its own. (Not root: its
    -- namespace belongs to the holder's user namespace, where the kernel
    -- makes shared mounts slaves already.)
    local argv = h.uid and { "unshare", "--mount", "--propagation", "private", "--", M.slirp } or { M.slirp }
    for _, a in ipairs(M.SLIRP_ARGS) do argv[#argv + 1] = a end
    if not h.uid then argv[#argv + 1] = "--userns-path=" .. base .. "user" end
    argv[#argv + 1] = tostring(pid)
    argv[#argv + 1] = "tap0"
    local sp, serr = proc.spawn{ argv = argv, env = {}, max_output = 65536, cgroup = h.cg, join = h.join }
    if not sp then holder_fail(h, p, "slirp4netns: " .. tostring(serr)) end
    holder.slirp = sp
    local route = poll(function()
      if not alive(sp.pid) then return false end
      local t = fs.read_host("/proc/" .. pid .. "/net/route", 65536) or ""
      if t:find("\ntap0%s+00000000") then return true end
    end, 10)
    if not route then
      local r = sp:wait()
      holder_fail(h, p, "slirp4netns did not configure the network: " .. tostring(r and r.stderr))
    end
  end
  if h.uid then ns[#ns + 1] = base .. "user" end
  h.ns = ns
  return ns
end

-- A failure to start the probe at all (out of fds, processes, memory) says
-- nothing about bwrap: `transient`, so the answer is not kept.
local transient
local function run_probe(argv, fds)
  local p, err = proc.spawn{ argv = argv, env = {}, timeout = 20, max_output = 8192,
                             fds = fds or { SECCOMP } }
  if not p then transient = true return false, err end
  local r = p:wait()
  p:close()
  if r.exit_code == 0 then return true end
  local msg = (r.stderr ~= "" and r.stderr or r.stdout):gsub("%s+$", "")
  return false, r.timed_out and "timed out" or (msg ~= "" and msg or ("exit " .. tostring(r.exit_code or r.signal)))
end

local function probe()
  local r = { ok = false }
  M.bwrap = bwrap_path()
  r.bwrap = M.bwrap
  if not M.bwrap then
    r.reason = "bubblewrap is not installed (no bwrap on PATH)"
    return r
  end
  if not SECCOMP then
    r.reason = "no seccomp filter for this CPU architecture (x86_64 and arm64 only)"
    return r
  end
  local vp = proc.spawn{ argv = { M.bwrap, "--version" }, env = {}, timeout = 10 }
  if vp then r.version = (vp:wait().stdout:match("[%d%.]+")) vp:close() end
  local cmd = { "--setenv", "PATH", "/usr/bin:/bin", "--", "true" }
  local function argv(h, o)
    local a, fds = command_line(h, o)
    for _, x in ipairs(cmd) do a[#a + 1] = x end
    return a, fds
  end
  local ok, why = run_probe(argv({ net = false }))
  if ok then
    r.ok, r.userns, r.netns, r.seccomp, r.disable_userns = true, true, true, true, true
    return r
  end
  -- Tell which part fails.
  if tostring(why):find("disable%-userns") then
    ok = run_probe(argv({ net = false }, { no_disable_userns = true }))
    if ok then
      -- an older bwrap: the seccomp filter still refuses new user namespaces
      M.no_disable_userns = true
      r.ok, r.userns, r.netns, r.seccomp, r.disable_userns = true, true, true, true, false
      return r
    end
  end
  local plain = { M.bwrap, "--unshare-user", "--unshare-pid", "--ro-bind", "/", "/", "--", "true" }
  local uok, uwhy = run_probe(plain)
  r.userns = uok
  if not uok then
    r.reason = "user namespaces are not available: " .. tostring(uwhy)
    return r
  end
  local nok, nwhy = run_probe{ M.bwrap, "--unshare-user", "--unshare-net", "--ro-bind", "/", "/", "--", "true" }
  r.netns = nok
  if not nok then
    r.reason = "network namespaces are not available (allow_internet = false could not be enforced): "
               .. tostring(nwhy)
    return r
  end
  r.reason = "the hardened bwrap command line fails: " .. tostring(why)
  return r
end

local probed
---What this machine offers, probed once (again with force): { ok=, reason=,
---bwrap=, version=, userns=, netns=, seccomp=, disable_userns= }. Tasks
---asking at once may each probe; the last answer stays.
function M.probe(force)
  if probed and not force then return probed end
  transient = false
  local r = probe()
  if transient and not r.ok then
    r.reason = tostring(r.reason) .. " (could not start the probe; asked again next time)"
    return r
  end
  probed = r
  return r
end

function M.available()
  local r = M.probe()
  return r.ok, r.reason
end

---For `sbxlua doctor`: { {ok= (nil: information), what=, detail=, fix=}, ... }
function M.doctor()
  local r = M.probe(true)
  local out = {}
  local function add(ok, what, detail, fix) out[#out + 1] = { ok = ok, what = what, detail = detail, fix = fix } end
  add(r.bwrap ~= nil, "bubblewrap", r.bwrap and (r.bwrap .. " " .. (r.version or "")) or "not installed",
      "apt-get install bubblewrap")
  if not r.bwrap then return out end
  add(r.userns ~= false, "user namespaces", r.userns == false and "refused" or "work",
      "sysctl -w user.max_user_namespaces=15000 (Debian < 11: sysctl -w kernel.unprivileged_userns_clone=1;"
      .. " Ubuntu >= 24.04: sysctl -w kernel.apparmor_restrict_unprivileged_userns=0)")
  add(r.netns ~= false, "network namespaces (allow_internet = false)", r.netns == false and "refused" or "work",
      "a kernel with CONFIG_NET_NS, and user namespaces allowed to create them")
  add(M.slirp ~= nil, "internet (allow_internet = true)", M.slirp and ("slirp4netns " .. M.slirp
      .. " in each sandbox's own network namespace; the host's 127.0.0.1 and abstract sockets are out of reach")
      or "slirp4netns is not installed: bwrap offers allow_internet = false only (no network capability)",
      "apt-get install slirp4netns")
  add(SECCOMP ~= nil, "seccomp filter", SECCOMP and (#native.denied() .. " calls refused (" ..
      table.concat(native.denied(), ", ", 1, 6) .. ", ...)") or "no filter for this architecture")
  if r.ok and not r.disable_userns then
    add(nil, "--disable-userns", "not supported by this bwrap; the seccomp filter refuses new user namespaces")
  end
  local base, why = require("sbx.backends.local").containment()
  add(base ~= nil, "containment", base and "each sandbox's namespace in its own cgroup (destroy kills it"
      .. " whole); inside, each command's tree is killed by its sbx-agent supervisor"
      or ("no writable cgroup v2 (" .. tostring(why) .. "): process trees are swept through /proc"),
      "run as root, or under a delegated cgroup (systemd-run --user --scope -p Delegate=yes sbxlua ...)")
  add(nil, "limits", limits.describe() .. " (what is not enforced is not offered: routing skips bwrap"
      .. " when it is requested); per-process rlimits via backend_options.rlimits (as_mb, cpu_secs,"
      .. " fsize_mb, nofile)")
  if native.getuid() == 0 then
    local u, g = M.ids()
    add(nil, "running as root", "sandboxes run as host uid " .. u .. ", gid " .. g .. " (root inside;"
        .. " /etc/subuid's first range of root, else " .. M.DEFAULT_ID .. "); a workdir must be writable"
        .. " by that uid; what in /etc is not readable by everyone is hidden (" .. #M.layout().hidden .. " entries)")
  end
  add(nil, "exec path", (M.exec_mode or os.getenv("SBX_BWRAP_EXEC")) == "direct"
      and "a new bwrap for every command (SBX_BWRAP_EXEC=direct)"
      or "one namespace per sandbox, commands sent to sbx-agent inside it (a bwrap per command"
         .. " for sandboxes with rlimits)")
  if M.fallback then
    add(false, "agent fallback used", M.fallback, "check that " .. M.AGENT_IN .. " can run inside bwrap")
  end
  if r.ok then add(nil, "probe", "run `sbxlua selftest --backend bwrap` for the escape probes") end
  return out
end

-- -------------------------------------------------------------- lifetime

local function sandboxes_dir(session) return owner.state_dir() .. "/bwrap/" .. session end

local function check_options(spec)
  local bo = spec.backend_options or {}
  local lims = { core = 0 }
  for k in pairs(bo) do
    if k ~= "rlimits" then
      errors.raise("ConfigError", "bwrap: unknown backend_options." .. tostring(k) .. " (known: rlimits)",
                   { backend = "bwrap", op = "create" })
    end
  end
  for k, v in pairs(bo.rlimits or {}) do
    local d = M.RLIMITS[k]
    if not d then
      local known = {}
      for n in pairs(M.RLIMITS) do known[#known + 1] = n end
      table.sort(known)
      errors.raise("ConfigError", "bwrap: unknown rlimit '" .. tostring(k) .. "' (known: "
                   .. table.concat(known, ", ") .. ")", { backend = "bwrap", op = "create" })
    end
    if math.type(v) ~= "integer" or v < d[3] then
      errors.raise("ConfigError", "bwrap: rlimits." .. k .. " must be an integer >= " .. d[3],
                   { backend = "bwrap", op = "create" })
    end
    lims[d[1]] = v * d[2]
  end
  return lims
end

local function handle(st)
  local L = M.layout()
  local h = { id = st.id, dir = st.dir, workdir = st.workdir, own = st.own, cg = st.cg, join = st.join,
              session = st.session, net = st.net and M.slirp ~= nil or false,
              rlimits = st.rlimits or { core = 0 }, roots = {} }
  if M.as_root() then h.uid, h.gid = M.ids() end
  h.resolv = h.net and M.resolv_target() or nil
  h.mounts = mounts_of(L, h.dir, h.workdir)
  h.top = top_entries(L, h.workdir)
  local root, rerr, rcode = fs.open_root(h.dir)
  if not root then                 -- e.g. out of fds (EMFILE), or gone
    errors.raise(rcode == "ENOENT" and "SandboxNotFoundError" or "SandboxCreationError",
                 "cannot open the sandbox directory " .. h.dir .. ": " .. tostring(rerr),
                 { backend = "bwrap", code = rcode })
  end
  h.root = root
  return h
end

-- The cgroup limits of a new sandbox: its cpu and memory_mb, and pids.max
-- wherever a pids controller is. Returns the v1 groups its processes join.
local function set_limits(spec, cg)
  local want = { cpu = spec.cpu, memory_mb = spec.memory_mb }   -- > 0: checked by the facade
  if want.memory_mb ~= nil and not (want.memory_mb >= 16) then
    fail("ConfigError", "memory_mb must be >= 16, got " .. tostring(want.memory_mb), "create")
  end
  if not cg then
    if want.cpu or want.memory_mb then
      fail("FeatureNotSupportedError", "cpu and memory_mb need the sandbox's cgroup, and there is none", "create")
    end
    return nil
  end
  if limits.controllers().pids then want.pids = limits.PIDS end
  local set, err = limits.apply(spec.session, spec.id, cg, want)
  if not set then return nil, err end
  return #set.join > 0 and set.join or nil
end

---@param spec table id=, session=, workdir=, allow_internet=, backend_options=, cpu=, memory_mb=
function M.create(spec)
  local rlim = check_options(spec)
  if spec.allow_internet == true and not M.slirp then
    fail("FeatureNotSupportedError", "allow_internet = true needs slirp4netns (apt-get install slirp4netns):"
         .. " without it bwrap sandboxes have no network", "create")
  end
  if spec.workdir then
    local root = fs.open_root(spec.workdir)
    if not root then
      errors.raise("ConfigError", "workdir " .. spec.workdir .. " is not an existing directory",
                   { backend = "bwrap", op = "create" })
    end
    root:close()
  end
  local d, err = fs.mkdtemp(sandboxes_dir(spec.session), spec.id .. ".")
  if not d then fail("SandboxCreationError", "cannot create the sandbox directory: " .. err, "create") end
  local cg
  local base = require("sbx.backends.local").containment()
  if base then
    local scg = base .. "/" .. spec.session
    if cgroup.create(scg) and cgroup.create(scg .. "/" .. spec.id) then cg = scg .. "/" .. spec.id end
  end
  local h = handle{ id = spec.id, dir = d, own = true, cg = cg, session = spec.session,
                    workdir = spec.workdir and native.realpath(spec.workdir) or nil,
                    net = spec.allow_internet ~= false, rlimits = rlim }
  local lok, join, lerr = pcall(set_limits, spec, cg)
  if not lok or lerr then        -- refuse rather than run without the limits asked for
    M.destroy(h)
    if not lok then error(join, 0) end
    fail("SandboxCreationError", "cannot set the sandbox's limits: " .. lerr, "create")
  end
  h.join = join
  local ok, perr = native.populate(d, h.top)
  if not ok then
    M.destroy(h)
    fail("SandboxCreationError", "cannot lay out the sandbox root: " .. perr, "create")
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
  require("sbx.claims").resume("bwrap", state)   -- an owned dir, a cgroup: sbxlua's own only
  if type(state.dir) ~= "string" then
    fail("ConfigError", "session state for bwrap has no 'dir'", "resume")
  end
  local root = fs.open_root(state.dir)
  if not root then fail("SandboxNotFoundError", "the sandbox directory " .. state.dir .. " is gone", "resume") end
  root:close()
  if state.workdir then      -- its working directory is a host directory too (workdir =)
    local wd = fs.open_root(state.workdir)
    if not wd then
      fail("SandboxNotFoundError", "the sandbox's working directory " .. state.workdir .. " is gone", "resume")
    end
    wd:close()
  end
  return handle(state)
end

function M.is_alive(h)
  if not h.root then return false end
  local r = fs.open_root(h.dir)
  if r then r:close() end
  return r ~= nil
end

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
  entry = require("sbx.claims").reap_entry("bwrap", entry)   -- no path or cgroup the journal merely claims
  local st = entry.state or {}
  local dir = st.dir or entry.dir
  local cg = st.cg
  local base = require("sbx.backends.local").containment()
  if not cg and entry.session and base then cg = base .. "/" .. entry.session .. "/" .. entry.id end
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

M.home = function() return M.WORKDIR end

-- ------------------------------------------------------------ sandbox paths

-- Where sandbox path p (absolute, normalized) lives: { kind = "mount"
-- (dir, rel, m), "virtual" (a directory of a tmpfs, or a hidden one),
-- "null" (a hidden file: /dev/null in its place), "missing" (inside a
-- tmpfs or a hidden directory), "special" (/proc, /dev) }.
local function where(h, p)
  for _, s in ipairs(SPECIAL) do
    if p == s or p:sub(1, #s + 1) == s .. "/" then return { kind = "special", path = p } end
  end
  local L = M.layout()
  for _, e in ipairs(L.hidden) do
    if p == e.path then return { kind = e.dir and "virtual" or "null", path = p, hidden = true } end
    if under(p, e.path) then return { kind = "missing", path = p } end
  end
  if L.virtual[p] then return { kind = "virtual", path = p } end
  for _, m in ipairs(h.mounts) do
    local prefix = m.path == "/" and "/" or m.path .. "/"
    if m.path == p or p:sub(1, #prefix) == prefix then
      if m.tmpfs or (m.name and m.path ~= p) then return { kind = "missing", path = p, m = m } end
      local rel = m.path == p and "" or p:sub(#prefix + 1)
      if m.name then rel = m.name end
      return { kind = "mount", m = m, dir = m.dir, rel = rel, path = p }
    end
  end
end

local MAXLINKS = 40

-- Resolve a sandbox path as the sandbox would, following symlinks across
-- its mounts (the last one only when `follow`); returns where() of it.
local function resolve(h, path, op, follow)
  local parts = segments(paths.resolve(M.WORKDIR, path, op))
  local hops, i = 0, 1
  while i <= #parts do
    if i < #parts or follow then
      local cur = "/" .. table.concat(parts, "/", 1, i)
      local t, target = where(h, cur)
      if t.kind == "special" then
        fail("PathError", op .. ": " .. path .. ": /proc and /dev are not reachable through the file API", op)
      elseif t.kind == "missing" then
        break
      elseif t.kind == "mount" then
        local st, err, code = native.lookup(t.dir, t.rel)
        if st and st.type == "link" then target = st.target
        elseif not st and (code == "ENOENT" or code == "ENOTDIR") then break
        elseif not st then core_fail(op, path, err, code) end
      end
      if target then
        hops = hops + 1
        if hops > MAXLINKS then
          fail("PathError", op .. ": " .. path .. ": too many levels of symbolic links", op, "ELOOP")
        end
        local base = target:sub(1, 1) == "/" and "" or table.concat(parts, "/", 1, i - 1)
        parts = segments(base .. "/" .. target .. "/" .. table.concat(parts, "/", i + 1))
        i = 0
      end
    end
    i = i + 1
  end
  return where(h, "/" .. table.concat(parts, "/"))
end
M._resolve = resolve

local function root_of(h, dir)
  local r = h.roots[dir]
  if not r then
    local err, code
    r, err, code = fs.open_root(dir)
    if not r then errors.core(err, code, "bwrap", "open") end
    h.roots[dir] = r
  end
  return r
end

local function read_only(op, path)
  fail("PathError", op .. ": " .. path .. ": read-only in a bwrap sandbox", op, "EROFS")
end

local function not_found(op, path)
  fail("FileNotFoundError", op .. ": " .. path .. ": No such file or directory", op, "ENOENT")
end

local function writable(h, path, op, follow)
  local t = resolve(h, path, op, follow)
  if t.kind == "mount" and not t.m.ro then return t end
  if t.kind == "special" then
    fail("PathError", op .. ": " .. path .. ": /proc and /dev are not reachable through the file API", op)
  end
  read_only(op, path)
end

local function call(h, t, op, path, method, ...)
  local root = root_of(h, t.dir)
  local r, err, code = root[method](root, t.rel, ...)
  if r == nil then core_fail(op, path, err, code) end
  -- the sandbox's own files, as if it had written them (sbxlua as root)
  if h.uid and t.m.path == "/" and (method == "write" or method == "mkdir") then own(h, t.rel) end
  return r
end

function M.read_file(h, path, max)
  local t = resolve(h, path, "read_file", true)
  if t.kind == "virtual" then fail("PathError", "read_file: " .. path .. ": Is a directory", "read_file", "EISDIR") end
  if t.kind == "null" then return "" end
  if t.kind ~= "mount" then not_found("read_file", path) end
  return call(h, t, "read_file", path, "read", max)
end

function M.write_file(h, path, data, mode)
  call(h, writable(h, path, "write_file", true), "write_file", path, "write", data, mode)
end

function M.mkdir(h, path)
  local t = resolve(h, path, "mkdir", true)
  if t.kind == "virtual" then return end
  if t.kind == "mount" and t.m.ro then
    local st = native.lookup(t.dir, t.rel)
    if st and st.type == "dir" then return end
    read_only("mkdir", path)
  end
  if t.kind ~= "mount" then read_only("mkdir", path) end
  call(h, t, "mkdir", path, "mkdir")
end

-- The names of the root the sandbox's layout depends on, and mount paths.
local function protected(h, p)
  if p == "/" or M.layout().virtual[p] then return true end
  for _, e in ipairs(h.top) do if p == "/" .. e.name then return true end end
  for _, m in ipairs(h.mounts) do if m.path == p then return true end end
  return false
end

function M.remove(h, path, recursive)
  local t = resolve(h, path, "remove", false)
  if protected(h, t.path) then
    fail("PathError", "remove: " .. path .. " is part of the sandbox's layout", "remove", "EBUSY")
  end
  if t.kind == "missing" then not_found("remove", path) end
  if t.kind ~= "mount" or t.m.ro then read_only("remove", path) end
  call(h, t, "remove", path, "remove", recursive)
end

local function entry(name, prefix, st)
  return { name = name, path = prefix .. name, is_dir = st.type == "dir", type = st.type,
           size = st.size or 0, mtime = st.mtime or 0 }
end

-- stat of what sandbox path p shows (through its mount), or nil
local function shown(h, p)
  local t = where(h, p)
  if t.kind == "virtual" then return { type = "dir", size = 0, mtime = 0 } end
  if t.kind == "null" then return { type = "char", size = 0, mtime = 0 } end
  if t.kind == "mount" then return native.lookup(t.dir, t.rel) end
end

function M.list_files(h, path)
  local t = resolve(h, path, "list_files", true)
  local prefix = (path == "" or path == ".") and "" or (path:sub(-1) == "/" and path or path .. "/")
  local base = t.path == "/" and "/" or t.path .. "/"
  if t.kind == "virtual" then
    local names, seen = {}, {}
    local L = M.layout()
    local function consider(p)
      if p:sub(1, #base) == base and not p:find("/", #base + 1, true) and not seen[p] then
        seen[p] = true
        names[#names + 1] = p:sub(#base + 1)
      end
    end
    for _, m in ipairs(h.mounts) do consider(m.path) end
    for v in pairs(L.virtual) do consider(v) end
    table.sort(names)
    local list = {}
    for _, n in ipairs(names) do
      local st = shown(h, base .. n)
      if st then list[#list + 1] = entry(n, prefix, st) end
    end
    return list
  end
  if t.kind ~= "mount" then not_found("list_files", path) end
  local list = call(h, t, "list_files", path, "list")
  for _, e in ipairs(list) do
    e.path = prefix .. e.name
    local child = base .. e.name
    local c = where(h, child)
    if c.kind ~= "mount" or c.m ~= t.m then     -- a mount point: show what is mounted
      local st = shown(h, child)
      if st then
        e.type, e.is_dir, e.size, e.mtime = st.type, st.type == "dir", st.size, st.mtime
      end
    end
  end
  return list
end

local function join(a, b) return (a == "" or a == ".") and b or (a:gsub("/+$", "") .. "/" .. b) end

---Write a tree of entries ({path, type = "dir"|"file", data, mode}) under dir,
---each path resolved as the sandbox would.
function M.put_tree(h, dir, entries)
  M.mkdir(h, dir)
  for _, e in ipairs(entries) do
    local p = join(dir, e.path)
    if e.type == "dir" then M.mkdir(h, p)
    elseif e.type == "file" then   -- root to root through a small buffer
      local t = writable(h, p, "upload_dir", true)
      require("sbx.transfer").copy_in(e, root_of(h, t.dir), t.rel)
    end
  end
end

-- lookup of what sandbox path p names, not following a last symlink
local function lstat(h, p, op)
  local t = resolve(h, p, op, false)
  if t.kind == "mount" then return native.lookup(t.dir, t.rel) end
  return shown(h, t.path)
end

---Read the tree under dir: entries, and the rejected ones (links are not
---followed; one pointing out of the directory is hostile).
function M.get_tree(h, dir)
  local entries, rejected = {}, {}
  local function walk(rel)
    for _, it in ipairs(M.list_files(h, rel == "" and dir or join(dir, rel))) do
      local r = rel == "" and it.name or rel .. "/" .. it.name
      local full = join(dir, r)
      local st = lstat(h, full, "download_dir") or {}
      if it.type == "dir" then
        entries[#entries + 1] = { path = r, type = "dir", mode = st.mode }
        walk(r)
      elseif it.type == "file" then   -- copied at write time, through a small buffer
        local t = resolve(h, full, "download_dir", true)
        local e = { path = r, type = "file", mode = st.mode }
        if t.kind == "mount" then
          local root = root_of(h, t.dir)
          e.copy = function(dst, rel, mode) return root:copy(t.rel, dst, rel, mode) end
        elseif t.kind == "null" then e.data = ""         -- a hidden file reads empty
        else not_found("download_dir", full) end
        entries[#entries + 1] = e
      elseif it.type == "link" then
        local target = st.target or "/"
        if require("sbx.paths").link_escapes(r, target) then rejected[#rejected + 1] = { path = r, reason = "symlink out of the directory" }
        else entries[#entries + 1] = { path = r, type = "symlink" } end
      else
        entries[#entries + 1] = { path = r, type = it.type }
      end
    end
  end
  walk("")
  return entries, rejected
end

-- ------------------------------------------------------------- commands

local function executable(h, p)
  local ok, t = pcall(resolve, h, p, "exec", true)
  if not ok or t.kind ~= "mount" then return false end
  local st = native.lookup(t.dir, t.rel)
  return st ~= nil and st.type == "file" and st.mode & tonumber("111", 8) ~= 0
end

local function find_program(h, name, env, cwd)
  if name:find("/", 1, true) then
    return executable(h, name:sub(1, 1) == "/" and name or (cwd .. "/" .. name))
  end
  local pathvar = require("sbx.sandbox").DEFAULT_PATH
  for _, kv in ipairs(env) do
    if kv:sub(1, 5) == "PATH=" then pathvar = kv:sub(6) end
  end
  for dir in pathvar:gmatch("[^:]+") do
    if dir:sub(1, 1) == "/" and executable(h, dir .. "/" .. name) then return true end
  end
  return false
end

-- Before bwrap mounts over the root's entries: recreate missing ones, and
-- refuse a mount point that is no longer a directory (it cannot change
-- while any command runs: the kernel keeps mount points busy).
local function check_root(h)
  local ok, err = native.populate(h.dir, h.top)
  if not ok then fail("SandboxExecutionError", "the sandbox root is damaged: " .. err, "exec") end
  if h.uid then own(h, "workspace") own(h, "tmp") end
  for _, e in ipairs(h.top) do
    if e.mount then
      local st = native.lookup(h.dir, e.name)
      if not st or st.type ~= "dir" then
        fail("SandboxExecutionError", "the sandbox replaced its mount point /" .. e.name
             .. " with a " .. (st and st.type or "missing entry") .. "; refusing to mount over it", "exec")
      end
    end
  end
end

---Start a process. req: argv, env (list), cwd, stdin, keep_stdin, timeout,
---max_output, stream. Returns a sbx.Proc (of bwrap, whose tree is the command's).
-- ------------------------------------------------------------ the agent

-- A sandbox keeps one namespace alive: bwrap runs `sbx-agent serve` and
-- every command is a frame on its stdin instead of a new bwrap (which costs
-- a user, pid, mount and network namespace each time). Commands of one
-- sandbox then share its pid namespace and /run, as in a container.
-- SBX_BWRAP_EXEC=direct (or M.exec_mode) keeps a bwrap per command; so do
-- sandboxes with per-process rlimits, which must not apply to the agent.
M.exec_mode = nil
M.AGENT_IN = "/run/.sbx/sbx-agent"

local function mode() return M.exec_mode or os.getenv("SBX_BWRAP_EXEC") or "agent" end

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

function agent_file()
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

local function transport(p)
  local t = { diag = "" }
  function t.read()
    while true do
      local which, chunk = p:read()
      if not which then return nil, t.diag ~= "" and ("the agent ended: " .. t.diag) or nil end
      if which == "stdout" then return chunk end
      t.diag = (t.diag .. chunk):sub(-2000)
    end
  end
  function t.write(data) return p:write(data) end
  function t.close() p:close() end
  return t
end

local function open_link(h)
  local file, ferr = agent_file()
  if not file then return nil, "cannot write the agent: " .. tostring(ferr) end
  -- the bind names a host path: it goes with the options through --args
  local ns = holder_of(h)
  local argv, fds = command_line(h, { extra = { "--ro-bind", ns and h.uid and M.VIEW .. "/agent" or file, M.AGENT_IN } })
  for _, x in ipairs{ "--chdir", "/", "--" } do argv[#argv + 1] = x end
  for _, x in ipairs{ M.AGENT_IN, "serve" } do argv[#argv + 1] = x end
  local p, err = proc.spawn{ argv = argv, env = {}, keep_stdin = true, stream = true, max_output = 0,
                             cgroup = h.cg, join = h.join, fds = fds, rlimits = h.rlimits, setns = ns }
  if not p then return nil, err end
  return agentlink.open(transport(p), 10)
end

local function plain_rlimits(r)
  for k in pairs(r or {}) do if k ~= "core" then return false end end
  return true
end

---The sandbox's agent link, opened on first use; nil: a bwrap per command.
local function link_of(h)
  if h.link and not h.link.broken then return h.link end
  if mode() == "direct" or h.no_agent or not plain_rlimits(h.rlimits) then return nil end
  local link, why = open_link(h)
  if link then
    h.link = link
    return link
  end
  h.no_agent = "sbx-agent serve did not start: " .. tostring(why)
  M.fallback = h.no_agent
  return nil
end
M.link_of = link_of

function M.spawn(h, req)
  if not h.root then fail("SandboxNotFoundError", "the sandbox was destroyed", "exec") end
  local ready = M.probe()        -- a resumed sandbox may be this process's first
  if not ready.ok then fail("BackendNotInstalledError", "bwrap: " .. tostring(ready.reason), "exec") end
  check_root(h)
  local t = resolve(h, req.cwd or M.WORKDIR, "exec", true)
  local cwd = t.path
  if t.kind == "mount" then
    local st, err, code = native.lookup(t.dir, t.rel)
    if not st then core_fail("exec", "cwd " .. (req.cwd or M.WORKDIR), err, code) end
    if st.type ~= "dir" then fail("PathError", "cwd " .. req.cwd .. " is not a directory", "exec") end
  elseif t.kind ~= "virtual" then
    not_found("exec", "cwd " .. tostring(req.cwd or M.WORKDIR))
  end
  local cur, max = limits.pids(h.session, h.id, h.cg)
  if cur and max and cur >= max then
    fail("SandboxExecutionError", "the sandbox reached its process limit (" .. max .. "); destroy it or"
         .. " kill its processes", "exec", "EAGAIN")
  end
  local link = link_of(h)
  local prog = req.argv[1]
  -- the agent looks the program up itself, inside (this lookup from the
  -- host was most of the host's time per command)
  if not link and not find_program(h, prog, req.env, cwd) then
    fail("SandboxExecutionError", "spawn: " .. prog .. ": No such file or directory", "exec", "ENOENT")
  end
  if link then
    return link:spawn{ argv = req.argv, env = req.env, cwd = cwd, stdin = req.stdin,
      keep_stdin = req.keep_stdin, timeout = req.timeout, max_output = req.max_output,
      stream = req.stream, want_pid = req.want_pid }
  end
  local ns = holder_of(h)
  local argv, fds = command_line(h, { env = req.env })
  if argv[2] ~= "--args" then
    fail("SandboxExecutionError", "the command's environment is over 64 KiB with the options", "exec", "E2BIG")
  end
  argv[#argv + 1] = "--chdir"; argv[#argv + 1] = cwd
  argv[#argv + 1] = "--"
  for _, a in ipairs(req.argv) do argv[#argv + 1] = a end
  local p, err, code = proc.spawn{
    argv = argv, env = {}, stdin = req.stdin, keep_stdin = req.keep_stdin, timeout = req.timeout,
    max_output = req.max_output, stream = req.stream, cgroup = h.cg, join = h.join, fds = fds,
    rlimits = h.rlimits, setns = ns,
  }
  if not p then fail("SandboxExecutionError", err, "exec", code) end
  return p
end

return M
