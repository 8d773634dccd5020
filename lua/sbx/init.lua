--- sbx: one API over many sandbox backends (see API.md).
local loop = require "sbx.loop"
local errors = require "sbx.errors"
local check = require "sbx.check"
local owner = require "sbx.owner"
local providers = require "sbx.providers"
local sandbox = require "sbx.sandbox"
local tasks = require "sbx.tasks"
local router = require "sbx.router"
local presets = require "sbx.presets"
local pool = require "sbx.pool"   -- also lets routing take warm sandboxes from open pools

loop.set_error_factory(errors.new)

local sbx = {}
sbx.version = "0.1.0"
sbx.errors = errors
do
  local cjson = require "cjson"
  local j = cjson.new()
  sbx.json = { encode = j.encode, decode = j.decode, null = j.null }
end

-- Every create option of API.md and its type.
local OPTIONS = {
  backend = "string", policy = { "string", "function" }, needs = "list", only = "list",
  ignore = "list", isolation = "string", max_price = "number", region = "string",
  preset = { "string", "table" }, cpu = "number", memory_mb = "number", disk_mb = "number",
  gpu = { "number", "string", "boolean" }, timeout_secs = "number",
  command_timeout_secs = "number", image = "string", template = "string", env_vars = "map",
  allow_internet = "boolean", snapshot_id = "string", workdir = "string", files = "map",
  git_repo = "string", git_ref = "string", labels = "map", backend_options = "table",
}
local function validate(opts)
  opts = check.options(opts, OPTIONS, "sandbox")
  for _, k in ipairs{ "needs", "only", "ignore" } do
    if opts[k] then check.list(opts[k], "sandbox", k) end
  end
  for _, k in ipairs{ "timeout_secs", "command_timeout_secs" } do
    if opts[k] and not (opts[k] > 0) then check.bad("sandbox", k .. " must be > 0 seconds") end
  end
  for _, k in ipairs{ "cpu", "memory_mb" } do
    if opts[k] and not (opts[k] > 0) then check.bad("sandbox", k .. " must be > 0, got " .. opts[k]) end
  end
  if opts.preset ~= nil then opts.preset = presets.resolve(opts) end   -- unknown: ConfigError
  if opts.git_ref and not opts.git_repo then check.bad("sandbox", "git_ref needs git_repo") end
  return opts
end

