--- The provider registry: every provider's descriptor and operations.
---
--- Three kinds, one contract (lua/sbx/providers/contract.lua, docs/providers.md):
--- the built-in backends (lua/sbx/providers/builtin/), provider scripts
--- (providers/*.lua built in, then provider_path and $SBX_PROVIDER_PATH,
--- loaded through lua/sbx/core/scripts.lua into the environment of
--- lua/sbx/providers/script.lua), and tables registered in memory (fakes in
--- specs). `names`, `planned` and `generation` are computed on access, so a
--- script dropped on the path shows up, and an edited one bumps the
--- generation (routing rebuilds its descriptors).
local errors = require "sbx.core.errors"
local contract = require "sbx.providers.contract"
local scripts = require "sbx.core.scripts"

local M = {}

-- Built-in backends, in the order routing prefers them by default.
M.BUILTIN = { "local", "bwrap", "docker" }
local modules = { ["local"] = "sbx.providers.builtin.local", bwrap = "sbx.providers.builtin.bwrap",
                  docker = "sbx.providers.builtin.docker" }
-- Providers API.md names that neither this build nor a script provides yet.
local PLANNED = { "ray", "e2b", "daytona", "tensorlake", "modal", "safehouse" }

M.ISOLATION = contract.ISOLATION

local registered, reg_order = {}, {}     -- sbx.providers.register
local gen = 0

-- ------------------------------------------------------------- scripts

-- What the facade builds on top when a provider leaves an optional
-- operation out (docs/providers.md, "What the facade builds").
local function join(a, b) return (a == "" or a == ".") and b or (a:gsub("/+$", "") .. "/" .. b) end
local DEFAULTS = {}
-- An upload's file entry holds its data, or a host root to read it from
-- (upload_dir's entries: lua/sbx/core/transfer.lua).
local function entry_data(e)
  if e.data then return e.data end
  local parts = {}
  for _, chunk in require("sbx.core.transfer").chunks(e) do parts[#parts + 1] = chunk end
  return table.concat(parts)
end
function DEFAULTS.put_tree(p)
  return function(h, dir, entries)
    p.mkdir(h, dir)
    for _, e in ipairs(entries) do
      if e.type == "dir" then p.mkdir(h, join(dir, e.path))
      elseif e.type == "file" then p.write_file(h, join(dir, e.path), entry_data(e), e.mode) end
    end
  end
end
function DEFAULTS.get_tree(p)
  return function(h, dir)
    local entries = {}
    local function walk(rel)
      for _, it in ipairs(p.list_files(h, rel == "" and dir or join(dir, rel))) do
        local r = rel == "" and it.name or rel .. "/" .. it.name
        if it.type == "dir" then
          entries[#entries + 1] = { path = r, type = "dir" }
          walk(r)
        elseif it.type == "file" then
          entries[#entries + 1] = { path = r, type = "file", data = p.read_file(h, join(dir, r)) }
        else            -- a link: nothing here reads its target; download_dir reports it skipped
          entries[#entries + 1] = { path = r, type = it.type }
        end
      end
    end
    walk("")
    return entries, {}
  end
end
function DEFAULTS.reap(p)        -- gc: reattach from the journal, then destroy
  return function(entry)
    local st = {}
    for k, v in pairs(entry.state or {}) do st[k] = v end
    st.id = entry.id
    local ok, h = pcall(p.resume, st)
    if not ok then
      if errors.is(h, "SandboxNotFoundError") then return end
      error(h, 0)
    end
    p.destroy(h)
  end
end

-- A checked script provider, completed: defaults for the optional
-- operations it left out, and spawn() checked to return a ProcessHandle.
local function complete(p, file)
  p.defaulted = {}
  for op, make in pairs(DEFAULTS) do
    if p[op] == nil then p[op], p.defaulted[op] = make(p), true end
  end
  local spawn = p.spawn
  p.spawn = function(h, req) return contract.check_process(spawn(h, req), file) end
  p.file = file
  return p
end

local loader = scripts.new{
  kind = "provider", env = "SBX_PROVIDER_PATH", key = "provider_path", builtin = "providers/",
  compile = function(source, file, name)
    if modules[name] then
      errors.raise("ConfigError", file .. ":1: '" .. name .. "' is a built-in provider; a script "
                   .. "cannot replace it (name it differently)", { file = file })
    end
    return complete(require("sbx.providers.script").compile(source, file, name), file)
  end,
}
M.loader = loader

-- Script names on the path (or `dirs`), without the built-in modules' names.
local function script_names(dirs)
  local out = {}
  local ok, names = pcall(loader.names, loader, dirs)
  for _, n in ipairs(ok and names or {}) do
    if not modules[n] and not registered[n] then out[#out + 1] = n end
  end
  return out
end

-- -------------------------------------------------------------- names

local last_names, last_key, seen_versions = nil, nil, {}
local last_scan = -math.huge
-- How long a listing of the provider path is reused (routing asks on every
-- decision); a new config, register() and reset() rescan at once, and a
-- script used by name is stat'ed on every use.
M.RESCAN_SECS = 1
-- A new config may name another provider_path.
require("sbx.core.config").on_change(function() last_names = nil end)

-- Recompute the provider names; bump the generation when they or a
-- script's version changed.
local function refresh()
  local now = require("sbx.loop").now()
  if last_names and now - last_scan < M.RESCAN_SECS then return last_names end
  last_scan = now
  local names = {}
  for _, n in ipairs(M.BUILTIN) do names[#names + 1] = n end
  local sn = script_names()
  local changed = false
  for _, n in ipairs(sn) do
    names[#names + 1] = n
    local e = loader:get(n)
    local v = e and e.version or false
    if seen_versions[n] ~= v then seen_versions[n], changed = v, true end
  end
  for _, n in ipairs(reg_order) do names[#names + 1] = n end
  local key = table.concat(names, "\0")
  if key ~= last_key or changed then last_key, gen = key, gen + 1 end
  last_names = names
  return names
end

local function planned()
  local have = {}
  for _, n in ipairs(last_names or refresh()) do have[n] = true end
  local out = {}
  for _, n in ipairs(PLANNED) do if not have[n] then out[#out + 1] = n end end
  return out
end

setmetatable(M, { __index = function(_, k)
  if k == "names" then return refresh()
  elseif k == "planned" then refresh() return planned()
  elseif k == "generation" then refresh() return gen end
end })

---Add a provider table (descriptor + operations), e.g. a fake in a spec;
---it is routed after the others. register(name, nil) removes it.
function M.register(name, p)
  gen, last_key, last_names = gen + 1, nil, nil
  if p == nil then
    if registered[name] then
      for i, n in ipairs(reg_order) do if n == name then table.remove(reg_order, i) break end end
    end
    registered[name] = nil
    return
  end
  if modules[name] then errors.raise("ConfigError", "provider '" .. name .. "' is built in") end
  if not registered[name] then reg_order[#reg_order + 1] = name end
  registered[name] = p
end

local function unknown(name)
  for _, p in ipairs(PLANNED) do
    if p == name then
      errors.raise("BackendNotInstalledError",
        "backend '" .. name .. "' is not available in this build of sbxlua (available: "
        .. table.concat(M.names, ", ") .. "; a provider script providers/" .. name
        .. ".lua on provider_path would add it)", { backend = name })
    end
  end
  errors.raise("ConfigError", "unknown backend '" .. tostring(name) .. "' (known: "
    .. table.concat(M.names, ", ") .. ", " .. table.concat(M.planned, ", ") .. ")")
end

-- A script that never loaded: listed (so `sbxlua providers` says why),
-- unavailable, and every use raises its ConfigError (file:line).
local function broken(name, err, file)
  local function raise()
    errors.raise("ConfigError", "provider script " .. name .. ": " .. tostring(err), { backend = name })
  end
  return { descriptor = { name = name, capabilities = {}, options = {} }, broken = err, broken_file = file,
           available = raise, create = raise, resume = raise, reap = raise }
end

---The provider table for `name`; a script that does not load is returned
---unavailable, its operations raising ConfigError (file:line). Raises
---ConfigError for unknown names.
function M.get(name)
  if registered[name] then return registered[name] end
  local mod = modules[name]
  if mod then return require(mod) end
  if type(name) == "string" and not name:find("/", 1, true) then
    local e, err, why = loader:get(name)
    if e then return e.value end
    if why == "broken" then return broken(name, err, (loader:resolve(name))) end
  end
  unknown(name)
end

---Load and check a provider file without registering it (sbxlua provider
---check): the provider table, or nil and why (file:line per problem).
function M.check_file(file)
  local name = file:match("([^/]+)%.lua$")
  if not name then return nil, file .. ": a provider script is a file NAME.lua" end
  return loader:load(file)
end

-- ------------------------------------------------------------- config

-- The keys of a provider API.md plans, before its script exists.
local GENERIC = { host = "string", image = "string", template = "string", api_url = "string",
                  api_key_env = "env", token_env = "env" }

---Every provider name the config may name: built in, planned, registered
---and the scripts found on `dirs` (the search path as the config sets it).
function M.known(dirs)
  local s = {}
  for _, n in ipairs(M.BUILTIN) do s[n] = true end
  for _, n in ipairs(PLANNED) do s[n] = true end
  for _, n in ipairs(reg_order) do s[n] = true end
  for _, n in ipairs(script_names(dirs)) do s[n] = true end
  return s
end

-- normalized schemas by the raw table they came from (read-only to every
-- caller): config.provider and a provider's env() ask on every request
local normalized = setmetatable({}, { __mode = "k" })

---The normalized config schema of `name` ({ key = { type, default, ... } }),
---nil when the name is unknown. A script that does not load gets the
---generic schema (it is reported unavailable, with why, elsewhere).
function M.schema(name, dirs)
  local raw
  if registered[name] then raw = registered[name].config_schema or {}
  elseif modules[name] then raw = require(modules[name]).config_schema or {}
  else
    local e = loader:get(name, dirs)
    if e then raw = e.value.config_schema or {}
    elseif M.known(dirs)[name] then raw = GENERIC
    else return nil end
  end
  if normalized[raw] then return normalized[raw] end
  local out = {}
  for k, v in pairs(raw) do out[k] = assert(contract.schema_entry(k, v)) end
  normalized[raw] = out
  return out
end

---The environment variable names a provider's config names (its
---credentials): the values of its "env" keys.
function M.credentials(name, cfg)
  local out = {}
  local ok, schema = pcall(M.schema, name)
  for k, e in pairs(ok and schema or {}) do
    if e.type == "env" and type(cfg[k]) == "string" then out[#out + 1] = cfg[k] end
  end
  return out
end

-- ----------------------------------------------------------- describing

local describers = {}

---fn(d) adds to each provider's description (the router: effective prices
---and limits from the config) before describe() returns it.
function M.on_describe(fn) describers[#describers + 1] = fn end

---name -> { available=, reason=, capabilities=, isolation=, price=, options=, ... }
---A provider that fails to load or to answer is unavailable, with the reason.
function M.describe()
  local out = {}
  for _, name in ipairs(M.names) do
    local loaded, p = pcall(M.get, name)
    local ok, reason
    if loaded then
      loaded, ok, reason = pcall(p.available)
      if not loaded then ok, reason = false, tostring(ok) end
    else
      ok, reason = false, "cannot load the provider: " .. tostring(type(p) == "table" and p.message or p)
      p = { descriptor = { name = name, capabilities = {}, options = {} } }
    end
    local d = {}
    for k, v in pairs(p.descriptor) do d[k] = v end
    d.available, d.reason = ok and true or false, (not ok) and reason or nil
    if p.file then d.script = p.file end
    for _, fn in ipairs(describers) do fn(d) end
    out[name] = d
  end
  for _, name in ipairs(M.planned) do
    out[name] = { name = name, available = false, reason = "not in this build yet",
                  capabilities = {}, options = {} }
    for _, fn in ipairs(describers) do fn(out[name]) end
  end
  return out
end

---Forget loaded scripts (tests).
function M.reset()
  loader:reset()
  seen_versions, last_key, last_names = {}, nil, nil
  gen = gen + 1
end

return M
