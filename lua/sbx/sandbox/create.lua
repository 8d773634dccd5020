--- The create pipeline (API.md, "Creating a sandbox"): the options checked
--- before anything exists, then, on the provider routing chose, the journal,
--- availability, the preset merged, the provider's create, tracking,
--- ownership and the workspace and setup commands (prepare).
local errors = require "sbx.core.errors"
local check = require "sbx.core.check"
local owner = require "sbx.state.owner"
local providers = require "sbx.providers"
local sandbox = require "sbx.sandbox"
local router = require "sbx.routing"
local presets = require "sbx.sandbox.presets"
local workspace = require "sbx.sandbox.workspace"

local M = {}

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
---Every option checked before anything exists: a bad value is a ConfigError
---naming it, never a half-created sandbox. Returns the checked options.
function M.validate(opts)
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

---Create a sandbox on provider `name` (routing calls this for each attempt):
---availability, the options it must honour, the preset merged, the journal
---line before anything exists, the provider's create, tracking (meter,
---admission `lease`), ownership, lifetime, then prepare. Returns the Sandbox.
function M.on(name, opts, lease)
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
    if spec.left then owner.keep_journal() else owner.record{ event = "destroy", id = id, failed = true } end
    if errors.is(h, "SandboxError") or errors.is(h, "Cancelled") then error(h, 0) end
    errors.raise("SandboxCreationError", name .. ": " .. tostring(h), { backend = name, op = "create" })
  end
  local tracked = router.track(p, name, opts, lease, { id = id, session = s.id })
  local sb = sandbox.new{ id = id, backend = name, provider = tracked, handle = h, journaled = true,
                          env = env, command_timeout = opts.command_timeout_secs, preset = preset }
  owner.record{ event = "ready", id = id, state = p.session_state(h) }
  owner.add(sb)
  sandbox.expire_after(sb, ttl)
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
function M.sandbox(backend, opts)
  if type(backend) == "table" and opts == nil then backend, opts = nil, backend end
  if backend ~= nil and type(backend) ~= "string" then
    check.bad("sandbox", "the backend must be a name like \"local\", got " .. type(backend))
  end
  opts = M.validate(opts)
  if backend and opts.backend and backend ~= opts.backend then
    check.bad("sandbox", "backend given twice: '" .. backend .. "' and opts.backend '" .. opts.backend .. "'")
  end
  backend = backend or opts.backend
  if backend then
    providers.get(backend)   -- unknown names raise ConfigError
    return router.pinned(backend, opts, M.on)
  end
  return router.create(opts, M.on)
end

---Reattach to a sandbox from its session_state(). The caller does not become
---its owner: it is destroyed only by an explicit destroy() or <close>.
function M.resume(state)
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

M.OPTIONS = OPTIONS

return M
