-- Shared by the install specs: running programs with a bare environment,
-- and bubblewrap views of the machine in which an installed tree is where
-- a real install puts it.
local proc = require "sbx.proc"

local M = {}

M.BUILD = os.getenv("SBX_MODULE_DIR") or "build"   -- the build directory (sbx.so is at its top)
M.SOURCE = os.getenv("SBX_SOURCE_DIR") or "."

-- A sanitizer build's sbx.so needs its runtime loaded first in a stock lua5.4.
function M.preload_env()
  local pre = os.getenv("SBX_PRELOAD") or ""
  if pre == "" then return {} end
  return { "LD_PRELOAD=" .. pre, "ASAN_OPTIONS=detect_leaks=0" }
end

---Run argv with exactly `env` (no LUA_CPATH, no SBX_LUA_PATH); the result table.
function M.run(argv, env, timeout)
  local p = assert(proc.spawn{ argv = argv, env = env or { "PATH=/usr/bin:/bin" }, timeout = timeout or 120 })
  return p:wait()
end

function M.have(cmd)
  return proc.which(cmd, "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin") ~= nil
end

---Skip (pending) only outside CI; in CI a missing tool fails the spec.
function M.need(cmd)
  if M.have(cmd) then return true end
  assert(os.getenv("CI") ~= "true", cmd .. " is missing; CI installs it from ./dev's PACKAGES")
  pending(cmd .. " is missing (apt-get install it): skipped")
  return false
end

---argv that runs `cmd` (a shell line) in a bubblewrap view of this machine,
---read-only, with `binds` ({ {src, dest}, ... }) mounted over it, a private
---/tmp and HOME=/tmp: the environment holds PATH and HOME only.
function M.bwrap(binds, cmd)
  local argv = { "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp" }
  for _, b in ipairs(binds) do
    argv[#argv + 1] = b.tmpfs and "--tmpfs" or "--ro-bind"
    argv[#argv + 1] = b[1]
    if not b.tmpfs then argv[#argv + 1] = b[2] end
  end
  for _, a in ipairs{ "--chdir", "/tmp", "--die-with-parent", "--", "/usr/bin/env", "-i",
                      "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp" } do
    argv[#argv + 1] = a
  end
  for _, kv in ipairs(M.preload_env()) do argv[#argv + 1] = kv end
  argv[#argv + 1] = "sh"
  argv[#argv + 1] = "-c"
  argv[#argv + 1] = cmd
  return argv
end

---Stock lua5.4's default package.cpath (no LUA_CPATH set).
function M.default_cpath()
  local r = M.run({ "lua5.4", "-e", "io.write(package.cpath)" })
  assert(r.exit_code == 0, r.stderr)
  return r.stdout
end

-- A job using the local backend and the module from a stock Lua, the same
-- in both views (sbxlua from PATH, sbx.so from lua5.4's default path).
M.CHECK = [[
set -e
sbxlua -e 'local sb <close> = sbx.sandbox("local") io.write(sb:execute_command("echo", {"job ok"}).stdout)'
printf 'local sb <close> = sbx.sandbox("local")\nprint(sb:execute_code("print(6 * 7)").stdout)\n' > /tmp/job.lua
sbxlua /tmp/job.lua
lua5.4 -e 'local sbx = require "sbx"
  io.write(package.searchpath("sbx", package.cpath), " ", sbx.version, "\n")
  local sb <close> = sbx.sandbox("local")
  io.write(sb:execute_command("echo", {"module ok"}).stdout)'
]]

return M
