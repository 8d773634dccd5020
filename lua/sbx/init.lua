--- sbx: one API over many sandbox backends (see API.md).
local loop = require "sbx.loop"
local errors = require "sbx.core.errors"
local check = require "sbx.core.check"
local owner = require "sbx.state.owner"
local providers = require "sbx.providers"
local sandbox = require "sbx.sandbox"
local create = require "sbx.sandbox.create"
local tasks = require "sbx.sandbox.tasks"
local router = require "sbx.routing"
local presets = require "sbx.sandbox.presets"
local pool = require "sbx.pool"   -- also lets routing take warm sandboxes from open pools

loop.set_error_factory(errors.new)

-- os.exit(code) without close = true skips lua_close and so every
-- finalizer: in a host embedding sbx (lua5.4) the sandboxes would be left.
-- sbx wraps it to destroy what this process owns first (sbxlua's job
-- runner replaces it again while a job runs: there it unwinds instead).
do
  local exit = os.exit
  os.exit = function(code, close)    -- luacheck: ignore
    if not close then pcall(owner.destroy_all) end
    return exit(code, close)
  end
end

local sbx = {}
sbx.version = "0.1.0"
sbx.errors = errors
do
  local cjson = require "cjson"
  local j = cjson.new()
  sbx.json = { encode = j.encode, decode = j.decode, null = j.null }
end

---Create a sandbox now. sbx.sandbox([backend], [opts]).
---@return table Sandbox
sbx.sandbox = create.sandbox

---Dry-run routing: { order = {...}, reasons = { name = why skipped }, plan = {...}, ... }
function sbx.route(request)
  return router.route(create.validate(request))
end

---Spend from the ledger, grouped: sbx.usage{ by = "provider"|"label"|"job", since = "24h" }
function sbx.usage(o) return require("sbx.routing.meter").usage(o) end

---Cap this job's spend in dollars (nil or false: no cap); returns what is
---left. sbx.budget() only returns what is left.
function sbx.budget(...) return require("sbx.routing.meter").budget(...) end

---Use a config file (nil: the lookup order of API.md); returns the effective config.
function sbx.config(path) return require("sbx.core.config").use(path) end

---Reattach to a sandbox from its session_state() (not owned: see create.resume).
sbx.resume = create.resume

---A client bound to one backend, with default options.
function sbx.client(backend, defaults)
  check.string(backend, "client", "backend")
  providers.get(backend)
  defaults = check.options(defaults, create.OPTIONS, "client")
  local c = {}
  function c:create(opts)
    local merged = {}
    for k, v in pairs(defaults) do merged[k] = v end
    for k, v in pairs(check.options(opts, create.OPTIONS, "create")) do merged[k] = v end
    merged.backend = nil
    return sbx.sandbox(backend, merged)
  end
  function c:resume(state)
    if type(state) == "table" and state.backend ~= backend then
      check.bad("resume", "state is for backend '" .. tostring(state.backend)
                .. "', this client is for '" .. backend .. "'")
    end
    return sbx.resume(state)
  end
  return c
end

function sbx.providers() return providers.describe() end

---A warm pool: sbx.pool{ backend =, size =, max_idle_secs =, reuse =, name =, ...sandbox options }
function sbx.pool(opts)
  return pool.new(opts, { sandbox = sbx.sandbox, options = create.OPTIONS, validate = create.validate })
end

sbx.agent = require "sbx.agents"

---sbx.register_preset{ name =, description =, image =, setup_commands =, ... }
function sbx.register_preset(p) return presets.register(p) end
---name -> preset, every preset this process can use.
function sbx.presets() return presets.all() end
sbx.spawn = tasks.spawn
sbx.parallel = tasks.parallel
sbx.sleep = tasks.sleep
sbx.run = tasks.run

return sbx
