-- A small OpenAPI 3 request validator for the stand-ins: the document is
-- read with sbx.yaml, routes are matched on their path templates, and a
-- request's query parameters and JSON body are checked against the schemas
-- the way strict servers do (unknown fields and missing required ones are
-- an error; types, enums, minimum/maximum, items, additionalProperties,
-- allOf/oneOf/anyOf, nullable, $ref).
--
--   local api = assert(O.load("/path/e2b-openapi.yml"))
--   local op, params = api:match("POST", "/sandboxes/abc/connect")
--   local why = api:check(op, query, body_string)   -- nil when valid
local yaml = require "sbx.yaml"
local json = require("cjson.safe").new()

local M = {}

local Api = {}
Api.__index = Api

function M.load(file)
  local f, err = io.open(file)
  if not f then return nil, err end
  local text = f:read("a")
  f:close()
  local doc, why = yaml.decode(text, { max_bytes = 1 << 24, max_depth = 64 })
  if not doc then return nil, file .. ": " .. tostring(why) end
  local routes = {}
  for tpl, item in pairs(doc.paths or {}) do
    local names = {}
    local pat = "^" .. tpl:gsub("[%-%.%+%*%?%%%[%]%(%)%^%$]", "%%%0"):gsub("{([^}]+)}", function(n)
      names[#names + 1] = n
      return "([^/]+)"
    end) .. "$"
    routes[#routes + 1] = { tpl = tpl, pat = pat, names = names, item = item,
                            literal = select(2, tpl:gsub("{", "")) == 0 }
  end
  -- literal paths first ("/sandboxes/metrics" before "/sandboxes/{sandboxID}")
  table.sort(routes, function(a, b)
    if a.literal ~= b.literal then return a.literal end
    return #a.tpl > #b.tpl
  end)
  return setmetatable({ doc = doc, routes = routes, file = file }, Api)
end

function Api:resolve(s)
  local seen = 0
  while type(s) == "table" and s["$ref"] do
    local ref = s["$ref"]
    local node = self.doc
    for part in ref:gsub("^#/", ""):gmatch("[^/]+") do node = type(node) == "table" and node[part] or nil end
    if node == nil then error("unresolved $ref " .. ref) end
    s, seen = node, seen + 1
    if seen > 32 then error("$ref loop at " .. ref) end
  end
  return s
end

---The operation for METHOD path, and the path parameters; nil when the
---document has no such route.
function Api:match(method, path)
  for _, r in ipairs(self.routes) do
    local caps = { path:match(r.pat) }
    if caps[1] or path:match(r.pat) then
      local op = r.item[method:lower()]
      if op then
        local params = {}
        for i, n in ipairs(r.names) do params[n] = caps[i] end
        op = setmetatable({ route = method .. " " .. r.tpl }, { __index = op })
        return op, params
      end
    end
  end
end

local function kind_of(v)
  if v == json.null then return "null" end
  local t = type(v)
  if t == "table" then
    if next(v) == nil then return "empty" end
    return #v > 0 and "array" or "object"
  end
  if t == "number" then return math.type(v) == "integer" and "integer" or (v == math.floor(v) and "integer" or "number") end
  return t
end

local function fits(kind, want)
  if want == nil then return true end
  if kind == want then return true end
  if kind == "empty" then return want == "array" or want == "object" end
  if kind == "integer" and want == "number" then return true end
  return false
end

-- Why `v` does not fit schema `s` (nil when it does); `at` names the place.
function Api:validate(v, s, at)
  s = self:resolve(s)
  if type(s) ~= "table" then return nil end
  if v == json.null then
    if s.nullable then return nil end
    if s.type or s.properties then return at .. ": must not be null" end
  end
  if s.allOf then
    for _, sub in ipairs(s.allOf) do
      local why = self:validate(v, sub, at)
      if why then return why end
    end
  end
  for _, key in ipairs{ "oneOf", "anyOf" } do
    if s[key] then
      local first
      for _, sub in ipairs(s[key]) do
        local why = self:validate(v, sub, at)
        if not why then first = nil break end
        first = first or why
      end
      if first then return first end
    end
  end
  local want = s.type or ((s.properties or s.additionalProperties ~= nil) and "object" or nil)
  local k = kind_of(v)
  if not fits(k, want) then return string.format("%s: expected %s, got %s", at, want, k == "empty" and "table" or k) end
  if s.enum then
    local ok = false
    for _, e in ipairs(s.enum) do ok = ok or e == v end
    if not ok then return string.format("%s: %s is not one of the allowed values", at, tostring(v)) end
  end
  if want == "integer" or want == "number" then
    if s.minimum and v < s.minimum then return string.format("%s: %s is below the minimum %s", at, v, s.minimum) end
    if s.maximum and v > s.maximum then return string.format("%s: %s is above the maximum %s", at, v, s.maximum) end
  elseif want == "array" then
    for i, item in ipairs(v) do
      local why = s.items and self:validate(item, s.items, at .. "[" .. (i - 1) .. "]")
      if why then return why end
    end
  elseif want == "object" then
    for _, r in ipairs(s.required or {}) do
      if v[r] == nil then return string.format("%s: required property '%s' is missing", at, r) end
    end
    local props, extra = s.properties or {}, s.additionalProperties
    local keys = {}
    for key in pairs(v) do keys[#keys + 1] = tostring(key) end
    table.sort(keys)
    for _, key in ipairs(keys) do
      local sub = props[key]
      if sub then
        local why = self:validate(v[key], sub, at .. "." .. key)
        if why then return why end
      elseif type(extra) == "table" then
        local why = self:validate(v[key], extra, at .. "." .. key)
        if why then return why end
      elseif extra ~= true and (s.properties or extra == false) then
        return string.format("%s: unknown property '%s'", at, key)
      end
    end
  end
  return nil
end

---Why the request does not fit operation `op` (nil when it does): its
---query parameters (query: name -> string) and its JSON body (a string).
function Api:check(op, query, body)
  for _, p in ipairs(op.parameters or {}) do
    p = self:resolve(p)
    if p["in"] == "query" then
      local v = query[p.name]
      if v == nil and p.required then return "query parameter '" .. p.name .. "' is required" end
      local s = p.schema and self:resolve(p.schema)
      if v ~= nil and s and s.type == "integer" then
        local n = tonumber(v)
        if not n or n ~= math.floor(n) then return "query parameter '" .. p.name .. "' must be an integer" end
        local why = self:validate(math.tointeger(n), s, "query." .. p.name)
        if why then return why end
      end
    end
  end
  local rb = op.requestBody and self:resolve(op.requestBody)
  if not rb then return nil end
  local media = rb.content and rb.content["application/json"]
  if not media then return nil end
  if body == nil or body == "" then
    if rb.required then return "the request body is required" end
    return nil
  end
  local v, why = json.decode(body)
  if v == nil then return "the body is not JSON: " .. tostring(why) end
  return self:validate(v, media.schema, "body")
end

return M
