-- bench/e2b_bench.lua URL KEY N: on an E2B stand-in already running at URL,
-- ms per operation for (a) the raw HTTP exchange (sbx.http alone: the
-- requests providers/e2b.lua makes, no provider or facade) and (b) sbxlua
-- (sbx.sandbox("e2b") ...): create+destroy, exec of `true`, write+read of
-- 1 KiB. One line per row: "raw|sbxlua op p50 mean".
package.path = "./?.lua;./?/init.lua;" .. package.path
local http = require "sbx.http"
local json = require "cjson"
local C = dofile("bench/common.lua")
local URL, KEY, N = arg[1], arg[2], tonumber(arg[3] or 50)
local CP = { ["x-api-key"] = KEY, ["content-type"] = "application/json" }

local function row(who, op, t)
  local s = C.stats(t)
  print(string.format("%s %s %.3f %.3f", who, op, s.p50, s.mean))
end

-- raw
local function raw_create()
  local r = assert(http.request{ method = "POST", url = URL .. "/sandboxes", headers = CP,
    body = json.encode{ templateID = "base", timeout = 300, secure = true } })
  assert(r.status == 201, r.body)
  return json.decode(r.body)
end
local function raw_destroy(sb)
  assert(assert(http.request{ method = "DELETE", url = URL .. "/sandboxes/" .. sb.sandboxID, headers = CP }).status == 204)
end
-- each raw exchange interleaved with sbxlua's operation, so both see the same
-- load; `also` (create): the raw exchange of sbxlua's three calls, its row "raw3"
local function pair(op, ours, raw, also)
  for _ = 1, 3 do ours() raw() if also then also() end end
  local a, b, c = {}, {}, {}
  for i = 1, N do
    local t0 = C.now() ours() a[i] = (C.now() - t0) * 1e3
    t0 = C.now() raw() b[i] = (C.now() - t0) * 1e3
    if also then t0 = C.now() also() c[i] = (C.now() - t0) * 1e3 end
  end
  row("raw", op, b)
  row("sbxlua", op, a)
  if also then row("raw3", op, c) end
end
local function start(sb, cmd, args)
  local eh = { ["e2b-sandbox-id"] = sb.sandboxID, ["e2b-sandbox-port"] = "49983", ["x-access-token"] = sb.envdAccessToken,
               ["content-type"] = "application/connect+json", ["connect-protocol-version"] = "1" }
  local b = json.encode{ process = { cmd = cmd, args = args, cwd = "/" }, stdin = false }
  local r = assert(http.request{ method = "POST", url = URL .. "/process.Process/Start", stream = true,
    body = string.pack(">B I4", 0, #b) .. b, headers = eh })
  while r:read() do end
end
pair("create+destroy", function() sbx.sandbox("e2b"):destroy() end, function() raw_destroy(raw_create()) end,
  function()   -- POST, the working directory's mkdir (the same sh line), DELETE
    local sb = raw_create()
    start(sb, "sh", { "-c", 'mkdir -p "$1" 2>/dev/null || { sudo mkdir -p "$1" && sudo chown "$(id -u):$(id -g)" "$1"; }',
                      "sh", "/workspace" })
    raw_destroy(sb)
  end)
local sb = raw_create()
local s <close> = sbx.sandbox("e2b")
pair("exec", function() s:execute_command("true", {}) end, function() start(sb, "true", {}) end)
local EH = { ["e2b-sandbox-id"] = sb.sandboxID, ["e2b-sandbox-port"] = "49983", ["x-access-token"] = sb.envdAccessToken }
local function h(extra) local t = {} for k, v in pairs(EH) do t[k] = v end for k, v in pairs(extra) do t[k] = v end return t end
local KB = string.rep("x", 1024)
pair("write+read", function() s:write_file("f", KB) assert(#s:read_file("f") == 1024) end, function()
  assert(assert(http.request{ method = "POST", url = URL .. "/files?path=/home/user/f", body = KB,
    headers = h{ ["content-type"] = "application/octet-stream" } }).status == 200)
  assert(#assert(http.request{ method = "GET", url = URL .. "/files?path=/home/user/f", headers = h{} }).body == 1024)
end)
raw_destroy(sb)
