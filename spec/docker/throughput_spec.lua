-- Docker creates issued at once share what they can: one engine ping, one
-- image check, one agent-volume check for the whole wave (each of 32
-- creates making its own was a third of the engine's work in a 32 x 10
-- job). Counted in a fresh sbxlua, which has no engine connection yet.
local proc = require "sbx.proc"
local json = require "cjson"
local docker = require "sbx.providers.builtin.docker"

local IMAGE = os.getenv("SBX_TEST_IMAGE") or "sbxlua-test:bookworm"

local ok, why = docker.available()
if not ok then
  assert(os.getenv("SBX_REQUIRE_DOCKER") ~= "1", "docker is required here but unavailable: " .. tostring(why))
  describe("docker throughput", function() pending("docker unavailable: " .. tostring(why)) end)
  return
end

local JOB = [[
local http = require "sbx.http"
local json = require "cjson"
local orig, n = http.request, {}
http.request = function(o)
  local path = o.url:gsub("^http://[^/]+", ""):gsub("^/v[%d.]+", ""):gsub("%?.*", "")
  local k = (o.method or "GET") .. " " .. (path:match("^/_ping") and "/_ping"
            or path:match("^/images/.*/json$") and "/images/json"
            or path:match("^/volumes/create$") and "/volumes/create"
            or path:match("^/containers/create$") and "/containers/create"
            or path:match("^/containers/[^/]+/start$") and "/containers/start" or "other")
  n[k] = (n[k] or 0) + 1
  return orig(o)
end
local items = {}
for i = 1, 6 do items[i] = i end
local res = sbx.parallel(items, function()
  local sb <close> = sbx.sandbox("docker", { image = "@IMAGE@", labels = { sbxspec = "throughput" } })
  return sb:execute_command("true", {}).exit_code
end, { concurrency = 6 })
n.exits = res
io.write(json.encode(n))
]]

describe("docker throughput", function()
  it("6 creates at once make one ping, one image check and one agent-volume check", function()
    local env = { "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" .. (os.getenv("HOME") or "/tmp") }
    for _, k in ipairs{ "SBX_STATE_DIR", "SBX_LUA_PATH", "DOCKER_HOST" } do
      if os.getenv(k) then env[#env + 1] = k .. "=" .. os.getenv(k) end
    end
    local bin = os.getenv("SBX_BIN") or "build/sbxlua"
    local p = assert(proc.spawn{ argv = { bin, "-e", (JOB:gsub("@IMAGE@", IMAGE)) }, env = env, timeout = 300 })
    local r = p:wait()
    assert.equal(0, r.exit_code, r.stderr)
    local n = json.decode(r.stdout)
    assert.same({ 0, 0, 0, 0, 0, 0 }, n.exits)
    assert.equal(1, n["GET /_ping"])
    assert.equal(1, n["GET /images/json"])
    assert.is_true((n["POST /volumes/create"] or 0) <= 1, r.stdout)
    -- six sandboxes, plus at most one helper that fills the agent volume
    assert.is_true(n["POST /containers/create"] >= 6 and n["POST /containers/create"] <= 7, r.stdout)
    assert.equal(6, n["POST /containers/start"])
  end)
end)
