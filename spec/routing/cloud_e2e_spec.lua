-- Routing end to end over the host's engines and the cloud providers, each
-- cloud behind its stand-in (a process of its own whose sandboxes are real
-- bwrap ones): prices from PRICES.md (the meter's table), `cheapest` by the
-- requested resources, `needs` filtering, an outage failing over, the
-- ledger per provider, a budget stopping creates, and `sbxlua route
-- --explain` naming every provider with its reason.
local sbx = require "sbx"
local proc = require "sbx.proc"
local router = require "sbx.routing"
local errors = require "sbx.core.errors"
local json = require "cjson"
local S = require "spec.support"

if not S.gate("bwrap", "routing over the cloud stand-ins") then return end
if not S.gate("docker", "routing over the cloud stand-ins") then return end
local modal = require "spec.support.modal"
local HAS_MODAL = modal.available()
if not HAS_MODAL and os.getenv("CI") == "true" then error("modal: " .. select(2, modal.available())) end

local H = S.home("cloud-e2e")
local e2b_run = require "spec.support.standin.e2b_run"
local TL = require "spec.support.standin.tensorlake"
local DP = require "spec.support.standin.daytona_proc"

local e2b, tl, dt, md, CONFIG, ENV
local CLOUDS = { "e2b", "daytona", "tensorlake", HAS_MODAL and "modal" or nil }

setup(function()
  e2b = e2b_run.start{ backend = "bwrap" }
  tl = TL.start()
  dt = DP.start{ max_cpu = 8 }
  dt:use()
  proc.setenv("E2B_API_KEY", e2b.key)
  proc.setenv("TENSORLAKE_API_KEY", tl.key)
  local yaml = "providers:\n"
    .. "  docker: { image: " .. S.IMAGE .. " }\n"
    .. "  e2b: { api_url: " .. e2b.url .. ", sandbox_url: " .. e2b.url .. " }\n"
    .. "  tensorlake: { api_url: " .. tl.url .. " }\n"
  ENV = { S.PATH, "HOME=" .. H.dir, "E2B_API_KEY=" .. e2b.key, "TENSORLAKE_API_KEY=" .. tl.key,
          "DAYTONA_API_KEY=" .. dt.key, "DAYTONA_API_URL=" .. dt.url }
  if HAS_MODAL then
    md = modal.start()
    yaml = yaml .. "  modal: { server_url: " .. md.url .. ", image: python:3.12-slim-bookworm, workdir: /workspace }\n"
    ENV[#ENV + 1] = "MODAL_TOKEN_ID=" .. os.getenv("MODAL_TOKEN_ID")
    ENV[#ENV + 1] = "MODAL_TOKEN_SECRET=" .. os.getenv("MODAL_TOKEN_SECRET")
  end
  CONFIG = H.write("sbx.yaml", yaml)
  ENV[#ENV + 1] = "SBX_CONFIG=" .. CONFIG
end)

teardown(function()
  sbx.config({})
  if e2b then e2b:stop() end
  if tl then tl:stop() end
  DP.restore()
  if dt then dt:stop() end
end)

before_each(function()
  sbx.config(CONFIG)
  router.reset()
  require("sbx.routing.health").reset()
  e2b:clear_faults()
  tl:clear_faults()
  dt:clear()
end)

local function has(list, x)
  for _, v in ipairs(list) do if v == x then return true end end
  return false
end

describe("routing over local, docker and the cloud stand-ins", function()
  it("every provider is available and priced as PRICES.md says", function()
    local ps = sbx.providers()
    for _, n in ipairs{ "local", "docker", table.unpack(CLOUDS) } do
      assert.is_true(ps[n].available, n .. ": " .. tostring(ps[n].reason))
    end
    local prices = require("sbx.routing.meter").PRICES
    assert.equal(0.0504, prices.e2b.per_vcpu_hour)
    assert.equal(0.05, prices.tensorlake.per_vcpu_hour)
  end)

  it("cheapest picks by price for the requested resources, and the sandbox works there", function()
    -- 2 vCPU + 4 GiB an hour: tensorlake $0.160, daytona $0.166, modal $0.239;
    -- e2b sizes by template (no cpu option): skipped
    local r = sbx.route{ policy = "cheapest", only = CLOUDS, cpu = 2, memory_mb = 4096 }
    assert.equal("tensorlake", r.order[1])
    assert.equal("daytona", r.order[2])
    assert.is_false(has(r.order, "e2b"))
    if HAS_MODAL then assert.equal("modal", r.order[#r.order]) end
    local sb <close> = sbx.sandbox{ policy = "cheapest", only = CLOUDS, cpu = 2, memory_mb = 4096 }
    assert.equal("tensorlake", sb.backend)
    assert.equal("tl\n", sb:execute_command("echo tl").stdout)
  end)

  it("needs = {'snapshot'} leaves out what cannot snapshot", function()
    local r = sbx.route{ needs = { "snapshot" }, only = { "local", "bwrap", "docker", table.unpack(CLOUDS) } }
    assert.is_false(has(r.order, "local"))
    assert.is_false(has(r.order, "bwrap"))
    for _, n in ipairs{ "docker", "e2b", "daytona", "tensorlake" } do assert.is_true(has(r.order, n), n) end
  end)

  it("an outage of the cheapest fails over to the next, and the ledger shows each provider", function()
    tl:fault{ route = "POST /sandboxes", status = 503, body = "upstream unavailable", times = -1 }
    tl:fault{ route = "POST /v1/namespaces/[^/]+/sandboxes", status = 503, body = "upstream unavailable", times = -1 }
    local sb <close> = sbx.sandbox{ policy = "cheapest", only = CLOUDS, cpu = 2, memory_mb = 4096 }
    assert.equal("daytona", sb.backend)                -- the next cheapest
    assert.equal("ok\n", sb:execute_command("echo ok").stdout)
    local failed_over = sb.backend
    sb:destroy()
    tl:clear_faults()
    local t <close> = sbx.sandbox("tensorlake")
    t:destroy()
    local u = sbx.usage{ by = "provider" }
    assert.is_truthy(u.groups[failed_over], json.encode(u))
    assert.is_truthy(u.groups.tensorlake, json.encode(u))
    assert.is_true(u.groups.tensorlake.cost_usd > 0)       -- a priced provider costs something
    assert.is_true(u.total.sandboxes >= 2)
  end)

  it("a budget stops creates on a priced provider", function()
    sbx.budget(0.00001)
    local err = S.caught(function()
      sbx.sandbox("tensorlake", { cpu = 2, memory_mb = 4096, timeout_secs = 3600 })
    end)
    assert.equal("BudgetExceededError", err.kind)
    sbx.budget(nil)
  end)

  it("sbxlua route --explain shows every provider with its reason", function()
    local r = S.sbxlua({ "route", "--explain", "--policy", "cheapest", "--cpu", "2", "--memory-mb", "4096" },
                       { env = ENV })
    assert.equal(0, r.exit_code, r.stderr)
    if os.getenv("SBX_SHOW") then io.stderr:write(r.stdout) end
    for _, n in ipairs{ "local", "docker", "e2b", "daytona", "tensorlake", HAS_MODAL and "modal" or nil } do
      assert.matches(n, r.stdout, 1, true)
    end
    assert.matches("e2b[^\n]*cpu", r.stdout)       -- why e2b is out: it has no cpu option
  end)
end)
