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
local workspace = require "sbx.workspace"

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

-- Every create option of API.md and its type.
local OPTIONS = {
  backend = "string", policy = { "string", "function" }, needs = "list", only = "list",
  ignore = "list", isolation = "string", max_price = "number", region = "string",
  preset = { "string", "table" }, cpu = "number", memory_mb = "number", disk_mb = "number",
  gpu = { "number", "string", "boolean" }, timeout_secs = "number",
  command_timeout_secs = "number", image = "string", template = "string", env_vars = "map",
  allow_internet = "boolean", snapshot_id = "string", workdir = "string", files = "map",
  git_repo = "string", git_ref = "string", labels = "map", backend_options = "table",
  workspace = "list",
}
-- Numeric options: check.number's rules for each.
local NUMBERS = {
  timeout_secs = { above = 0, max = check.MAX_SECONDS }, command_timeout_secs = { above = 0, max = check.MAX_SECONDS },
  cpu = { above = 0, max = 1e6 }, memory_mb = { above = 0, max = 1e12 }, disk_mb = { above = 0, max = 1e15 },
  max_price = { min = 0 },
}
-- Every option checked before anything exists: a bad value is a ConfigError
-- naming it, never a half-created sandbox.
local function validate(opts)
  opts = check.options(opts, OPTIONS, "sandbox")
  for _, k in ipairs{ "needs", "only", "ignore" } do
    if opts[k] then check.list(opts[k], "sandbox", k) end
  end
  for k, rule in pairs(NUMBERS) do
    if opts[k] ~= nil then check.number(opts[k], "sandbox", k, rule) end
  end
  if type(opts.gpu) == "number" then check.number(opts.gpu, "sandbox", "gpu", { integer = true, min = 0 }) end
  for _, k in ipairs{ "backend", "isolation", "region", "image", "template", "snapshot_id", "workdir", "git_ref" } do
    if opts[k] ~= nil then check.text(opts[k], "sandbox", k) end
  end
  if type(opts.policy) == "string" then check.text(opts.policy, "sandbox", "policy") end
  if opts.isolation and not providers.ISOLATION[opts.isolation] then
    check.bad("sandbox", "unknown isolation '" .. opts.isolation .. "' (process, namespace, container, gvisor, microvm)")
  end
  check.env(opts.env_vars, "sandbox", "env_vars")
  check.labels(opts.labels, "sandbox", "labels")
  if opts.git_repo ~= nil then
    local repo = check.text(opts.git_repo, "sandbox", "git_repo")
    local name = repo:gsub("/+$", ""):match("([^/:]+)$")
    name = name and name:gsub("%.git$", "")
    if repo:sub(1, 1) == "-" or not name or name == "" or name == "." or name == ".." then
      check.bad("sandbox", "git_repo must be a repository URL or path like https://host/org/repo.git, got '"
                .. repo .. "'")
    end
  end
  if opts.git_ref and opts.git_ref:sub(1, 1) == "-" then
    check.bad("sandbox", "git_ref must be a branch or tag name, got '" .. opts.git_ref .. "'")
  end
  if opts.preset ~= nil then opts.preset = presets.resolve(opts) end   -- unknown: ConfigError
  if opts.git_ref and not opts.git_repo then check.bad("sandbox", "git_ref needs git_repo") end
  -- files and git_repo are workspace entries: bad entries, blank dests,
  -- missing host paths are a ConfigError now
  workspace.from_options(opts)
  for path, data in pairs(opts.files or {}) do
    check.text(path, "sandbox", "files key")
    if type(data) == "number" then check.number(data, "sandbox", "files['" .. path .. "']") end
  end
  return opts
end

-- git_repo -> files -> workspace -> preset setup (API.md order); a failure
-- destroys the sandbox.
local function prepare(sb, opts, setup)
  workspace.apply(sb, workspace.from_options(opts))
  for _, cmd in ipairs(setup) do
    local r = sb:execute_command(cmd, nil, { timeout = opts.command_timeout_secs or 1800 })
    if r.exit_code ~= 0 then
      errors.raise("WorkspaceError", "preset setup command failed (" .. (r.timed_out and "timed out" or r.signal
            or ("exit " .. tostring(r.exit_code))) .. "): " .. cmd .. "\n" .. r.stdout .. r.stderr,
        { backend = sb.backend, op = "create", context = { command = cmd, exit_code = r.exit_code, result = r } })
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
  local env = check.env(opts.env_vars, "sandbox", "env_vars")   -- (a preset's too) before create
  local id = owner.new_id()
  local ttl = opts.timeout_secs or 3600
  local s = owner.before_create{ event = "create", id = id, backend = name, created = os.time(),
                                 ttl = ttl, labels = opts.labels, host = owner.hostname() }
  local spec = { id = id, session = s.id, ttl = ttl }
  for k, v in pairs(opts) do if spec[k] == nil then spec[k] = v end end
  local okc, h = pcall(p.create, spec)
  owner.created(id)
  if not okc then
    -- spec.left: the backend could not remove what it made; the journal keeps it for gc
    if spec.left then owner.unfinished = true else owner.record{ event = "destroy", id = id, failed = true } end
    if errors.is(h, "SandboxError") then error(h, 0) end
    errors.raise("SandboxCreationError", name .. ": " .. tostring(h), { backend = name, op = "create" })
  end
  local tracked = router.track(p, name, opts, lease, { id = id, session = s.id })
  local sb = sandbox.new{ id = id, backend = name, provider = tracked, handle = h, journaled = true,
                          env = env, command_timeout = opts.command_timeout_secs }
  owner.record{ event = "ready", id = id, state = p.session_state(h) }
  owner.add(sb)
  sandbox.expire_after(sb, ttl)
  sb._preset = preset
  local pok, perr = pcall(prepare, sb, opts, setup)
  if not pok then
    pcall(sb.destroy, sb)
    if errors.is(perr, "Cancelled") then error(perr, 0) end
    if errors.is(perr, "WorkspaceError") then   -- the request's own: never retried elsewhere
      perr.phase, perr.context.phase = "prepare", "prepare"
      error(perr, 0)
    end
    errors.raise("SandboxCreationError", "preparing the sandbox failed: " .. tostring(perr),
                 { backend = name, op = "create", phase = "prepare", cause = perr })
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

---Cap this job's spend in dollars (nil or false: no cap); returns what is
---left. sbx.budget() only returns what is left.
function sbx.budget(...) return require("sbx.meter").budget(...) end

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
sbx.sleep = tasks.sleep
sbx.run = tasks.run

return sbx
