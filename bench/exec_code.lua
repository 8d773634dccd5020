-- p50 of local execute_code('print(1)') (python3), inside one job.
--   sbxlua bench/exec_code.lua [N=100]
local B = dofile((arg[0]:match("^(.*)/") or ".") .. "/common.lua")
local n = tonumber(arg[1]) or 100
local sb <close> = sbx.sandbox("local")
B.report(B.time(n, 5, function()
  local r = sb:execute_code("print(1)")
  assert(r.exit_code == 0 and r.stdout == "1\n", r.stderr)
end))
