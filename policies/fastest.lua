-- fastest: lowest live create + first-exec latency first (p50, plus a quarter
-- of the p50-p95 spread); backends with no samples yet go after the measured ones.
local function score(c)
  local s = c.stats or {}
  if not s.p50_create_ms then return math.huge end
  local tail = (s.p95_create_ms or s.p50_create_ms) - s.p50_create_ms
  return s.p50_create_ms + (s.p50_exec_ms or 0) + tail / 4
end

return {
  name = "fastest",
  route = function(req, candidates, stats, now)
    local scores = {}
    for _, c in ipairs(candidates) do scores[c] = score(c) end
    table.sort(candidates, function(a, b)
      if scores[a] ~= scores[b] then return scores[a] < scores[b] end
      return a.index < b.index
    end)
    return { order = candidates, reason = "lowest p50 create + exec latency first" }
  end,
}
