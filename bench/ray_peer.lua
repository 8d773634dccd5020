-- The sbxlua side of bench/ray_peer.sh: sbxlua's ray provider on the
-- cluster of spec/support/ray.sh; bench/peer_ray.py is the peer's side,
-- with the same modes and the same output, run in the same rounds.
--   round NC NE NR   NC x (create -> first `true` ran, then destroy), each
--                    after one floor sample (a raw POST /api/jobs/ until its
--                    entrypoint runs: what a job-per-sandbox design costs),
--                    then on one sandbox NE x exec (sh -c and exact argv),
--                    NR x write+read of 1 KiB and of 8 MiB
--   par N            N x (create, `true`, destroy) at once: wall time
--   probe            what a command inside a sandbox sees of the node
-- Output: one "OP MS" line per sample (probe: "probe KEY VALUE" lines).
local sbx = require "sbx"
local C = dofile((os.getenv("SBX_SOURCE_DIR") or ".") .. "/bench/common.lua")
local mode = arg[1]

local function ok(r) assert(r.exit_code == 0, r.stderr) end
local function out(op, ms) print(string.format("%s %.4f", op, ms)) end

local floor_once = C.ray_floor

local function timed(op, fn) local t0 = C.now() fn() out(op, (C.now() - t0) * 1e3) end

if mode == "round" then
  local NC, NE, NR = tonumber(arg[2]), tonumber(arg[3]), tonumber(arg[4])
  for _ = 1, NC do
    out("floor", floor_once())
    local sb
    timed("create", function() sb = sbx.sandbox("ray") ok(sb:execute_command("true")) end)
    timed("destroy", function() sb:destroy() end)
  end
  local sb <close> = sbx.sandbox("ray")
  for _, t in ipairs(C.time(NE, 5, function() ok(sb:execute_command("true")) end)) do out("exec_sh", t) end
  for _, t in ipairs(C.time(NE, 5, function() ok(sb:execute_command("true", {})) end)) do out("exec_argv", t) end
  for name, size in pairs({ rw_1k = 1024, rw_8m = 8 * 1024 * 1024 }) do
    local blob = string.rep("x", size)
    for _, t in ipairs(C.time(NR, 1, function()
      sb:write_file("f.bin", blob)
      assert(sb:read_file("f.bin") == blob)
    end)) do out(name, t) end
  end
elseif mode == "par" then
  local n, items = tonumber(arg[2]), {}
  for i = 1, n do items[i] = i end
  local t0 = C.now()
  local res = sbx.parallel(items, function()
    local s <close> = sbx.sandbox("ray")
    ok(s:execute_command("true"))
    return true
  end, { concurrency = n })
  for i = 1, n do assert(res[i] == true, "par: item " .. i .. " failed") end
  out("par" .. n, (C.now() - t0) * 1e3)
elseif mode == "probe" then
  local sb <close> = sbx.sandbox("ray")
  local r = sb:execute_command("sh", { "-c", os.getenv("PROBE") })
  io.write(r.stdout)
else
  error("usage: ray_peer.lua round NC NE NR | par N | probe")
end
