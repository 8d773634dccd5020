-- bench/daytona_bench.lua: sbxlua's daytona provider against the stand-in
-- whose URL and key are in $DAYTONA_API_URL / $DAYTONA_API_KEY (bench/daytona.sh).
--   sbxlua bench/daytona_bench.lua N_CREATE N_EXEC N_RW
-- One line per measurement: "<what> p50 <ms> p90 <ms> n <n>", plus the raw
-- HTTP round trips the stand-in answers (libcurl from Lua, no provider).
local C = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/common.lua")
local http = require "sbx.http"
local json = require "cjson"
local n_create, n_exec, n_rw = tonumber(arg[1] or "10"), tonumber(arg[2] or "50"), tonumber(arg[3] or "50")

local function line(what, t)
  local s = C.stats(t)
  print(string.format("%s p50 %.3f p90 %.3f n %d", what, s.p50, s.p90, s.n))
  io.stdout:flush()
end

local url, key = os.getenv("DAYTONA_API_URL"), os.getenv("DAYTONA_API_KEY")
local h = { authorization = "Bearer " .. key, ["content-type"] = "application/json" }

local function pair(n, ours, raw, warm)
  for _ = 1, warm or 3 do ours() raw() end
  local a, b = {}, {}
  for i = 1, n do
    local t0 = C.now() ours() a[i] = (C.now() - t0) * 1e3
    t0 = C.now() raw() b[i] = (C.now() - t0) * 1e3
  end
  return a, b
end

-- The raw exchange of a create+destroy as sbxlua makes it: POST /sandbox,
-- GET /sandbox/{id} on sbxlua's schedule (50 ms, then 1.5x longer each)
-- until started, GET user-home-dir, DELETE.
local nraw = 0
local function raw_create()
  nraw = nraw + 1
  local r = assert(http.request{ method = "POST", url = url .. "/sandbox", headers = h,
    body = json.encode{ name = "bench-raw-" .. nraw .. "-" .. require("sbx.proc").getpid(),
                        labels = { bench = "raw" }, autoStopInterval = 0 } })
  assert(r.status == 200, r.body)
  local v, wait = json.decode(r.body), 0.05
  while v.state ~= "started" do
    assert(v.state ~= "error", v.errorReason)
    sbx.sleep(wait)
    wait = math.min(wait * 1.5, 1)
    v = json.decode(assert(http.request{ url = url .. "/sandbox/" .. v.id, headers = h }).body)
  end
  assert(assert(http.request{ url = v.toolboxProxyUrl .. "/" .. v.id .. "/user-home-dir", headers = h }).status == 200)
  assert(assert(http.request{ method = "DELETE", url = url .. "/sandbox/" .. v.id, headers = h }).status < 300)
end

local cr, rcr = pair(n_create, function()
  local sb = sbx.sandbox("daytona")
  sb:destroy()
end, raw_create, 1)
line("create+destroy", cr)

local sb <close> = sbx.sandbox("daytona")
assert(sb:execute_command("true", {}).exit_code == 0)   -- uploads the agent, opens the session
local blob = string.rep("x", 1024)
local st = sb:session_state().state
local tb = url .. "/toolbox/" .. st.sid

-- The raw exchanges under those operations (libcurl from Lua, no provider),
-- each interleaved with sbxlua's operation in the same loop so that both
-- see the same load: sbxlua's own cost is the difference.
-- The same exchange as sbxlua's exec: one session exec of the agent line
-- sbxlua sends (pid file slot, cwd, the default timeout).
assert(http.request{ method = "POST", url = tb .. "/process/session", headers = h,
                     body = json.encode{ sessionId = "bench-raw" } })
local agent_line = "env -i 'PATH=/usr/local/bin:/usr/bin:/bin' '" .. st.agent .. "' run --pidfile '"
                   .. st.agent:match("^(.*)/[^/]*$") .. "/slot-99.pid' --cwd '" .. sb.workdir .. "' --timeout 600.000 -- 'true'"
local function raw_exec()
  local r = assert(http.request{ method = "POST", url = tb .. "/process/session/bench-raw/exec", headers = h,
                                 body = json.encode{ command = agent_line, runAsync = false } })
  assert(r.status == 200, r.body)
end
local function raw_rw()
  local body = "--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"r.txt\"\r\n\r\n" .. blob .. "\r\n--b--\r\n"
  local up = assert(http.request{ method = "POST", url = tb .. "/files/upload-v2?path=" .. http.escape(sb.workdir .. "/r.txt"),
                                  headers = { authorization = h.authorization, ["content-type"] = "multipart/form-data; boundary=b" },
                                  body = body })
  assert(up.status == 200, up.body)
  assert(assert(http.request{ url = tb .. "/files/download?path=" .. http.escape(sb.workdir .. "/r.txt"), headers = h }).body == blob)
end

local ex, rex = pair(n_exec, function()
  local r = sb:execute_command("true", {})
  assert(r.exit_code == 0)
end, raw_exec)
line("exec true", ex)
local rw, rrw = pair(n_rw, function()
  sb:write_file("bench.txt", blob)
  assert(sb:read_file("bench.txt") == blob)
end, raw_rw)
line("write+read 1KiB", rw)

line("raw GET /sandbox/{id}", C.time(n_exec, 3, function()
  assert(assert(http.request{ url = url .. "/sandbox/" .. st.sid, headers = h }).status == 200)
end))
line("raw GET files/download 1KiB", C.time(n_exec, 3, function()
  assert(assert(http.request{ url = tb .. "/files/download?path=" .. http.escape(sb.workdir .. "/bench.txt"),
                              headers = h }).status == 200)
end))
line("raw POST process/execute true", C.time(n_exec, 3, function()
  assert(assert(http.request{ method = "POST", url = tb .. "/process/execute", headers = h,
                              body = json.encode{ command = "true" } }).status == 200)
end))
line("raw create+destroy (sbxlua's polls)", rcr)
line("raw POST session exec (agent) true", rex)
line("raw upload-v2 + download 1KiB", rrw)
