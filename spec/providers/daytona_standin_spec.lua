-- The Daytona stand-in (spec/support/standin/daytona.lua) and the OpenAPI
-- checker under it (openapi.lua): requests are held to the published
-- documents as a strict server holds them, its answers match the
-- documents' response schemas, the state machine moves over polls, and
-- Daytona's own error shapes come out.
local http = require "sbx.http"
local loop = require "sbx.loop"
local json = require "cjson"
require "sbx"
local S = require "spec.support"
local D = require "spec.support.standin.daytona"
local openapi = require "spec.support.standin.openapi"

describe("openapi checker", function()
  local api, tb
  setup(function() api, tb = D.documents(S.SOURCE) end)

  it("finds routes, literal segments before templated ones, with their parameters", function()
    local r, p = api:route("GET", "/sandbox/abc")
    assert.equal("getSandbox", r.op.operationId)
    assert.equal("abc", p.sandboxIdOrName)
    assert.equal("listSandboxes", api:route("GET", "/sandbox").op.operationId)
    assert.equal("getSandboxesForRunner", api:route("GET", "/sandbox/for-runner").op.operationId)
    assert.is_nil(api:route("GET", "/no/such/route"))
    r, p = tb:route("GET", "/process/session/s1/command/c2/logs")
    assert.equal("GetSessionCommandLogs", r.op.operationId)
    assert.same({ sessionId = "s1", commandId = "c2" }, p)
  end)

  it("refuses unknown fields, missing required ones and wrong types, naming them", function()
    local r = api:route("POST", "/sandbox")
    assert.is_true(api:check(r, { body = { cpu = 2, labels = { a = "b" }, env = {} } }))
    local ok, why = api:check(r, { body = { cpu = 2, cpus = 4 } })
    assert.is_nil(ok)
    assert.matches("body%.cpus should not exist", why)
    ok, why = api:check(r, { body = { cpu = "2" } })
    assert.matches("body%.cpu must be an integer", why)
    ok, why = api:check(r, { body = { cpu = 1.5 } })
    assert.matches("body%.cpu must be an integer", why)
    ok, why = api:check(r, { body = { labels = { a = 1 } } })
    assert.matches("body%.labels%.a must be string", why)
    ok, why = api:check(r, { body = { buildInfo = {} } })
    assert.matches("body%.buildInfo%.dockerfileContent is required", why)
    ok, why = api:check(r, {})
    assert.matches("request body is required", why)
    -- Swagger 2.0 (the toolbox): body parameters and required query ones
    local e = tb:route("POST", "/process/execute")
    assert.is_true(tb:check(e, { body = { command = "ls", timeout = 5 } }))
    assert.matches("body%.command is required", select(2, tb:check(e, { body = { cwd = "/" } })))
    local f = tb:route("POST", "/files/folder")
    assert.matches("query parameter mode is required", select(2, tb:check(f, { query = { path = "/x" } })))
    local l = api:route("GET", "/sandbox")
    assert.matches("query parameter limit must be a number", select(2, api:check(l, { query = { limit = "lots" } })))
  end)

  it("works on a document decoded from YAML too", function()
    local yaml = require "sbx.yaml"
    local doc = assert(yaml.decode([[
paths:
  /things:
    post:
      requestBody:
        required: true
        content:
          application/json:
            schema: { $ref: "#/components/schemas/Thing" }
components:
  schemas:
    Thing:
      type: object
      required: [name]
      properties:
        name: { type: string }
]]))
    local a = openapi.new(doc)
    local r = a:route("POST", "/things")
    assert.is_true(a:check(r, { body = { name = "x" } }))
    assert.matches("body%.name is required", select(2, a:check(r, { body = {} })))
    assert.matches("body%.size should not exist", select(2, a:check(r, { body = { name = "x", size = 1 } })))
  end)
end)

