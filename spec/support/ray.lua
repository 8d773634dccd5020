-- The test Ray cluster (spec/support/ray.sh) for the ray specs:
--   local R = require "spec.support.ray"
--   if not R.gate("ray: ...") then return end     -- a skip with one line
--   teardown(R.release)
-- gate() uses the cluster ./dev started (build/ray/cluster.env), or starts
-- one (installing Ray into a venv first); spec processes running in
-- parallel share it, and the last to release() stops one a spec started.
-- Where Ray cannot be installed or started the spec is skipped
-- with the reason, unless CI=true or SBX_REQUIRE_RAY=1: then it fails.
-- It exports SBX_RAY_ADDRESS and RAY_AUTH_TOKEN (the provider's default
-- variables) to this process and the sbxlua processes it starts.
local proc = require "sbx.proc"
local busted = require "busted"

local R = {}

R.SOURCE = os.getenv("SBX_SOURCE_DIR") or "."
R.SCRIPT = R.SOURCE .. "/spec/support/ray.sh"
R.DIR = os.getenv("SBX_RAY_DIR") or (R.SOURCE .. "/build/ray")

local function sh(cmd)
  local f = io.popen(cmd .. " 2>&1")
  local out = f:read("a")
  local ok, _, code = f:close()
  return out, ok and 0 or code
end
R.sh = sh

local function parse(text)
  local e = {}
  for k, v in text:gmatch("([%w_]+)=([^\n]*)") do e[k] = v end
  return e.SBX_RAY_ADDRESS and e or nil
end

local function read(path)
  local f = io.open(path)
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

---script(args) -> output, status of spec/support/ray.sh ARGS.
function R.script(args) return sh("SBX_RAY_DIR=" .. R.DIR .. " " .. R.SCRIPT .. " " .. args) end

---cluster() -> the env table of a running cluster (started when needed) |
---nil, why.
function R.cluster()
  if R.env then return R.env end
  local out, status = R.script("use " .. proc.getpid())
  if status ~= 0 then return nil, "the test cluster did not start: " .. out:gsub("%s+$", ""):sub(-800) end
  local e = parse(out)
  if not e then return nil, "spec/support/ray.sh start printed no cluster: " .. out:sub(-400) end
  R.using = true
  e.token = (read(e.SBX_RAY_TOKEN_FILE) or ""):gsub("%s+$", "")
  proc.setenv("SBX_RAY_ADDRESS", e.SBX_RAY_ADDRESS)
  proc.setenv("RAY_AUTH_TOKEN", e.token)
  R.env = e
  return e
end

---gate(title) -> env | false: as cluster(); unavailable is a pending test
---saying why, or (CI=true, SBX_REQUIRE_RAY=1) an error.
function R.gate(title)
  local e, why = R.cluster()
  if e then return e end
  assert(os.getenv("CI") ~= "true" and os.getenv("SBX_REQUIRE_RAY") ~= "1",
         "ray is required here but unavailable: " .. tostring(why))
  busted.describe(title, function() busted.pending("ray unavailable: " .. tostring(why)) end)
  return false
end

---release(): this process is done with the cluster; the last spec process
---to finish stops one a spec started (./dev's own stays for the next run).
function R.release()
  if R.using then R.script("unuse " .. proc.getpid()) R.using = false end
end

---api(method, path [, body]) -> decoded body, HTTP status (curl, as a
---user of the cluster would; the spec's own view of the cluster).
function R.api(method, path, body)
  local e = assert(R.env, "no cluster")
  local cmd = "curl -s -w '\\n%{http_code}' -X " .. method .. " -H 'Authorization: Bearer " .. e.token .. "'"
  if body then cmd = cmd .. " -H 'content-type: application/json' --data-binary " .. "'" .. body:gsub("'", "'\\''") .. "'" end
  local out = sh(cmd .. " '" .. e.SBX_RAY_ADDRESS .. path .. "'")
  local text, status = out:match("^(.*)\n(%d+)$")
  return require("cjson.safe").decode(text or ""), tonumber(status)
end

---jobs(prefix) -> the cluster's jobs whose submission_id starts with prefix.
function R.jobs(prefix)
  local list = R.api("GET", "/api/jobs/") or {}
  local out = {}
  for _, j in ipairs(list) do
    if type(j.submission_id) == "string" and j.submission_id:sub(1, #prefix) == prefix then out[#out + 1] = j end
  end
  return out
end

---node(label) -> the node whose sbx.node label is `label` (alive), or nil.
function R.node(label)
  local d = R.api("GET", "/api/v0/nodes?limit=1000")
  for _, n in ipairs(d and d.data.result.result or {}) do
    if n.state == "ALIVE" and (n.labels or {})["sbx.node"] == label then return n end
  end
end

return R
