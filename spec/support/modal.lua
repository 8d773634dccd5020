-- The stand-in Modal server (bridge/modal/standin) for the modal specs: one
-- per spec process, started on first use on a free port of 127.0.0.1, with
-- the credentials of $MODAL_TOKEN_ID/$MODAL_TOKEN_SECRET (ctest sets test
-- values for the modal specs; the stand-in refuses any other pair). It
-- ends with this process (its stdin closes) and takes its sandboxes along.
--   local M = require "spec.support.modal"
--   local ok, why = M.available()       -- the binaries, bwrap, the credentials
--   local s = M.start()                 -- { url, port, log, host_env }
local proc = require "sbx.proc"
local fs = require "sbx.fs"
local loop = require "sbx.loop"

local M = {}

local function dir_of(p) return p:match("^(.*)/[^/]+$") or "." end
M.BUILD = dir_of(os.getenv("SBX_BIN") or "build/sbxlua")
M.BRIDGE = M.BUILD .. "/sbx-modal-bridge"
M.STANDIN = M.BUILD .. "/modal-standin"

local function is_file(p) local st = fs.stat_host(p) return st and st.type == "file" end

---ok, why: what the modal specs need is here. SBX_REQUIRE_MODAL=1 (CI)
---makes a missing piece an error instead of a skip.
function M.available()
  local why
  if not is_file(M.BRIDGE) or not is_file(M.STANDIN) then
    why = "sbx-modal-bridge / modal-standin are not built in " .. M.BUILD .. " (Go >= 1.25 is missing: ./dev build says what to install)"
  elseif not (os.getenv("MODAL_TOKEN_ID") and os.getenv("MODAL_TOKEN_SECRET")) then
    why = "MODAL_TOKEN_ID and MODAL_TOKEN_SECRET are not set (ctest sets test values for the stand-in)"
  else
    local ok, bwhy = require("sbx.providers.builtin.bwrap").available()
    if not ok then why = "the stand-in runs its sandboxes under bwrap: " .. tostring(bwhy) end
  end
  assert(not why or os.getenv("SBX_REQUIRE_MODAL") ~= "1", "modal is required here but unavailable: " .. tostring(why))
  return why == nil, why
end

local server

---The stand-in of this process, started on first use.
function M.start()
  if server and server.p:running() then return server end
  local state = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/modal-standin-" .. proc.getpid()
  assert(fs.mkdir_host(state))
  local log = state .. "/calls.jsonl"
  local p = assert(proc.spawn{ argv = { M.STANDIN, "--state", state .. "/world", "--log", log },
    env = { "PATH=/usr/local/bin:/usr/bin:/bin", "MODAL_TOKEN_ID=" .. os.getenv("MODAL_TOKEN_ID"),
            "MODAL_TOKEN_SECRET=" .. os.getenv("MODAL_TOKEN_SECRET") },
    keep_stdin = true, stream = true, max_output = 0 })
  local got, err = "", ""
  local deadline = loop.now() + 30
  while not got:find("\n") and loop.now() < deadline do
    local which, chunk = p:read()
    if not which then break end
    if which == "stdout" then got = got .. chunk else err = err .. chunk end
  end
  local port = got:match("^listening 127%.0%.0%.1:(%d+)\n")
  assert(port, "modal-standin did not start: " .. got .. err)
  -- its stderr from here on is drained by nobody: it writes none unless it fails
  server = { p = p, port = tonumber(port), url = "http://127.0.0.1:" .. port, log = log, state = state }
  server.host_env = "MODAL_SERVER_URL=" .. server.url .. " MODAL_TOKEN_ID=" .. os.getenv("MODAL_TOKEN_ID")
                    .. " MODAL_TOKEN_SECRET=" .. os.getenv("MODAL_TOKEN_SECRET") .. " "
  return server
end

---This process's config for the modal provider, pointed at the stand-in `s`
---(a config given as a table gets no schema defaults: every key is named).
function M.configure(s, extra)
  local c = { server_url = s.url, token_id_env = "MODAL_TOKEN_ID", token_secret_env = "MODAL_TOKEN_SECRET",
              server_url_env = "MODAL_SERVER_URL", app = "sbxlua", image = "python:3.12-slim-bookworm",
              workdir = "/workspace" }
  for k, v in pairs(extra or {}) do c[k] = v end
  require("sbx.core.config").use{ providers = { modal = c } }
end

---The calls the stand-in logged so far: a list of { method, request, code }.
function M.calls()
  local out = {}
  for line in (fs.read_host(server.log, 64 << 20) or ""):gmatch("[^\n]+") do
    out[#out + 1] = require("cjson").decode(line)
  end
  return out
end

---The stand-in's calls of `method` (the short name, e.g. "SandboxCreateV2").
function M.calls_of(method)
  local out = {}
  for _, c in ipairs(M.calls()) do
    if c.method:match("/([^/]+)$") == method then out[#out + 1] = c end
  end
  return out
end

return M
