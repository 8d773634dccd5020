-- sbx.cloud (the `cloud` global of provider scripts): HTTP answers and
-- broken links become API.md's typed errors with the provider's message,
-- idempotent calls are retried within their deadline, others never.
-- Against a real server on loopback (spec/support/standin/http.lua).
local loop = require "sbx.loop"
local stream = require "sbx.stream"
require "sbx"
local cloud = require "sbx.providers.cloud"
local H = require "spec.support.standin.http"
local S = require "spec.support"

describe("cloud client", function()
  local srv, hits, api
  before_each(function()
    hits = 0
    srv = assert(H.serve{ handler = function(req)
      hits = hits + 1
      if req.path == "/text" then return 200, "not json" end
      if req.path == "/empty" then return 204, "" end
      return 200, { ok = true, auth = req.headers.authorization, body = req.body, q = req.query.a }
    end })
    api = cloud.client{ provider = "acme", base = srv.url .. "/", deadline = 5,
                        headers = { authorization = "Bearer k" },
                        quota = { "maximum number of concurrent" }, not_found = { "sandbox was not found" } }
  end)
  after_each(function() srv:close() end)

  local function fails(method, path, o)
    local err = S.caught(function() api:request(method, path, o) end)
    return err
  end

  it("sends JSON with the client's headers and a query, and decodes the answer", function()
    local v = api:json("POST", "/x", { json = { n = 1 }, query = { a = "b c" } })
    assert.same({ true, "Bearer k", '{"n":1}', "b c" }, { v.ok, v.auth, v.body, v.q })
    assert.is_nil((api:json("GET", "/empty")))
    local err = S.caught(function() api:json("GET", "/text", { op = "info" }) end)
    assert.equal("SandboxConnectionError", err.kind)
    assert.matches("acme: info: the answer is not JSON", err.message)
  end)

  it("maps statuses to kinds, with the provider's message and context.status", function()
    for _, c in ipairs{
      { 401, { message = "bad key" }, "AuthenticationError" },
      { 403, { error = "forbidden here" }, "AuthenticationError" },
      { 404, { message = "no such sandbox" }, "SandboxNotFoundError" },
      { 502, "The sandbox was not found", "SandboxNotFoundError" },
      { 429, { message = "You have reached the maximum number of concurrent sandboxes" }, "QuotaExceededError" },
      { 400, { message = "Total CPU limit exceeded" }, "SandboxExecutionError" },
      { 503, { message = "down" }, "SandboxConnectionError" },
    } do
      srv:fault{ route = "POST /op", status = c[1], body = c[2] }
      local err = fails("POST", "/op", { op = "run" })
      assert.equal(c[3], err.kind, err.message)
      assert.equal(c[1], err.context.status)
      assert.equal("acme", err.backend)
      local said = type(c[2]) == "table" and (c[2].message or c[2].error) or c[2]
      assert.equal("acme: run: HTTP " .. c[1] .. ": " .. said, err.message)
    end
    srv:fault{ route = "POST /op", status = 422, body = { detail = "bad image" } }
    assert.equal("SandboxCreationError", fails("POST", "/op", { op = "create" }).kind)
  end)

  it("a 429 carries retry_after from Retry-After or the longest Retry-After-<bucket>", function()
    srv:fault{ route = "POST /op", status = 429, headers = { ["Retry-After"] = "7" } }
    local err = fails("POST", "/op")
    assert.equal("RateLimitError", err.kind)
    assert.is_true(err.retryable)
    assert.equal(7, err.retry_after)
    srv:fault{ route = "POST /op", status = 429,
               headers = { ["Retry-After-sandbox-create"] = "3", ["Retry-After-api"] = "11" } }
    assert.equal(11, fails("POST", "/op").context.retry_after)
    srv:fault{ route = "POST /op", status = 429 }
    assert.is_nil(fails("POST", "/op").retry_after)
    local soon = os.date("!%a, %d %b %Y %H:%M:%S GMT", os.time() + 30)
    local s = cloud.retry_after(soon)
    assert.is_true(s >= 28 and s <= 31, tostring(s))
  end)

  it("retries an idempotent call through 5xx, 429 and a cut link, never a POST", function()
    srv:fault{ route = "GET /x", status = 503, times = 1 }
    srv:fault{ route = "GET /x", status = 429, headers = { ["Retry-After"] = "0" } }
    srv:fault{ route = "GET /x", cut = "head" }
    assert.is_true(api:json("GET", "/x").ok)
    assert.equal(1, hits)
    srv:fault{ route = "POST /x", status = 503 }
    assert.equal("SandboxConnectionError", fails("POST", "/x").kind)
    assert.equal(1, hits)                                   -- the POST was not sent again
    srv:fault{ route = "DELETE /x", status = 404 }
    assert.equal(404, api:request("DELETE", "/x", { ok = { [404] = true } }).status)
  end)

  it("gives up at the deadline with the last attempt's error", function()
    srv:fault{ route = "GET /x", status = 500, times = -1 }
    local t0 = loop.now()
    local err = fails("GET", "/x", { deadline = 1 })
    assert.equal("SandboxConnectionError", err.kind)
    assert.equal(500, err.context.status)
    assert.is_true(loop.now() - t0 < 3)
    assert.equal(0, hits)
  end)

  it("a refused connection is a retryable SandboxConnectionError with its errno", function()
    local l, port = assert(stream.listen{ host = "127.0.0.1", port = 0 })
    l:close()                                              -- a port nobody listens on
    local dead = cloud.client{ provider = "acme", base = "http://127.0.0.1:" .. port, deadline = 0.5 }
    local err = S.caught(function() dead:request("GET", "/x", { op = "list" }) end)
    assert.equal("SandboxConnectionError", err.kind)
    assert.is_true(err.retryable)
    assert.matches("^acme: list: ", err.message)
    assert.equal("ECONNREFUSED", err.errno)
  end)

  it("labels a sandbox with what gc and list_owned find it by", function()
    local l = cloud.labels({ id = "sbx-1", session = "h-1-2", ttl = 60 }, { extra = 1 })
    assert.equal("sbx-1", l["sbxlua.id"])
    assert.equal("h-1-2", l["sbxlua.session"])
    assert.equal("60", l["sbxlua.ttl"])
    assert.equal("1", l.extra)
    assert.equal(require("sbx.state.owner").hostname(), l["sbxlua.host"])
  end)
end)

