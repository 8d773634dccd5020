-- Issue 15's bwrap items: the kernel's knobs of /proc are read-only or
-- masked, the sandbox has its own network namespace (internet through
-- slirp4netns, the host's loopback and abstract sockets out of reach), a
-- command's environment never reaches bwrap's command line, a failure to
-- start the probe is not kept, and a full pids limit is named.
local sbx = require "sbx"
local proc = require "sbx.proc"
local loop = require "sbx.loop"
local fs = require "sbx.fs"
local bwrap = require "sbx.providers.builtin.bwrap"

local BIN = os.getenv("SBX_BIN") or "build/sbxlua"
local ok, why = bwrap.available()
if not ok then
  assert(os.getenv("SBX_REQUIRE_BWRAP") ~= "1", "bwrap is required here but unavailable: " .. tostring(why))
  describe("bwrap hardening", function() pending("bwrap unavailable: " .. tostring(why)) end)
  return
end

local function host(cmd)
  local f = io.popen(cmd .. " 2>&1")
  local out = f:read("a")
  f:close()
  return out
end

local kind_of = require("spec.support").kind_of

-- a listener of the spec's own on the host: 127.0.0.1 TCP and an abstract unix socket
local function host_listener(name)
  local l = assert(proc.spawn{ argv = { "python3", "-c", [[
import socket, sys, time
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(8)
u = socket.socket(socket.AF_UNIX); u.bind('\0' + sys.argv[1]); u.listen(8)
print(s.getsockname()[1], flush=True); time.sleep(60)
]], name }, env = { "PATH=/usr/bin:/bin" }, timeout = 60, stream = true })
  local port
  while not port do
    local which, c = l:read()
    assert(which, "the listener did not start")
    port = c and c:match("%d+")
  end
  return l, port
end

local PROBE = [[
import socket, sys
s = socket.socket(); s.settimeout(5)
try: s.connect((sys.argv[1], int(sys.argv[2]))); print('tcp reached')
except OSError as e: print('tcp blocked', e.errno)
if len(sys.argv) > 3:
    u = socket.socket(socket.AF_UNIX)
    try: u.connect('\0' + sys.argv[3]); print('abstract reached')
    except OSError as e: print('abstract blocked', e.errno)
]]

for _, mode in ipairs{ "agent", "direct" } do
  describe("bwrap hardening (" .. mode .. ")", function()
    local sb
    before_each(function() bwrap.exec_mode = mode; sb = sbx.sandbox("bwrap") end)
    after_each(function() if sb then sb:destroy() end bwrap.exec_mode = nil end)

    it("cannot write the host's sysctls; /proc's kernel knobs are read-only or masked", function()
      local r = sb:execute_command([[
for f in kernel/core_pattern fs/suid_dumpable kernel/panic vm/drop_caches net/ipv4/ip_forward; do
  if (cat /proc/sys/$f > /proc/sys/$f) 2>/dev/null; then echo "wrote $f"; else echo "refused $f"; fi
done
for f in sysrq-trigger kcore keys timer_list sched_debug; do
  [ -e /proc/$f ] && echo "$f size $(wc -c < /proc/$f 2>/dev/null)"
done
grep -E ' /proc/(sys|sysrq-trigger) ' /proc/self/mountinfo | awk '{print $5, $6}'
]])
      assert.equal(0, r.exit_code, r.stderr)
      assert.not_matches("wrote", r.stdout)
      assert.matches("refused kernel/core_pattern", r.stdout)
      assert.matches("/proc/sys ro", r.stdout)
      for _, f in ipairs{ "kcore", "keys", "timer_list", "sched_debug", "sysrq-trigger" } do
        if fs.read_host("/proc/" .. f, 1) ~= nil or f == "kcore" then
          local size = r.stdout:match(f .. " size (%d+)")
          if size then assert.equal("0", size, f .. " is not masked") end
        end
      end
      -- and the host's value is what it was
      assert.is_string(fs.read_host("/proc/sys/kernel/core_pattern", 4096))
    end)

    it("does not reach the host's 127.0.0.1 listeners nor its abstract unix sockets", function()
      local name = "sbx-spec-abs-" .. proc.random_hex(6)
      local l, port = host_listener(name)
      local r = sb:execute_command("python3", { "-c", PROBE, "127.0.0.1", port, name }, { timeout = 30 })
      l:kill() l:close()
      assert.equal(0, r.exit_code, r.stderr)
      assert.matches("tcp blocked", r.stdout)
      assert.matches("abstract blocked", r.stdout)
      -- the host's own reachable address too, through slirp's gateway
      local g = sb:execute_command("python3", { "-c", PROBE, "10.0.2.2", port }, { timeout = 30 })
      assert.matches("tcp blocked", g.stdout)
    end)
  end)
end

describe("bwrap internet through slirp4netns", function()
  if not bwrap.slirp then
    it("is not offered without slirp4netns", function()
      assert.equal("FeatureNotSupportedError", kind_of(function() sbx.sandbox("bwrap", { allow_internet = true }) end))
    end)
    return
  end
  -- a network namespace of the spec's own, reached over a veth pair: no
  -- traffic leaves this machine
  local tag = proc.random_hex(3)
  local ns, hv, nv = "sbxt-" .. tag, "sbxh" .. tag, "sbxn" .. tag
  local net = "198.18." .. (tonumber(tag:sub(1, 2), 16) % 250 + 1)
  local listener
  setup(function()
    local out = host(table.concat({
      "ip netns add " .. ns,
      "ip link add " .. hv .. " type veth peer name " .. nv,
      "ip link set " .. nv .. " netns " .. ns,
      "ip addr add " .. net .. ".1/30 dev " .. hv, "ip link set " .. hv .. " up",
      "ip -n " .. ns .. " addr add " .. net .. ".2/30 dev " .. nv, "ip -n " .. ns .. " link set " .. nv .. " up",
      "ip -n " .. ns .. " link set lo up" }, " && "))
    assert(host("ip netns list"):find(ns, 1, true), out)
    listener = assert(proc.spawn{ argv = { "ip", "netns", "exec", ns, "python3", "-c", [[
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 8080)); s.listen(8); print('ready', flush=True)
s.settimeout(60)
while True:
    c, _ = s.accept(); c.sendall(b'hello from the test netns\n'); c.close()
]], net .. ".2" }, env = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin" }, timeout = 90, stream = true })
    local which, c = listener:read()
    assert(which == "stdout" and c:find("ready"), tostring(c))
  end)
  teardown(function()
    if listener then listener:kill() listener:close() end
    host("ip netns del " .. ns .. "; ip link del " .. hv)
  end)

  for _, mode in ipairs{ "agent", "direct" } do
    it("reaches a non-loopback address when allowed (" .. mode .. ")", function()
      bwrap.exec_mode = mode
      local sb <close> = sbx.sandbox("bwrap")
      local r = sb:execute_command("python3", { "-c", [[
import socket, sys
s = socket.create_connection((sys.argv[1], 8080), timeout=10); print(s.recv(100).decode().strip())
]], net .. ".2" }, { timeout = 30 })
      bwrap.exec_mode = nil
      assert.equal("hello from the test netns\n", r.stdout, r.stderr)
      local off <close> = sbx.sandbox("bwrap", { allow_internet = false })
      local o = off:execute_command("python3", { "-c", PROBE, net .. ".2", "8080" }, { timeout = 30 })
      assert.matches("tcp blocked", o.stdout)
    end)
  end

  it("leaves no slirp4netns behind at destroy", function()
    local sb = sbx.sandbox("bwrap")
    sb:execute_command("true")
    -- this process's own (other tests on the machine run theirs meanwhile)
    local mine = "pgrep -c -x -P " .. require("sbx.proc").getpid() .. " slirp4netns"
    local n = tonumber(host(mine):match("%d+")) or 0
    sb:destroy()
    loop.sleep(0.2)
    local m = tonumber(host(mine):match("%d+")) or 0
    assert.is_true(m < n, "slirp4netns processes before destroy " .. n .. ", after " .. m)
  end)
end)

describe("bwrap secrets and failures", function()
  it("keeps a command's env_vars off bwrap's command line (a bwrap per command)", function()
    bwrap.exec_mode = "direct"
    local sb <close> = sbx.sandbox("bwrap")
    local canary = "sbxcanary" .. proc.random_hex(8)
    local p = sb:spawn("sleep", { "5" }, { env = { SECRET_TOKEN = canary } })
    loop.sleep(0.3)
    local seen = {}
    for _, pid in ipairs(fs.list_host("/proc") or {}) do
      local c = pid:match("^%d+$") and fs.read_host("/proc/" .. pid .. "/cmdline", 1 << 20)
      if c and c:find(canary, 1, true) then seen[#seen + 1] = pid .. ": " .. c:gsub("%z", " ") end
    end
    local env = sb:execute_command("sh", { "-c", "echo $SECRET_TOKEN" }, { env = { SECRET_TOKEN = canary } })
    p:kill()
    bwrap.exec_mode = nil
    assert.same({}, seen)
    assert.equal(canary .. "\n", env.stdout)
  end)

  it("does not keep a probe that could not start (EMFILE)", function()
    local script = os.tmpname()
    local f = io.open(script, "w")
    f:write([[
local b = require "sbx.providers.builtin.bwrap"
local held = {}
while true do local h = io.open("/dev/null") if not h then break end held[#held + 1] = h end
local r1 = b.probe(true)
for _, h in ipairs(held) do h:close() end
collectgarbage()
local r2 = b.probe()
print("first", tostring(r1.ok), "then", tostring(r2.ok), tostring(r1.reason))
]])
    f:close()
    local p = assert(proc.spawn{ argv = { BIN, script }, timeout = 60, rlimits = { nofile = 64 },
                                 env = { "PATH=/usr/bin:/bin", "SBX_LUA_PATH=" .. (os.getenv("SBX_LUA_PATH") or ""),
                                         "SBX_STATE_DIR=" .. (os.getenv("SBX_STATE_DIR") or "/tmp") } })
    local r = p:wait()
    p:close()
    os.remove(script)
    assert.matches("first%sfalse%sthen%strue", r.stdout, r.stdout .. r.stderr)
  end)

  it("names a full process limit instead of spawn: errno 11", function()
    if not bwrap.descriptor.limits.pids then pending("no pids controller") return end
    local sb <close> = sbx.sandbox("bwrap")
    -- forks until the limit refuses one, then holds every process: nothing
    -- exits afterwards, so the group stays full (a shell's loop would keep
    -- retrying and the next command could take a freed slot)
    local full = false
    local bomb = sb:spawn("python3", { "-c", [[
import os, time
while True:
    try:
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "300"])
    except OSError:
        break
print("full", flush=True)
time.sleep(300)
]] }, { timeout = 120, on_stdout = function(c) if c:find("full", 1, true) then full = true end end })
    local t0 = loop.now()
    while not full and loop.now() - t0 < 90 do loop.sleep(0.05) end
    assert.is_true(full, "the bomb did not fill the limit")
    local okk, e = pcall(sb.execute_command, sb, "true")
    local kind, err = not okk and type(e) == "table" and e.kind, e
    bomb:kill()
    assert.equal("SandboxExecutionError", kind, tostring(err))
    assert.matches("the sandbox reached its process limit %(1024%); destroy it or kill its processes", err.message)
  end)
end)
