--- Argument checks for the facade: misuse becomes a ConfigError that names
--- the call, the option and what was expected.
local errors = require "sbx.core.errors"

local M = {}

function M.bad(op, msg)
  errors.raise("ConfigError", op .. ": " .. msg, { op = op })
end

-- Levenshtein distance, for "did you mean" hints on option names.
local function distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = a:sub(i, i) == b:sub(j, j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

function M.suggest(name, known)
  local best, bestd
  for k in pairs(known) do
    local d = distance(name, k)
    if d <= 2 and (not bestd or d < bestd or (d == bestd and k < best)) then best, bestd = k, d end
  end
  return best and (" (did you mean '" .. best .. "'?)") or ""
end

local function is_list(t)
  if type(t) ~= "table" then return false end
  local n = #t
  for k in pairs(t) do
    if math.type(k) ~= "integer" or k < 1 or k > n then return false end
  end
  return true
end

local checkers = {
  list = function(v) return is_list(v) end,
  map = function(v)
    if type(v) ~= "table" then return false end
    for k, x in pairs(v) do
      if type(k) ~= "string" or (type(x) ~= "string" and type(x) ~= "number") then return false end
    end
    return true
  end,
  integer = function(v) return math.type(v) == "integer" end,
}

local function matches(v, want)
  if type(want) == "table" then
    for _, w in ipairs(want) do if matches(v, w) then return true end end
    return false
  end
  local c = checkers[want]
  if c then return c(v) end
  return type(v) == want
end

local function describe(want)
  if type(want) == "table" then return table.concat(want, " or ") end
  if want == "map" then return "a table of string keys to strings" end
  if want == "list" then return "a list" end
  return "a " .. want
end

---Check an options table against { name = type } and return it (or {}).
function M.options(opts, spec, op)
  if opts == nil then return {} end
  if type(opts) ~= "table" then M.bad(op, "options must be a table, got " .. type(opts)) end
  for k, v in pairs(opts) do
    if type(k) ~= "string" then M.bad(op, "option names must be strings, got " .. tostring(k)) end
    local want = spec[k]
    if not want then M.bad(op, "unknown option '" .. k .. "'" .. M.suggest(k, spec)) end
    if not matches(v, want) then
      M.bad(op, "option '" .. k .. "' must be " .. describe(want) .. ", got " .. type(v))
    end
  end
  return opts
end

---A list of strings (numbers are converted); raises naming the bad item.
function M.list(t, op, name)
  if not is_list(t) then M.bad(op, name .. " must be a list of strings") end
  local out = {}
  for i, v in ipairs(t) do
    if type(v) == "number" then v = tostring(v) end
    if type(v) ~= "string" then
      M.bad(op, string.format("%s[%d] must be a string, got %s", name, i, type(v)))
    end
    if v:find("\0", 1, true) then M.bad(op, string.format("%s[%d] contains a NUL byte", name, i)) end
    out[i] = v
  end
  return out
end

function M.string(v, op, name)
  if type(v) ~= "string" then M.bad(op, name .. " must be a string, got " .. type(v)) end
  return v
end

M.MAX_SECONDS = 1e9       -- ~31 years: any duration past it is a mistake

---A number argument: finite, an integer when o.integer, > o.above, within
---[o.min, o.max]; returns it (as an integer when o.integer). Raises a
---ConfigError naming the call and the option.
function M.number(v, op, name, o)
  o = o or {}
  if type(v) ~= "number" then M.bad(op, name .. " must be a number, got " .. type(v)) end
  if v ~= v or v == math.huge or v == -math.huge then
    M.bad(op, name .. " must be a finite number, got " .. (v ~= v and "nan" or tostring(v)))
  end
  if o.integer then
    local i = math.tointeger(v)
    if not i then M.bad(op, name .. " must be an integer, got " .. tostring(v)) end
    v = i
  end
  if o.above and not (v > o.above) then M.bad(op, name .. " must be > " .. o.above .. ", got " .. tostring(v)) end
  if o.min and v < o.min then M.bad(op, name .. " must be >= " .. o.min .. ", got " .. tostring(v)) end
  if o.max and v > o.max then M.bad(op, name .. " must be <= " .. o.max .. ", got " .. tostring(v)) end
  return v
end

local SECONDS_ZERO_OK = { min = 0, max = M.MAX_SECONDS }
local SECONDS = { above = 0, max = M.MAX_SECONDS }

---A duration in seconds: finite, > 0 (>= 0 with zero_ok), at most MAX_SECONDS.
function M.seconds(v, op, name, zero_ok)
  return M.number(v, op, name, zero_ok and SECONDS_ZERO_OK or SECONDS)
end

---A plain text option: a string without NUL (non-empty unless empty_ok).
function M.text(v, op, name, empty_ok)
  M.string(v, op, name)
  if v == "" and not empty_ok then M.bad(op, name .. " must not be empty") end
  if v:find("\0", 1, true) then M.bad(op, name .. " contains a NUL byte") end
  return v
end

---Labels: non-empty names without '=', spaces, control bytes or NUL;
---values strings without NUL or finite numbers.
function M.labels(t, op, name)
  for k, v in pairs(t or {}) do
    if type(k) ~= "string" or k == "" or k:find("[%z%c%s=]") then
      M.bad(op, string.format("%s: invalid label name %q", name, tostring(k)))
    end
    if type(v) == "number" then M.number(v, op, name .. "." .. k)
    elseif type(v) ~= "string" or v:find("\0", 1, true) then
      M.bad(op, string.format("%s.%s must be a string without NUL bytes", name, k))
    end
  end
  return t
end

---Environment variables: names without '=' or NUL, values without NUL.
function M.env(t, op, name)
  local out = {}
  for k, v in pairs(t or {}) do
    if type(k) ~= "string" or k == "" or k:find("[=%z]") then
      M.bad(op, string.format("%s: invalid variable name %q", name, tostring(k)))
    end
    if type(v) == "number" then M.number(v, op, name .. "." .. k) end
    v = tostring(v)
    if v:find("\0", 1, true) then M.bad(op, string.format("%s.%s contains a NUL byte", name, k)) end
    out[k] = v
  end
  return out
end

return M
