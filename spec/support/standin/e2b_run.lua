-- The E2B stand-in as a process of its own (with its own SBX_STATE_DIR, so
-- its sandboxes are never in the tested process's session), for specs:
--
--   local R = require "spec.support.standin.e2b_run"
--   local s = R.start{ scale = false, rate = nil, max_concurrent = nil }
--   s.url, s.key, s.env ("E2B_API_KEY=... E2B_API_URL=... E2B_SANDBOX_URL=... ")
--   s:stats()   -> { live, created, envd_calls }
--   s:fault{ route = "POST /sandboxes", status = 429 }   (over HTTP)
--   s:stop()
--
-- The spec process itself has no setenv: R.use(s) points this process's
-- e2b config at the stand-in and names, as the key's variable, one that is
-- set here already (SBX_STATE_DIR, else HOME); the stand-in takes that
-- variable's value as the API key.
local proc = require "sbx.proc"
local fs = require "sbx.fs"
local loop = require "sbx.loop"
local http = require "sbx.http"
local json = require "cjson"
local S = require "spec.support"

local M = {}

M.KEY_VAR = os.getenv("SBX_STATE_DIR") and "SBX_STATE_DIR" or "HOME"

local Run = {}
Run.__index = Run

function M.start(o)
  o = o or {}
  local src = os.getenv("SBX_SOURCE_DIR") or "."
  local base = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/e2b-standin-" .. proc.getpid() .. "-" .. proc.random_hex(4)
  assert(fs.mkdir_host(base))
  local port_file = base .. "/port"
  local key = os.getenv(M.KEY_VAR)
  local argv = { S.BIN, src .. "/spec/support/standin/e2b.lua", "--port-file", port_file, "--api-key", key }
  if o.scale then argv[#argv + 1] = "--scale" end
  if o.split then argv[#argv + 1] = "--split-envelopes" end
  if o.rate then argv[#argv + 1] = "--rate" argv[#argv + 1] = tostring(o.rate) end
  if o.max_concurrent then argv[#argv + 1] = "--max-concurrent" argv[#argv + 1] = tostring(o.max_concurrent) end
  if o.backend then argv[#argv + 1] = "--backend" argv[#argv + 1] = o.backend end
  local env = { S.PATH, "SBX_STATE_DIR=" .. base .. "/state" }
  for _, k in ipairs{ "SBX_MODULE_DIR", "SBX_SOURCE_DIR", "SBX_SPECS_DIR" } do
    if os.getenv(k) then env[#env + 1] = k .. "=" .. os.getenv(k) end
  end
  local p = assert(proc.spawn{ argv = argv, env = env, cwd = src, stream = true })
  local port
  for _ = 1, 300 do
    local f = io.open(port_file)
    if f then port = tonumber(f:read("l")) f:close() end
    if port then break end
    if not p:running() then break end
    loop.sleep(0.05)
  end
  if not port then
    p:kill(9)
    local r = p:wait()
    error("the e2b stand-in did not start: " .. tostring(r.stderr) .. tostring(r.stdout))
  end
  local url = "http://127.0.0.1:" .. port
  return setmetatable({ p = p, port = port, url = url, key = key, dir = base,
    env = "E2B_API_KEY=" .. S.shq(key) .. " E2B_API_URL=" .. url .. " E2B_SANDBOX_URL=" .. url .. " " }, Run)
end

function Run:stats()
  local r = assert(http.request{ url = self.url .. "/standin/e2b" })
  return json.decode(r.body)
end

function Run:fault(f)
  local r = assert(http.request{ url = self.url .. "/_standin/faults", method = "POST", body = json.encode(f) })
  assert(r.status == 201, r.body)
end

function Run:clear_faults() http.request{ url = self.url .. "/_standin/faults", method = "DELETE" } end

function Run:stop()
  if self.stopped then return end
  self.stopped = true
  self.p:kill(15)
  local done = false
  for _ = 1, 200 do
    if not self.p:running() then done = true break end
    loop.sleep(0.05)
  end
  if not done then self.p:kill(9) end
  self.p:wait()
  self.p:close()
  fs.rmtree(self.dir)
end

---Point this process's e2b provider at the stand-in `s`.
---(`routing`: the config's routing section, e.g. { admission_wait_secs = 0 }.)
function M.use(s, extra, routing)
  local config = require "sbx.core.config"
  local e2b = { api_key_env = M.KEY_VAR, api_url_env = "E2B_API_URL", sandbox_url_env = "E2B_SANDBOX_URL",
                api_url = s.url, sandbox_url = s.url }
  for k, v in pairs(extra or {}) do e2b[k] = v end
  config.use{ providers = { e2b = e2b }, routing = routing }
  require("sbx.routing").reset()
end

return M