describe("daytona stand-in", function()
  local s, H
  local function call(method, path, body, headers)
    local h = { authorization = "Bearer k", ["content-type"] = "application/json" }
    for k, v in pairs(headers or {}) do h[k] = v end
    local res = assert(http.request{ method = method, url = s.url .. path, headers = h,
                                     body = body and json.encode(body) or nil })
    return res.status, (res.body ~= "" and res.headers["content-type"] == "application/json") and json.decode(res.body) or res.body, res
  end
  -- the answer holds to the document's response schema
  local function conforms(doc, method, path, status, v)
    local r = assert(doc:route(method, path))
    local schema = assert(doc:response_schema(r, status), "no schema for " .. method .. " " .. path .. " " .. status)
    assert(doc:check_value(schema, v, "answer"))
  end

  setup(function()
    s = D.start{ key = "k", max_cpu = 3, polls = 3 }
    H = s.srv
  end)
  teardown(function() s:close() end)

  it("creates: creating, then started after several polls, and its answers fit the document", function()
    local st, v = call("POST", "/sandbox", { cpu = 1, memory = 1, labels = { ["sbxlua.id"] = "x1" } })
    assert.equal(200, st)
    assert.equal("creating", v.state)
    conforms(s.apidoc, "POST", "/sandbox", 200, v)
    local states = {}
    for _ = 1, 200 do
      local _, g = call("GET", "/sandbox/" .. v.id)
      conforms(s.apidoc, "GET", "/sandbox/x", 200, g)
      if states[#states] ~= g.state then states[#states + 1] = g.state end
      if g.state == "started" then break end
      loop.sleep(0.05)
    end
    assert.same({ "starting", "started" }, states)
    local _, list = call("GET", "/sandbox?labels=" .. http.escape(json.encode{ ["sbxlua.id"] = "x1" }))
    conforms(s.apidoc, "GET", "/sandbox", 200, list)
    assert.equal(1, #list.items)
    assert.equal(v.id, list.items[1].id)
    local _, none = call("GET", "/sandbox?labels=" .. http.escape(json.encode{ ["sbxlua.id"] = "nope" }))
    assert.same({}, none.items)
    -- the toolbox: merged output and exit code; an unknown field is a 400
    local _, x = call("POST", "/toolbox/" .. v.id .. "/process/execute", { command = "echo out; echo err >&2; exit 3" })
    assert.same({ exitCode = 3, result = "out\nerr\n" }, x)
    local bad, e = call("POST", "/toolbox/" .. v.id .. "/process/execute", { command = "true", shell = "bash" })
    assert.equal(400, bad)
    assert.equal("DAYTONA_DAEMON", e.source)
    assert.matches("body%.shell should not exist", e.message)
    assert.equal(200, (call("DELETE", "/sandbox/" .. v.id)))
    local gone, ge = call("GET", "/sandbox/" .. v.id)
    assert.equal(404, gone)
    assert.equal("Sandbox with ID or name " .. v.id .. " not found", ge.message)
    assert.same({ 404, "Not Found", "/sandbox/" .. v.id }, { ge.statusCode, ge.error, ge.path })
    assert.matches("^%d%d%d%d%-%d%d%-%d%dT", ge.timestamp)
  end)

  it("answers Daytona's errors: auth, quota, resources with a snapshot, a strict body", function()
    local before = s.created
    assert.equal(401, (call("GET", "/sandbox", nil, { authorization = "Bearer wrong" })))
    local st, v = call("POST", "/sandbox", { cpu = 4 })
    assert.equal(400, st)
    assert.equal("Total CPU limit exceeded. Maximum allowed: 3.", v.message)
    st, v = call("POST", "/sandbox", { snapshot = "daytonaio/sandbox:0.4.3", cpu = 1 })
    assert.equal(400, st)
    assert.equal("Cannot specify Sandbox resources when using a snapshot", v.message)
    st, v = call("POST", "/sandbox", { cpu = 1, labels = { a = "b" }, networkBlockAll = true, cpuCount = 1 })
    assert.equal(400, st)
    assert.matches("cpuCount should not exist", v.message)
    assert.equal(0, s.created - before)
  end)

  it("429 with Retry-After-<bucket> from the fault API", function()
    H:fault{ route = "POST /sandbox", status = 429, body = { statusCode = 429, message = "ThrottlerException: Too Many Requests" },
             headers = { ["Retry-After-sandbox-create"] = "2", ["X-RateLimit-Remaining-sandbox-create"] = "0" } }
    local st, v, res = call("POST", "/sandbox", { cpu = 1 })
    assert.equal(429, st)
    assert.equal("2", res.headers["retry-after-sandbox-create"])
    assert.matches("Too Many Requests", v.message)
  end)
end)
