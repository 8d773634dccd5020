--- The provider registry: every backend's descriptor and operations.
local errors = require "sbx.errors"

local M = {}

-- Known backend names, in the order routing prefers them by default.
M.names = { "local", "docker" }
local modules = { ["local"] = "sbx.backends.local", docker = "sbx.backends.docker" }
-- Backends that API.md names but this build cannot drive yet.
M.planned = { "bwrap", "ray", "e2b", "daytona", "tensorlake", "modal", "safehouse" }

M.ISOLATION = { process = 1, namespace = 2, container = 3, gvisor = 4, microvm = 5 }

---The provider table for `name`; raises ConfigError for unknown names.
function M.get(name)
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
    out[name] = d
  end
  for _, name in ipairs(M.planned) do
    out[name] = { name = name, available = false, reason = "not in this build yet",
                  capabilities = {}, options = {} }
  end
  return out
end

return M
