-- Spill-over from the local machine to a real Ray cluster: with local at
-- its max_concurrent, routed creates go to ray (the default policy takes
-- the cheaper local first), every sandbox works, the ledger counts each
-- provider's.
local sbx = require "sbx"
local router = require "sbx.routing"
local S = require "spec.support"
local R = require "spec.support.ray"

local env = R.gate("routing: local spills over to ray")
if not env then return end
teardown(R.release)

local H = S.home("spill")

describe("routing: local spills over to ray", function()
  after_each(function() sbx.config({}) end)

  it("8 routed sandboxes with local capped at 4: 4 local, 4 on ray, all working, ledger per provider", function()
    router.reset()
    sbx.config(H.write("spill.yaml", "providers:\n"
      .. "  local: { max_concurrent: 4, price: { per_hour: 0.01 } }\n"
      .. "  ray: { price: { per_hour: 0.10 } }\n"))
    local before = sbx.usage{ by = "provider" }.groups
    local l0 = before["local"] and before["local"].sandboxes or 0
    local r0 = before.ray and before.ray.sandboxes or 0
    local sbs, on = {}, { ["local"] = 0, ray = 0 }
    for i = 1, 8 do
      local sb = sbx.sandbox{ only = { "local", "ray" } }
      sbs[i] = sb
      on[sb.backend] = on[sb.backend] + 1
      if i <= 4 then assert.equal("local", sb.backend, "sandbox " .. i) else assert.equal("ray", sb.backend, "sandbox " .. i) end
    end
    assert.same({ ["local"] = 4, ray = 4 }, on)
    local out = sbx.parallel(sbs, function(sb)
      return sb:execute_command("echo $((6 * 7))").stdout
    end, { concurrency = 8 })
    for i = 1, 8 do assert.equal("42\n", out[i], "sandbox " .. i .. " on " .. sbs[i].backend) end
    local r = sbx.route{ only = { "local", "ray" } }
    assert.matches("at max_concurrent %(4%)", r.reasons["local"])
    for _, sb in ipairs(sbs) do sb:destroy() end
    local u = sbx.usage{ by = "provider" }.groups
    assert.equal(l0 + 4, u["local"].sandboxes)
    assert.equal(r0 + 4, u.ray.sandboxes)
    assert.is_true(u.ray.cost_usd > 0)
  end)
end)
