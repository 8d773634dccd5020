-- One source of truth for what a docker sandbox gets: the descriptor's
-- defaults are what the create asks the engine for, what the ledger records
-- and what both price displays (providers, route --explain) charge for.
-- Issue 15, item 18: a default container got 2 GiB while the ledger said
-- memory_mb = 1024, and per-vCPU/per-GiB prices showed $0.00/h in one
-- display and $0.03/h in the other. Real engine, real container.
local sbx = require "sbx"
local http = require "sbx.http"
local json = require "cjson"
local config = require "sbx.core.config"
local docker = require "sbx.providers.builtin.docker"

local IMAGE = os.getenv("SBX_TEST_IMAGE") or "sbxlua-test:bookworm"
local BIN = os.getenv("SBX_BIN") or "build/sbxlua"

local ok, why = docker.available()
if not ok then
  describe("docker resources", function() pending("docker unavailable: " .. tostring(why)) end)
  return
end

local function inspect(cid)
  local r = assert(http.request{ url = "http://docker/v1.41/containers/" .. cid .. "/json",
                                 unix_socket = "/var/run/docker.sock" })
  return json.decode(r.body)
end

local function last_ledger_line(id)
  local f = io.open(require("sbx.state.owner").state_dir() .. "/ledger.jsonl")
  local found
  for line in f:lines() do
    local e = json.decode(line)
    if e.id == id then found = e end
  end
  f:close()
  return found
end

describe("docker resources", function()
  local PRICE = { per_vcpu_hour = 0.01, per_gib_hour = 0.01, per_hour = 0 }
  before_each(function() config.use{ providers = { docker = { price = PRICE } } } end)
  after_each(function() config.use(nil) end)

  -- What the engine gave a sandbox created without cpu/memory_mb.
  local function default_limits()
    local sb = sbx.sandbox("docker", { image = IMAGE })
    local hc = inspect(sb:session_state().state.container).HostConfig
    local id = sb.id
    sb:destroy()
    return hc, id
  end

  it("a default sandbox: the engine's limits are what the ledger records", function()
    local hc, id = default_limits()
    local e = assert(last_ledger_line(id), "no ledger line")
    assert.equal(hc.Memory, e.memory_mb * 1024 * 1024, "the ledger's memory_mb is not what the container got")
    assert.equal(hc.NanoCpus, math.floor(e.cpu * 1e9))
    assert.near(0.01 * hc.NanoCpus / 1e9 + 0.01 * hc.Memory / 2 ^ 30, e.per_hour, 1e-9)
    local d = docker.descriptor.defaults or {}      -- the one place these come from
    assert.equal(d.memory_mb, e.memory_mb)
    assert.equal(d.cpu, e.cpu)
  end)

  it("an explicit request: the same numbers everywhere", function()
    local sb = sbx.sandbox("docker", { image = IMAGE, cpu = 0.5, memory_mb = 256 })
    local hc = inspect(sb:session_state().state.container).HostConfig
    local id = sb.id
    sb:destroy()
    assert.equal(256 * 1024 * 1024, hc.Memory)
    assert.equal(5e8, hc.NanoCpus)
    local e = assert(last_ledger_line(id))
    assert.equal(256, e.memory_mb)
    assert.equal(0.5, e.cpu)
  end)

  it("sbx.providers() and sbx.route() price a default sandbox for what it gets", function()
    local hc = default_limits()
    local want = 0.01 * hc.NanoCpus / 1e9 + 0.01 * hc.Memory / 2 ^ 30
    assert.near(want, sbx.providers().docker.price_per_hour or -1, 1e-9)
    local r = sbx.route{ only = { "docker" } }
    assert.near(want, r.candidates[1].price_per_hour, 1e-9)
  end)

  it("the CLI's providers and route --explain show the same hourly price", function()
    local cfg = os.tmpname()
    finally(function() os.remove(cfg) end)
    local f = assert(io.open(cfg, "w"))
    f:write("providers:\n  docker: { price: { per_vcpu_hour: 0.01, per_gib_hour: 0.01, per_hour: 0 } }\n")
    f:close()
    local function run(args)
      local p = io.popen("SBX_CONFIG=" .. cfg .. " " .. BIN .. " " .. args .. " 2>&1")
      local out = p:read("a")
      p:close()
      return out
    end
    local shown = run("providers"):match("\ndocker%s[^\n]*%$([%d.]+)/h")
      or run("providers"):match("^docker%s[^\n]*%$([%d.]+)/h")
    local explained = run("route --only docker --explain"):match("docker%s+kept%s+%$([%d.]+)/h")
    assert.is_truthy(shown, "providers shows no price for docker")
    assert.is_truthy(explained, "route --explain shows no price for docker")
    assert.equal(explained, shown)
    assert.near(0.03, tonumber(shown), 1e-9)
  end)
end)
