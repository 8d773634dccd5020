-- spec/support/standin/http.lua, the server under every cloud stand-in:
-- keep-alive, request bodies (length and chunked), streaming answers, and
-- the faults on demand, driven through libcurl (sbx.http) as a client.
local http = require "sbx.http"
local loop = require "sbx.loop"
local json = require "cjson"
require "sbx"
local H = require "spec.support.standin.http"

describe("stand-in http server", function()
  local srv, calls
  before_each(function()
    calls = 0
    srv = assert(H.serve{ handler = function(req, res)
      calls = calls + 1
      if req.path == "/echo" then
        return 200, { method = req.method, body = req.body, q = req.query.q, h = req.headers["x-t"] }
      elseif req.path == "/stream" then
        res:start(200, { ["Content-Type"] = "text/plain" })
        for i = 1, 3 do res:write("part" .. i .. "\n") loop.sleep(0.01) end
        res:finish()
      elseif req.path == "/sent" then
        return res:send(201, { made = true })
      elseif req.path == "/boom" then
        error("handler bug")
      else
        return 404, { message = "no " .. req.path }
      end
    end })
  end)
  after_each(function() srv:close() end)

  local function req(o)
    o.url = srv.url .. o.url
    return assert(http.request(o))
  end

  it("answers JSON, with bodies, queries and headers, on one kept-alive connection", function()
    for i = 1, 3 do
      local r = req{ url = "/echo?q=" .. i, method = "POST", body = string.rep("b", 100000 * i),
                     headers = { ["x-t"] = "t" .. i } }
      assert.equal(200, r.status)
      local v = json.decode(r.body)
      assert.same({ "POST", 100000 * i, tostring(i), "t" .. i }, { v.method, #v.body, v.q, v.h })
    end
    assert.equal(3, calls)
  end)

  it("streams chunked answers as they are written", function()
    local r = req{ url = "/stream", stream = true }
    local got = {}
    while true do
      local c = r:read()
      if not c then break end
      got[#got + 1] = c
    end
    assert.equal("part1\npart2\npart3\n", table.concat(got))
  end)

  it("a handler's error is a 500 saying so, and an unknown route the handler's 404", function()
    local r = req{ url = "/boom" }
    assert.equal(500, r.status)
    assert.matches("handler bug", r.body)
    assert.equal(404, req{ url = "/nope" }.status)
  end)

  it("injects a fault per route, the given number of times", function()
    srv:fault{ route = "GET /echo", status = 429, headers = { ["Retry-After"] = "2" }, times = 2 }
    local a, b, c = req{ url = "/echo" }, req{ url = "/echo" }, req{ url = "/echo" }
    assert.same({ 429, 429, 200 }, { a.status, b.status, c.status })
    assert.equal("2", a.headers["retry-after"])
    assert.equal(1, calls)                     -- the handler ran only for the third
  end)

  it("after = true: the handler's effect happens, the answer is the fault's", function()
    srv:fault{ route = "POST /echo", status = 504, after = true }
    assert.equal(504, req{ url = "/echo", method = "POST", body = "x" }.status)
    assert.equal(1, calls)
  end)

  it("after = true with a handler that answered through res:send: only the fault's answer goes out", function()
    srv:fault{ route = "POST /sent", status = 504, after = true }
    assert.equal(504, req{ url = "/sent", method = "POST", body = "x" }.status)
    assert.equal(1, calls)
    -- the next answer on the kept-alive connection is its own, not the handler's stray 201
    local r = req{ url = "/echo?q=next" }
    assert.equal(200, r.status)
    assert.equal("next", json.decode(r.body).q)
  end)

  it("cuts a connection before the answer or in the middle of its body", function()
    srv:fault{ route = "GET /echo", cut = "head" }
    local r, err = http.request{ url = srv.url .. "/echo" }
    assert.is_nil(r, "a cut connection must not look like an answer")
    assert.is_string(err)
    srv:fault{ route = "GET /echo", cut = "body" }
    r, err = http.request{ url = srv.url .. "/echo" }
    assert.is_nil(r)
    assert.is_string(err)
    assert.equal(200, req{ url = "/echo" }.status)   -- the server goes on
  end)

  it("delays an answer", function()
    srv:fault{ route = "GET /echo", delay = 0.3 }
    local t0 = loop.now()
    assert.equal(200, req{ url = "/echo" }.status)
    assert.is_true(loop.now() - t0 >= 0.3)
  end)

  it("takes faults over HTTP and lists the routes it served", function()
    local r = req{ url = "/_standin/faults", method = "POST",
                   body = json.encode{ route = "GET /e%a+", status = 503, times = 1 } }
    assert.equal(201, r.status)
    assert.equal(503, req{ url = "/echo" }.status)
    assert.equal(400, req{ url = "/_standin/faults", method = "POST", body = "{}" }.status)
    srv:fault{ route = "GET /echo", status = 500, times = -1 }
    assert.equal(204, req{ url = "/_standin/faults", method = "DELETE" }.status)
    assert.equal(200, req{ url = "/echo" }.status)
    assert.same({ "GET /echo", "GET /echo" }, json.decode(req{ url = "/_standin/requests" }.body))
  end)

  it("answers a request it cannot parse with 400 and closes", function()
    local stream = require "sbx.stream"
    local c = assert(stream.connect{ host = "127.0.0.1", port = srv.port })
    assert(c:write("GARBAGE\r\n\r\n"))
    assert.matches("^HTTP/1.1 400", c:read(5))
    assert.is_nil(c:read(5))
    c:close()
  end)
end)
