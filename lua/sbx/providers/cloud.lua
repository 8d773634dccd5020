--- What every HTTP provider script needs, in one place (the `cloud` global
--- of provider scripts; docs/providers.md, "Cloud providers"): the typed
--- error for an HTTP answer or a broken link, with the provider's own
--- message and `context.status`; retries of idempotent calls with backoff
--- within a deadline, honouring Retry-After; JSON in and out; and the
--- ownership labels every cloud sandbox carries.
local http = require "sbx.http"
local loop = require "sbx.loop"
local errors = require "sbx.core.errors"
local cjson = require("cjson.safe").new()

local M = {}

M.BACKOFF = 0.2          -- first wait between attempts, doubled each time
M.BACKOFF_MAX = 5

local IDEMPOTENT = { GET = true, HEAD = true, PUT = true, DELETE = true, OPTIONS = true }

---Seconds to wait from a Retry-After value (seconds or an HTTP date), or nil.
local MONTHS = { Jan = 1, Feb = 2, Mar = 3, Apr = 4, May = 5, Jun = 6,
                 Jul = 7, Aug = 8, Sep = 9, Oct = 10, Nov = 11, Dec = 12 }
function M.retry_after(v)
  if type(v) ~= "string" then return nil end
  local n = tonumber(v:match("^%s*(%d+%.?%d*)%s*$"))
  if n then return n end
  local d, mon, y, hh, mm, ss = v:match("(%d+) (%a%a%a) (%d%d%d%d) (%d%d):(%d%d):(%d%d) GMT")
  if not d or not MONTHS[mon] then return nil end
  local t = os.time{ year = tonumber(y), month = MONTHS[mon], day = tonumber(d),
                     hour = tonumber(hh), min = tonumber(mm), sec = tonumber(ss), isdst = false }
  -- os.time reads the table as local time: correct by this machine's offset
  local now = os.time()
  local utc_now = os.time(os.date("!*t", now))
  return math.max(0, t + (now - utc_now) - now)
end

-- The longest wait any Retry-After header of the answer asks for
-- (Daytona sends one per bucket: Retry-After-<bucket>).
local function wait_asked(headers)
  local best
  for k, v in pairs(headers or {}) do
    if k == "retry-after" or k:match("^retry%-after%-") then
      local s = M.retry_after(v)
      if s and (not best or s > best) then best = s end
    end
  end
  return best
end

---The provider's own words in an error body: JSON message/error/detail
---fields, else the text itself (cut to 300 bytes).
function M.message_of(body)
  if type(body) ~= "string" or body == "" then return nil end
  local v = cjson.decode(body)
  if type(v) == "table" then
    local m = v.message or v.error or v.detail or v.msg
    if type(m) == "table" then m = m.message or cjson.encode(m) end
    if type(m) == "string" and m ~= "" then return m end
  end
  body = body:gsub("%s+$", "")
  return #body > 300 and body:sub(1, 300) .. "..." or body
end

local function matches_any(text, patterns)
  text = (text or ""):lower()
  for _, p in ipairs(patterns or {}) do
    if text:find(p:lower(), 1, true) then return true end
  end
  return false
end

---The typed error (not raised) for an answer `res` (or a transport failure:
---res nil, why, code) of the call `op` to `provider`.
---o: { quota = { substrings of a quota answer }, not_found = { substrings of
---a 'gone' answer on another status }, kind = kind for other 4xx }
function M.error_for(provider, op, res, why, code, o)
  o = o or {}
  local fields = { backend = provider, op = op }
  if not res then
    fields.retryable, fields.code = true, code
    return errors.new("SandboxConnectionError", string.format("%s: %s: %s", provider, op, tostring(why)), fields)
  end
  local status = res.status
  local said = M.message_of(res.body) or ""
  local msg = string.format("%s: %s: HTTP %d%s", provider, op, status, said ~= "" and (": " .. said) or "")
  fields.status = status
  local kind
  if matches_any(said, o.quota) then
    kind = "QuotaExceededError"
  elseif status == 401 or status == 403 then
    kind = "AuthenticationError"
  elseif status == 429 then
    kind, fields.retry_after = "RateLimitError", wait_asked(res.headers)
  elseif status == 404 or matches_any(said, o.not_found) then
    kind = "SandboxNotFoundError"
  elseif status >= 500 then
    kind, fields.retryable = "SandboxConnectionError", true
  else
    kind = o.kind or (op == "create" and "SandboxCreationError" or "SandboxExecutionError")
  end
  return errors.new(kind, msg, fields)
