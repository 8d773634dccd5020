-- sbx.demux: Docker's multiplexed stream, split anywhere across feeds.
local demux = require "sbx.demux"

local function frame(stream, data, pad)
  return string.char(stream, 0, 0, pad or 0) .. string.pack(">I4", #data) .. data
end

-- feed the pieces; return per-stream concatenations and the number of parts
local function run(pieces)
  local d = demux.new()
  local out, parts = { [0] = "", "", "" }, 0
  for _, piece in ipairs(pieces) do
    local list = assert(d:feed(piece))
    for _, part in ipairs(list) do
      assert.is_true(#part.data > 0)
      out[part.stream] = out[part.stream] .. part.data
      parts = parts + 1
    end
  end
  assert.is_true(d:finish())
  return out, parts
end

describe("sbx.demux", function()
  local stream = frame(1, "hello ") .. frame(2, "oops\n") .. frame(1, "") ..
                 frame(1, "world\0\255") .. frame(2, string.rep("e", 300))

  it("splits whole frames by stream, in order", function()
    local d = demux.new()
    local list = assert(d:feed(stream))
    assert.same({ { stream = 1, data = "hello " }, { stream = 2, data = "oops\n" },
                  { stream = 1, data = "world\0\255" }, { stream = 2, data = string.rep("e", 300) } }, list)
    assert.is_true(d:finish())
  end)

  it("works with the stream split at every byte offset, in two and in three", function()
    for i = 0, #stream do
      local out = run({ stream:sub(1, i), stream:sub(i + 1) })
      assert.equal("hello world\0\255", out[1], "split at " .. i)
      assert.equal("oops\n" .. string.rep("e", 300), out[2], "split at " .. i)
    end
    for i = 0, 40 do
      for j = i, #stream, 7 do
        local out = run({ stream:sub(1, i), stream:sub(i + 1, j), stream:sub(j + 1) })
        assert.equal("hello world\0\255", out[1])
        assert.equal("oops\n" .. string.rep("e", 300), out[2])
      end
    end
  end)

  it("works one byte at a time", function()
    local pieces = {}
    for i = 1, #stream do pieces[i] = stream:sub(i, i) end
    local out = run(pieces)
    assert.equal("hello world\0\255", out[1])
    assert.equal("oops\n" .. string.rep("e", 300), out[2])
  end)

  it("delivers payload as it arrives: a large frame fed in small pieces", function()
    local n = 8 * 1024 * 1024
    local hdr = string.char(1, 0, 0, 0) .. string.pack(">I4", n)
    local d = demux.new()
    assert.same({}, assert(d:feed(hdr:sub(1, 3))))
    assert.same({}, assert(d:feed(hdr:sub(4))))
    local piece = string.rep("x", 4093)
    local got = 0
    while got < n do
      local want = math.min(#piece, n - got)
      local list = assert(d:feed(piece:sub(1, want)))
      assert.equal(1, #list)                      -- no waiting for the whole frame
      assert.equal(1, list[1].stream)
      assert.equal(want, #list[1].data)
      got = got + want
      if got == 4093 then
        local _, err = d:finish()
        assert.equal("demux: truncated frame", err)
      end
    end
    assert.is_true(d:finish())
    -- the declared length may be the maximum, 4 GiB - 1: nothing is reserved
    local big = demux.new()
    local list = assert(big:feed(string.char(2, 0, 0, 0, 255, 255, 255, 255) .. "abc"))
    assert.same({ { stream = 2, data = "abc" } }, list)
  end)

  it("accepts stdin frames (stream 0) and interleaves many small frames", function()
    local parts, want1, want2 = {}, {}, {}
    for i = 1, 1000 do
      local s = (i % 3 == 0) and 2 or 1
      local data = tostring(i)
      parts[#parts + 1] = frame(s, data)
      if s == 1 then want1[#want1 + 1] = data else want2[#want2 + 1] = data end
    end
    local out, n = run({ table.concat(parts) })
    assert.equal(table.concat(want1), out[1])
    assert.equal(table.concat(want2), out[2])
    assert.equal(1000, n)
    out = run({ frame(0, "in") })
    assert.equal("in", out[0])
  end)

  it("fails on a bad header, says where, and stays failed", function()
    local d = demux.new()
    assert(d:feed(frame(1, "ok")))
    local list, err, code = d:feed(string.char(3, 0, 0, 0, 0, 0, 0, 1) .. "x")
    assert.is_nil(list)
    assert.equal("demux: bad frame header at byte 10", err)
    assert.equal("EPROTO", code)
    list, err, code = d:feed(frame(1, "more"))
    assert.is_nil(list)
    assert.equal("demux: bad frame header at byte 10", err)
    assert.equal("EPROTO", code)
    local ok, err2, code2 = d:finish()
    assert.is_nil(ok)
    assert.equal(err, err2)
    assert.equal("EPROTO", code2)

    for pad = 1, 3 do                          -- non-zero padding, split in the header
      local bad = frame(1, "abc")
      bad = bad:sub(1, pad) .. "\1" .. bad:sub(pad + 2)
      local d2 = demux.new()
      assert.same({}, assert(d2:feed(frame(2, "") .. bad:sub(1, 5))))
      local l2, e2, c2 = d2:feed(bad:sub(6))
      assert.is_nil(l2)
      assert.equal("demux: bad frame header at byte 8", e2)
      assert.equal("EPROTO", c2)
    end
    -- plain text (a TTY stream read as multiplexed) fails at once
    local _, e3 = demux.new():feed("total 0\ndrwxr-xr-x 2 root root\n")
    assert.equal("demux: bad frame header at byte 0", e3)
  end)

  it("finish reports a truncated header or payload", function()
    for _, tail in ipairs({ frame(1, "abc"):sub(1, 1), frame(1, "abc"):sub(1, 7),
                            frame(1, "abc"):sub(1, 8), frame(1, "abc"):sub(1, 10) }) do
      local d = demux.new()
      assert(d:feed(frame(1, "whole") .. tail))
      local ok, err, code = d:finish()
      assert.is_nil(ok)
      assert.equal("demux: truncated frame", err)
      assert.equal("EPROTO", code)
    end
    assert.is_true(demux.new():finish())       -- an empty stream is fine
  end)

  it("raises on misuse; close is idempotent; <close> works", function()
    local d = demux.new()
    assert.has_error(function() d:feed() end)
    assert.has_error(function() d:feed({}) end)
    assert.has_error(function() d.feed(nil, "x") end)
    assert.matches("sbx.Demux", tostring(d))
    d:close()
    d:close()
    assert.has_error(function() d:feed("x") end)
    assert.has_error(function() d:finish() end)
    do
      local c <close> = demux.new()
      assert(c:feed(frame(1, "x")))
    end
  end)
end)
