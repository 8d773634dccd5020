--- Presets: named bundles of create options, setup commands and an agent
--- spec. Files in presets paths ($SBX_PRESET_PATH, the config's
--- preset_path, the built-ins) are data: each is compiled text-only in its
--- own capped state (sbx.script) and re-read when it changes; a broken edit
--- keeps the last good version. sbx.register_preset adds one in memory.
local script = require "sbx.script"
local errors = require "sbx.core.errors"
local check = require "sbx.core.check"

local M = {}

M.LIMITS = { memory = 4 * 1024 * 1024, instructions = 200000, millis = 250 }
M.MAX_SOURCE = 256 * 1024

local FIELDS = {
  name = "string", description = "string", image = "string", setup_commands = "list",
  cpu = "number", memory_mb = "number", timeout_secs = "number", env_vars = "map",
  allow_internet = "boolean", backends = "table", agent = "table",
}
-- The create options a preset may set (explicit options always win).
local OPTION_FIELDS = { "image", "cpu", "memory_mb", "timeout_secs", "allow_internet" }

local registered = {}      -- name -> preset (sbx.register_preset)
M.warn = function(msg) io.stderr:write("sbxlua: ", msg, "\n") end

---Check a preset table; returns a clean copy or raises ConfigError naming `where`.
function M.validate(p, where)
  if type(p) ~= "table" then errors.raise("ConfigError", where .. ": a preset must be a table") end
  local ok, err = pcall(check.options, p, FIELDS, where)
  if not ok then error(err, 0) end
  if type(p.name) ~= "string" or not p.name:match("^[%w_%-%.]+$") then
    errors.raise("ConfigError", where .. ": a preset needs a name of letters, digits, '-', '_' or '.'")
  end
  local out = {}
  for k, v in pairs(p) do out[k] = v end
  out.setup_commands = check.list(p.setup_commands or {}, where, "setup_commands")
  out.env_vars = check.env(p.env_vars, where, "env_vars")
  for backend, o in pairs(p.backends or {}) do
    if type(backend) ~= "string" or type(o) ~= "table" then
      errors.raise("ConfigError", where .. ": backends must map backend names to tables of overrides")
    end
    local bo = check.options(o, FIELDS, where .. ".backends." .. backend)
    if bo.setup_commands then bo.setup_commands = check.list(bo.setup_commands, where, "setup_commands") end
  end
  if p.agent ~= nil then
    local a = p.agent
    if a.kind ~= nil and a.kind ~= "inside" then
      errors.raise("ConfigError", where .. ": a preset's agent must be kind = \"inside\"")
    end
    local spec = {}
    for k, v in pairs(a) do if k ~= "kind" then spec[k] = v end end
    spec.name = spec.name or p.name
    out.agent = require("sbx.agents").inside(spec)   -- raises on a bad spec
  end
  return out
end

-- ----------------------------------------------------------- files

-- (a broken config must not hide the built-in presets)
function M.path() return require("sbx.core.config").search_path("SBX_PRESET_PATH", "preset_path", true) end

-- The whole returned table crosses out of the capped state by copy.
local WRAP_HEAD = "local __preset = (function(...) "
local WRAP_TAIL = "\nend)()\nreturn { get = function() return __preset end }\n"

local function compile(source, chunkname)
  local s = script.new(M.LIMITS)
  local ok, types = s:load(WRAP_HEAD .. source .. WRAP_TAIL, chunkname)
  if not ok then
    s:close()
    return nil, types
  end
  local got, value = s:call("get")
  s:close()
  if not got then return nil, value end
  if type(value) ~= "table" then
    return nil, chunkname:sub(2) .. ": the file returned " .. type(value) .. ", not a preset table"
  end
  local vok, v = pcall(M.validate, value, chunkname:sub(2))
  if not vok then return nil, type(v) == "table" and v.message or tostring(v) end
  return v
end

-- Preset files and built-ins through the one script loader (search path,
-- reload on change, last good version, atomic swap).
local loader = require("sbx.core.scripts").new{
  kind = "preset", env = "SBX_PRESET_PATH", key = "preset_path", builtin = "presets/",
  max_source = M.MAX_SOURCE,
  dirs = function() return M.path() end,
  warn = function(msg) M.warn(msg) end,
  compile = function(source, file) return compile(source, "@" .. file) end,
}

-- The loader's entry for `name` (nil, why, "missing"|"broken"); names only.
local function entry(name, dirs)
  if type(name) ~= "string" or name:find("/", 1, true) then return nil, nil, "missing" end
  return loader:get(name, dirs)
end

-- ------------------------------------------------------------ public

---sbx.register_preset{...}: add (or replace) a preset in this process.
function M.register(p)
  local v = M.validate(p, "register_preset")
  registered[v.name] = v
  return v
end

---The preset called `name`, or raises ConfigError listing the known ones.
function M.get(name)
  if registered[name] then return registered[name] end
  local e, err, why = entry(name)
  if e then return e.value end
  if why == "broken" then errors.raise("ConfigError", "preset '" .. name .. "' is broken: " .. tostring(err)) end
  local known = {}
  for n in pairs(M.all()) do known[#known + 1] = n end
  table.sort(known)
  errors.raise("ConfigError", "unknown preset '" .. tostring(name) .. "' (known: " .. table.concat(known, ", ") .. ")")
end

---name -> preset, every preset that loads.
function M.all()
  local out = {}
  local dirs = loader:dirs()
  for _, n in ipairs(loader:names(dirs)) do
    local e = entry(n, dirs)
    if e then out[n] = e.value end
  end
  for n, p in pairs(registered) do out[n] = p end
  return out
end

---Resolve opts.preset (a name or a table); returns the preset or nil.
function M.resolve(opts)
  if opts.preset == nil then return nil end
  if type(opts.preset) == "table" then return M.validate(opts.preset, "preset") end
  return M.get(opts.preset)
end

-- Options every backend takes from a preset; the others (image, cpu,
-- memory_mb, allow_internet) only where the backend honours them: a
-- preset's image is a preference, not a requirement.
local ALWAYS = { timeout_secs = true }

---The create options for `backend` (whose descriptor is `desc`): the
---preset's values (and its overrides for that backend) under the explicit ones.
function M.merge(opts, preset, backend, desc)
  if not preset then return opts end
  local over = preset.backends and preset.backends[backend] or {}
  local honours = desc and desc.options or {}
  local out = {}
  for k, v in pairs(opts) do out[k] = v end
  for _, k in ipairs(OPTION_FIELDS) do
    local v = over[k]
    if v == nil then v = preset[k] end
    if out[k] == nil and v ~= nil and (ALWAYS[k] or honours[k]) then out[k] = v end
  end
  local env = {}
  for k, v in pairs(preset.env_vars or {}) do env[k] = v end
  for k, v in pairs(over.env_vars or {}) do env[k] = tostring(v) end
  for k, v in pairs(opts.env_vars or {}) do env[k] = v end
  out.env_vars = env
  return out
end

---The setup commands to run on `backend`, or none when the sandbox runs the
---preset's own image (which has them baked in).
function M.setup_for(preset, backend, image, honours_image)
  if not preset then return {} end
  local over = preset.backends and preset.backends[backend] or {}
  local own = over.image or preset.image
  if honours_image and own and image == own then return {} end
  return over.setup_commands or preset.setup_commands or {}
end

function M.reset()
  registered = {}
  loader:reset()
end

return M
