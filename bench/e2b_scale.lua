-- bench/e2b_scale.lua: one sbxlua process creates N sandboxes on the E2B
-- stand-in's --scale mode (no process behind them; a create rate limit of
-- RATE/s, 429 with Retry-After past it), runs a command in each and destroys
-- them all, C at a time. Prints wall time against the rate limit's floor
-- (N / RATE), peak RSS per live sandbox, the most fds open, and what is left
-- on the stand-in. Run from the source tree:
--   SBX_STATE_DIR=/tmp/e2bscale build/sbxlua bench/e2b_scale.lua [N] [RATE] [C] [HOLD]
package.path = "./?.lua;./?/init.lua;" .. package.path
local loop = require "sbx.loop"
local R = require "spec.support.standin.e2b_run"
local N, RATE, C = tonumber(arg[1] or 5000), tonumber(arg[2] or 500), tonumber(arg[3] or 200)

local function status(key)
  for line in io.lines("/proc/self/status") do
    local v = line:match("^" .. key .. ":%s+(%d+)") if v then return tonumber(v) end
  end
end
local function fds() local n = 0 for _ in io.popen("ls /proc/" .. require("sbx.proc").getpid() .. "/fd"):lines() do n = n + 1 end return n end

local s = R.start{ scale = true, rate = RATE }
R.use(s, { max_creates_per_sec = RATE })
collectgarbage() collectgarbage()
local base_rss, base_fds = status("VmRSS"), fds()
local live, peak_live, peak_rss, peak_fds, failed = 0, 0, base_rss, base_fds, 0
local sampler = loop.spawn(function()
  while true do
    loop.sleep(0.25)
    local r = status("VmRSS")
    if r > peak_rss then peak_rss = r end
    if live > peak_live then peak_live = live end
    local f = fds() if f > peak_fds then peak_fds = f end
  end
end)
local jobs = {}
for i = 1, N do jobs[i] = i end
local t0 = loop.now()
local ok = sbx.parallel(jobs, function(i)
  local sb <close> = sbx.sandbox("e2b")
  live = live + 1
  local r = sb:execute_command("echo", { "n" .. i })
  if r.stdout ~= "n" .. i .. "\n" then failed = failed + 1 end
  live = live - 1
  return true
end, { concurrency = C })
local wall = loop.now() - t0
sampler:cancel()
-- RSS per live sandbox, measured still: HOLD sandboxes alive at once, after a full GC
local HOLD = tonumber(arg[4] or 1000)
collectgarbage() collectgarbage()
local before_hold, held = status("VmRSS"), {}
local hjobs = {}
for i = 1, HOLD do hjobs[i] = i end
sbx.parallel(hjobs, function(i) held[i] = sbx.sandbox("e2b") end, { concurrency = C })
collectgarbage() collectgarbage()
local hold_rss, hold_fds = status("VmRSS"), fds()
sbx.parallel(hjobs, function(i) held[i]:destroy() held[i] = nil end, { concurrency = C })
local st = s:stats()
s:stop()
local floor = N / RATE
print(string.format("e2b scale: %d creates+exec+destroy, rate %d/s, %d at a time", N, RATE, C))
print(string.format("wall %.2f s, floor %.2f s, ratio %.3f", wall, floor, wall / floor))
print(string.format("peak RSS %d KiB over a base of %d KiB with %d live: %.1f KiB per live sandbox",
  peak_rss - base_rss, base_rss, peak_live, (peak_rss - base_rss) / math.max(1, peak_live)))
print(string.format("held %d live at once: RSS +%d KiB after GC, %.1f KiB per live sandbox; fds %d",
  HOLD, hold_rss - before_hold, (hold_rss - before_hold) / HOLD, hold_fds))
print(string.format("fds: base %d, peak %d", base_fds, peak_fds))
print(string.format("stand-in: created %d, 429s %d, live at the end %d; wrong outputs %d, jobs %d",
  st.created, st.limited, st.live, failed, #ok))
