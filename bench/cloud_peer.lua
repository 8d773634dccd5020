-- bench/cloud_peer.lua PROVIDER N_CREATE N_EXEC N_RW: one round of sbxlua's
-- side of bench/cloud_peer.sh, through the provider script (e2b, daytona or
-- tensorlake) pointed at a stand-in by the variables the official SDKs
-- honour (E2B_API_URL..., DAYTONA_API_URL, TENSORLAKE_API_URL + keys):
-- create+destroy, execute_command("true", {}) and write_file + read_file of
-- 1 KiB. Warm-up calls (1 create, 3 of the others) are not counted. Prints
-- one line per operation: "sbxlua OP ms ms ...", read by peer_cloud.py table.
local C = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/common.lua")
local provider = assert(arg[1], "usage: cloud_peer.lua PROVIDER N_CREATE N_EXEC N_RW")
local nc, ne, nr = tonumber(arg[2] or 3), tonumber(arg[3] or 20), tonumber(arg[4] or 20)
local KB = string.rep("x", 1024)

local function line(op, t)
  local out = {}
  for i, v in ipairs(t) do out[i] = string.format("%.3f", v) end
  print("sbxlua " .. op .. " " .. table.concat(out, " "))
  io.stdout:flush()
end

line("create", C.time(nc, 1, function() sbx.sandbox(provider):destroy() end))
local sb <close> = sbx.sandbox(provider)
line("exec", C.time(ne, 3, function() assert(sb:execute_command("true", {}).exit_code == 0) end))
line("rw", C.time(nr, 3, function()
  sb:write_file("bench.txt", KB)
  assert(sb:read_file("bench.txt") == KB)
end))
