--- `sbxlua dashboard`: a local web page served by sbxlua itself, on
--- 127.0.0.1 by default: live sandboxes, spend over time, routing decisions,
--- provider health (lua/sbx/cli/dashboard/data.lua), as HTML and as JSON under
--- /api/. Read-only unless started with --allow-actions, and then an action
--- (POST /api/gc) needs the token printed at start.
---
--- One task accepts; one task per connection reads a request head (parsed
--- in C: sbx.httpreq, bounded), answers it and closes (Connection: close).
local loop = require "sbx.loop"
local stream = require "sbx.stream"
local httpreq = require "sbx.httpreq"
local proc = require "sbx.proc"
local data = require "sbx.cli.dashboard.data"
local page = require "sbx.cli.dashboard.page"

local M = {}

M.READ_TIMEOUT = 10     -- seconds a client has to send its request head
M.MAX_CONNECTIONS = 32  -- connections served at once; more get 503
M.AVAIL_TTL = 5         -- seconds a provider availability answer is reused

local STATUS = { [200] = "OK", [400] = "Bad Request", [403] = "Forbidden", [404] = "Not Found",
                 [405] = "Method Not Allowed", [409] = "Conflict", [413] = "Payload Too Large",
                 [431] = "Request Header Fields Too Large", [500] = "Internal Server Error",
                 [503] = "Service Unavailable" }

local function complain(...) io.stderr:write("sbxlua: ", ...) io.stderr:write("\n") end

