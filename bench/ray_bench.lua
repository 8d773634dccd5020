-- The ray provider against its floor on one cluster, in one run (bench/ray.sh):
--   floor   raw POST /api/jobs/ -> the entrypoint running (it dials a listener)
--   create  sbx.sandbox("ray") -> ready (submit, dial back, agent hello)
--   exec    `true` over the agent link
--   rw      8 MiB write_file + read_file
--   par4/par10  4 and 10 creates at once (wall time)
-- arg: N_CREATE N_EXEC N_RW
local sbx = require "sbx"
local C = dofile((os.getenv("SBX_SOURCE_DIR") or ".") .. "/bench/common.lua")
local NC, NE, NR = tonumber(arg[1] or 8), tonumber(arg[2] or 200), tonumber(arg[3] or 20)
local floor_once = C.ray_floor

local floor, create = {}, {}
for i = 1, NC do            -- interleaved: the same load for both
  floor[#floor + 1] = floor_once(i)
  local t0 = C.now()
  local sb = sbx.sandbox("ray")
  create[#create + 1] = (C.now() - t0) * 1000
  sb:destroy()
end
local sb <close> = sbx.sandbox("ray")
local exec = C.time(NE, 5, function() sb:execute_command("true") end)
local blob = string.rep("x", 8 * 1024 * 1024)
local rw = C.time(NR, 1, function()
  sb:write_file("big.bin", blob)
  assert(#sb:read_file("big.bin") == #blob)
end)
local function par(n)
  local t0 = C.now()
  sbx.parallel((function() local t = {} for i = 1, n do t[i] = i end return t end)(), function()
    local s <close> = sbx.sandbox("ray")
    s:execute_command("true")
  end, { concurrency = n })
  return (C.now() - t0) * 1000
end
local p4, p10 = par(4), par(10)
local f, c, e, r = C.stats(floor), C.stats(create), C.stats(exec), C.stats(rw)
print(string.format("%-34s %10s %10s %4s", "ray (this machine, 2 cores)", "p50 ms", "p90 ms", "n"))
print(string.format("%-34s %10.1f %10.1f %4d", "floor: POST -> entrypoint running", f.p50, f.p90, f.n))
print(string.format("%-34s %10.1f %10.1f %4d", "create (sbx.sandbox -> ready)", c.p50, c.p90, c.n))
print(string.format("%-34s %10.2f %10.2f %4d", "exec true", e.p50, e.p90, e.n))
print(string.format("%-34s %10.1f %10.1f %4d", "8 MiB write + read", r.p50, r.p90, r.n))
print(string.format("%-34s %10.0f", "4 creates at once (wall)", p4))
print(string.format("%-34s %10.0f", "10 creates at once (wall)", p10))
print(string.format("create / floor (p50): %.2fx", c.p50 / f.p50))
