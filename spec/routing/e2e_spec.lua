-- Routing end to end on the real backends (local and a real Docker engine):
-- needs, only/ignore/isolation/max_price with config prices, an unreachable
-- engine, max_concurrent spilling to local, and the ledger of real sandboxes.
local sbx = require "sbx"
local proc = require "sbx.proc"
local errors = require "sbx.core.errors"
local docker = require "sbx.providers.builtin.docker"
local router = require "sbx.routing"
local json = require "cjson"
local S = require "spec.support"

local IMAGE, BIN = S.IMAGE, S.BIN
local H = S.home("e2e")
local DIR, write = H.dir, H.write

-- The host's backends these specs compare (others, like bwrap, may be present too).
local HOST = { "local", "docker" }

if not S.gate("docker", "routing on real backends") then return end

-- Prices from a config: docker costs $0.50/h, local $0.01/h.
local PRICED = write("priced.yaml", "providers:\n"
  .. "  docker: { image: " .. IMAGE .. ", price: { per_hour: 0.5 } }\n"
  .. "  local: { price: { per_hour: 0.01 } }\n")

describe("routing on real backends", function()
  before_each(function() router.reset(); sbx.config(PRICED) end)
  after_each(function() sbx.config({}) end)

  it("needs = {'snapshot'} lands on docker", function()
    local sb <close> = sbx.sandbox{ needs = { "snapshot" } }
    assert.equal("docker", sb.backend)
    assert.equal("hi\n", sb:execute_command("echo hi").stdout)
  end)

  it("only, ignore, isolation and max_price decide between local and docker", function()
    do
      local sb <close> = sbx.sandbox{ only = { "docker" } }
      assert.equal("docker", sb.backend)
    end
    do
      local sb <close> = sbx.sandbox{ only = HOST, ignore = { "local" } }
      assert.equal("docker", sb.backend)
    end
    do
      local sb <close> = sbx.sandbox{ only = HOST, isolation = "container" }
      assert.equal("docker", sb.backend)
    end
    do
      local sb <close> = sbx.sandbox{ only = HOST, max_price = 0.1 }
      assert.equal("local", sb.backend)
    end
    local okc, e = pcall(sbx.sandbox, { only = HOST, isolation = "container", max_price = 0.1 })
    assert.is_false(okc)
    assert.is_true(errors.is(e, "NoRouteError"))
    assert.matches("docker: costs %$0.5000/h, over max_price", e.message)
    assert.matches("local: isolation 'process' is below 'container'", e.message)
  end)

  it("a docker engine that is unreachable makes routing fall back to local", function()
    local job = write("down.lua", [[
      local sb <close> = sbx.sandbox{ only = { "docker", "local" }, policy = function(req, c)
        local order = {}
        for _, x in ipairs(c) do if x.name == "docker" then table.insert(order, 1, x.name) else order[#order + 1] = x.name end end
        return { order = order } end }
      print("landed on " .. sb.backend)
      local ok, e = pcall(sbx.sandbox, { needs = { "snapshot" } })
      print(e.kind, e.message)
    ]])
    local p = assert(proc.spawn{ argv = { BIN, job }, timeout = 60,
      env = { "PATH=/usr/bin:/bin", "HOME=" .. DIR, "SBX_STATE_DIR=" .. DIR, "DOCKER_HOST=unix:///nonexistent" } })
    local r = p:wait()
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("landed on local", r.stdout)
    assert.matches("NoRouteError", r.stdout)
    assert.matches("docker: unavailable: no Docker socket at /nonexistent", r.stdout)
  end)

  it("docker at max_concurrent spills the next request to local", function()
    sbx.config(write("limited.yaml", "providers:\n"
      .. "  docker: { image: " .. IMAGE .. ", max_concurrent: 1 }\n"
      .. "  local: { price: { per_hour: 0.01 } }\n"))
    local a <close> = sbx.sandbox{ only = HOST }
    local b <close> = sbx.sandbox{ only = HOST }
    assert.equal("docker", a.backend)      -- free, so the default policy takes it first
    assert.equal("local", b.backend)       -- docker is full: spilled
    local r = sbx.route{ only = HOST }
    assert.matches("at max_concurrent %(1%)", r.reasons.docker)
  end)

  it("the ledger records real sandboxes with their prices", function()
    local before = sbx.usage{ by = "provider" }.groups
    local d0 = before.docker and before.docker.sandboxes or 0
    local l0 = before["local"] and before["local"].sandboxes or 0
    do
      local sb <close> = sbx.sandbox("docker", { labels = { suite = "e2e" } })
      local sl <close> = sbx.sandbox("local", { labels = { suite = "e2e" } })
      sbx.sleep(0.2)
    end
    local u = sbx.usage{ by = "provider" }
    assert.equal(d0 + 1, u.groups.docker.sandboxes)
    assert.equal(l0 + 1, u.groups["local"].sandboxes)
    assert.is_true(u.groups.docker.cost_usd > 0)          -- $0.50/h x >0.2 s
    assert.is_true(u.groups.docker.seconds >= 0.2)
    local byl = sbx.usage{ by = "label" }
    assert.is_true(byl.groups["suite=e2e"].sandboxes >= 2)
    -- and the CLI reads the same ledger
    local p = assert(proc.spawn{ argv = { BIN, "usage", "--json", "--since", "1h" }, timeout = 30,
      env = { "PATH=/usr/bin:/bin", "HOME=" .. DIR, "SBX_STATE_DIR=" .. require("sbx.state.owner").state_dir() } })
    local r = p:wait()
    assert.equal(0, r.exit_code, r.stderr)
    assert.is_true(json.decode(r.stdout).groups.docker.sandboxes >= 1)
  end)

  it("sbxlua route --explain says why each backend was kept or skipped", function()
    local p = assert(proc.spawn{ argv = { BIN, "--config", PRICED, "route", "--need", "snapshot", "--explain" },
      timeout = 30, env = { "PATH=/usr/bin:/bin", "HOME=" .. DIR, "SBX_STATE_DIR=" .. DIR } })
    local r = p:wait()
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("order: docker", r.stdout)
    assert.matches("docker%s+kept%s+%$0.5000/h", r.stdout)
    assert.matches("local%s+skipped%s+lacks capability 'snapshot'", r.stdout)
    p = assert(proc.spawn{ argv = { BIN, "route", "--need", "gpu", "--json" },
      timeout = 30, env = { "PATH=/usr/bin:/bin", "HOME=" .. DIR, "SBX_STATE_DIR=" .. DIR } })
    r = p:wait()
    assert.equal(1, r.exit_code)
    local d = json.decode(r.stdout)
    assert.same({}, d.order)
    assert.equal("lacks capability 'gpu'", d.reasons["local"])
  end)
end)
