--- The bwrap provider's holder: the process per sandbox that owns its
--- namespaces (as root: a user namespace on root's subordinate ids and a
--- mount view; with the internet: the network namespace slirp4netns is
--- attached to once), started on a sandbox's first command and again after
--- a resume; the ids sandboxes of root run as.
local fs = require "sbx.fs"
local proc = require "sbx.proc"
local native = require "sbx.bwrap"
local errors = require "sbx.core.errors"
local host = require "sbx.providers.builtin.host"
local common = require "sbx.providers.builtin.bwrap.common"
local layout = require "sbx.providers.builtin.bwrap.layout"

local M = {}
local fail, agent_file = common.fail, layout.agent_file

-- ------------------------------------------------------------ host root

-- When sbxlua runs as root, no sandbox process is host root: each sandbox
-- has a holder process (created on its first command, again after a
-- resume) owning a user namespace that maps uid and gid 0 onto M.ids()
-- (unprivileged host ids), with its network namespace when the sandbox has
-- the internet (slirp4netns attached once, for every command) and a mount
-- namespace where the sandbox's host directories appear under common.VIEW (the
-- unprivileged uid could not reach them under a state dir like /root's).
-- Every bwrap starts in those namespaces (sbx.proc's setns) as that
-- namespace's root, and its own user namespace nests inside.

local ids_cache
---The host uid and gid sandboxes of root run as: root's first subordinate
---ids (/etc/subuid, /etc/subgid), else common.DEFAULT_ID.
function M.ids()
  if ids_cache then return ids_cache[1], ids_cache[2] end
  local function first(file)
    for line in (fs.read_host(file, 1 << 20) or ""):gmatch("[^\n]+") do
      local who, start = line:match("^([^:]+):(%d+):%d+")
      if who == "root" or who == "0" then return tonumber(start) end
    end
    return common.DEFAULT_ID
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

local HOLDER = 'set -e; mount -t tmpfs -o mode=0711,size=64k sbx "$1"; mkdir "$1/root" "$1/work";'
  .. ' touch "$1/agent"; mount --bind "$2" "$1/root";'
  .. ' if [ -n "$3" ]; then mount --bind "$3" "$1/work"; fi;'
  .. ' mount --bind "$4" "$1/agent"; mount -o remount,bind,ro "$1/agent";'
  .. ' exec unshare --user $5 sleep infinity'


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
       .. (out ~= "" and (" (" .. out .. ")") or ""), { op = "exec" })
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

start_holder = function(h)
  local env = { "PATH=" .. host.DEFAULT_PATH }
  local p, err, pid
  if h.uid then
    local file, ferr = agent_file()
    if not file then holder_fail(h, nil, "cannot write the agent: " .. tostring(ferr)) end
    local ok, merr = fs.mkdir_host(common.VIEW)
    if not ok then holder_fail(h, nil, tostring(merr)) end
    p, err = proc.spawn{ argv = { "unshare", "--mount", "--propagation", "slave", "--", "/bin/sh", "-c",
        HOLDER, "sbx-holder", common.VIEW, h.dir, h.workdir or "", file, h.net and "--net" or "" },
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
    local argv = h.uid and { "unshare", "--mount", "--propagation", "private", "--", common.slirp } or { common.slirp }
    for _, a in ipairs(common.SLIRP_ARGS) do argv[#argv + 1] = a end
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

M.own, M.holder_of, M.kill_holder = own, holder_of, kill_holder

return M
