-- The Daytona stand-in (daytona.lua) as a process of its own, for specs
-- that drive the provider against it: its backing sandboxes live in its own
-- SBX_STATE_DIR, out of the tested process's session, and it ends with the
-- spec's process (--parent).
--
--   local DP = require "spec.support.standin.daytona_proc"
--   local s = DP.start{ max_cpu = 8 }      -- s.url, s.key, s.host_env ("K=V ... " for sbxlua processes)
--   s:use()                                -- this process's provider finds it ($DAYTONA_API_KEY/URL)
--   s:fault{ route = "POST /sandbox", status = 429 }   s:clear()   s:requests()   s:sandboxes()
--   s:stop()
local proc = require "sbx.proc"
local http = require "sbx.http"
local loop = require "sbx.loop"
local json = require "cjson"
local S = require "spec.support"

local M = {}

local P = {}
P.__index = P

---start{ key =, max_cpu =, polls =, backend = } -> the running stand-in
function M.start(o)
  o = o or {}
  -- under the spec's own state directory: a row that never stops it leaves nothing in /tmp
  local base = os.getenv("SBX_STATE_DIR") or "/tmp"
  os.execute("mkdir -p " .. S.shq(base))
  local dir = assert(require("sbx.fs").mkdtemp(base, "daytona-standin-"))
  local key = o.key or ("standin-" .. proc.random_hex(8))
  local port_file = dir .. "/port"
  local argv = { S.BIN, S.SOURCE .. "/spec/support/standin/daytona.lua", "--port-file", port_file,
                 "--key", key, "--parent", tostring(proc.getpid()) }
  for _, k in ipairs{ "max_cpu", "polls", "backend" } do
    if o[k] then argv[#argv + 1] = "--" .. k:gsub("_", "-") argv[#argv + 1] = tostring(o[k]) end
  end
  local p = assert(proc.spawn{ argv = argv, max_output = 1 << 20, env = { S.PATH, "SBX_STATE_DIR=" .. dir .. "/state",
                                                                   "HOME=" .. dir } })
  local port
  local stop = loop.now() + 60
  repeat
    loop.sleep(0.05)
    local f = io.open(port_file)
    if f then port = f:read("l") f:close() end
  until port or loop.now() > stop or not p:running()
  if not port then
    local r = p:wait()
    error("the daytona stand-in did not start: " .. tostring(r.stderr) .. tostring(r.stdout))
  end
  local s = setmetatable({ p = p, dir = dir, key = key, port = tonumber(port), url = "http://127.0.0.1:" .. port }, P)
  s.host_env = "DAYTONA_API_KEY=" .. key .. " DAYTONA_API_URL=" .. s.url .. " "
  return s
end

---This process's provider uses this stand-in: the two variables the
---provider's config names, set in this process's environment.
local saved
function P:use()
  saved = saved or { os.getenv("DAYTONA_API_KEY"), os.getenv("DAYTONA_API_URL") }
  proc.setenv("DAYTONA_API_KEY", self.key)
  proc.setenv("DAYTONA_API_URL", self.url)
end

function M.unset()
  proc.setenv("DAYTONA_API_KEY", nil)
  proc.setenv("DAYTONA_API_URL", nil)
end

function M.restore()
  if not saved then return end
  proc.setenv("DAYTONA_API_KEY", saved[1])
  proc.setenv("DAYTONA_API_URL", saved[2])
  saved = nil
end

local function call(self, method, path, body)
  local res = assert(http.request{ method = method, url = self.url .. path, body = body and json.encode(body) or nil,
                                   headers = { authorization = "Bearer " .. self.key, ["content-type"] = "application/json" } })
  return res.status, res.body ~= "" and json.decode(res.body) or nil
end

function P:fault(f) assert(call(self, "POST", "/_standin/faults", f) == 201) end
function P:clear() call(self, "DELETE", "/_standin/faults") end
function P:requests() return select(2, call(self, "GET", "/_standin/requests")) end

---The sandboxes the stand-in holds (its own listing, all of them).
function P:sandboxes(labels)
  local path = "/sandbox?includeErroredDeleted=true&limit=200"
  if labels then path = path .. "&labels=" .. http.escape(json.encode(labels)) end
  local st, v = call(self, "GET", path)
  assert(st == 200, "listing the stand-in's sandboxes: HTTP " .. tostring(st))
  return v.items
end

function P:stop()
  if self.stopped then return end
  self.stopped = true
  self.p:kill(15)
  local r = self.p:wait()
  self.p:close()
  os.execute("rm -rf " .. S.shq(self.dir))
  return r
end

return M
