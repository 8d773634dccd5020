-- Warm pools: pool:acquire() while the pool is warm vs sbx.sandbox() create,
-- p50 on local and (when the engine and the image are there) docker.
--   build/sbxlua bench/pool.lua [N]        N acquires and N creates per backend (default 30)
-- Each acquire is timed after pool:wait_ready(), so it measures "a ready
-- sandbox at once"; an acquire that has to wait for a create is not this row.
local C = dofile((arg[0]:match("^(.*)/") or ".") .. "/common.lua")

local N = tonumber(arg and arg[1]) or 30
local IMAGE = os.getenv("SBX_TEST_IMAGE") or "sbxlua-test:bookworm"

local function bench(backend, opts)
  local pool_opts = { backend = backend, size = 4 }
  for k, v in pairs(opts) do pool_opts[k] = v end
  local pool <close> = sbx.pool(pool_opts)
  assert(pool:wait_ready(300), "the pool did not fill")
  local warm, cold = {}, {}
  for i = 1, N do
    assert(pool:wait_ready(300))
    local t0 = C.now()
    local sb = pool:acquire()
    warm[i] = (C.now() - t0) * 1e3
    pool:release(sb)
  end
  for i = 1, N do
    local t0 = C.now()
    local sb = sbx.sandbox(backend, opts)
    cold[i] = (C.now() - t0) * 1e3
    sb:destroy()
  end
  local w, c = C.stats(warm), C.stats(cold)
  print(string.format("%-7s pool:acquire() p50 %8.4f ms  p90 %8.4f ms | sbx.sandbox() p50 %8.2f ms  p90 %8.2f ms | %.0fx",
                      backend, w.p50, w.p90, c.p50, c.p90, c.p50 / w.p50))
end

print(string.format("warm pool (size 4) acquire vs create, n = %d each (%s)", N, _VERSION))
bench("local", {})
local docker = require "sbx.providers.builtin.docker"
local ok, why = docker.available()
if ok then
  local f = io.popen("docker image inspect " .. IMAGE .. " >/dev/null 2>&1 && echo y")
  if f:read("a") ~= "y\n" then ok, why = false, "image " .. IMAGE .. " missing (images/test/build.sh)" end
  f:close()
end
if ok then bench("docker", { image = IMAGE }) else print("docker  skipped: " .. tostring(why)) end