describe("cloud.multipart and cloud.agent", function()
  it("builds a multipart body the stand-ins' parser takes apart again, binary parts intact", function()
    local bytes = {}
    for i = 0, 255 do bytes[#bytes + 1] = string.char(i) end
    local blob = table.concat(bytes):rep(8) .. "\r\n--"
    local body, ctype = cloud.multipart{ { name = "files[0].path", data = "/a/b" },
                                         { name = "files[0].file", filename = "b", data = blob } }
    assert.matches("^multipart/form%-data; boundary=sbxlua%-%x+$", ctype)
    local parts = assert(require("spec.support.standin.daytona_toolbox").multipart(body, ctype))
    assert.equal(2, #parts)
    assert.same({ "files[0].path", "/a/b" }, { parts[1].name, parts[1].data })
    assert.same({ "files[0].file", "b", blob }, { parts[2].name, parts[2].filename, parts[2].data })
  end)

  it("hands out this build's static sbx-agent with a stable id", function()
    local bytes, id = cloud.agent()
    assert.equal("\127ELF", bytes:sub(1, 4))
    assert.equal(require("sbx.daemon.link").hash(bytes), id)
    assert.equal(id, select(2, cloud.agent()))
  end)
end)

describe("cloud.all", function()
  it("runs the functions at once and answers their results in order", function()
    local ev = loop.event()
    local a, b, c = cloud.all(function() ev:wait() return "first" end,     -- waits for the second: at once, or never
                              function() ev:notify() return "second" end,
                              function() return nil end)
    assert.same({ "first", "second" }, { a, b })
    assert.is_nil(c)
  end)

  it("raises the error of the one that failed, the others cancelled", function()
    local ran_on = false
    local err = S.caught(function()
      cloud.all(function() error({ kind = "SandboxConnectionError", message = "cut" }, 0) end,
                function() loop.sleep(30) ran_on = true end)
    end)
    assert.equal("SandboxConnectionError", err and err.kind)
    assert.is_false(ran_on)
  end)

  it("refuses what is not a function, naming its place, before running any", function()
    local ran = false
    local ok, err = pcall(cloud.all, function() ran = true end, "GET /x")
    assert.is_false(ok)
    assert.matches("cloud%.all: argument 2 is not a function", tostring(err))
    assert.is_false(ran)
  end)
end)
