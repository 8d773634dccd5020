--- The escape probes of `sbxlua selftest` (selftest.lua runs them; its
--- header lists what each tries), what each isolating backend claims, and
--- the host-side helpers the probes check with.
local proc = require "sbx.proc"
local fs = require "sbx.fs"
local loop = require "sbx.loop"

local M = {}

local function shq(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- Capability bits no sandbox may hold (CAP_DAC_READ_SEARCH, NET_ADMIN,
-- SYS_MODULE, SYS_RAWIO, SYS_PTRACE, SYS_ADMIN, SYS_BOOT, PERFMON, BPF).
M.DANGEROUS_CAPS = { DAC_READ_SEARCH = 2, NET_ADMIN = 12, SYS_MODULE = 16, SYS_RAWIO = 17,
                     SYS_PTRACE = 19, SYS_ADMIN = 21, SYS_BOOT = 22, PERFMON = 38, BPF = 39 }

---What an isolating backend claims beyond the common probes: no_caps (it
---drops every capability), pids (its default limit), memory (the create
---options of a limit, and a bounded allocation past it, in MiB).
function M.claims(name)
  if name == "bwrap" then
    local lim = require("sbx.providers.builtin.bwrap").descriptor.limits
    return { no_caps = true, pids = lim.pids and require("sbx.providers.builtin.limits").PIDS or nil,
             memory = lim.memory_mb and { memory_mb = 128, mb = 512 }
                      or { backend_options = { rlimits = { as_mb = 256 } }, mb = 512 } }
  elseif name == "docker" then
    return { pids = require("sbx.providers.builtin.docker").DEFAULTS.pids, memory = { memory_mb = 128, mb = 512 } }
  end
  return {}
end

---The host's own IPv4 addresses (not loopback), from /proc/net/fib_trie.
function M.host_addresses()
  local seen, out, last = {}, {}, nil
  for line in (fs.read_host("/proc/net/fib_trie", 1 << 20) or ""):gmatch("[^\n]+") do
    local ip = line:match("|%-%- (%d+%.%d+%.%d+%.%d+)")
    if ip then last = ip
    elseif line:find("/32 host LOCAL", 1, true) and last and not last:match("^127%.") and not seen[last] then
      seen[last] = true
      out[#out + 1] = last
    end
  end
  table.sort(out)
  return out
end

-- A host process with a tagged command line and a canary in its environment.
local function host_witness(tag, canary)
  return proc.spawn{ argv = { "bash", "-c", 'exec -a "$0" sleep 120', tag }, timeout = 120,
                     env = { "PATH=/usr/bin:/bin", "SBX_SELFTEST_CANARY=" .. canary } }
end

local function host_count(pattern)
  local p = proc.spawn{ argv = { "pgrep", "-c", "-f", pattern }, env = { "PATH=/usr/bin:/bin" }, timeout = 10 }
  local out = p and p:wait().stdout or ""
  if p then p:close() end
  return tonumber(out:match("%d+")) or 0
end

-- Is there anything at host path p (not following a last symlink)?
local function exists(p) return require("sbx.bwrap").lookup("/", p:sub(2)) ~= nil end

-- ---------------------------------------------------------------- probes
-- Each: function(ctx) -> "ok" | "FAIL" | "skip", detail. ctx: sb (a sandbox
-- with the network on), off (one with allow_internet = false), backend,
-- claims, new(opts), tag, canary.

local probes = {}

probes[#probes + 1] = { name = "write outside the root", run = function(ctx)
  local dir = assert(fs.mkdtemp("/tmp", "sbx-selftest-"))
  local f = io.open(dir .. "/secret", "w") f:write(ctx.canary) f:close()
  local name = "sbx-selftest-" .. ctx.tag
  local targets = { dir .. "/pwned", "/usr/" .. name, "/etc/" .. name, "/" .. name, "/usr/bin/" .. name }
  local script = { "cat " .. shq(dir .. "/secret") .. " 2>/dev/null" }
  for _, t in ipairs(targets) do script[#script + 1] = "echo x > " .. shq(t) .. " 2>/dev/null" end
  local r = ctx.sb:execute_command(table.concat(script, "; ") .. "; true", nil, { timeout = 30 })
  local leaked = {}
  if r.stdout:find(ctx.canary, 1, true) then leaked[#leaked + 1] = "read " .. dir .. "/secret" end
  for _, t in ipairs(targets) do
    if exists(t) then leaked[#leaked + 1] = "wrote host " .. t; os.remove(t) end
  end
  fs.rmtree(dir)
  if #leaked > 0 then return "FAIL", table.concat(leaked, "; ") end
  return "ok", "a host directory is invisible; /usr, /etc and / of the host are untouched"
end }

probes[#probes + 1] = { name = "read the host's secrets", run = function(ctx)
  local w = host_witness("sbxselftest-" .. ctx.tag, ctx.canary)
  local r = ctx.sb:execute_command(
    "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done 2>/dev/null; env", nil, { timeout = 30 })
  local shadow = ctx.sb:execute_command("cat", { "/etc/shadow" }, { timeout = 30 }).stdout
  if w then w:close() end
  local bad = {}
  if r.stdout:find(ctx.canary, 1, true) then bad[#bad + 1] = "a host process's environment" end
  -- the host's own shadow file (a container's own /etc/shadow is not the host's)
  local host_shadow = fs.read_host("/etc/shadow", 1 << 20)
  if host_shadow and host_shadow ~= "" and shadow == host_shadow then bad[#bad + 1] = "/etc/shadow of the host" end
  if #bad > 0 then return "FAIL", "read " .. table.concat(bad, " and ") end
  return "ok", "no host process's environment (canary) and no shadow file inside"
end }

probes[#probes + 1] = { name = "write a host sysctl", run = function(ctx)
  -- each written back with its own value: nothing changes if it gets through
  local r = ctx.sb:execute_command([[
for f in kernel/core_pattern fs/suid_dumpable kernel/panic vm/drop_caches net/ipv4/ip_forward; do
  [ -e /proc/sys/$f ] || continue
  if [ $f = vm/drop_caches ]; then v=4; else v="$(cat /proc/sys/$f)"; fi
  if (printf '%s\n' "$v" > /proc/sys/$f) 2>/dev/null; then echo "wrote $f"; else echo "refused $f"; fi
done]], nil, { timeout = 30 })
  local wrote = {}
  for f in r.stdout:gmatch("wrote (%S+)") do wrote[#wrote + 1] = f end
  if #wrote > 0 then return "FAIL", "wrote /proc/sys/" .. table.concat(wrote, ", /proc/sys/") end
  local n = select(2, r.stdout:gsub("refused", ""))
  if n == 0 then return "FAIL", "the probe could not run: " .. r.stderr:sub(1, 200) end
  return "ok", n .. " sysctls refused (kernel.core_pattern, ...)"
end }

probes[#probes + 1] = { name = "reach mountinfo's host paths", run = function(ctx)
  -- a mount's root (field 4) is a path of its filesystem on the host; it
  -- gets through when that path, opened inside, is the mount's own root
  local r = ctx.sb:execute_command([[
n=0
while read -r _ _ _ root point _; do
  [ "$root" = / ] && continue
  [ "$root" = "$point" ] && continue
  n=$((n+1))
  a=$(stat -L -c '%d:%i' "$root" 2>/dev/null) || continue
  b=$(stat -c '%d:%i' "$point" 2>/dev/null) || continue
  [ "$a" = "$b" ] && echo "reached $root (mounted at $point)"
done < /proc/self/mountinfo
echo "checked $n"]], nil, { timeout = 30 })
  local reached = {}
  for line in r.stdout:gmatch("reached ([^\n]+)") do reached[#reached + 1] = line end
  if #reached > 0 then return "FAIL", table.concat(reached, "; ") end
  local n = tonumber(r.stdout:match("checked (%d+)"))
  if not n then return "FAIL", "the probe could not run: " .. r.stderr:sub(1, 200) end
  return "ok", n .. " host paths in mountinfo, none reachable inside"
end }

probes[#probes + 1] = { name = "reach the network when it is off", run = function(ctx)
  if not ctx.off then return "skip", "the backend does not honour allow_internet = false" end
  local ips = M.host_addresses()
  local r = ctx.off:execute_command("python3", { "-c", [[
import socket, sys
for line in open('/proc/net/dev').read().splitlines()[2:]:
    name = line.split(':')[0].strip()
    if name != 'lo': print('iface', name)
for ip in sys.argv[1:]:
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect((ip, 9)); print('reach', ip)
    except ConnectionRefusedError:
        print('reach', ip)
    except OSError as e:
        print('blocked', ip, e.errno)
]], table.unpack(ips) }, { timeout = 60 })
  if r.exit_code ~= 0 then return "FAIL", "the probe could not run: " .. r.stderr:sub(1, 200) end
  local got = {}
  for what, x in r.stdout:gmatch("(%a+) (%S+)") do
    if what == "iface" or what == "reach" then got[#got + 1] = what .. " " .. x end
  end
  if #got > 0 then return "FAIL", "with allow_internet = false: " .. table.concat(got, ", ") end
  return "ok", string.format("only lo; %d host address(es) unreachable", #ips)
end }

-- Issue 15, item 2: with the internet allowed, a sandbox must still not
-- reach what listens on the host's loopback (a database, a Docker TCP API).
probes[#probes + 1] = { name = "reach the host's loopback", run = function(ctx)
  local l, port = require("sbx.stream").listen{ host = "127.0.0.1", port = 0 }
  if not l then return "skip", "cannot listen on the host's 127.0.0.1: " .. tostring(port) end
  local r = ctx.sb:execute_command("python3", { "-c", [[
import socket, sys
s = socket.socket(); s.settimeout(3)
try:
    s.connect(('127.0.0.1', int(sys.argv[1]))); print('reach')
except OSError as e:
    print('blocked', e.errno)
]], tostring(port) }, { timeout = 60 })
  l:close()
  if r.exit_code ~= 0 then return "FAIL", "the probe could not run: " .. r.stderr:sub(1, 200) end
  if r.stdout:find("reach", 1, true) then
    return "FAIL", "a listener on the host's 127.0.0.1:" .. port .. " was reached with the internet allowed"
  end
  return "ok", "the host's 127.0.0.1:" .. port .. " is out of reach (" .. r.stdout:gsub("%s+$", "") .. ")"
end }

probes[#probes + 1] = { name = "see host processes", run = function(ctx)
  local tag = "sbxselftest-" .. ctx.tag .. "-ps"
  local w = host_witness(tag, ctx.canary)
  local r = ctx.sb:execute_command(
    "n=0; for f in /proc/[0-9]*/cmdline; do n=$((n+1)); tr '\\0' ' ' < $f; echo; done 2>/dev/null; echo count=$n",
    nil, { timeout = 30 })
  if w then w:close() end
  if r.stdout:find(tag, 1, true) then return "FAIL", "a host process is visible inside" end
  return "ok", "own pid namespace (" .. (r.stdout:match("count=(%d+)") or "?") .. " processes visible)"
end }

probes[#probes + 1] = { name = "raise privileges", run = function(ctx)
  local r = ctx.sb:execute_command("python3", { "-c", [[
import ctypes, os
st = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)
print('capeff', int(st['CapEff'].strip(), 16))
print('nonewprivs', st.get('NoNewPrivs', '?').strip())
libc = ctypes.CDLL(None, use_errno=True)
print('unshare_user', libc.unshare(0x10000000))
# a mount of its own namespace where it can make one (nothing reaches the host)
if libc.unshare(0x00020000) == 0:
    libc.mount(None, b'/', None, 0x4000 | 0x40000, None)
os.makedirs('/tmp/.sbx-selftest-mnt', exist_ok=True)
print('mount', libc.mount(b'none', b'/tmp/.sbx-selftest-mnt', b'tmpfs', 0, None))
]] }, { timeout = 30 })
  if r.exit_code ~= 0 then return "FAIL", "the probe could not run: " .. r.stderr:sub(1, 200) end
  local capeff = math.tointeger(tonumber(r.stdout:match("capeff (%d+)"))) or -1
  local bad = {}
  if capeff < 0 then bad[#bad + 1] = "unknown capabilities" end
  for name, bit in pairs(M.DANGEROUS_CAPS) do
    if capeff >= 0 and capeff & (1 << bit) ~= 0 then bad[#bad + 1] = "holds CAP_" .. name end
  end
  if ctx.claims.no_caps and capeff ~= 0 then bad[#bad + 1] = string.format("capabilities %x (claims none)", capeff) end
  if r.stdout:match("nonewprivs (%S+)") ~= "1" then bad[#bad + 1] = "no_new_privs is off" end
  if r.stdout:match("unshare_user (%-?%d+)") == "0" then bad[#bad + 1] = "created a user namespace" end
  if r.stdout:match("mount (%-?%d+)") == "0" then bad[#bad + 1] = "mounted a filesystem" end
  table.sort(bad)
  if #bad > 0 then return "FAIL", table.concat(bad, "; ") end
  return "ok", string.format("capabilities %x, no_new_privs, no user namespace, no mount", capeff)
end }

probes[#probes + 1] = { name = "exhaust pids", run = function(ctx)
  local limit = ctx.claims.pids
  local n = limit and (limit + 200) or 300
  local tag = "sbxselftest-" .. ctx.tag .. "-fork"
  local out = {}
  local p = ctx.sb:spawn("python3", { "-c", [[
import os, sys, time
n, tag, made = int(sys.argv[1]), sys.argv[2], 0
for i in range(n):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        try: os.execv('/bin/sleep', [tag, '600'])
        finally: os._exit(1)
    made += 1
print('made', made, flush=True)
time.sleep(600)
]], tostring(n), tag }, { timeout = 60, on_stdout = function(c) out[#out + 1] = c end })
  local t0 = loop.now()
  while not table.concat(out):find("made %d+") and loop.now() - t0 < 30 and require("sbx.sandbox.process").running(p) do
    loop.sleep(0.05)
  end
  local r = p:wait(0.2)           -- the deadline: the whole tree goes
  r.stdout = table.concat(out)
  loop.sleep(0.3)
  local survivors = host_count("^" .. tag)
  local made = tonumber(r.stdout:match("made (%d+)"))
  if survivors > 0 then
    os.execute("pkill -9 -f " .. shq("^" .. tag))
    return "FAIL", survivors .. " processes survived the timeout"
  end
  if not made then return "FAIL", "the probe could not run: " .. r.stderr:sub(1, 200) end
  if limit and made >= limit then return "FAIL", string.format("made %d processes past the claimed limit %d", made, limit) end
  if limit then return "ok", string.format("stopped at %d processes (limit %d); none survived the timeout", made, limit) end
  return "ok", string.format("%d processes (no pids limit claimed); all killed at the timeout", made)
end }

probes[#probes + 1] = { name = "exhaust memory", run = function(ctx)
  local m = ctx.claims.memory
  if not m then return "skip", "the backend claims no memory limit" end
  local opts = {}
  for k, v in pairs(m) do if k ~= "mb" then opts[k] = v end end
  local ok, sb = pcall(ctx.new, opts)
  if not ok then return "FAIL", "cannot create a sandbox with the limit it claims: " .. tostring(sb) end
  local r = sb:execute_command("python3", { "-c", [[
import sys
try:
    b = bytearray(int(sys.argv[1]) * 1024 * 1024)
    for i in range(0, len(b), 4096): b[i] = 1
    print('allocated')
except MemoryError:
    print('refused')
]], tostring(m.mb) }, { timeout = 60 })
  sb:destroy()
  if r.stdout:find("allocated", 1, true) then
    return "FAIL", string.format("allocated %d MiB past the claimed limit", m.mb)
  end
  local how = r.stdout:find("refused", 1, true) and "MemoryError" or (r.signal or ("exit " .. tostring(r.exit_code)))
  return "ok", string.format("%d MiB refused (%s)", m.mb, how)
end }

M.probes = probes

return M
