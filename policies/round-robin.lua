-- round-robin: rotate the first choice over the candidates, one step per decision.
local turn = 0

return {
  name = "round-robin",
  route = function(req, candidates, stats, now)
    table.sort(candidates, function(a, b) return a.name < b.name end)
    local n = #candidates
    turn = turn + 1
    local order = {}
    for i = 0, n - 1 do order[#order + 1] = candidates[(turn + i - 1) % n + 1].name end
    return { order = order, reason = "turn " .. turn }
  end,
}
