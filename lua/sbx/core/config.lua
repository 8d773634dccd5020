--- Configuration: sbx.yaml (API.md, "Configuration and search paths").
---
--- Optional and strict: a file that exists is read through sbx.yaml (libyaml,
--- bounded), and every unknown key, wrong type, tab, duplicate key, alias
--- bomb or absurd size is a ConfigError naming file:line:column. Secrets
--- are never in the file: a provider names the environment variable that
--- holds its key (`api_key_env`).
local errors = require "sbx.core.errors"
local check = require "sbx.core.check"

local M = {}

M.MAX_BYTES = 1024 * 1024

local function is_null(v) return v == nil or type(v) == "userdata" end

-- A ConfigError at file:line:column of `tbl`'s `key` (or of `tbl` itself).
local function bad(ctx, tbl, key, msg)
  local p = ctx.pos[tbl]
  local line, col = p and p.line or 1, p and p.col or 1
  if p and key ~= nil and p.keys[key] then line, col = p.keys[key][1], p.keys[key][2] end
  errors.raise("ConfigError", string.format("%s:%d:%d: %s", ctx.file, line, col, msg),
               { file = ctx.file, line = line, col = col })
end

local function where(path) return path == "" and "the top level" or path end

-- Check a mapping against { key = checker }; returns a plain table.
local function mapping(ctx, t, path, spec)
  local out = {}
  if is_null(t) then return out end
  if type(t) ~= "table" or (#t > 0) then
    bad(ctx, t, nil, (path == "" and "the file" or path) .. " must be a mapping")
  end
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local f = spec[k]
    if not f then
      bad(ctx, t, k, "unknown key '" .. k .. "' in " .. where(path) .. check.suggest(k, spec))
    end
    local v = t[k]
    if not is_null(v) then out[k] = f(ctx, t, k, v, path == "" and k or (path .. "." .. k)) end
  end
  return out
end

local function str(ctx, t, k, v, path)
  if type(v) ~= "string" then bad(ctx, t, k, path .. " must be a string, got " .. (math.type(v) or type(v))) end
  return v
end

local function bool(ctx, t, k, v, path)
  if type(v) ~= "boolean" then bad(ctx, t, k, path .. " must be true or false") end
  return v
end

local function number(min, integer)
  return function(ctx, t, k, v, path)
    if type(v) ~= "number" or v ~= v or v == math.huge or (integer and math.type(v) ~= "integer") then
      bad(ctx, t, k, path .. " must be " .. (integer and "an integer" or "a number"))
    end
    if v < min then bad(ctx, t, k, path .. " must be >= " .. min) end
    return v
  end
end

-- A list of strings; a single string is a list of one.
local function strings(ctx, t, k, v, path)
  if type(v) == "string" then return { v } end
  if type(v) ~= "table" then bad(ctx, t, k, path .. " must be a list of strings") end
  local out = {}
  for i, x in ipairs(v) do
    if type(x) ~= "string" then bad(ctx, v, i, path .. "[" .. i .. "] must be a string") end
    out[i] = x
  end
  for kk in pairs(v) do
    if math.type(kk) ~= "integer" then bad(ctx, v, kk, path .. " must be a list, not a mapping") end
  end
  return out
end

local function env_name(ctx, t, k, v, path)
  str(ctx, t, k, v, path)
  if not v:match("^[%a_][%w_]*$") then
    bad(ctx, t, k, path .. " must name an environment variable (like E2B_API_KEY), got '" .. v .. "'")
  end
  return v
end

local function secret(ctx, t, k, _, path)
  bad(ctx, t, k, path .. ": credentials are never written in the config; put the secret in an "
      .. "environment variable and name that variable with " .. (k == "token" and "token_env" or "api_key_env"))
end

local PRICE = { per_hour = number(0), per_vcpu_hour = number(0), per_gib_hour = number(0),
                per_sandbox = number(0) }
-- Keys every provider takes (routing reads them); each provider adds the
-- keys of its own schema (its config_schema, see docs/providers.md).
local COMMON = {
  enabled = bool, region = str, regions = strings,
  max_concurrent = number(1, true), max_creates_per_sec = number(0),
  price = function(ctx, t, k, v, path) return mapping(ctx, v, path, PRICE) end,
  api_key = secret, token = secret, secret = secret, password = secret,
}
local TYPED = { string = str, number = number(-math.huge), integer = number(-math.huge, true),
                boolean = bool, strings = strings, env = env_name }

-- The checker table of one provider's section, from its schema.
local function provider_spec(schema)
  local spec = {}
  for k, f in pairs(COMMON) do spec[k] = f end
  for k, e in pairs(schema) do spec[k] = TYPED[e.type] end
  return spec
end

-- The schema's defaults under the values the file set.
local function with_defaults(values, schema)
  for k, e in pairs(schema or {}) do
    if values[k] == nil and e.default ~= nil then values[k] = e.default end
  end
  return values
end

local ROUTING = { max_attempts = number(1, true), breaker_failures = number(1, true),
                  breaker_cooldown_secs = number(0), decision_log = bool,
                  hedge_after_ms = number(0), admission_wait_secs = number(0) }
local TOP = {
  default_policy = str, policy_path = strings, preset_path = strings, provider_path = strings,
  state_dir = str,
  routing = function(ctx, t, k, v, path) return mapping(ctx, v, path, ROUTING) end,
  -- checked once provider_path is known (a script on it may be named here)
  providers = function(ctx, _, _, v)
    if type(v) ~= "table" or #v > 0 then bad(ctx, v, nil, "providers must be a mapping of backend names") end
    ctx.providers = v
    return {}
  end,
}

-- providers.NAME against the schema of provider NAME; `dirs`: where the
-- scripts are (SBX_PROVIDER_PATH, then this file's provider_path).
local function check_providers(ctx, v, dirs)
  local registry = require "sbx.providers"
  local known = registry.known(dirs)
  local keys = {}
  for name in pairs(v) do keys[#keys + 1] = name end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local out = {}
  for _, name in ipairs(keys) do
    local schema = type(name) == "string" and known[name] and registry.schema(name, dirs)
    if not schema then
      bad(ctx, v, name, "unknown provider '" .. tostring(name) .. "'" .. check.suggest(tostring(name), known))
    end
    out[name] = with_defaults(mapping(ctx, v[name], "providers." .. name, provider_spec(schema)), schema)
  end
  return out
end

local function expand(p, base)
  if p:sub(1, 2) == "~/" then p = (os.getenv("HOME") or "") .. p:sub(2) end
  if base and p:sub(1, 1) ~= "/" then p = base .. "/" .. p:gsub("^%./", "") end
  return p
end

---Parse and check config text. Raises ConfigError with file:line:column.
---@param text string
---@param file string name used in errors (and the base of relative paths)
---@return table config
function M.parse(text, file)
  local yaml = require "sbx.yaml"
  local v, pos, code = yaml.decode(text, { max_bytes = M.MAX_BYTES, max_depth = 32,
                                           max_aliases = 50, max_nodes = 20000 })
  if v == nil and type(pos) == "string" then
    local line, col, msg = pos:match("^(%d+):(%d+): (.*)$")
    errors.raise("ConfigError", string.format("%s:%s:%s: %s", file, line or 1, col or 1, msg or pos),
                 { file = file, code = code })
  end
  local ctx = { file = file, pos = pos or {} }
  local cfg = mapping(ctx, v, "", TOP)
  local base = file:match("^(.*)/[^/]*$") or "."
  for _, k in ipairs{ "policy_path", "preset_path", "provider_path" } do
    for i, p in ipairs(cfg[k] or {}) do cfg[k][i] = expand(p, base) end
  end
  if cfg.state_dir then cfg.state_dir = expand(cfg.state_dir, base) end
  local dirs = {}
  for d in (os.getenv("SBX_PROVIDER_PATH") or ""):gmatch("[^:]+") do dirs[#dirs + 1] = d end
  for _, d in ipairs(cfg.provider_path or {}) do dirs[#dirs + 1] = d end
  cfg.providers = ctx.providers and check_providers(ctx, ctx.providers, dirs) or {}
  cfg.routing = cfg.routing or {}
  cfg.file = file
  return cfg
end

-- ------------------------------------------------------------ lookup

local explicit            -- --config FILE / sbx.config(path)
local current             -- the effective config
M.EMPTY = { providers = {}, routing = {} }

---Where the config comes from: --config, $SBX_CONFIG, ./sbx.yaml,
---$XDG_CONFIG_HOME/sbxlua/config.yaml. Returns path, required?
function M.locate()
  if explicit then return explicit, true end
  local env = os.getenv("SBX_CONFIG")
  if env and env ~= "" then return env, true end
  local function exists(p)
    local f = io.open(p, "r")
    if f then f:close() return true end
  end
  if exists("./sbx.yaml") then return "./sbx.yaml", false end
  local xdg = os.getenv("XDG_CONFIG_HOME")
  if not xdg or xdg == "" then xdg = (os.getenv("HOME") or "/nonexistent") .. "/.config" end
  local p = xdg .. "/sbxlua/config.yaml"
  if exists(p) then return p, false end
  return nil
end

---Read and check a config file.
function M.read(path)
  local f, err = io.open(path, "rb")
  if not f then errors.raise("ConfigError", "cannot read the config " .. tostring(err), { file = path }) end
  local text = f:read(M.MAX_BYTES + 1) or ""
  f:close()
  if #text > M.MAX_BYTES then
    errors.raise("ConfigError", string.format("%s:1:1: the config is larger than %d bytes", path, M.MAX_BYTES),
                 { file = path })
  end
  return M.parse(text, path)
end

local listeners = {}
---fn(cfg) runs whenever a config takes effect (router, owner, docker).
function M.on_change(fn) listeners[#listeners + 1] = fn end

local function apply(cfg)
  current = cfg
  for _, fn in ipairs(listeners) do fn(cfg) end
  return cfg
end

---The effective config (loaded on first use).
function M.get()
  if current then return current end
  local path = M.locate()
  return apply(path and M.read(path) or M.EMPTY)
end

---Use `path` (or a table already parsed, or nil for the lookup order).
function M.use(path_or_table)
  if type(path_or_table) == "table" then
    local t = path_or_table
    t.providers, t.routing = t.providers or {}, t.routing or {}
    return apply(t)
  end
  explicit = path_or_table
  current = nil
  return M.get()
end

---Set the --config file without loading it yet.
function M.set_path(path) explicit = path; current = nil end

---A search path: the directories of $env (colon-separated), then the
---config's `key` list. With `lenient`, a broken config only drops its part.
local function search_path(env, key, lenient)
  local dirs = {}
  for d in (os.getenv(env) or ""):gmatch("[^:]+") do dirs[#dirs + 1] = d end
  local ok, cfg = true, nil
  if lenient then ok, cfg = pcall(M.get) else cfg = M.get() end
  for _, d in ipairs(ok and cfg[key] or {}) do dirs[#dirs + 1] = d end
  return dirs
end

-- The last answer per (env, key, lenient), kept while $env and the config
-- are the same: every request of a cloud provider looks its script up.
local paths = {}
function M.search_path(env, key, lenient)
  local ev, slot = os.getenv(env), env .. "\0" .. key .. (lenient and "\0l" or "")
  local hit = paths[slot]
  if hit and hit.env == ev and hit.cfg == current and current then return hit.dirs end
  local dirs = search_path(env, key, lenient)
  paths[slot] = { env = ev, cfg = current, dirs = dirs }
  return dirs
end

---The settings of one provider: providers.NAME of the config with its
---schema's defaults (only the defaults when the config names none).
-- Sections given as a table (M.use{...}) get their schema's defaults on
-- first use, as a file's do when it is read.
-- A provider the config names no section for gets the defaults of its
-- schema, made once per config and schema (every request of a cloud
-- provider reads its settings; callers only read them).
local defaulted = setmetatable({}, { __mode = "k" })
local bare = setmetatable({}, { __mode = "k" })    -- config -> name -> { schema, p }
function M.provider(name)
  local cfg = M.get()
  local p = cfg.providers[name]
  if p and defaulted[p] then return p end
  local ok, schema = pcall(require("sbx.providers").schema, name)
  schema = ok and schema or {}
  if not p and name ~= nil then
    local by = bare[cfg] or {}
    bare[cfg] = by
    local hit = by[name]
    if hit and hit.schema == schema then return hit.p end
    p = with_defaults({}, schema)
    by[name] = { schema = schema, p = p }
    return p
  end
  p = with_defaults(p or {}, schema)
  if p == cfg.providers[name] then defaulted[p] = true end
  return p
end

return M
