-- examples/eval.lua: an eval over N tasks, each in a fresh sandbox, run
-- concurrently with sbx.parallel. Usage: sbxlua examples/eval.lua [N] [backend]
local n = tonumber(arg[1]) or 20
local backend = arg[2]            -- nil: routed (local unless told otherwise)

-- Each task: a small program and the answer it should print.
local tasks = {}
for i = 1, n do
  tasks[i] = { code = ("print(sum(x * x for x in range(%d)))"):format(i),
               want = tostring((i - 1) * i * (2 * i - 1) // 6) }
end

local t0 = require("sbx.loop").now()
local results, errors = sbx.parallel(tasks, function(task)
  local sb <close> = sbx.sandbox(backend, { timeout_secs = 120 })
  local r = sb:execute_code(task.code, { timeout = 30 })
  return { ok = r.exit_code == 0 and r.stdout:gsub("%s+$", "") == task.want,
           got = r.stdout:gsub("%s+$", ""), ms = r.duration_ms }
end, { concurrency = 8, collect_errors = true })

local passed = 0
for i = 1, n do
  local r = results[i]
  if r and r.ok then passed = passed + 1
  else print(("task %d failed: %s"):format(i, r and ("got " .. r.got) or tostring(errors[i]))) end
end
print(("%d/%d tasks passed in %.2f s"):format(passed, n, require("sbx.loop").now() - t0))
os.exit(passed == n and 0 or 1)
