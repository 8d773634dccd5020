-- p50 of one local execute_command, inside one job.
--   sbxlua bench/exec_true.lua [N=500] [MODE=args]
-- MODE "args": execute_command("true", {})  -> exact argv, no shell (vs posix_spawn /bin/true)
-- MODE "sh":   execute_command("true")      -> sh -c true            (vs posix_spawn sh -c true)
local B = dofile((arg[0]:match("^(.*)/") or ".") .. "/common.lua")
local n = tonumber(arg[1]) or 500
local mode = arg[2] or "args"
local sb <close> = sbx.sandbox("local")
local fn
if mode == "args" then
  fn = function() local r = sb:execute_command("true", {}); assert(r.exit_code == 0) end
else
  fn = function() local r = sb:execute_command("true"); assert(r.exit_code == 0) end
end
B.report(B.time(n, 20, fn))
