-- bench/tensorlake_bench.lua N_CREATE N_EXEC N_RW: on the Tensorlake stand-in
-- ($TENSORLAKE_API_URL), the p50 of create+destroy, execute_command("true", {})
-- and write_file+read_file of 1 KiB, through sbxlua's provider and as the raw
-- HTTP exchanges the operation needs at least (sbx.http, one call after
-- another: POST /sandboxes, GET until running, DELETE; POST
-- /api/v1/processes/run to its exit event; PUT + GET /api/v1/files),
-- interleaved in rounds so both see the same load. Prints one JSON line.
local loop, http, json = require "sbx.loop", require "sbx.http", require "cjson"
local NC, NE, NR = tonumber(arg[1] or 10), tonumber(arg[2] or 50), tonumber(arg[3] or 100)
local URL, KEY = assert(os.getenv("TENSORLAKE_API_URL")), assert(os.getenv("TENSORLAKE_API_KEY"))
local AUTH = "Bearer " .. KEY
local DATA = string.rep("x", 1024)

local function p50(t) table.sort(t) return t[(#t + 1) // 2] * 1000 end
local function timed(t, fn) local a = loop.now() fn() t[#t + 1] = loop.now() - a end
local function req(o)
  local res = assert(http.request(o))
  assert(res.status < 300, res.status .. " " .. o.url .. " " .. tostring(res.body))
  return res
end

local raw = {}
function raw.create()
  local res = req{ method = "POST", url = URL .. "/sandboxes", headers = { authorization = AUTH, ["content-type"] = "application/json" },
                   body = json.encode{ resources = { cpus = 1, memory_mb = 1024 }, timeout_secs = 600 } }
  local id = json.decode(res.body).sandbox_id
  local pause = 0.05
  while true do
    local info = json.decode(req{ url = URL .. "/sandboxes/" .. id, headers = { authorization = AUTH } }.body)
    if info.status == "running" and type(info.sandbox_url) == "string" then break end
    loop.sleep(pause)
    pause = math.min(pause * 2, 1)
  end
  req{ method = "DELETE", url = URL .. "/sandboxes/" .. id, headers = { authorization = AUTH } }
end

local function data_headers(st)
  return { authorization = AUTH, ["x-tensorlake-sandbox-id"] = st.sandbox_id, host = st.sandbox_id .. ".local" }
end
function raw.exec(st)
  local h = data_headers(st)
  h.accept, h["content-type"] = "text/event-stream", "application/json"
  local res = req{ method = "POST", url = st.sandbox_url .. "/api/v1/processes/run", headers = h, body = '{"command":"true"}' }
  assert(res.body:find('"exit_code":0', 1, true), res.body)
end
function raw.rw(st)
  local h = data_headers(st)
  req{ method = "PUT", url = st.sandbox_url .. "/api/v1/files?path=/workspace/raw.txt", headers = h, body = DATA }
  assert(req{ url = st.sandbox_url .. "/api/v1/files?path=/workspace/raw.txt", headers = h }.body == DATA)
end

local out = { raw = {}, sbx = {} }
local rc, sc, re, se, rr, sr = {}, {}, {}, {}, {}, {}
for _ = 1, NC do
  timed(rc, raw.create)
  timed(sc, function() local sb = sbx.sandbox("tensorlake") sb:destroy() end)
end
local sb <close> = sbx.sandbox("tensorlake")
local st = sb:session_state().state
for _ = 1, 3 do raw.exec(st) sb:execute_command("true", {}) end         -- warm-up
for _ = 1, NE do
  timed(re, function() raw.exec(st) end)
  timed(se, function() assert(sb:execute_command("true", {}).exit_code == 0) end)
end
for _ = 1, NR do
  timed(rr, function() raw.rw(st) end)
  timed(sr, function() sb:write_file("sbx.txt", DATA) assert(sb:read_file("sbx.txt") == DATA) end)
end
out.raw = { create = p50(rc), exec = p50(re), rw = p50(rr) }
out.sbx = { create = p50(sc), exec = p50(se), rw = p50(sr) }
print(json.encode(out))
