-- local-first: fill this machine's backends (local, bwrap, docker) first,
-- then spill to the rest, cheapest first. Backends at max_concurrent are
-- already filtered out, so a full docker spills to the next one.
local HOST = { ["local"] = 1, bwrap = 2, docker = 3 }

return {
  name = "local-first",
  route = function(req, candidates, stats, now)
    table.sort(candidates, function(a, b)
      local ha, hb = HOST[a.name] or 99, HOST[b.name] or 99
      if ha ~= hb then return ha < hb end
      if a.price_per_hour ~= b.price_per_hour then return a.price_per_hour < b.price_per_hour end
      return a.index < b.index
    end)
    return { order = candidates, reason = "this machine first, then the cheapest remote" }
  end,
}
