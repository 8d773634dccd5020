--- The bwrap provider's probe and doctor: what this machine offers (bwrap,
--- user and network namespaces, seccomp, --disable-userns), probed once and
--- not kept when the probe could not start, and `sbxlua doctor`'s lines.
local proc = require "sbx.proc"
local native = require "sbx.bwrap"
local limits = require "sbx.providers.builtin.limits"
local host = require "sbx.providers.builtin.host"
local common = require "sbx.providers.builtin.bwrap.common"
local layout = require "sbx.providers.builtin.bwrap.layout"
local holder = require "sbx.providers.builtin.bwrap.holder"

local M = {}
local SECCOMP, command_line, bwrap_path = layout.SECCOMP, layout.command_line, layout.bwrap_path

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
  common.found_bwrap(bwrap_path())
  r.bwrap = common.bwrap
  if not common.bwrap then
    r.reason = "bubblewrap is not installed (no bwrap on PATH)"
    return r
  end
  if not SECCOMP then
    r.reason = "no seccomp filter for this CPU architecture (x86_64 and arm64 only)"
    return r
  end
  local vp = proc.spawn{ argv = { common.bwrap, "--version" }, env = {}, timeout = 10 }
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
      common.lacks_disable_userns()
      r.ok, r.userns, r.netns, r.seccomp, r.disable_userns = true, true, true, true, false
      return r
    end
  end
  local plain = { common.bwrap, "--unshare-user", "--unshare-pid", "--ro-bind", "/", "/", "--", "true" }
  local uok, uwhy = run_probe(plain)
  r.userns = uok
  if not uok then
    r.reason = "user namespaces are not available: " .. tostring(uwhy)
    return r
  end
  local nok, nwhy = run_probe{ common.bwrap, "--unshare-user", "--unshare-net", "--ro-bind", "/", "/", "--", "true" }
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
  add(common.slirp ~= nil, "internet (allow_internet = true)", common.slirp and ("slirp4netns " .. common.slirp
      .. " in each sandbox's own network namespace; the host's 127.0.0.1 and abstract sockets are out of reach")
      or "slirp4netns is not installed: bwrap offers allow_internet = false only (no network capability)",
      "apt-get install slirp4netns")
  add(SECCOMP ~= nil, "seccomp filter", SECCOMP and (#native.denied() .. " calls refused (" ..
      table.concat(native.denied(), ", ", 1, 6) .. ", ...)") or "no filter for this architecture")
  if r.ok and not r.disable_userns then
    add(nil, "--disable-userns", "not supported by this bwrap; the seccomp filter refuses new user namespaces")
  end
  local base, why = host.containment()
  add(base ~= nil, "containment", base and "each sandbox's namespace in its own cgroup (destroy kills it"
      .. " whole); inside, each command's tree is killed by its sbx-agent supervisor"
      or ("no writable cgroup v2 (" .. tostring(why) .. "): process trees are swept through /proc"),
      "run as root, or under a delegated cgroup (systemd-run --user --scope -p Delegate=yes sbxlua ...)")
  add(nil, "limits", limits.describe() .. " (what is not enforced is not offered: routing skips bwrap"
      .. " when it is requested); per-process rlimits via backend_options.rlimits (as_mb, cpu_secs,"
      .. " fsize_mb, nofile)")
  if native.getuid() == 0 then
    local u, g = holder.ids()
    add(nil, "running as root", "sandboxes run as host uid " .. u .. ", gid " .. g .. " (root inside;"
        .. " /etc/subuid's first range of root, else " .. common.DEFAULT_ID .. "); a workdir must be writable"
        .. " by that uid; what in /etc is not readable by everyone is hidden (" .. #layout.layout().hidden .. " entries)")
  end
  add(nil, "exec path", (common.exec_mode or os.getenv("SBX_BWRAP_EXEC")) == "direct"
      and "a new bwrap for every command (SBX_BWRAP_EXEC=direct)"
      or "one namespace per sandbox, commands sent to sbx-agent inside it (a bwrap per command"
         .. " for sandboxes with rlimits)")
  if common.fallback then
    add(false, "agent fallback used", common.fallback, "check that " .. common.AGENT_IN .. " can run inside bwrap")
  end
  if r.ok then add(nil, "probe", "run `sbxlua selftest --backend bwrap` for the escape probes") end
  return out
end

return M
