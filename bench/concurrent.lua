-- 200 concurrent local sandboxes x 10 commands each, one job.
--   sbxlua bench/concurrent.lua [SANDBOXES=200] [CMDS=10]
-- Prints: ok <bool> wall_ms <ms> vmhwm_kb <kB> fd_start <n> fd_baseline <n> fd_after <n> cmds <n>
-- fd_baseline is counted after one warm-up sandbox: the first sandbox of a job
-- opens the session journal + lock (2 fds) for the rest of the job, by design.
local B = dofile((arg[0]:match("^(.*)/") or ".") .. "/common.lua")
local nsb = tonumber(arg[1]) or 200
local ncmd = tonumber(arg[2]) or 10
local pid = require("sbx.proc").getpid()

local function fd_count()
  local p = assert(io.popen("ls /proc/" .. pid .. "/fd"))
  local n = 0
  for _ in p:lines() do n = n + 1 end
  p:close()
  return n
end

local function status(key)
  local f = assert(io.open("/proc/self/status"))
  local s = f:read("a")
  f:close()
  return tonumber(s:match(key .. ":%s*(%d+)"))
end

local items = {}
for i = 1, nsb do items[i] = i end
local fd_start = fd_count()
do
  local sb <close> = sbx.sandbox("local")
  sb:execute_command("true", {})
end
local fd_baseline = fd_count()
local t0 = B.now()
local results = sbx.parallel(items, function(i)
  local sb <close> = sbx.sandbox("local")
  local ok = 0
  for _ = 1, ncmd do
    if sb:execute_command("true", {}).exit_code == 0 then ok = ok + 1 end
  end
  return ok
end, { concurrency = nsb })
local wall = (B.now() - t0) * 1e3
local total = 0
for _, v in ipairs(results) do total = total + v end
local fd_after = fd_count()
print(string.format("ok %s wall_ms %.2f vmhwm_kb %d fd_start %d fd_baseline %d fd_after %d cmds %d",
  tostring(total == nsb * ncmd), wall, status("VmHWM"), fd_start, fd_baseline, fd_after, total))
