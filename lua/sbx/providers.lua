--- The provider registry: every backend's descriptor and operations.
local errors = require "sbx.errors"

local M = {}

-- Known backend names, in the order routing prefers them by default.
M.names = { "local", "bwrap", "docker" }
local modules = { ["local"] = "sbx.backends.local", bwrap = "sbx.backends.bwrap",
                  docker = "sbx.backends.docker" }
-- Backends that API.md names but this build cannot drive yet.
M.planned = { "ray", "e2b", "daytona", "tensorlake", "modal", "safehouse" }

M.ISOLATION = { process = 1, namespace = 2, container = 3, gvisor = 4, microvm = 5 }

local registered = {}     -- name -> provider table (sbx.providers.register)

---Add a provider table (descriptor + operations), e.g. a fake in a spec;
---it is routed after the built-in ones. register(name, nil) removes it.
function M.register(name, p)
  M.generation = (M.generation or 0) + 1
  local i
  for k, n in ipairs(M.names) do if n == name then i = k end end
  if p == nil then
    if registered[name] and i then table.remove(M.names, i) end
    registered[name] = nil
    return
  end
  if modules[name] then errors.raise("ConfigError", "provider '" .. name .. "' is built in") end
  registered[name] = p
  if not i then M.names[#M.names + 1] = name end
end

---The provider table for `name`; raises ConfigError for unknown names.
function M.get(name)
  if registered[name] then return registered[name] end
  local mod = modules[name]
  if not mod then
    for _, p in ipairs(M.planned) do
      if p == name then
        errors.raise("BackendNotInstalledError",
          "backend '" .. name .. "' is not available in this build of sbxlua (available: "
          .. table.concat(M.names, ", ") .. ")", { backend = name })
      end
    end
    errors.raise("ConfigError", "unknown backend '" .. tostring(name) .. "' (known: "
      .. table.concat(M.names, ", ") .. ", " .. table.concat(M.planned, ", ") .. ")")
  end
  return require(mod)
end

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
      ok, reason = false, "cannot load the provider: " .. tostring(p)
      p = { descriptor = { name = name, capabilities = {}, options = {} } }
    end
    local d = {}
    for k, v in pairs(p.descriptor) do d[k] = v end
    d.available, d.reason = ok and true or false, (not ok) and reason or nil
    if M.decorate then M.decorate(d) end
    out[name] = d
  end
  for _, name in ipairs(M.planned) do
    out[name] = { name = name, available = false, reason = "not in this build yet",
                  capabilities = {}, options = {} }
    if M.decorate then M.decorate(out[name]) end
  end
  return out
end

return M
