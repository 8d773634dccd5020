-- An HTTP/1.1 server on the project's loop, for the stand-ins of cloud
-- providers' APIs (spec/support/standin/*.lua). Keep-alive, Content-Length
-- and chunked request bodies, chunked (streaming) responses, and faults on
-- demand per route, from the spec or over HTTP from another process:
--
--   local H = require "spec.support.standin.http"
--   local srv = assert(H.serve{ port = 0, handler = function(req, res) ... end })
--   srv.port, srv.url                      -- "http://127.0.0.1:PORT"
--   srv:fault{ route = "POST /sandboxes", status = 429, headers = { ["retry-after"] = "1" } }
--   srv:close()
--
-- req = { method, target, path, query, headers (lower-case), body, route = "METHOD path" }
-- The handler answers through `res`:
--   res:send(status, body [, headers])     body: a string, or a table sent as JSON
--   res:start(status [, headers])          then res:write(chunk)... res:finish()
--   res:cut()                              drop the connection now (a broken link)
-- or returns status, body [, headers] (res:send of those). An error raised
-- by the handler is a 500 whose body says it.
--
-- A fault is matched on "METHOD path" (a Lua pattern, anchored) before the
-- handler runs; fields:
--   status, body, headers   answer this instead (the handler does not run)
--   after = true            the handler runs (its effect happens) but this answer is
--                           sent instead: a create that succeeded behind a 504
--   delay = seconds         wait first (a slow answer)
--   cut = "head" | "body"   drop the connection before answering, or after half the body
--   times = N               how many requests it hits (default 1; -1: until cleared)
-- Over HTTP: POST /_standin/faults with the fault as JSON adds one;
-- DELETE /_standin/faults clears them; GET /_standin/requests lists the
-- routes seen so far (for assertions in another process).
local stream = require "sbx.stream"
local loop = require "sbx.loop"
local httpreq = require "sbx.httpreq"
local json = require "cjson"

local M = {}

M.READ_TIMEOUT = 60          -- an idle keep-alive connection is closed after this
M.MAX_BODY = 512 << 20

local REASON = {
  [200] = "OK", [201] = "Created", [202] = "Accepted", [204] = "No Content", [206] = "Partial Content",
  [400] = "Bad Request", [401] = "Unauthorized", [403] = "Forbidden", [404] = "Not Found",
  [405] = "Method Not Allowed", [409] = "Conflict", [413] = "Payload Too Large",
  [422] = "Unprocessable Entity", [429] = "Too Many Requests", [500] = "Internal Server Error",
  [502] = "Bad Gateway", [503] = "Service Unavailable", [504] = "Gateway Timeout",
}

local Conn = {}
Conn.__index = Conn

local function conn(c) return setmetatable({ c = c, buf = "", broken = false }, Conn) end

-- One more chunk from the peer into the buffer; false at its end.
function Conn:fill()
  local chunk = self.c:read(M.READ_TIMEOUT)
  if not chunk then self.broken = true return false end
  self.buf = self.buf .. chunk
  return true
end

function Conn:take(n)
  while #self.buf < n do if not self:fill() then return nil end end
  local s = self.buf:sub(1, n)
  self.buf = self.buf:sub(n + 1)
  return s
end

function Conn:line()
  while true do
    local i = self.buf:find("\r\n", 1, true)
    if i then
      local s = self.buf:sub(1, i - 1)
      self.buf = self.buf:sub(i + 2)
      return s
    end
    if #self.buf > 8192 or not self:fill() then return nil end
  end
end

