-- Shared helpers for the bench jobs (loaded with dofile from each job).
local M = {}
M.now = require("sbx.loop").now

-- Percentile (nearest rank) of an unsorted list of numbers; sorts a copy.
function M.stats(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  local n, sum = #s, 0
  for _, v in ipairs(s) do sum = sum + v end
  local function pct(p)
    local i = math.max(1, math.min(n, math.floor(p * n + 0.5)))
    return s[i]
  end
  return { p50 = pct(.5), p90 = pct(.9), mean = sum / n, min = s[1], n = n }
end

-- One machine-readable line, same shape as floor_spawn's output.
function M.report(t)
  local s = M.stats(t)
  print(string.format("p50 %.4f p90 %.4f mean %.4f min %.4f n %d", s.p50, s.p90, s.mean, s.min, s.n))
end

-- Time fn() n times after `warm` warm-up calls; returns a list of ms.
function M.time(n, warm, fn)
  for _ = 1, warm do fn() end
  local t = {}
  for i = 1, n do
    local t0 = M.now()
    fn()
    t[i] = (M.now() - t0) * 1e3
  end
  return t
end

return M
