-- default: OpenRouter-like. Drop backends that failed recently, prefer the
-- cheapest healthy one (then the configured order), and keep the unhealthy
-- ones as fallbacks at the end.
local function unhealthy(c)
  local s = c.stats or {}
  return (s.samples or 0) >= 3 and (s.error_rate or 0) >= 0.5
end

local function cheaper(a, b)
  if a.price_per_hour ~= b.price_per_hour then return a.price_per_hour < b.price_per_hour end
  return a.index < b.index
end

return {
  name = "default",
  route = function(req, candidates, stats, now)
    local healthy, sick = {}, 0
    for _, c in ipairs(candidates) do
      if unhealthy(c) then sick = sick + 1 else healthy[#healthy + 1] = c end
    end
    table.sort(healthy, cheaper)
    if sick > 0 then      -- the failing ones last, in the configured order
      for _, c in ipairs(candidates) do
        if unhealthy(c) then healthy[#healthy + 1] = c end
      end
    end
    return { order = healthy,
             reason = sick > 0 and "cheapest healthy first; recently failing last" or "cheapest first" }
  end,
}
