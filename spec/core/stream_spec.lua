-- sbx.stream: raw unix/TCP streams on the loop (used for hijacked Docker
-- exec connections): connect, concurrent read and write, shutdown, errors.
local stream = require "sbx.stream"
local loop = require "sbx.loop"
local fs = require "sbx.fs"
require "sbx"

local dir = assert(fs.mkdtemp("/tmp", "sbxstream"))
local n = 0
local function sock() n = n + 1 return dir .. "/s" .. n end

describe("sbx.stream", function()
  teardown(function() fs.rmtree(dir) end)

  it("connects, echoes, and sees the peer's shutdown as end of file", function()
    local path = sock()
    local l = assert(stream.listen{ unix = path })
    local server = loop.spawn(function()
      local c = assert(l:accept(5))
      local got = {}
      while true do
        local chunk = c:read(5)
        if not chunk then break end
        got[#got + 1] = chunk
        assert(c:write(chunk:upper()))
      end
      c:close()
      return table.concat(got)
    end)
    local c = assert(stream.connect{ unix = path })
    assert.is_true(c:write("hello "))
    assert.is_true(c:write("world"))
    c:shutdown()
    local back = {}
    while true do
      local chunk = c:read(5)
      if not chunk then break end
      back[#back + 1] = chunk
    end
    assert.equal("HELLO WORLD", table.concat(back))
    assert.same({ true, "hello world" }, { server:join() })
    c:close()
    l:close()
  end)

  it("reads and writes at once from two tasks (no deadlock on big data)", function()
    local path = sock()
    local l = assert(stream.listen{ unix = path })
    local big = string.rep("0123456789", 1000000)   -- 10 MB through an echo
    local server = loop.spawn(function()
      local c = assert(l:accept(5))
      while true do
        local chunk = c:read(10)
        if not chunk then break end
        assert(c:write(chunk))
      end
      c:shutdown()
    end)
    local c = assert(stream.connect{ unix = path })
    local writer = loop.spawn(function() assert(c:write(big)) c:shutdown() end)
    local total = 0
    while true do
      local chunk = c:read(10)
      if not chunk then break end
      total = total + #chunk
    end
    assert.equal(#big, total)
    assert.is_true((writer:join()))
    assert.is_true((server:join()))
    c:close()
    l:close()
  end)

  it("reports connect failures and read timeouts", function()
    local s, err, code = stream.connect{ unix = dir .. "/missing" }
    assert.is_nil(s)
    assert.equal("ENOENT", code)
    assert.matches("missing", err)
    s, err, code = stream.connect{ host = "127.0.0.1", port = "1" }
    assert.is_nil(s)
    assert.equal("ECONNREFUSED", code)
    local path = sock()
    local l = assert(stream.listen{ unix = path })
    local c = assert(stream.connect{ unix = path })
    local t0 = loop.now()
    local chunk, msg, tcode = c:read(0.2)
    assert.is_nil(chunk)
    assert.equal("ETIMEDOUT", tcode)
    assert.is_true(loop.now() - t0 < 2)
    c:close()
    c:close()
    assert.has_error(function() c:read() end)
    l:close()
  end)

  it("a cancelled reader leaves the stream usable", function()
    local path = sock()
    local l = assert(stream.listen{ unix = path })
    local c = assert(stream.connect{ unix = path })
    local peer = assert(l:accept(5))
    local t = loop.spawn(function() return c:read() end)
    loop.sleep(0.05)
    t:cancel()
    local ok, err = t:join()
    assert.is_false(ok)
    assert.equal("Cancelled", err.kind)
    assert(peer:write("late"))
    assert.equal("late", c:read(5))
    c:close() peer:close() l:close()
  end)

  it("listens on loopback TCP, on a free port when asked for port 0", function()
    local l, port = assert(stream.listen{ host = "127.0.0.1", port = 0 })
    assert.is_true(math.type(port) == "integer" and port > 0)
    local server = loop.spawn(function()
      local c = assert(l:accept(5))
      local got = c:read(5)
      assert(c:write("re:" .. got))
      c:close()
    end)
    local c = assert(stream.connect{ host = "127.0.0.1", port = tostring(port) })
    assert.is_true(c:write("ping"))
    assert.equal("re:ping", c:read(5))
    server:join()
    c:close()
    -- the port is taken while l listens
    local again, msg = stream.listen{ host = "127.0.0.1", port = port }
    assert.is_nil(again)
    assert.matches("listen", msg)
    l:close()
    local bad, why = stream.listen{ host = "localhost", port = 0 }
    assert.is_nil(bad)
    assert.matches("IPv4", why)
    assert.has_error(function() stream.listen{ host = "127.0.0.1", port = 70000 } end)
  end)

  it("rejects misuse", function()
    assert.has_error(function() stream.connect{} end)
    assert.has_error(function() stream.connect("x") end)
    assert.has_error(function() stream.listen{ unix = string.rep("x", 200) } end)
  end)
end)
