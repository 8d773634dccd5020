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
row("raw", "create+destroy", C.time(N, 3, function() raw_destroy(raw_create()) end))
local sb = raw_create()
local EH = { ["e2b-sandbox-id"] = sb.sandboxID, ["e2b-sandbox-port"] = "49983", ["x-access-token"] = sb.envdAccessToken }
local function h(extra) local t = {} for k, v in pairs(EH) do t[k] = v end for k, v in pairs(extra) do t[k] = v end return t end
local body = json.encode{ process = { cmd = "true", args = {} }, stdin = false }
local env = string.pack(">B I4", 0, #body) .. body
row("raw", "exec", C.time(N, 3, function()
  local r = assert(http.request{ method = "POST", url = URL .. "/process.Process/Start", body = env, stream = true,
    headers = h{ ["content-type"] = "application/connect+json", ["connect-protocol-version"] = "1" } })
  while r:read() do end
end))
local KB = string.rep("x", 1024)
row("raw", "write+read", C.time(N, 3, function()
  assert(assert(http.request{ method = "POST", url = URL .. "/files?path=/home/user/f", body = KB,
    headers = h{ ["content-type"] = "application/octet-stream" } }).status == 200)
  assert(#assert(http.request{ method = "GET", url = URL .. "/files?path=/home/user/f", headers = h{} }).body == 1024)
end))
raw_destroy(sb)

-- sbxlua
row("sbxlua", "create+destroy", C.time(N, 3, function() sbx.sandbox("e2b"):destroy() end))
local s <close> = sbx.sandbox("e2b")
row("sbxlua", "exec", C.time(N, 3, function() s:execute_command("true", {}) end))
row("sbxlua", "write+read", C.time(N, 3, function() s:write_file("f", KB) assert(#s:read_file("f") == 1024) end))
