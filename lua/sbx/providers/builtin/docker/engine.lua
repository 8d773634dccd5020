--- The docker provider's Engine API client: the endpoint ($DOCKER_HOST,
--- providers.docker.host), one ping and API version per process, calls
--- with deadlines and retries, typed errors for the engine's answers,
--- single-flight calls (shared), hijacked exec streams, and the container
--- create/remove that a cancel cannot cut short.
local http = require "sbx.http"
local stream = require "sbx.stream"
local json = require "cjson.safe"
local loop = require "sbx.loop"
local errors = require "sbx.core.errors"
local owner = require "sbx.state.owner"
local common = require "sbx.providers.builtin.docker.common"

local M = {}
local fail, settings = common.fail, common.settings

local API_MAX = 1.43          -- newest Engine API version this code speaks

-- -------------------------------------------------------------- transport

local conn                    -- { socket=, base=, prefix= }

local function endpoint()
  local host = os.getenv("DOCKER_HOST")
  if not host or host == "" then host = settings().host or "unix:///var/run/docker.sock" end
  if host:match("^unix://") then return { socket = host:sub(8), base = "http://docker", host = host } end
  local hp = host:match("^tcp://(.+)$") or host:match("^http://(.+)$")
  if hp then return { base = "http://" .. hp, host = host } end
  return nil, "unsupported DOCKER_HOST '" .. host .. "' (use unix:///path or tcp://host:port)"
end

-- Transport failures, in the words of someone fixing their machine.
local function why_unreachable(ep, msg, code)
  if code == "ENOENT" then
    return "no Docker socket at " .. tostring(ep.socket) .. " (install docker.io and start dockerd)"
  elseif code == "EACCES" then
    return "permission denied on " .. tostring(ep.socket) .. " (add the user to the docker group, or run as root)"
  elseif code == "ECONNREFUSED" then
    return "the Docker engine at " .. ep.host .. " is not running (start dockerd)"
  elseif code == "ETIMEDOUT" then
    return "the Docker engine at " .. ep.host .. " did not answer in time"
  end
  return "cannot reach the Docker engine at " .. ep.host .. ": " .. tostring(msg)
end

local function raw(ep, method, path, o)
  return http.request{
    url = ep.base .. path, unix_socket = ep.socket, method = method,
    headers = o.headers, body = o.body, timeout = o.timeout or 60,
    connect_timeout = 5, max_body = o.max_body, stream = o.stream,
  }
end

-- One call per key at a time, shared: tasks asking while it runs wait for
-- its answer (32 creates issued at once make one engine ping, one image
-- check and one agent-volume check, not 32 of each); later asks make their
-- own. A leader cancelled meanwhile leaves its followers to ask again.
local flights = {}
local function shared(key, fn, ...)
  while flights[key] do
    local f = flights[key]
    f.ev:wait()
    if f.done then
      if f.ok then return table.unpack(f.res, 1, f.res.n) end
      error(f.res[1], 0)
    end
  end
  local f = { ev = loop.event() }
  flights[key] = f
  local res = table.pack(pcall(fn, ...))
  flights[key] = nil
  f.done = not (not res[1] and errors.is(res[2], "Cancelled"))
  f.ok, f.res = res[1], table.pack(table.unpack(res, 2, res.n))
  f.ev:notify()
  if not f.ok then error(f.res[1], 0) end
  return table.unpack(f.res, 1, f.res.n)
end

---Connect (once): find the engine and agree on an API version.
local function connect_now()
  if conn then return conn end
  local ep, err = endpoint()
  if not ep then fail("BackendNotInstalledError", err) end
  local res, msg, code = raw(ep, "GET", "/_ping", { timeout = 5 })
  if not res then fail("BackendNotInstalledError", why_unreachable(ep, msg, code)) end
  if res.status ~= 200 then
    fail("BackendNotInstalledError", "the Docker engine answered /_ping with HTTP " .. res.status)
  end
  local v = tonumber(res.headers["api-version"] or "") or 1.41
  ep.prefix = string.format("/v%.2f", math.min(v, API_MAX))
  conn = ep
  return conn
end
local function connect() return conn or shared("connect", connect_now) end

local IDEMPOTENT = { GET = true, HEAD = true, DELETE = true, PUT = true }

