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

-- The Ray floor (bench/ray_bench.lua, bench/ray_peer.lua): submit a job
-- whose entrypoint dials a listener, timed until the dial arrives (ms);
-- the job is deleted after. Needs SBX_RAY_ADDRESS and RAY_AUTH_TOKEN.
function M.ray_floor()
  local http, stream, json = require "sbx.http", require "sbx.stream", require "cjson"
  local addr = os.getenv("SBX_RAY_ADDRESS")
  local H = { authorization = "Bearer " .. os.getenv("RAY_AUTH_TOKEN"), ["content-type"] = "application/json" }
  local l, port = assert(stream.listen{ host = "127.0.0.1", port = 0 })
  local sid = "sbxbench-floor-" .. require("sbx.proc").random_hex(8)
  local t0 = M.now()
  local res = assert(http.request{ method = "POST", url = addr .. "/api/jobs/", headers = H, body = json.encode{
    entrypoint = "exec python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", " .. port .. ")).recv(1)'",
    submission_id = sid, entrypoint_num_cpus = 0.25 } })
  assert(res.status == 200, res.body)
  local s = assert(l:accept(120))
  local ms = (M.now() - t0) * 1000
  s:close() l:close()
  for _ = 1, 100 do
    local j = json.decode(http.request{ url = addr .. "/api/jobs/" .. sid, headers = H }.body)
    if j.status == "SUCCEEDED" or j.status == "FAILED" or j.status == "STOPPED" then break end
    sbx.sleep(0.1)
  end
  sbx.sleep(2)
  http.request{ method = "DELETE", url = addr .. "/api/jobs/" .. sid, headers = H }
  return ms
end

return M
