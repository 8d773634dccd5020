--- Typed errors: tables raised with error(), `tostring(err)` = "<Kind>: <message>".
--- Every error has kind, message, backend, op, retryable, code (a stable
--- name per kind), context (a table of details), cause and errno (API.md,
--- "Errors").
local M = {}

local parent = {
  SandboxError = false,
  SandboxCreationError = "SandboxError",
  NoRouteError = "SandboxCreationError",
  WorkspaceError = "SandboxCreationError",
  SandboxExecutionError = "SandboxError",
  CommandFailedError = "SandboxExecutionError",
  SandboxConnectionError = "SandboxError",
  SandboxTimeoutError = "SandboxError",
  AuthenticationError = "SandboxError",
  RateLimitError = "SandboxError",
  QuotaExceededError = "SandboxError",
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

-- The stable machine-readable name of each kind (logs, metrics, retries).
M.CODES = {
  SandboxError = "sandbox_error", SandboxCreationError = "creation_failed",
  NoRouteError = "no_route", WorkspaceError = "workspace_failed",
  SandboxExecutionError = "execution_failed", CommandFailedError = "command_failed",
  SandboxConnectionError = "connection_failed", SandboxTimeoutError = "timeout",
  AuthenticationError = "authentication_failed", RateLimitError = "rate_limited",
  QuotaExceededError = "quota_exceeded", SandboxNotFoundError = "not_found",
  FileNotFoundError = "file_not_found", PathError = "invalid_path",
  BackendNotInstalledError = "backend_not_installed", FeatureNotSupportedError = "not_supported",
  ConfigError = "config_error", BudgetExceededError = "budget_exceeded", Cancelled = "cancelled",
}

-- Kinds that are worth trying again (elsewhere, or later) unless told otherwise.
local RETRYABLE = { SandboxConnectionError = true, SandboxTimeoutError = true, RateLimitError = true }

-- Fields of the error itself; any other field given is a detail (context).
local OWN = { kind = true, message = true, backend = true, op = true, retryable = true,
              code = true, context = true, cause = true, errno = true }

local Error = {}
Error.__index = Error
Error.__tostring = function(e) return e.kind .. ": " .. e.message end
M.Error = Error

local names        -- "ENOENT" -> true: every errno name of this system

---The name and text of an errno number ("ENOENT", "No such file or
---directory"), or nil for a number that is none.
---@param n integer
---@return string|nil name, string|nil text
function M.errno_name(n)
  if math.type(n) ~= "integer" then return nil end
  return require("sbx.fs").errname(n)
end

---Is `name` an OS error name (ENOENT, EACCES, ...)?
function M.is_errno(name)
  if not names then
    names = {}
    for n = 1, 300 do
      local nm = M.errno_name(n)
      if nm then names[nm] = true end
    end
  end
  return type(name) == "string" and names[name] == true
end

local function bad_kind(kind)
  local known = {}
  for k in pairs(parent) do known[#known + 1] = k end
  table.sort(known)
  return M.new("ConfigError", "unknown error kind '" .. tostring(kind) .. "' (known: "
               .. table.concat(known, ", ") .. ")", { op = "errors" })
end

---@param kind string
---@param message string
---@param fields? table backend=, op=, retryable=, cause=, errno=, context=, and details
function M.new(kind, message, fields)
  if parent[kind] == nil then error(bad_kind(kind), 2) end
  local e = { kind = kind, message = tostring(message), retryable = RETRYABLE[kind] or false,
              code = M.CODES[kind], context = {} }
  if fields ~= nil and type(fields) ~= "table" then
    error(M.new("ConfigError", "errors: fields must be a table, got " .. type(fields), { op = "errors" }), 2)
  end
  for k, v in pairs(fields or {}) do
    if k == "context" then
      if type(v) == "table" then for ck, cv in pairs(v) do e.context[ck] = cv end end
    elseif k == "code" then
      -- core modules name failures like errno ("ENOENT", or their own
      -- "ESCAPE", "ETOOBIG"): an OS name is the errno, the rest a detail
      if M.is_errno(v) then e.errno = e.errno or v else e.context.reason = v end
    elseif k == "errno" then
      e.errno = math.type(v) == "integer" and (M.errno_name(v) or tostring(v)) or v
    elseif k == "kind" or k == "message" then    -- the arguments win
    else
      e[k] = v
      if not OWN[k] then e.context[k] = v end    -- also at the top, as before
    end
  end
  return setmetatable(e, Error)
end

---Raise a typed error: sbx.errors.raise(kind, message, fields).
function M.raise(kind, message, fields)
  if parent[kind] == nil then error(bad_kind(kind), 2) end
  error(M.new(kind, message, fields), 0)
end

---The raise helper of one provider: fail(kind, message, fields) raises the
---typed error with fields.backend = `backend` (fields is taken as given).
---@param backend string
---@return fun(kind: string, message: string, fields?: table)
function M.raiser(backend, prefix)
  return function(kind, message, fields)
    fields = fields or {}
    fields.backend = backend
    M.raise(kind, prefix and (prefix .. tostring(message)) or message, fields)
  end
end

---Does `err` belong to `kind` (respecting the hierarchy)?
---@return boolean
function M.is(err, kind)
  if parent[kind] == nil then error(bad_kind(kind), 2) end
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
