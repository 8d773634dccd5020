--- The request options exec and route share (--backend, --need, --only,
--- --cpu, ...), checked before anything is created: an unknown name, a
--- malformed number or a missing file is a usage error naming the flag,
--- what was expected and, for names, what exists (with "did you mean").
local providers = require "sbx.providers"
local check = require "sbx.core.check"

local M = {}

-- Every capability a backend may declare (the columns of `providers --matrix`).
M.CAPABILITIES = { "exec", "files", "streaming", "background", "resume", "snapshot", "network", "gpu" }

local function set_of(list)
  local s = {}
  for _, v in ipairs(list) do s[v] = true end
  return s
end

local function sorted_keys(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  table.sort(out)
  return out
end

-- "unknown backend 'x' (did you mean 'y'?; known: a, b)"
local function unknown(what, name, known)
  return string.format("unknown %s '%s'%s; known: %s", what, name, check.suggest(name, known),
                       table.concat(sorted_keys(known), ", "))
end

function M.backend_names()
  local s = set_of(providers.names)
  for _, n in ipairs(providers.planned) do s[n] = true end
  return s
end

function M.capability_names()
  local s = set_of(M.CAPABILITIES)
  for _, d in pairs(providers.describe()) do
    for _, c in ipairs(d.capabilities or {}) do s[c] = true end
  end
  return s
end

local function number(o, flag, min, strict)
  local v = o[flag]
  if v == nil then return true end
  local n = tonumber(v)
  if not n or n ~= n or n == math.huge or (strict and n <= min) or (not strict and n < min) then
    return nil, string.format("--%s expects a number %s %s, got '%s'", flag, strict and ">" or ">=",
                              tostring(min), v)
  end
  return n
end

---Check a policy name or file: nil, why when it is unknown.
function M.policy(name)
  if name == nil then return true end
  local pol, err, why = require("sbx.routing.policy").get(name)
  if not pol and why == "missing" then return nil, "--policy: " .. tostring(err) end
  return true
end

---sbx.sandbox/sbx.route options from parsed flags; nil, message on a usage error.
function M.options(o)
  local req = { needs = o.need, only = o.only, ignore = o.ignore, region = o.region,
                image = o.image, policy = o.policy, preset = o.preset, backend = o.backend }
  local backends = M.backend_names()
  if o.backend and not backends[o.backend] then return nil, "--backend: " .. unknown("backend", o.backend, backends) end
  for _, flag in ipairs{ "only", "ignore" } do
    for _, n in ipairs(o[flag] or {}) do
      if not backends[n] then return nil, "--" .. flag .. ": " .. unknown("backend", n, backends) end
    end
  end
  local caps = M.capability_names()
  for _, c in ipairs(o.need or {}) do
    if not caps[c] then return nil, "--need: " .. unknown("capability", c, caps) end
  end
  if o.isolation and not providers.ISOLATION[o.isolation] then
    return nil, "--isolation: " .. unknown("isolation", o.isolation, providers.ISOLATION)
  end
  if o.preset then
    local known = {}
    for n in pairs(require("sbx").presets()) do known[n] = true end
    if not known[o.preset] then return nil, "--preset: " .. unknown("preset", o.preset, known) end
  end
  local ok, err = M.policy(o.policy)
  if not ok then return nil, err end
  for flag, spec in pairs{ ["max-price"] = { "max_price", 0, false }, cpu = { "cpu", 0, true },
                           ["memory-mb"] = { "memory_mb", 0, true } } do
    local n, e = number(o, flag, spec[2], spec[3])
    if not n then return nil, e end
    if o[flag] then req[spec[1]] = n end
  end
  if o["no-internet"] then req.allow_internet = false end
  return req
end

-- ------------------------------------------------------------------ json

-- The JSON library writes an empty table as {}; a list that is empty must
-- still read [] (one shape, empty or not). `json(v, lists, is_list)`
-- writes the fields named in `lists` (at any depth) as arrays, and `v`
-- itself when `is_list`.
local EMPTY = "\1sbx-empty-list\1"
local function mark(v, lists)
  if type(v) ~= "table" then return v end
  local out = {}
  for k, x in pairs(v) do
    if lists[k] and type(x) == "table" and next(x) == nil then out[k] = EMPTY
    else out[k] = mark(x, lists) end
  end
  return out
end

function M.json(v, lists, is_list)
  if is_list and next(v) == nil then return "[]" end
  return (require("sbx").json.encode(mark(v, lists or {})):gsub('"\\u0001sbx%-empty%-list\\u0001"', "[]"))
end

---A --timeout in seconds (> 0), or nil, message.
function M.seconds(o, flag)
  return number(o, flag, 0, true)
end

return M
