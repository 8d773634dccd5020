-- Fake providers for routing specs: registered through sbx.providers,
-- deterministic (their behaviour is a table the spec edits), with the
-- clock of sbx.health injected.
local providers = require "sbx.providers"
local health = require "sbx.routing.health"
local router = require "sbx.routing"
local policy = require "sbx.routing.policy"
local config = require "sbx.core.config"
local meter = require "sbx.routing.meter"
local loop = require "sbx.loop"

local S = {}

S.now = 1000
health.clock = function() return S.now end

local registered = {}

---fake(name, { isolation=, caps=, options=, price=, regions=, down=, fail=, delay=, held= })
---`held = true` keeps create waiting until the spec sets it to false.
---The returned control table counts created/destroyed and can be edited.
function S.fake(name, o)
  o = o or {}
  o.created, o.destroyed, o.creates = 0, 0, 0
  local p = { descriptor = { name = name, isolation = o.isolation or "microvm",
                             capabilities = o.caps or { "exec", "files" }, options = o.options or {},
                             price = o.price or {}, regions = o.regions or {} } }
  p.available = function()
    if o.down then return false, "fake " .. name .. " is down" end
    return true
  end
  p.create = function(spec)
    o.creates = o.creates + 1
    if o.delay then loop.sleep(o.delay) end
    while o.held do loop.sleep(0.005) end
    if o.fail then
      local f = o.fail
      if type(f) == "function" then f = f() end
      if f then error(f, 0) end
    end
    o.created = o.created + 1
    return { id = spec.id }
  end
  p.destroy = function() o.destroyed = o.destroyed + 1 end
  p.session_state = function() return {} end
  p.resume = function(st) return { id = st.id } end
  p.home = function() return "/" end
  p.is_alive = function() return true end
  providers.register(name, p)
  registered[#registered + 1] = name
  return o
end

---Forget every fake, stats, breakers, loaded policies, budget, config.
function S.reset()
  for _, n in ipairs(registered) do providers.register(n, nil) end
  registered = {}
  router.reset()
  policy.reset()
  meter.set_budget(nil)
  config.use({ providers = {}, routing = {} })
  S.now = 1000
end

function S.write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

S.DIR = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/routing-" .. require("sbx.proc").getpid()
os.execute("mkdir -p '" .. S.DIR .. "'")

return S
