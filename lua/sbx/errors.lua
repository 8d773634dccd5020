--- Typed errors: tables raised with error(), `tostring(err)` = "<Kind>: <message>".
local M = {}

local parent = {
  SandboxError = false,
  SandboxCreationError = "SandboxError",
  NoRouteError = "SandboxCreationError",
  SandboxExecutionError = "SandboxError",
  SandboxNotFoundError = "SandboxError",
  FileNotFoundError = "SandboxError",
  PathError = "SandboxError",
  BackendNotInstalledError = "SandboxError",
  FeatureNotSupportedError = "SandboxError",
  ConfigError = "SandboxError",
  BudgetExceededError = "SandboxError",
  -- not a SandboxError: a task was cancelled (sbx.parallel, signals)
  Cancelled = false,
}
M.kinds = parent

local Error = {}
Error.__index = Error
Error.__tostring = function(e) return e.kind .. ": " .. e.message end
M.Error = Error

---@param kind string
---@param message string
---@param fields? table backend=, op=, retryable=, ...
function M.new(kind, message, fields)
  assert(parent[kind] ~= nil, "unknown error kind " .. tostring(kind))
  local e = { kind = kind, message = tostring(message), retryable = false }
  for k, v in pairs(fields or {}) do e[k] = v end
  return setmetatable(e, Error)
end

---Raise a typed error.
function M.raise(kind, message, fields)
  error(M.new(kind, message, fields), 0)
end

---Does `err` belong to `kind` (respecting the hierarchy)?
---@return boolean
function M.is(err, kind)
  local k = type(err) == "table" and err.kind
  while k do
    if k == kind then return true end
    k = parent[k]
  end
  return false
end

-- Core modules fail with nil, msg, code; this names the typed error.
local by_code = {
  ENOENT = "FileNotFoundError",
  ESCAPE = "PathError", EINVAL = "PathError", ENOTDIR = "PathError",
  EISDIR = "PathError", ENOTREG = "PathError", ENAMETOOLONG = "PathError",
  ELOOP = "PathError", EEXIST = "PathError", ENOTEMPTY = "PathError",
}

---Raise the typed error for a core failure.
function M.core(msg, code, backend, op)
  local kind = by_code[code] or "SandboxExecutionError"
  M.raise(kind, msg, { backend = backend, op = op, code = code })
end

return M
