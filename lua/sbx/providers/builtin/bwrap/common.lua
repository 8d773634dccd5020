--- What every part of the bwrap provider shares: its descriptor (with the
--- options this machine's cgroup controllers can enforce), the layout's
--- constants, the paths of the holder's view and the agent inside, the
--- knobs specs and doctor read or set through the facade (exec_mode,
--- fallback; bwrap and no_disable_userns are the probe's findings; the
--- facade's metatable forwards them here), the exec path in use and the
--- raise helpers.
local proc = require "sbx.proc"
local errors = require "sbx.core.errors"
local limits = require "sbx.providers.builtin.limits"
local host = require "sbx.providers.builtin.host"

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
M.slirp = proc.which("slirp4netns", host.DEFAULT_PATH)
if not M.slirp then
  local caps = M.descriptor.capabilities
  for i = #caps, 1, -1 do if caps[i] == "network" then table.remove(caps, i) end end
end

-- fail(kind, message, fields): a typed error of this provider.
local fail = errors.raiser("bwrap")

-- A core failure (nil, msg, code) about sandbox path `path`.
local function core_fail(op, path, err, code)
  local reason = tostring(err):match(": ([^:]*)$") or tostring(err)
  errors.core(op .. ": " .. path .. ": " .. reason, code, "bwrap", op)
end
M.fail, M.core_fail = fail, core_fail
M.SPECIAL = SPECIAL

-- The holder's mount view of a sandbox of root (holder.lua) and its
-- default host ids when /etc/subuid names none.
M.VIEW = "/run/sbxlua-bwrap"
M.DEFAULT_ID = 100000

-- ------------------------------------------------------------ the agent

-- A sandbox keeps one namespace alive: bwrap runs `sbx-agent serve` and
-- every command is a frame on its stdin instead of a new bwrap (which costs
-- a user, pid, mount and network namespace each time). Commands of one
-- sandbox then share its pid namespace and /run, as in a container.
-- SBX_BWRAP_EXEC=direct (or M.exec_mode) keeps a bwrap per command; so do
-- sandboxes with per-process rlimits, which must not apply to the agent.
M.exec_mode = nil
M.AGENT_IN = "/run/.sbx/sbx-agent"

function M.mode() return M.exec_mode or os.getenv("SBX_BWRAP_EXEC") or "agent" end

-- Why the last sandbox whose agent did not start runs a bwrap per command
-- (`sbxlua doctor` shows it); nil while every agent started.
M.fallback = nil
---@param why string
function M.note_fallback(why) M.fallback = why end

-- What the probe found (probe.lua): the bwrap program, and whether it
-- lacks --disable-userns; layout.lua's command line reads both.
M.bwrap, M.no_disable_userns = nil, nil
---@param path string|nil
function M.found_bwrap(path) M.bwrap = path end
function M.lacks_disable_userns() M.no_disable_userns = true end

return M