-- clone -> files -> preset setup (API.md order); a failure destroys the sandbox.
local function prepare(sb, opts, setup)
  if opts.git_repo then
    local name = opts.git_repo:gsub("/+$", ""):match("([^/:]+)$"):gsub("%.git$", "")
    local args = { "clone", "--depth", "1", "--quiet" }
    if opts.git_ref then args[#args + 1] = "--branch"; args[#args + 1] = opts.git_ref end
    args[#args + 1] = opts.git_repo
    args[#args + 1] = name
    local ok, r = pcall(sb.execute_command, sb, "git", args)
    if not ok then error("git is not available in the sandbox (" .. tostring(r) .. ")", 0) end
    if r.exit_code ~= 0 then
      error("git clone " .. opts.git_repo .. " failed: " .. r.stderr .. r.stdout, 0)
    end
  end
  local paths = {}
  for p in pairs(opts.files or {}) do paths[#paths + 1] = p end
  table.sort(paths)
  for _, p in ipairs(paths) do sb:write_file(p, tostring(opts.files[p])) end
  for _, cmd in ipairs(setup) do
    local r = sb:execute_command(cmd, nil, { timeout = opts.command_timeout_secs or 1800 })
    if r.exit_code ~= 0 then
      error("preset setup command failed (" .. (r.timed_out and "timed out" or r.signal
            or ("exit " .. tostring(r.exit_code))) .. "): " .. cmd .. "\n" .. r.stdout .. r.stderr, 0)
    end
  end
end

local function create_on(name, opts, lease)
  local p = providers.get(name)
  local ok, reason = p.available()
  if not ok then errors.raise("BackendNotInstalledError", name .. ": " .. tostring(reason), { backend = name }) end
  local miss = router.unsupported(p.descriptor, opts)
  if #miss > 0 then
    errors.raise("FeatureNotSupportedError", name .. " cannot honour " .. table.concat(miss, ", "),
                 { backend = name, op = "create" })
  end
  local preset = opts.preset
  opts = presets.merge(opts, preset, name, p.descriptor)
  local setup = presets.setup_for(preset, name, opts.image, p.descriptor.options.image)
  local id = owner.new_id()
  local ttl = opts.timeout_secs or 3600
  local s = owner.before_create{ event = "create", id = id, backend = name, created = os.time(),
                                 ttl = ttl, labels = opts.labels, host = owner.hostname() }
  local spec = { id = id, session = s.id, ttl = ttl }
  for k, v in pairs(opts) do if spec[k] == nil then spec[k] = v end end
  local okc, h = pcall(p.create, spec)
  if not okc then
    owner.record{ event = "destroy", id = id, failed = true }
    if errors.is(h, "SandboxError") or errors.is(h, "Cancelled") then error(h, 0) end
    errors.raise("SandboxCreationError", name .. ": " .. tostring(h), { backend = name, op = "create" })
  end
  local tracked = router.track(p, name, opts, lease, { id = id, session = s.id })
  local sb = sandbox.new{ id = id, backend = name, provider = tracked, handle = h, journaled = true,
                          env = check.env(opts.env_vars, "sandbox", "env_vars"),
                          command_timeout = opts.command_timeout_secs }
  owner.record{ event = "ready", id = id, state = p.session_state(h) }
  owner.add(sb)
  sandbox.expire_after(sb, ttl)
  sb._preset = preset
  local pok, perr = pcall(prepare, sb, opts, setup)
  if not pok then
    pcall(sb.destroy, sb)
    if errors.is(perr, "Cancelled") then error(perr, 0) end
    errors.raise("SandboxCreationError", "preparing the sandbox failed: " .. tostring(perr),
                 { backend = name, op = "create", phase = "prepare" })
  end
  return sb
end

---Create a sandbox now. sbx.sandbox([backend], [opts]).
---@return table Sandbox
function sbx.sandbox(backend, opts)
  if type(backend) == "table" and opts == nil then backend, opts = nil, backend end
  if backend ~= nil and type(backend) ~= "string" then
    check.bad("sandbox", "the backend must be a name like \"local\", got " .. type(backend))
  end
  opts = validate(opts)
  if backend and opts.backend and backend ~= opts.backend then
    check.bad("sandbox", "backend given twice: '" .. backend .. "' and opts.backend '" .. opts.backend .. "'")
  end
  backend = backend or opts.backend
  if backend then
    providers.get(backend)   -- unknown names raise ConfigError
    return router.pinned(backend, opts, create_on)
  end
  return router.create(opts, create_on)
end

---Dry-run routing: { order = {...}, reasons = { name = why skipped }, plan = {...}, ... }
function sbx.route(request)
  return router.route(validate(request))
end

---Spend from the ledger, grouped: sbx.usage{ by = "provider"|"label"|"job", since = "24h" }
function sbx.usage(o) return require("sbx.meter").usage(o) end

---Cap this job's spend in dollars (nil: no cap); returns what is left.
function sbx.budget(usd) return require("sbx.meter").set_budget(usd) end

---Use a config file (nil: the lookup order of API.md); returns the effective config.
function sbx.config(path) return require("sbx.config").use(path) end

---Reattach to a sandbox from its session_state(). The caller does not become
---its owner: it is destroyed only by an explicit destroy() or <close>.
function sbx.resume(state)
  if type(state) ~= "table" or type(state.backend) ~= "string" or type(state.id) ~= "string"
     or type(state.state) ~= "table" then
    check.bad("resume", "expected a table from sb:session_state()")
  end
  local p = providers.get(state.backend)
  local st = {}
  for k, v in pairs(state.state) do st[k] = v end
  st.id = state.id
  local h = p.resume(st)
  return sandbox.new{ id = state.id, backend = state.backend, provider = p, handle = h,
                      env = check.env(state.env_vars, "resume", "env_vars"),
                      command_timeout = state.command_timeout_secs }
end

---A client bound to one backend, with default options.
function sbx.client(backend, defaults)
  check.string(backend, "client", "backend")
  providers.get(backend)
  defaults = check.options(defaults, OPTIONS, "client")
  local c = {}
  function c:create(opts)
    local merged = {}
    for k, v in pairs(defaults) do merged[k] = v end
    for k, v in pairs(check.options(opts, OPTIONS, "create")) do merged[k] = v end
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
  return pool.new(opts, { sandbox = sbx.sandbox, options = OPTIONS, validate = validate })
end

sbx.agent = require "sbx.agent"

---sbx.register_preset{ name =, description =, image =, setup_commands =, ... }
function sbx.register_preset(p) return presets.register(p) end
---name -> preset, every preset this process can use.
function sbx.presets() return presets.all() end
sbx.spawn = tasks.spawn
sbx.parallel = tasks.parallel
sbx.sleep = loop.sleep
sbx.run = tasks.run

return sbx
