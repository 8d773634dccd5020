-- The primitives that let transfers stream (issue 15, item 12): a file
-- copied root to root through a small buffer, read a piece at a time, and
-- an archive read from a host file with its data handed to a sink. The
-- jails and the hostile-archive checks hold on these paths too.
local fs = require "sbx.fs"
local tar = require "sbx.tar"

local function tmpdir()
  local d = assert(fs.mkdtemp("/tmp", "sbx-streamspec."))
  return d
end

describe("root:copy and root:read_at", function()
  local base, a, b
  before_each(function()
    base = tmpdir()
    assert(os.execute("mkdir -p " .. base .. "/a " .. base .. "/b && head -c 300000 /dev/urandom > "
                      .. base .. "/a/f && ln -s /etc/passwd " .. base .. "/a/out && mkfifo " .. base .. "/a/fifo"))
    a, b = assert(fs.open_root(base .. "/a")), assert(fs.open_root(base .. "/b"))
  end)
  after_each(function() a:close() b:close() fs.rmtree(base) end)

  it("copies a file whole, parents made, with the mode given", function()
    assert.equal(300000, a:copy("f", b, "x/y/g", tonumber("750", 8)))
    assert.equal(a:read("f"), b:read("x/y/g"))
    assert.equal(tonumber("750", 8), b:stat("x/y/g").mode)
    assert.equal(300000, a:copy("f", b, "x/y/g"))      -- again: truncated, not appended
    assert.equal(300000, b:stat("x/y/g").size)
  end)

  it("follows no link out on either side and copies only regular files", function()
    local n, _, code = a:copy("out", b, "p")
    assert.is_nil(n)
    assert.equal("ESCAPE", code)
    n, _, code = a:copy("fifo", b, "p")
    assert.is_nil(n)
    assert.equal("ENOTREG", code)
    assert(os.execute("ln -s /tmp " .. base .. "/b/evil"))
    n, _, code = a:copy("f", b, "evil/x")
    assert.is_nil(n)
    assert.equal("ESCAPE", code)
    n = a:copy("f", b, "../x")
    assert.is_nil(n)
  end)

  it("reads pieces at offsets, short at the end, empty past it", function()
    local whole = a:read("f")
    assert.equal(whole:sub(1, 1000), a:read_at("f", 0, 1000))
    assert.equal(whole:sub(299991), a:read_at("f", 299990, 1000))
    assert.equal("", a:read_at("f", 400000, 10))
    local _, _, code = a:read_at("out", 0, 10)
    assert.equal("ESCAPE", code)
    assert.has_error(function() a:read_at("f", -1, 10) end)
    assert.has_error(function() a:read_at("f", 0, 1 << 40) end)
  end)
end)

describe("tar.extract from a file, with a sink", function()
  local base
  before_each(function() base = tmpdir() end)
  after_each(function() fs.rmtree(base) end)

  local function spool(entries)
    local arc = assert(tar.pack(entries))
    local f = assert(io.open(base .. "/a.tar", "wb"))
    f:write(arc)
    f:close()
    return base .. "/a.tar"
  end

  it("hands file data to the sink in pieces and keeps none of it", function()
    local big = string.rep("ab", 400000)
    local file = spool{ { path = "d", type = "dir", mode = 493 }, { path = "d/big", data = big, mode = 420 },
                        { path = "d/empty", data = "", mode = 420 } }
    local got, pieces = {}, 0
    local entries = assert(tar.extract(nil, { file = file, sink = function(p, chunk)
      got[p] = (got[p] or "") .. chunk
      pieces = pieces + 1
    end }))
    assert.equal(big, got["d/big"])
    assert.is_true(pieces > 1)
    for _, e in ipairs(entries) do
      assert.is_nil(e.data)
      if e.path == "d/big" then assert.equal(#big, e.size) end
    end
    local listed = assert(tar.extract(nil, { file = file, data = false }))
    assert.equal(3, #listed)
    for _, e in ipairs(listed) do assert.is_nil(e.data) end
  end)

  it("still rejects hostile entries and lying sizes read from a file", function()
    local file = spool{ { path = "ok", data = "x" }, { path = "l", type = "symlink", target = "/etc" } }
    local entries = assert(tar.extract(nil, { file = file, data = false, skip_unsafe = true }))
    for _, e in ipairs(entries) do if e.path == "l" then assert.is_true(e.escapes) end end
    local file2 = spool{ { path = "big", data = string.rep("z", 5000) } }
    local ok, msg, code = tar.extract(nil, { file = file2, data = false, max_bytes = 100 })
    assert.is_nil(ok)
    assert.equal("ETOOBIG", code)
    assert.matches("exceeds", msg)
    local none, _, c2 = tar.extract(nil, { file = base .. "/missing.tar" })
    assert.is_nil(none)
    assert.equal("EIO", c2)
    assert.has_error(function() tar.extract("x", { file = file }) end)
    assert.has_error(function() tar.extract(nil, { file = file, sink = 1 }) end)
  end)

  it("a sink that raises ends the read with its error", function()
    local file = spool{ { path = "f", data = "data" } }
    local ok, err = pcall(tar.extract, nil, { file = file, sink = function() error("disk full", 0) end })
    assert.is_false(ok)
    assert.equal("disk full", err)
  end)
end)