-- The engine's error message: always a string, whatever the body holds.
local function message_of(res)
  local body = json.decode(res.body or "")
  local m = type(body) == "table" and body.message
  if type(m) == "string" then return m end
  return (res.body or ""):sub(1, 300)
end

-- A field of the engine's JSON answer that must be there (an id, a list);
-- a body without it is a broken engine, not a crash of ours.
local function field(res, name, want, o)
  local v = type(res.json) == "table" and res.json[name]
  if type(v) ~= want then
    fail(o.kind or "SandboxExecutionError", o.op .. ": the engine's answer has no " .. name
         .. " (HTTP " .. tostring(res.status) .. ", " .. #(res.body or "") .. " bytes)", { op = o.op })
  end
  return v
end

---One Engine API call, with a deadline; idempotent calls retry transport
---errors and 5xx/429 (at most 3 tries, jittered, honouring Retry-After).
---@return table res { status, headers, body, json }
local function call(method, path, o)
  o = o or {}
  local ep = connect()
  local body, headers = o.body, o.headers or {}
  if type(body) == "table" then
    body = json.encode(body)
    headers["Content-Type"] = "application/json"
  end
  local tries = IDEMPOTENT[method] and 3 or 1
  for attempt = 1, tries do
    local res, msg, code = raw(ep, method, ep.prefix .. path,
      { headers = headers, body = body, timeout = o.timeout, max_body = o.max_body, stream = o.stream })
    local again = attempt < tries and (not res or res.status >= 500 or res.status == 429)
    if not again then
      if not res then       -- the engine could not be reached (retryable: routing fails over),
        conn = nil          -- or answered with something that is not HTTP (EPROTO)
        fail(code == "ETIMEDOUT" and "SandboxTimeoutError" or code == "EPROTO" and "SandboxExecutionError"
             or "SandboxConnectionError",
             o.op .. ": " .. why_unreachable(ep, msg, code), { op = o.op, retryable = true, code = code })
      end
      return res
    end
    local wait = 0.1 * 2 ^ attempt * (0.5 + math.random())
    local ra = res and tonumber(res.headers["retry-after"] or "")
    if ra then wait = math.min(ra, 5) end
    if res and res.stream then res:close() end
    loop.sleep(wait)
  end
end

---call() that expects one of `ok` statuses; maps the rest to typed errors.
local function expect(res, ok, o)
  for _, s in ipairs(ok) do if res.status == s then return res end end
  local msg = o.op .. ": " .. message_of(res)
  if res.status == 404 then fail(o.not_found or "SandboxNotFoundError", msg, { op = o.op }) end
  if res.status == 409 then fail(o.conflict or "SandboxExecutionError", msg, { op = o.op }) end
  if res.status == 400 then fail(o.bad_request or "SandboxExecutionError", msg, { op = o.op }) end
  fail(o.kind or "SandboxExecutionError", msg .. " (HTTP " .. res.status .. ")",
       { op = o.op, retryable = res.status >= 500 })
end

local function api(method, path, ok, o)
  o = o or {}
  local res = expect(call(method, path, o), ok, o)
  if not o.stream and (res.headers["content-type"] or ""):find("json", 1, true) then
    res.json = json.decode(res.body)
  end
  return res
end

local function q(s) return http.escape(s) end

-- A removal somebody else started (a killed job's own destroy, another
-- gc): waited for, up to 60 s, so that a destroy or a gc that returns has
-- left no container behind (G2). Polled, the engine has no event for it.
local function wait_removed(cid)
  local deadline = loop.now() + 60
  for _ = 1, 1200 do               -- (bounded by count too: 1200 x 50 ms)
    local ok, res = pcall(call, "GET", "/containers/" .. q(cid) .. "/json", { op = "destroy", timeout = 10 })
    if ok and res.status == 404 then return end
    if loop.now() > deadline then break end
    loop.sleep(0.05)
  end
  fail("SandboxExecutionError", "destroy: container " .. cid .. " is still being removed after 60 s", { op = "destroy" })
end

-- Gone, or going (another gc got there first, and it is gone once this returns).
local function remove_container(cid, volumes)
  local ok, res = pcall(call, "DELETE", "/containers/" .. q(cid) .. "?force=true&v=" .. (volumes == false and "false" or "true"),
                        { op = "destroy", timeout = 60 })
  local going = ok and res.status == 409 and message_of(res):find("already in progress", 1, true)
  if ok and res.status ~= 204 and res.status ~= 404 and not going then
    fail("SandboxExecutionError", "destroy: " .. message_of(res), { op = "destroy" })
  elseif not ok then
    error(res, 0)
  end
  if going then wait_removed(cid) end
end

-- POST /containers/create?name=<name> in a task of its own: a cancel of the
-- caller (SIGINT) must not cut the call short, or the engine makes a
-- container nobody hears of. A caller cancelled first leaves: the task then
-- removes the container by name once the engine has answered (or failed to),
-- and the session waits for it at exit (owner.hold). Raises what call does.
local function create_container(name, body, o)
  local abandoned = false
  local t = loop.spawn(function()
    local ok, res = pcall(call, "POST", "/containers/create?name=" .. q(name),
                          { op = "create", body = body, timeout = o.timeout or 120 })
    if abandoned or not ok then pcall(remove_container, name, o.volumes) end
    if not ok then error(res, 0) end
    return res
  end)
  owner.hold(t)
  local jok, ok, res = pcall(t.join, t)
  if not jok then          -- cancelled: wait for the engine's answer; the task removes what it made
    abandoned = true
    pcall(t.join, t)
    error(ok, 0)
  end
  if not ok then error(res, 0) end
  return res
end

-- A hijacked connection (HTTP upgrade to a raw stream) for `path`: an
-- exec's start, or a container's attach. Output arrives multiplexed, and
-- what we write is the process's stdin.
local function upgrade(path, body, op)
  local ep = connect()
  local s, err, code
  if ep.socket then
    s, err, code = stream.connect{ unix = ep.socket, timeout = 10 }
  else
    local host, port = ep.base:match("^http://%[?([^%]/]-)%]?:(%d+)$")
    s, err, code = stream.connect{ host = host or ep.base:sub(8), port = port or "2375", timeout = 10 }
  end
  if not s then
    fail(code == "ETIMEDOUT" and "SandboxTimeoutError" or "SandboxConnectionError",
         op .. ": " .. why_unreachable(ep, err, code), { op = op, code = code })
  end
  local ok, werr = s:write("POST " .. ep.prefix .. path .. " HTTP/1.1\r\n"
    .. "Host: docker\r\nContent-Type: application/json\r\nConnection: Upgrade\r\n"
    .. "Upgrade: tcp\r\nContent-Length: " .. #body .. "\r\n\r\n" .. body)
  local head = ""
  while ok and not head:find("\r\n\r\n", 1, true) and #head < 65536 do
    local chunk, rerr = s:read(30)
    if not chunk then ok, werr = false, rerr or "the engine closed the connection" break end
    head = head .. chunk
  end
  local i = head:find("\r\n\r\n", 1, true)
  local status = tonumber(head:match("^HTTP/1%.%d (%d%d%d)") or "")
  if not ok or not i or not status then
    s:close()
    fail("SandboxExecutionError", op .. ": starting the command failed: " .. tostring(werr or "bad answer"), { op = op })
  end
  local rest = head:sub(i + 4)
  if status ~= 101 and status ~= 200 then
    s:close()
    local msg = message_of{ body = rest }
    fail(status == 404 and "SandboxNotFoundError" or "SandboxExecutionError", op .. ": " .. msg, { op = op })
  end
  return s, rest
end

-- Start exec `eid` on a hijacked connection.
local function hijack(eid, op)
  return upgrade("/exec/" .. eid .. "/start", '{"Detach":false,"Tty":false}', op)
end

-- Attach to container `cid`'s own stdin, stdout and stderr (before its
-- start, so that nothing it writes first is missed).
local function attach(cid, op)
  return upgrade("/containers/" .. cid .. "/attach?stream=1&stdin=1&stdout=1&stderr=1", "", op)
end

M.shared, M.connect, M.call, M.expect, M.api, M.field = shared, connect, call, expect, api, field
M.message_of, M.q, M.hijack, M.attach, M.why_unreachable = message_of, q, hijack, attach, why_unreachable
M.remove_container, M.create_container = remove_container, create_container

return M
