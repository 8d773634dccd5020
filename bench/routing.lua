-- Routing decision cost: the hard filter + a built-in policy over 10 providers
-- (fakes registered like a spec's, with live stats), p50/p99 over many runs.
--   build/sbxlua bench/routing.lua [iterations]
local providers = require "sbx.providers"
local health = require "sbx.routing.health"
local router = require "sbx.routing"
local loop = require "sbx.loop"

local N = tonumber(arg and arg[1]) or 5000
local names = {}
for i = 1, 10 do
  local name = string.format("p%02d", i)
  names[i] = name
  providers.register(name, {
    descriptor = { name = name, isolation = i % 2 == 0 and "microvm" or "container",
                   capabilities = { "exec", "files", i % 3 == 0 and "gpu" or "snapshot" },
                   options = { image = true, cpu = true, memory_mb = true },
                   price = { per_vcpu_hour = 0.01 * i, per_gib_hour = 0.002 * i }, regions = {} },
    available = function() return true end,
  })
  for k = 1, 50 do health.record_create(name, 100 + (k * 7 + i * 13) % 400, k % 10 ~= 0, "retryable") end
  for k = 1, 50 do health.record_exec(name, 5 + k % 20) end
end

local function run(label, req)
  for _ = 1, 200 do router.decide(req) end          -- warm up (policy states, caches)
  collectgarbage()                                   -- start from a collected heap
  local t = {}
  for i = 1, N do
    local t0 = loop.now()
    local d = router.decide(req)
    t[i] = (loop.now() - t0) * 1e6
    assert(#d.order > 0)
  end
  table.sort(t)
  local p50, p99 = t[math.ceil(N * 0.5)], t[math.ceil(N * 0.99)]
  print(string.format("%-42s p50 %6.1f us %-4s  p99 %7.1f us %s", label, p50,
                      p50 < 50 and "PASS" or "MISS", p99, p99 < 50 and "PASS" or "MISS"))
  return p50, p99
end

print(string.format("routing decision over 10 providers, %d runs each (%s); target < 50 us", N, _VERSION))
run("default policy", { only = names, needs = { "exec" }, cpu = 2, memory_mb = 2048 })
run("cheapest policy", { only = names, policy = "cheapest", cpu = 2 })
run("fastest policy", { only = names, policy = "fastest" })
run("local-first policy", { only = names, policy = "local-first" })
run("round-robin policy", { only = names, policy = "round-robin" })
run("function policy (in the job's own state)", { only = names,
  policy = function(_, c) table.sort(c, function(a, b) return a.price_per_hour < b.price_per_hour end)
                          return { order = c } end })
do  -- a user policy file: compiled in its own capped state, values copied across
  local dir = os.getenv("TMPDIR") or "/tmp"
  local path = dir .. "/sbxlua-bench-policy.lua"
  local f = assert(io.open(path, "w"))
  f:write(require("sbx.script").builtin("policies/cheapest"))
  f:close()
  run("user policy file (own capped state)", { only = names, policy = path })
  os.remove(path)
end
