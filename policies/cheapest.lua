-- cheapest: lowest price for the request's resources first (ties: configured order).
return {
  name = "cheapest",
  route = function(req, candidates, stats, now)
    table.sort(candidates, function(a, b)
      if a.price_per_hour ~= b.price_per_hour then return a.price_per_hour < b.price_per_hour end
      return a.index < b.index
    end)
    return { order = candidates, reason = "lowest price first" }
  end,
}