local function respond(c, status, ctype, body, extra, head_only)
  local h = { string.format("HTTP/1.1 %d %s", status, STATUS[status] or "Error"),
              "Content-Type: " .. ctype, "Content-Length: " .. #body, "Connection: close",
              "Cache-Control: no-store", "X-Content-Type-Options: nosniff",
              "Referrer-Policy: no-referrer",
              "Content-Security-Policy: default-src 'self'; script-src 'self'; style-src 'self'; "
                .. "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'" }
  for _, line in ipairs(extra or {}) do h[#h + 1] = line end
  c:write(table.concat(h, "\r\n") .. "\r\n\r\n" .. (head_only and "" or body))
end

local function json_error(c, status, msg, extra)
  respond(c, status, "application/json", data.encode{ error = msg }, extra)
end

-- Tokens compared in time that does not depend on where they differ.
local function same_token(a, b)
  if type(a) ~= "string" or type(b) ~= "string" or #a ~= #b then return false end
  local diff = 0
  for i = 1, #a do diff = diff | (a:byte(i) ~ b:byte(i)) end
  return diff == 0
end

-- Provider availability, asked at most every AVAIL_TTL seconds.
local function availability(srv)
  local now = loop.now()
  if not srv.avail or now - srv.avail_t >= M.AVAIL_TTL then
    local out = {}
    for name, d in pairs(require("sbx.providers").describe()) do
      if d.isolation then out[name] = { available = d.available, reason = d.reason } end
    end
    srv.avail, srv.avail_t = out, now
  end
  return srv.avail
end

local function summary_of(srv, q)
  local since = q.since and require("sbx.routing.meter").since(q.since) or nil
  local bucket = math.tointeger(tonumber(q.bucket or "")) or nil
  if bucket and (bucket < 60 or bucket > 30 * 86400) then bucket = nil end
  local limit = math.tointeger(tonumber(q.limit or "")) or 50
  return data.summary{ since = since, bucket = bucket, limit = math.max(1, math.min(limit, 1000)),
                       available = availability(srv), actions = srv.token ~= nil }
end

local API = {
  ["/api/summary"] = function(srv, q) return summary_of(srv, q) end,
  ["/api/sandboxes"] = function() return data.sandboxes(os.time()) end,
  ["/api/spend"] = function(srv, q) return summary_of(srv, q).spend end,
  ["/api/decisions"] = function(srv, q) return summary_of(srv, q).decisions end,
  ["/api/health"] = function(srv) return data.health(os.time(), nil, availability(srv)) end,
}

-- POST /api/gc: what `sbxlua gc` does (its report comes back as text).
local function action_gc(srv, c, req)
  if not srv.token then
    return json_error(c, 403, "actions are off: start sbxlua dashboard --allow-actions")
  end
  if not same_token(req.headers["x-sbx-token"], srv.token) then
    return json_error(c, 403, "this action needs the dashboard's token (X-Sbx-Token)")
  end
  local origin = req.headers.origin
  if origin and not srv.hosts[origin:gsub("^https?://", "")] then
    return json_error(c, 403, "cross-origin request refused")
  end
  if srv.gc_running then return json_error(c, 503, "a gc started from this page is still running") end
  -- gc reports on io.stdout: captured for the response
  local tmp, saved = io.tmpfile(), io.stdout
  srv.gc_running = true
  io.stdout = tmp
  local ok, code = pcall(require("sbx.state.gc").run, { all_sessions = false })
  io.stdout = saved
  srv.gc_running = false
  tmp:seek("set")
  local report = tmp:read("a") or ""
  tmp:close()
  if not ok then return json_error(c, 500, tostring(code)) end
  respond(c, 200, "application/json", data.encode{ exit_code = code, report = report })
end

local function route(srv, c, req)
  local host = req.headers.host
  if not host or not srv.hosts[host] then
    return json_error(c, 403, "unexpected Host header (the dashboard answers " .. srv.url .. " only)")
  end
  local head_only = req.method == "HEAD"
  if req.method == "POST" then
    if req.path == "/api/gc" then return action_gc(srv, c, req) end
    return json_error(c, 405, "only GET here", { "Allow: GET, HEAD" })
  end
  if req.method ~= "GET" and not head_only then
    return json_error(c, 405, "only GET, HEAD (and POST for actions)", { "Allow: GET, HEAD, POST" })
  end
  local asset = page.assets[req.path]
  if asset then
    local body = asset.body
    if asset.body:find("@DATA@", 1, true) then
      body = body:gsub("@DATA@", function()   -- the first render needs no request
        return (data.encode(summary_of(srv, req.query)):gsub("</", "<\\/"))
      end)
    end
    return respond(c, 200, asset.type, body, nil, head_only)
  end
  local api = API[req.path]
  if not api then return json_error(c, 404, "no such page: " .. req.path) end
  local ok, v = pcall(api, srv, req.query)
  if not ok then
    local status = type(v) == "table" and v.kind == "ConfigError" and 400 or 500
    return json_error(c, status, type(v) == "table" and tostring(v.message) or tostring(v))
  end
  respond(c, 200, "application/json", data.encode(v), nil, head_only)
end

-- One connection: read a head (bounded, timed), answer, close.
local function serve(srv, c)
  local buf = ""
  local ok, err = pcall(function()
    while true do
      local req, a, code = httpreq.parse(buf)
      if req then
        local len = tonumber(req.headers["content-length"] or "0")
        if req.headers["transfer-encoding"] or not len or len > 0 then
          return json_error(c, 413, "request bodies are not accepted")
        end
        return route(srv, c, req)
      end
      if a then
        return json_error(c, code == "E2BIG" and 431 or 400, a)
      end
      local chunk = c:read(M.READ_TIMEOUT)
      if not chunk then return end          -- closed or timed out: nothing to answer
      buf = buf .. chunk
    end
  end)
  if not ok and not require("sbx.core.errors").is(err, "Cancelled") then
    complain("dashboard: ", tostring(err))
  end
  c:close()
  srv.active = srv.active - 1
  if not ok and require("sbx.core.errors").is(err, "Cancelled") then error(err, 0) end
end

---Listen and serve until cancelled (SIGINT/SIGTERM).
---@param o table { host=, port=, allow_actions=, on_ready = fn(url, token) }
function M.serve(o)
  local l, port, code = stream.listen{ host = o.host, port = o.port }
  if not l then return nil, port, code end
  local srv = { active = 0, token = o.allow_actions and proc.random_hex(32) or nil }
  srv.url = "http://" .. o.host .. ":" .. port .. "/"
  srv.hosts = { [o.host .. ":" .. port] = true, ["127.0.0.1:" .. port] = true, ["localhost:" .. port] = true }
  if o.on_ready then o.on_ready(srv.url, srv.token) end
  local ok, err = pcall(function()
    while true do
      local c, aerr = l:accept()
      if not c then
        complain("dashboard: accept: ", tostring(aerr))
        loop.sleep(0.1)
      elseif srv.active >= M.MAX_CONNECTIONS then
        pcall(json_error, c, 503, "too many connections")
        c:close()
      else
        srv.active = srv.active + 1
        loop.spawn(serve, srv, c)
      end
    end
  end)
  l:close()
  if not ok then error(err, 0) end
end

-- "PORT", "HOST:PORT" or "HOST" (port 0: a free one).
local function parse_listen(s)
  local host, port = s:match("^([%d%.]+):(%d+)$")
  if not host then port = s:match("^(%d+)$") end
  if not host and not port then
    host = s:match("^([%d%.]+)$")
    if not host then return nil end
  end
  host, port = host or "127.0.0.1", tonumber(port or "0")
  if not host:match("^%d+%.%d+%.%d+%.%d+$") or port > 65535 then return nil end
  return host, math.tointeger(port)
end

---sbxlua dashboard [--listen ADDR] [--allow-actions]
---sbxlua dashboard, with the options cli_table parsed.
function M.main(o)
  local host, port = parse_listen(o.listen or "127.0.0.1:0")
  if not host then
    complain("dashboard: --listen expects PORT, IPV4:PORT or IPV4, got '", o.listen, "'")
    return 2
  end
  if not host:match("^127%.") then
    complain("dashboard: warning: listening on ", host, ": other machines may reach this page")
  end
  local ok, err = M.serve{ host = host, port = port, allow_actions = o["allow-actions"],
    on_ready = function(url, token)
      io.stdout:write("sbxlua dashboard: ", url, " (state directory ", require("sbx.state.owner").state_dir(), ")\n")
      if token then
        io.stdout:write("actions allowed: open ", url, "?token=", token, "\n")
      else
        io.stdout:write("read-only (--allow-actions to enable gc from the page); Ctrl-C stops\n")
      end
      io.stdout:flush()
    end }
  if ok == nil then
    complain("dashboard: cannot listen on ", host, ":", tostring(port), ": ", tostring(err))
    return 1
  end
  return 0
end

return M
