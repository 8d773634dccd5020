-- Requests checked against a published OpenAPI document (3.x or Swagger
-- 2.0), decoded into Lua tables (cjson for JSON; YAML decodes to the same
-- shape), as a strict server checks them: an unknown route is a 404, a
-- missing required parameter, a value of the wrong type, a missing
-- required field or a field the schema does not declare is a 400 naming
-- it. The stand-ins of cloud APIs (spec/support/standin/*.lua) check every
-- request with it, and their specs check their answers.
--
--   local openapi = require "spec.support.standin.openapi"
--   local api = openapi.new(cjson.decode(text), { prefix = "/api" })
--   local op, params = api:route("POST", "/api/sandbox")      -- nil: no such route
--   local ok, why = api:check(op, { query = q, headers = h, body = decoded_json, params = params })
--   local ok, why = api:check_value(schema_or_ref, value, "where")
--   api:extend("CreateSandbox", { kvm = { type = "boolean" } })   -- fields a vendor's SDK sends beyond its spec
local M = {}

local Api = {}
Api.__index = Api

local METHODS = { get = true, put = true, post = true, delete = true, patch = true, head = true, options = true }

local function escape_pattern(s) return (s:gsub("[%^%$%(%)%%%.%[%]%*%+%-%?]", "%%%0")) end

---new(doc, { prefix = "/api", null = cjson.null }) -> an Api over the decoded document
function M.new(doc, o)
  o = o or {}
  assert(type(doc) == "table" and type(doc.paths) == "table", "openapi.new: a decoded OpenAPI document with paths")
  local self = setmetatable({ doc = doc, prefix = o.prefix or "", null = o.null, routes = {} }, Api)
  self.schemas = (doc.components and doc.components.schemas) or doc.definitions or {}
  for path, item in pairs(doc.paths) do
    local names = {}
    local pat = escape_pattern(path):gsub("{([^}]+)}", function(n) names[#names + 1] = n return "([^/]+)" end)
    -- literal segments first: /sandbox/paginated before /sandbox/{id}
    local literal = select(2, path:gsub("{", "")) == 0
    for m, op in pairs(item) do
      if METHODS[m] then
        local params = {}
        for _, p in ipairs(item.parameters or {}) do params[#params + 1] = p end
        for _, p in ipairs(op.parameters or {}) do params[#params + 1] = p end
        self.routes[#self.routes + 1] = { method = m:upper(), path = path, pattern = "^" .. pat .. "$",
          names = names, literal = literal, segments = select(2, path:gsub("/", "")), op = op, params = params }
      end
    end
  end
  table.sort(self.routes, function(a, b)
    if a.literal ~= b.literal then return a.literal end
    if a.segments ~= b.segments then return a.segments > b.segments end
    return a.path < b.path
  end)
  return self
end

function Api:ref(s)
  local seen = 0
  while type(s) == "table" and s["$ref"] do
    local name = s["$ref"]:match("([^/]+)$")
    s = self.schemas[name]
    seen = seen + 1
    assert(s and seen < 32, "openapi: unresolved $ref " .. tostring(name))
  end
  return s
end

---extend(schema name, { field = schema }): fields accepted beyond the
---document (what the vendor's own SDK sends that its spec does not list).
function Api:extend(name, props)
  local s = assert(self.schemas[name], "openapi.extend: no schema " .. name)
  s.properties = s.properties or {}
  for k, v in pairs(props) do s.properties[k] = v end
end

---route(method, path) -> the route ({ op, params, path }), the path parameters | nil
function Api:route(method, path)
  if self.prefix ~= "" then
    if path:sub(1, #self.prefix) ~= self.prefix then return nil end
    path = path:sub(#self.prefix + 1)
  end
  for _, r in ipairs(self.routes) do
    if r.method == method then
      local caps = { path:match(r.pattern) }
      if caps[1] ~= nil or path:match(r.pattern) then
        local out = {}
        for i, n in ipairs(r.names) do out[n] = caps[i] end
        return r, out
      end
    end
  end
end

local function json_type(v, null)
  local t = type(v)
  if v == nil or (null ~= nil and v == null) then return "null" end
  if t == "string" then return "string" end
  if t == "boolean" then return "boolean" end
  if t == "number" then return math.type(v) == "integer" and "integer" or (v == math.floor(v) and "integer" or "number") end
  if t == "table" then
    if next(v) == nil then return getmetatable(v) and getmetatable(v).__name == "array" and "array" or "empty" end
    if v[1] ~= nil and #v > 0 then return "array" end
    return "object"
  end
  return t
end

local function fits(want, got)
  if want == got then return true end
  if want == "number" and got == "integer" then return true end
  if got == "empty" and (want == "object" or want == "array") then return true end
  return false
end

---check_value(schema, value, where) -> true | nil, why
function Api:check_value(s, v, where)
  s = self:ref(s)
  if type(s) ~= "table" then return true end
  if s.allOf then
    for _, sub in ipairs(s.allOf) do
      local ok, why = self:check_value(sub, v, where)
      if not ok then return nil, why end
    end
    if not s.type and not s.properties then return true end
  end
  if s.oneOf or s.anyOf then
    local last
    for _, sub in ipairs(s.oneOf or s.anyOf) do
      local ok, why = self:check_value(sub, v, where)
      if ok then return true end
      last = why
    end
    return nil, last
  end
  local got = json_type(v, self.null)
  if got == "null" then
    if s.nullable or s["x-nullable"] then return true end
    return nil, where .. " must not be null"
  end
  local want = s.type
  if want == "file" then return true end
  if want and not fits(want, got) then
    return nil, string.format("%s must be %s, not %s", where, want == "integer" and "an integer" or want,
                              got == "empty" and "an empty list" or got)
  end
  if s.enum then
    local found = false
    for _, e in ipairs(s.enum) do if e == v then found = true end end
    if not found then return nil, where .. " must be one of the allowed values (got " .. tostring(v) .. ")" end
  end
  if (want == "array" or got == "array") and s.items and type(v) == "table" then
    for i, item in ipairs(v) do
      local ok, why = self:check_value(s.items, item, where .. "[" .. (i - 1) .. "]")
      if not ok then return nil, why end
    end
  end
  if (want == "object" or s.properties) and type(v) == "table" and got ~= "array" then
    for _, name in ipairs(s.required or {}) do
      if v[name] == nil then return nil, string.format("%s.%s is required", where, name) end
    end
    local props = s.properties or {}
    local extra = s.additionalProperties
    for k, item in pairs(v) do
      if type(k) ~= "string" then return nil, where .. " must be an object" end
      if props[k] then
        local ok, why = self:check_value(props[k], item, where .. "." .. k)
        if not ok then return nil, why end
      elseif type(extra) == "table" then
        local ok, why = self:check_value(extra, item, where .. "." .. k)
        if not ok then return nil, why end
      elseif extra ~= true and (s.properties or extra == false) then
        return nil, string.format("property %s.%s should not exist", where, k)
      end
    end
  end
  return true
end

local function scalar(p, raw, where)
  local s = p.schema or p
  local t = s.type
  if t == "array" then return true end             -- repeated or comma-joined: any text
  if t == "integer" then
    if not raw:match("^%-?%d+$") then return nil, where .. " must be an integer" end
  elseif t == "number" then
    if not tonumber(raw) then return nil, where .. " must be a number" end
  elseif t == "boolean" then
    if raw ~= "true" and raw ~= "false" then return nil, where .. " must be a boolean" end
  end
  if s.enum then
    for _, e in ipairs(s.enum) do if tostring(e) == raw then return true end end
    return nil, where .. " must be one of the allowed values"
  end
  return true
end

---The request body's schema and media type of a route (3.x requestBody or a 2.0 body parameter).
function Api:body_schema(r)
  local rb = r.op.requestBody
  if rb then
    rb = self:ref(rb)
    local c = rb.content or {}
    local json = c["application/json"]
    return json and json.schema, rb.required, json and "application/json" or next(c)
  end
  for _, p in ipairs(r.params) do
    if p["in"] == "body" then return p.schema, p.required, "application/json" end
  end
  for _, p in ipairs(r.params) do
    if p["in"] == "formData" then return nil, false, "multipart/form-data" end
  end
end

---check(route, { query = { k = "v" }, headers = {...}, body = decoded JSON | nil,
---params = path parameters }) -> true | nil, why
function Api:check(r, req)
  local query, headers = req.query or {}, req.headers or {}
  for _, p in ipairs(r.params) do
    p = self:ref(p)
    local where = p["in"]
    local raw
    if where == "query" then raw = query[p.name]
    elseif where == "header" then raw = headers[p.name:lower()]
    elseif where == "path" then raw = (req.params or {})[p.name] end
    if where == "query" or where == "header" or where == "path" then
      if raw == nil or raw == "" then
        if p.required then return nil, string.format("%s parameter %s is required", where, p.name) end
      else
        local ok, why = scalar(p, raw, where .. " parameter " .. p.name)
        if not ok then return nil, why end
      end
    end
  end
  local schema, required, media = self:body_schema(r)
  if media == "application/json" and schema then
    if req.body == nil then
      if required then return nil, "the request body is required" end
      return true
    end
    return self:check_value(schema, req.body, "body")
  end
  return true
end

---The schema of a route's answer with `status` (for checking a server's answers).
function Api:response_schema(r, status)
  local resp = r.op.responses and (r.op.responses[tostring(status)] or r.op.responses.default)
  resp = resp and self:ref(resp)
  if not resp then return nil end
  if resp.schema then return resp.schema end
  local c = resp.content and resp.content["application/json"]
  return c and c.schema
end

return M