end

local Client = {}
Client.__index = Client

---client{ provider =, base =, headers = {...}, timeout = 30, deadline = 60,
---quota =, not_found = } -> a client of one HTTP API
function M.client(o)
  assert(type(o.provider) == "string", "cloud.client: provider is required")
  assert(type(o.base) == "string", "cloud.client: base is required")
  return setmetatable({ provider = o.provider, base = o.base:gsub("/+$", ""), headers = o.headers or {},
                        timeout = o.timeout or 30, deadline = o.deadline or 60,
                        quota = o.quota, not_found = o.not_found }, Client)
end

local function merged(a, b)
  local out = {}
  for k, v in pairs(a or {}) do out[k] = v end
  for k, v in pairs(b or {}) do out[k] = v end
  return out
end

-- Whether an error is worth the same call again.
local function again(err)
  return err.kind == "SandboxConnectionError" or err.kind == "RateLimitError"
end

---client:request(method, path, o) -> res (status < 400, or listed in o.ok)
---o: { json = value (sent as JSON), body = string, headers =, query = {k=v},
---op = "name", timeout =, deadline = seconds for all attempts, idempotent =
---(default: by method), ok = { [404] = true, ... }, stream = true, base = }
---Raises the typed error of the last attempt.
function Client:request(method, path, o)
  o = o or {}
  local headers = merged(self.headers, o.headers)
  local body = o.body
  if o.json ~= nil then
    body = assert(cjson.encode(o.json))
    headers["content-type"] = headers["content-type"] or "application/json"
  end
  local url = (o.base or self.base) .. path
  if o.query then
    local q = {}
    for k, v in pairs(o.query) do q[#q + 1] = http.escape(tostring(k)) .. "=" .. http.escape(tostring(v)) end
    table.sort(q)
    if #q > 0 then url = url .. (url:find("?", 1, true) and "&" or "?") .. table.concat(q, "&") end
  end
  local idempotent = o.idempotent
  if idempotent == nil then idempotent = IDEMPOTENT[method] or false end
  local op = o.op or (method .. " " .. path)
  local stop = loop.now() + (o.deadline or self.deadline)
  local wait = M.BACKOFF
  while true do
    local left = stop - loop.now()
    local res, why, code = http.request{ method = method, url = url, headers = headers, body = body,
      timeout = math.max(0.5, math.min(o.timeout or self.timeout, left)), stream = o.stream,
      max_body = o.max_body }
    if res and (res.status < 400 or (o.ok and o.ok[res.status])) then return res end
    if res and o.stream then        -- the error's body, to say what it was
      local parts = {}
      for _ = 1, 64 do
        local c = res:read()
        if not c then break end
        parts[#parts + 1] = c
      end
      res:close()
      res = { status = res.status, headers = res.headers, body = table.concat(parts) }
    end
    local err = M.error_for(self.provider, op, res, why, code, self)
    local pause = math.min(math.max(err.retry_after or 0, wait), M.BACKOFF_MAX)
    if not (idempotent and again(err)) or loop.now() + pause >= stop then error(err, 0) end
    loop.sleep(pause)
    wait = math.min(wait * 2, M.BACKOFF_MAX)
  end
end

---client:json(method, path, o) -> the decoded JSON answer (nil for an empty
---one), res. A body that is not JSON is a SandboxConnectionError (a proxy's
---page, a cut answer).
function Client:json(method, path, o)
  local res = self:request(method, path, o)
  if res.body == nil or res.body == "" then return nil, res end
  local v, why = cjson.decode(res.body)
  if v == nil then
    errors.raise("SandboxConnectionError", string.format("%s: %s: the answer is not JSON (%s)",
      self.provider, (o and o.op) or (method .. " " .. path), tostring(why)),
      { backend = self.provider, op = o and o.op, status = res.status, retryable = true })
  end
  return v, res
end

---multipart(parts) -> body, content_type: a multipart/form-data body of
---parts { name =, data =, filename = (a file part), content_type = }, for
---the upload endpoints of in-sandbox APIs. The boundary is random and
---checked against every part's bytes.
function M.multipart(parts)
  local boundary
  repeat
    boundary = "sbxlua-" .. require("sbx.proc").random_hex(24)
    local clash = false
    for _, p in ipairs(parts) do if p.data:find(boundary, 1, true) then clash = true end end
  until not clash
  local out = {}
  for _, p in ipairs(parts) do
    assert(type(p.name) == "string" and type(p.data) == "string", "cloud.multipart: each part has a name and data")
    out[#out + 1] = "--" .. boundary .. "\r\nContent-Disposition: form-data; name=\"" .. p.name .. "\""
      .. (p.filename and ("; filename=\"" .. p.filename:gsub('[\r\n"]', "_") .. "\"") or "") .. "\r\n"
      .. "Content-Type: " .. (p.content_type or (p.filename and "application/octet-stream" or "text/plain"))
      .. "\r\n\r\n" .. p.data .. "\r\n"
  end
  out[#out + 1] = "--" .. boundary .. "--\r\n"
  return table.concat(out), "multipart/form-data; boundary=" .. boundary
end

---all(f1, f2, ...) -> r1, r2, ...: the functions at once, each in a task of
---its own (a request each: their round trips overlap), their first results
---in order. When one raises, the others are cancelled and its error is
---raised once all have ended; outside a task they run one after another.
function M.all(...)
  local fns, n = { ... }, select("#", ...)
  for i = 1, n do assert(type(fns[i]) == "function", "cloud.all: argument " .. i .. " is not a function") end
  local loop = require "sbx.loop"
  local out = {}
  if n < 2 or not loop.current() then
    for i = 1, n do out[i] = fns[i]() end
    return table.unpack(out, 1, n)
  end
  local tasks = {}
  for i = 2, n do tasks[i] = loop.spawn(fns[i]) end
  local failure
  local ok, err = pcall(function()
    local fok, v = pcall(fns[1])
    if fok then out[1] = v else failure = v end
    for i = 2, n do
      if failure ~= nil then tasks[i]:cancel() end
      local tok, r = tasks[i]:join()
      if tok then out[i] = r elseif failure == nil then failure = r end
    end
  end)
  if not ok then                    -- we were cancelled: take the others down too
    for i = 2, n do tasks[i]:cancel() end
    for i = 2, n do tasks[i]:join() end
    error(err, 0)
  end
  if failure ~= nil then error(failure, 0) end
  return table.unpack(out, 1, n)
end

local agent_bytes, agent_id
---agent() -> bytes, id: this build's static sbx-agent (docs/agent-protocol.md;
---`sbx-agent run` supervises one command: a subreaper, a timeout that kills
---the whole tree, its status as the last bytes of stderr), for a provider
---to place in a sandbox whose API can run commands but not supervise
---them; `id` (agentlink.hash, as docker's agent volume names it) tells
---this build's from another's.
function M.agent()
  if not agent_bytes then
    agent_bytes = require "sbx.agentbin"
    agent_id = require("sbx.daemon.link").hash(agent_bytes)
  end
  return agent_bytes, agent_id
end

---The ownership labels of a sandbox made for `spec` (create's argument):
---what gc and list_owned find it by.
function M.labels(spec, extra)
  local owner = require "sbx.state.owner"
  local out = { ["sbxlua.host"] = owner.hostname(), ["sbxlua.session"] = spec.session,
                ["sbxlua.id"] = spec.id, ["sbxlua.created"] = tostring(os.time()),
                ["sbxlua.ttl"] = tostring(spec.ttl or 0) }
  for k, v in pairs(extra or {}) do out[k] = tostring(v) end
  return out
end

return M
