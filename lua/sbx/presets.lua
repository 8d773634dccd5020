--- Presets: named bundles of create options, setup commands and an agent
--- spec. Files in presets paths ($SBX_PRESET_PATH, the config's
--- preset_path, the built-ins) are data: each is compiled text-only in its
--- own capped state (sbx.script) and re-read when it changes; a broken edit
--- keeps the last good version. sbx.register_preset adds one in memory.
local script = require "sbx.script"
local errors = require "sbx.errors"
local check = require "sbx.check"

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
local cache = {}           -- key -> { sig, preset, error }
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
    out.agent = require("sbx.agent").inside(spec)   -- raises on a bad spec
  end
  return out
end

-- ----------------------------------------------------------- files

-- (a broken config must not hide the built-in presets)
function M.path() return require("sbx.config").search_path("SBX_PRESET_PATH", "preset_path", true) end

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

local function source_of(key)
  if key:sub(1, 8) == "builtin:" then
    return script.builtin("presets/" .. key:sub(9)), "@presets/" .. key:sub(9) .. ".lua (built-in)"
  end
  local f, err = io.open(key, "rb")
  if not f then return nil, nil, "cannot read " .. tostring(err) end
  local src = f:read(M.MAX_SOURCE + 1) or ""
  f:close()
  if #src > M.MAX_SOURCE then return nil, nil, key .. ": larger than " .. M.MAX_SOURCE .. " bytes" end
  return src, "@" .. key
end

local function load_key(key)
  local sig = key:sub(1, 8) == "builtin:" and "builtin" or script.stat(key) or "gone"
  local cur = cache[key]
  if cur and (cur.sig == sig or cur.broken_sig == sig) then return cur end
  local src, chunkname, rerr = source_of(key)
  local preset, err
  if src then preset, err = compile(src, chunkname) else err = rerr end
  if not preset then
    if cur and cur.preset then
      if cur.broken_sig ~= sig then
        cur.broken_sig = sig
        M.warn("preset " .. key .. " changed but the new version is broken (" .. tostring(err)
               .. "); keeping the last good version")
      end
      return cur
    end
    cache[key] = { sig = sig, error = tostring(err) }
    return cache[key]
  end
  cache[key] = { sig = sig, preset = preset }    -- the atomic swap
  return cache[key]
end

local function keys()
  local out, seen = {}, {}
  for _, d in ipairs(M.path()) do
    for _, f in ipairs(require("sbx.fs").list_host(d) or {}) do
      local n = f:match("^(.+)%.lua$")
      if n and not seen[n] then seen[n] = true; out[n] = d .. "/" .. f end
    end
  end
  for _, b in ipairs(script.builtins("presets/")) do
    local n = b:sub(9)
    if not seen[n] then seen[n] = true; out[n] = "builtin:" .. n end
  end
  return out
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
  local key = keys()[name]
  if key then
    local c = load_key(key)
    if c.preset then return c.preset end
    errors.raise("ConfigError", "preset '" .. name .. "' is broken: " .. tostring(c.error))
  end
  local known = {}
  for n in pairs(M.all()) do known[#known + 1] = n end
  table.sort(known)
  errors.raise("ConfigError", "unknown preset '" .. tostring(name) .. "' (known: " .. table.concat(known, ", ") .. ")")
end

---name -> preset, every preset that loads.
function M.all()
  local out = {}
  for n, key in pairs(keys()) do
    local c = load_key(key)
    if c.preset then out[n] = c.preset end
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
  registered, cache = {}, {}
end

return M