-- The request body: Content-Length or chunked; nil, why on a bad one.
function Conn:body(h)
  if (h["transfer-encoding"] or ""):lower():find("chunked", 1, true) then
    local parts, total = {}, 0
    while true do
      local size = tonumber(((self:line() or ""):match("^%x+")) or "", 16)
      if not size then return nil, "bad chunk size" end
      if size == 0 then
        repeat local l = self:line() until not l or l == ""
        return table.concat(parts)
      end
      total = total + size
      if total > M.MAX_BODY then return nil, "body too large" end
      parts[#parts + 1] = self:take(size)
      if not parts[#parts] or self:take(2) ~= "\r\n" then return nil, "truncated chunk" end
    end
  end
  local len = tonumber(h["content-length"] or "0")
  if not len or len < 0 or len > M.MAX_BODY then return nil, "bad content-length" end
  local body = self:take(len)
  if not body then return nil, "truncated body" end
  return body
end

function Conn:send_raw(s)
  if self.broken then return false end
  if not self.c:write(s) then self.broken = true return false end
  return true
end

-- ------------------------------------------------------------ responses

local Res = {}
Res.__index = Res

local function head(status, headers, extra)
  local out = { string.format("HTTP/1.1 %d %s\r\n", status, REASON[status] or "Status") }
  for k, v in pairs(headers or {}) do out[#out + 1] = k .. ": " .. tostring(v) .. "\r\n" end
  out[#out + 1] = extra
  out[#out + 1] = "\r\n"
  return table.concat(out)
end

local function encode(body, headers)
  headers = headers or {}
  if type(body) == "table" then
    local has = false
    for k in pairs(headers) do if k:lower() == "content-type" then has = true end end
    if not has then headers["Content-Type"] = "application/json" end
    body = json.encode(body)
  end
  return body or "", headers
end

function Res:send(status, body, headers)
  if self.done then return end
  self.done = true
  body, headers = encode(body, headers)
  local f = self.fault
  if f and f.cut == "body" then
    self.conn:send_raw(head(status, headers, "Content-Length: " .. #body .. "\r\n") .. body:sub(1, #body // 2))
    return self:cut()
  end
  self.conn:send_raw(head(status, headers, "Content-Length: " .. #body .. "\r\n") .. (self.head_only and "" or body))
end

function Res:start(status, headers)
  if self.done then return end
  self.done, self.chunked = true, true
  self.conn:send_raw(head(status, headers, "Transfer-Encoding: chunked\r\n"))
end

function Res:write(chunk)
  if not self.chunked or #chunk == 0 then return not self.conn.broken end
  return self.conn:send_raw(string.format("%x\r\n", #chunk) .. chunk .. "\r\n")
end

function Res:finish()
  if self.chunked and not self.finished then
    self.finished = true
    self.conn:send_raw("0\r\n\r\n")
  end
end

function Res:cut()
  self.done, self.conn.broken = true, true
  self.conn.c:close()
end

-- ------------------------------------------------------------ faults

local Server = {}
Server.__index = Server

function Server:fault(f)
  assert(type(f.route) == "string", "fault: route is a string like 'POST /sandboxes'")
  f.times = f.times or 1
  self.faults[#self.faults + 1] = f
end

function Server:clear_faults() self.faults = {} end

function Server:take_fault(route)
  for i, f in ipairs(self.faults) do
    if route:match("^" .. f.route .. "$") then
      if f.times > 0 then
        f.times = f.times - 1
        if f.times == 0 then table.remove(self.faults, i) end
      end
      return f
    end
  end
end

-- Answer what the fault says (or nothing, for after = true).
local function apply(f, res)
  if f.delay then loop.sleep(f.delay) end
  if f.cut == "head" then res:cut() return true end
  if f.status and not f.after then
    res:send(f.status, f.body or { message = "fault injected" }, f.headers)
    return true
  end
end

local function admin(srv, req, res)
  if req.path == "/_standin/faults" and req.method == "POST" then
    local ok, f = pcall(json.decode, req.body)
    if not ok or type(f) ~= "table" or type(f.route) ~= "string" then
      return res:send(400, { message = "a fault is a JSON object with a route" })
    end
    srv:fault(f)
    return res:send(201, { ok = true })
  elseif req.path == "/_standin/faults" and req.method == "DELETE" then
    srv:clear_faults()
    return res:send(204, "")
  elseif req.path == "/_standin/requests" and req.method == "GET" then
    return res:send(200, srv.seen)
  end
  return res:send(404, { message = "no such stand-in route" })
end

-- ------------------------------------------------------------ serving

local function answer(srv, cn, req)
  local res = setmetatable({ conn = cn, head_only = req.method == "HEAD" }, Res)
  if req.path:sub(1, 10) == "/_standin/" then return admin(srv, req, res) end
  req.route = req.method .. " " .. req.path
  srv.seen[#srv.seen + 1] = req.route
  local f = srv:take_fault(req.route)
  if f and apply(f, res) then return end
  if f and f.cut == "body" then res.fault = f end
  -- after = true: what the handler sends goes nowhere (only the fault's answer is sent)
  local hres = res
  if f and f.after then
    hres = setmetatable({ conn = { broken = false, send_raw = function() return true end,
                                   c = { close = function() end } } }, Res)
  end
  local ok, status, body, headers = xpcall(srv.handler, debug.traceback, req, hres)
  if not ok then
    return res:send(500, { message = "stand-in handler failed: " .. tostring(status) })
  end
  if f and f.after then
    res.done = false
    return res:send(f.status, f.body or { message = "fault injected" }, f.headers)
  end
  if status and not res.done then res:send(status, body, headers) end
  if res.chunked then res:finish() end
  if not res.done then res:send(204, "") end
end

local function serve_conn(srv, c)
  local cn = conn(c)
  srv.conns[cn] = true
  while not cn.broken do
    local req, a = httpreq.parse(cn.buf, 65536)
    if req then
      cn.buf = cn.buf:sub(a + 1)
      local body, why = cn:body(req.headers)
      if not body then
        if not cn.broken then cn:send_raw(head(400, {}, "Content-Length: 0\r\nConnection: close\r\n")) end
        break
      end
      req.body = body
      answer(srv, cn, req)
      if (req.headers.connection or ""):lower() == "close" or req.version == "HTTP/1.0" then break end
    elseif a then
      cn:send_raw(head(400, {}, "Content-Length: 0\r\nConnection: close\r\n"))
      break
    elseif not cn:fill() then
      break
    end
  end
  srv.conns[cn] = nil
  c:close()
end

---serve{ host = "127.0.0.1", port = 0, handler = fn(req, res) } -> server | nil, msg
function M.serve(o)
  local l, port = stream.listen{ host = o.host or "127.0.0.1", port = o.port or 0 }
  if not l then return nil, port end
  local srv = setmetatable({ port = port, url = "http://" .. (o.host or "127.0.0.1") .. ":" .. port,
                             handler = o.handler, faults = {}, seen = {}, conns = {}, l = l }, Server)
  srv.task = loop.spawn(function()
    while not srv.closed do
      -- close() closes the listener under a waiting accept: that ends the loop
      local ok, c = pcall(l.accept, l)
      if not ok or not c then break end
      loop.spawn(serve_conn, srv, c)
    end
  end)
  return srv
end

function Server:close()
  if self.closed then return end
  self.closed = true
  self.l:close()
  for cn in pairs(self.conns) do cn.broken = true cn.c:close() end
end

return M
