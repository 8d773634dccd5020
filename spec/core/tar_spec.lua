-- sbx.tar: in-memory tar (G8 and the "Archives" catalogue of RELIABILITY.md).
-- Archives come from GNU tar itself or from raw ustar headers built below.
-- Over 400 lines: every case shares the raw-header builders below.
local tar = require "sbx.tar"
local fs = require "sbx.fs"
local S = require "spec.support"

local function o(s) return math.tointeger(tonumber(s, 8)) end

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function sh(cmd)
  assert(os.execute(cmd), "command failed: " .. cmd)
end

local function slurp(p)
  local f = assert(io.open(p, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function spit(p, s)
  local f = assert(io.open(p, "wb"))
  f:write(s)
  f:close()
end

local function run(cmd)
  local f = assert(io.popen(cmd .. " 2>&1"))
  local out = f:read("a")
  local ok = f:close()
  return out, ok
end

local fails = S.fails   -- a nil, msg, code failure; returns msg

local function by_path(list)
  local t = {}
  for _, e in ipairs(list) do
    assert.is_nil(t[e.path], "listed twice: " .. e.path)
    t[e.path] = e
  end
  return t
end

local function paths(list)
  local t = {}
  for i, e in ipairs(list) do t[i] = e.path end
  return t
end

---------------------------------------------------------------- raw ustar

local function field(s, n)
  assert(#s <= n, "field too long: " .. s)
  return s .. string.rep("\0", n - #s)
end

local function oct(n, width)   -- width digits then NUL
  local s = string.format("%o", n)
  assert(#s <= width - 1)
  return string.rep("0", width - 1 - #s) .. s .. "\0"
end

-- One 512-byte ustar header. h: name, size (or size_raw: 12 raw bytes),
-- mode, type ("0" file, "2" symlink...), linkname, prefix, checksum.
local function header(h)
  local data = h.data or ""
  local blk = table.concat {
    field(h.name, 100), oct(h.mode or o"644", 8), oct(0, 8), oct(0, 8),
    h.size_raw or oct(h.size or #data, 12), oct(h.mtime or 0, 12),
    "        ", h.type or "0", field(h.linkname or "", 100),
    "ustar\0", "00", field("", 32), field("", 32),
    oct(h.major or 0, 8), oct(h.minor or 0, 8), field(h.prefix or "", 155),
    field("", 12),
  }
  assert(#blk == 512)
  local sum = 0
  for i = 1, 512 do sum = sum + blk:byte(i) end
  sum = h.checksum or sum
  return blk:sub(1, 148) .. string.format("%06o\0 ", sum) .. blk:sub(157)
end

local function pad(s) return s .. string.rep("\0", (512 - #s % 512) % 512) end

-- A member: header plus padded data.
local function member(h)
  return header(h) .. pad(h.data or "")
end

-- A pax extended header ("x") carrying records, for the member after it.
local function pax(records)
  local body = {}
  for _, kv in ipairs(records) do
    local rec = " " .. kv[1] .. "=" .. kv[2] .. "\n"
    local n = #rec + 1
    while #tostring(n) + #rec ~= n do n = #tostring(n) + #rec end
    body[#body + 1] = n .. rec
  end
  body = table.concat(body)
  return header { name = "PaxHeader/x", type = "x", data = body } .. pad(body)
end

local function archive(members)
  return table.concat(members) .. string.rep("\0", 1024)
end

local function file(name, data) return member { name = name, data = data } end
local function dir(name) return member { name = name, type = "5", mode = o"755" } end
local function symlink(name, target)
  return member { name = name, type = "2", linkname = target, mode = o"777" }
end

---------------------------------------------------------------- the spec

describe("sbx.tar", function()
  local tmp

  setup(function() tmp = assert(fs.mkdtemp("/tmp", "tarspec")) end)
  teardown(function() assert(fs.rmtree(tmp)) end)

  -- a fresh directory under tmp
  local n = 0
  local function scratch()
    n = n + 1
    local d = tmp .. "/d" .. n
    sh("mkdir -p " .. q(d))
    return d
  end

  describe("pack", function()
    local bin = {}
    for i = 0, 255 do bin[#bin + 1] = string.char(i) end
    bin = string.rep(table.concat(bin), 40) .. "\0\0end\0"

    it("adds parent directories unless parents = false", function()
      local with = assert(tar.list(assert(tar.pack({ { path = "a/b/c.txt", data = "x" } }))))
      assert.are.same({ "a", "a/b", "a/b/c.txt" }, { with[1].path, with[2].path, with[3].path })
      local without = assert(tar.list(assert(tar.pack({ { path = "a/b/c.txt", data = "x" } },
                                                       { parents = false }))))
      assert.are.equal(1, #without)
      assert.are.equal("a/b/c.txt", without[1].path)
    end)

    it("round-trips binary data, a 1 MiB file, modes and symlinks", function()
      local big = string.rep("0123456789abcdef", 65536)
      local s = assert(tar.pack {
        { path = "bin/blob", data = bin, mode = o"600" },
        { path = "big", data = big },
        { path = "bin/run.sh", data = "#!/bin/sh\n", mode = o"755", mtime = 1700000000 },
        { path = "empty", data = "" },
        { path = "lnk", type = "symlink", target = "bin/run.sh" },
        { path = "d/e", type = "dir", mode = "700" },
      })
      assert.are.equal(0, #s % 512)
      local got, rejected = assert(tar.extract(s))
      assert.are.same({}, rejected)
      local t = by_path(got)
      assert.are.equal(bin, t["bin/blob"].data)
      assert.are.equal(#bin, t["bin/blob"].size)
      assert.are.equal(o"600", t["bin/blob"].mode)
      assert.are.equal(big, t.big.data)
      assert.are.equal(o"644", t.big.mode)
      assert.are.equal(o"755", t["bin/run.sh"].mode)
      assert.are.equal(1700000000, t["bin/run.sh"].mtime)
      assert.are.equal("", t.empty.data)
      assert.are.equal("symlink", t.lnk.type)
      assert.are.equal("bin/run.sh", t.lnk.target)
      assert.is_false(t.lnk.escapes)
      assert.are.equal("dir", t["d/e"].type)
      assert.are.equal(o"700", t["d/e"].mode)
      assert.are.equal(o"755", t.bin.mode)
      assert.are.equal(o"755", t.d.mode)
    end)

    it("adds each parent once, before its children, and normalizes paths", function()
      local s = assert(tar.pack {
        { path = "/a/b/c.txt", data = "1" },
        { path = "./a/./b//d.txt", data = "2" },
        { path = "a/x/", type = "dir" },
        { path = "a/b", type = "dir", mode = o"750" },
      })
      assert.are.same({ "a", "a/b", "a/b/c.txt", "a/b/d.txt", "a/x" },
                      paths(assert(tar.list(s))))
      -- the explicit directory entry supplied the parent's mode
      assert.are.equal(o"750", by_path(tar.list(s))["a/b"].mode)
    end)

    it("puts everything under opts.prefix", function()
      local s = assert(tar.pack({ ["f.txt"] = "x", ["sub/g"] = "y" },
                                { prefix = "/workspace/" }))
      assert.are.same({ "workspace", "workspace/f.txt", "workspace/sub",
                        "workspace/sub/g" }, paths(assert(tar.list(s))))
      local e = by_path(tar.extract(s))
      assert.are.equal("y", e["workspace/sub/g"].data)
      -- a prefix alone
      assert.are.same({ "a", "a/b" },
                      paths(tar.list(assert(tar.pack({}, { prefix = "a/b" })))))
    end)

    it("accepts a map, sorted, and is deterministic", function()
      local m = { zeta = "z", alpha = "a", ["m/n"] = "n", ["/beta"] = "b" }
      local s1 = assert(tar.pack(m))
      assert.are.same({ "alpha", "beta", "m", "m/n", "zeta" }, paths(tar.list(s1)))
      for _ = 1, 3 do
        local copy = {}
        for k, v in pairs(m) do copy[k] = v end
        assert.are.equal(s1, tar.pack(copy))
      end
      local long = { { path = string.rep("long/", 40) .. "name", data = bin } }
      assert.are.equal(tar.pack(long), tar.pack(long))
      assert.are.equal(tar.pack(long, { uid = 7 }), tar.pack(long, { uid = 7 }))
      -- an empty archive is the end-of-archive marker
      assert.are.equal(string.rep("\0", 1024), tar.pack({}))
    end)

    it("is read back by GNU tar (tar -tvf, tar -xf)", function()
      local d = scratch()
      local longname = string.rep("deep/", 30) .. "file.txt"
      spit(d .. "/a.tar", assert(tar.pack({
        { path = "src/main.c", data = bin, mode = o"640" },
        { path = "bin/tool", data = "#!/bin/sh\necho hi\n", mode = o"755" },
        { path = "link", type = "symlink", target = "src/main.c" },
        { path = longname, data = "long" },
      }, { prefix = "ws", uid = 1000, gid = 1000 })))
      local out, ok = run("tar -tvf " .. q(d .. "/a.tar"))
      assert.is_true(ok, out)
      assert.matches("drwxr%-xr%-x 1000/1000%s+0 1970%-01%-01 00:00 ws/\n", out)
      assert.matches("%-rw%-r%-%-%-%-%- 1000/1000%s+" .. #bin .. " [^\n]* ws/src/main.c\n", out)
      assert.matches("%-rwxr%-xr%-x [^\n]* ws/bin/tool\n", out)
      assert.matches("lrwxrwxrwx [^\n]* ws/link %-> src/main.c\n", out)
      assert.matches("ws/" .. longname:gsub("%p", "%%%0"), out)
      local _, dirs = out:gsub("ws/src/\n", "")
      assert.are.equal(1, dirs)
      sh("mkdir " .. q(d .. "/x") .. " && tar -xf " .. q(d .. "/a.tar") .. " -C " .. q(d .. "/x"))
      assert.are.equal(bin, slurp(d .. "/x/ws/src/main.c"))
      assert.are.equal("long", slurp(d .. "/x/ws/" .. longname))
      assert.are.equal("ws/bin/tool", (run("cd " .. q(d .. "/x") .. " && find . -perm -u+x -type f"):gsub("^%./", ""):gsub("\n", "")))
    end)

    it("rejects '..', NUL and empty paths with EINVAL", function()
      for _, p in ipairs { "..", "a/../b", "../x", "a/..", "a\0b", "", "/", "./.", "//" } do
        fails("EINVAL", tar.pack { { path = p, data = "x" } })
        fails("EINVAL", tar.pack { [p] = "x" })
      end
      fails("EINVAL", tar.pack { { path = "l", type = "symlink", target = "a\0b" } })
      fails("EINVAL", tar.pack({ a = "x" }, { prefix = "../up" }))
    end)

    it("rejects duplicates (EEXIST) and files used as directories (ENOTDIR)", function()
      fails("EEXIST", tar.pack { { path = "a", data = "1" }, { path = "a", data = "2" } })
      fails("EEXIST", tar.pack { { path = "a/b" }, { path = "/a/./b/" } })
      fails("EEXIST", tar.pack { a = "1", ["/a"] = "2" })
      fails("ENOTDIR", tar.pack { { path = "a", data = "1" }, { path = "a/b", data = "2" } })
      fails("ENOTDIR", tar.pack { { path = "a/b", data = "2" }, { path = "a", data = "1" } })
      fails("ENOTDIR", tar.pack { { path = "l", type = "symlink", target = "/etc" },
                                  { path = "l/passwd", data = "x" } })
    end)

    it("raises on misuse", function()
      local bad = {
        function() tar.pack("x") end,
        function() tar.pack({ "not a table" }) end,
        function() tar.pack({ { path = "a", data = 42 } }) end,
        function() tar.pack({ { data = "x" } }) end,
        function() tar.pack({ { path = 1 } }) end,
        function() tar.pack({ { path = "a", type = "fifo" } }) end,
        function() tar.pack({ { path = "a", mode = "rwx" } }) end,
        function() tar.pack({ { path = "a", mode = o"10000" } }) end,
        function() tar.pack({ { path = "a", mode = 1.5 } }) end,
        function() tar.pack({ { path = "a", mtime = "now" } }) end,
        function() tar.pack({ { path = "l", type = "symlink" } }) end,
        function() tar.pack({ { path = "d", type = "dir", data = "x" } }) end,
        function() tar.pack({ { path = "f", target = "x" } }) end,
        function() tar.pack({ a = 1 }) end,
        function() tar.pack({ [1.5] = "x" }) end,
        function() tar.pack({}, { prefx = "typo" }) end,
        function() tar.pack({}, { uid = -1 }) end,
        function() tar.pack({}, "opts") end,
      }
      for i, f in ipairs(bad) do
        assert.has_error(f, nil, "case " .. i)
      end
    end)
  end)

  describe("extract of GNU tar archives", function()
    it("reads a tree with a symlink, a directory and an exec bit", function()
      local d = scratch()
      sh("cd " .. q(d) .. " && mkdir -p src/sub && printf 'hello\\0world' > src/sub/f.bin"
         .. " && printf '#!/bin/sh\\n' > src/run && chmod 755 src/run && chmod 644 src/sub/f.bin"
         .. " && ln -s sub/f.bin src/ln && tar -cf t.tar -C src .")
      local got = assert(tar.extract(slurp(d .. "/t.tar")))
      local t = by_path(got)
      assert.is_nil(t["."])
      assert.is_nil(t[""])
      assert.are.equal("hello\0world", t["sub/f.bin"].data)
      assert.are.equal(o"644", t["sub/f.bin"].mode)
      assert.are.equal(o"755", t.run.mode)
      assert.are.equal("dir", t.sub.type)
      assert.are.equal("symlink", t.ln.type)
      assert.are.equal("sub/f.bin", t.ln.target)
      assert.is_false(t.ln.escapes)
      assert.is_nil(t.ln.data)
      local l = by_path(assert(tar.list(slurp(d .. "/t.tar"))))
      assert.are.equal(11, l["sub/f.bin"].size)
      assert.is_nil(l["sub/f.bin"].data)
    end)

    it("refuses absolute member names (tar -P): ESCAPE, or dropped", function()
      local d = scratch()
      sh("echo x > " .. q(d .. "/abs") .. " && tar -P -cf " .. q(d .. "/t.tar") .. " " .. q(d .. "/abs"))
      local s = slurp(d .. "/t.tar")
      fails("ESCAPE", tar.extract(s))
      local got, rejected = assert(tar.extract(s, { skip_unsafe = true }))
      assert.are.same({}, got)
      assert.are.equal(1, #rejected)
      assert.are.equal("ESCAPE", rejected[1].code)
      assert.are.equal(d .. "/abs", rejected[1].path)
    end)

    it("refuses '..' members made with --transform", function()
      local d = scratch()
      sh("cd " .. q(d) .. " && echo x > f && echo y > g && tar --transform 's,^f$,../../f,' -cf t.tar f g")
      fails("ESCAPE", tar.extract(slurp(d .. "/t.tar")))
      local got, rejected = assert(tar.extract(slurp(d .. "/t.tar"), { skip_unsafe = true }))
      assert.are.same({ "g" }, paths(got))
      assert.are.equal("../../f", rejected[1].path)
      assert.are.equal("ESCAPE", by_path(tar.list(slurp(d .. "/t.tar")))["../../f"].unsafe)
    end)

    it("refuses hard links unless allowed, and then only inside the archive", function()
      local d = scratch()
      sh("cd " .. q(d) .. " && echo data > a && ln a b && tar -cf t.tar a b")
      local s = slurp(d .. "/t.tar")
      fails("ESCAPE", tar.extract(s))
      local got = assert(tar.extract(s, { allow_hardlinks = true }))
      local t = by_path(got)
      assert.are.equal("hardlink", t.b.type)
      assert.are.equal("a", t.b.target)
      assert.are.equal("data\n", t.b.data)
      got = assert(tar.extract(s, { skip_unsafe = true }))
      assert.are.same({ "a" }, paths(got))
      -- hard links out of the archive or to nothing
      for _, target in ipairs { "/etc/passwd", "../x", "missing", "d" } do
        local arc = archive { dir("d/"), member { name = "h", type = "1", linkname = target } }
        fails("ESCAPE", tar.extract(arc, { allow_hardlinks = true }))
      end
    end)

    it("refuses FIFOs and devices (ENOTREG), or drops them", function()
      local d = scratch()
      sh("cd " .. q(d) .. " && mkfifo p && echo x > f && tar -cf t.tar p f")
      local s = slurp(d .. "/t.tar")
      fails("ENOTREG", tar.extract(s))
      local got, rejected = assert(tar.extract(s, { skip_unsafe = true }))
      assert.are.same({ "f" }, paths(got))
      assert.are.equal("ENOTREG", rejected[1].code)
      assert.are.equal("fifo", by_path(tar.list(s)).p.type)
      for _, ty in ipairs { "3", "4" } do
        local arc = archive { member { name = "dev", type = ty, major = 1, minor = 3 } }
        fails("ENOTREG", tar.extract(arc))
        fails("ENOTREG", tar.read_one(arc))
        assert.are.equal(ty == "3" and "chardev" or "blockdev", tar.list(arc)[1].type)
      end
    end)

    it("clears setuid, setgid and sticky bits", function()
      local d = scratch()
      sh("cd " .. q(d) .. " && echo x > s && chmod 6755 s && mkdir t && chmod 1777 t"
         .. " && echo y > plain && tar -cf t.tar s t plain")
      local t = by_path(assert(tar.extract(slurp(d .. "/t.tar"))))
      assert.are.equal(o"755", t.s.mode)
      assert.is_true(t.s.mode_stripped)
      assert.are.equal(o"777", t.t.mode)
      assert.is_true(t.t.mode_stripped)
      assert.is_nil(t.plain.mode_stripped)
      assert.are.equal(o"6755", by_path(tar.list(slurp(d .. "/t.tar"))).s.mode)
    end)

    it("reads the single member the Docker archive endpoint returns", function()
      local d = scratch()
      sh("cd " .. q(d) .. " && mkdir dir && printf 'v\\0' > dir/hosts && ln -s hosts dir/l"
         .. " && tar --owner=1000 -cf one.tar -C dir hosts && tar -cf dir.tar dir"
         .. " && tar -cf lnk.tar -C dir l")
      local data, e = tar.read_one(slurp(d .. "/one.tar"))
      assert.are.equal("v\0", data)
      assert.are.equal("hosts", e.path)
      assert.are.equal("file", e.type)
      assert.is_nil(e.data)
      fails("EISDIR", tar.read_one(slurp(d .. "/dir.tar")))
      fails("ESCAPE", tar.read_one(slurp(d .. "/lnk.tar")))
      fails("ENOENT", tar.read_one(""))
      fails("EPROTO", tar.read_one(archive { file("a", "1"), file("b", "2") }))
      assert.are.equal("2", tar.read_one(archive { file("a", "1"), file("b", "2") }, { only = "b" }))
    end)
  end)

  describe("extract of hostile archives", function()
    it("refuses '..', absolute and climbing paths", function()
      for _, name in ipairs { "../x", "/etc/x", "a/../../x", "a/..", "..", "./../x", "//etc/x" } do
        local arc = archive { file("ok", "1"), file(name, "evil") }
        fails("ESCAPE", tar.extract(arc))
        fails("ESCAPE", tar.read_one(arc, { only = "ok" }))
        local got, rejected = assert(tar.extract(arc, { skip_unsafe = true }))
        assert.are.same({ "ok" }, paths(got))
        assert.are.equal(name, rejected[1].path)
        assert.are.equal("ESCAPE", by_path(tar.list(arc))[name].unsafe)
      end
      -- the same through a pax path and through the ustar prefix field
      fails("ESCAPE", tar.extract(archive { pax { { "path", "../../etc/cron.d/x" } }, file("innocent", "x") }))
      fails("ESCAPE", tar.extract(archive { member { name = "x", prefix = "/etc", data = "x" } }))
      fails("ESCAPE", tar.extract(archive { member { name = "x", prefix = "..", data = "x" } }))
      -- a non-directory that would replace the root
      fails("ESCAPE", tar.extract(archive { file(".", "x") }))
    end)

    it("never yields a path with '..' from a name holding NUL", function()
      local arc = archive { pax { { "path", "safe\0/../../etc/passwd" } }, file("x", "data") }
      local got, msg = tar.extract(arc)
      if got then
        for _, e in ipairs(got) do
          assert.is_nil(e.path:find("..", 1, true))
          assert.is_nil(e.path:find("\0", 1, true))
        end
      else
        assert.is_string(msg)
      end
      -- a NUL inside the ustar name field ends the name
      got = assert(tar.extract(archive { file("a\0/../../x", "d") }))
      assert.are.same({ "a" }, paths(got))
    end)

    it("refuses a member that goes through an earlier symlink", function()
      local arc = archive { symlink("link", "/etc"), file("link/passwd", "root::0:0") }
      local msg = fails("ESCAPE", tar.extract(arc))
      assert.matches("link/passwd", msg)
      for _, name in ipairs { "link/./passwd", "./link//passwd", "link/x/y" } do
        fails("ESCAPE", tar.extract(archive { symlink("link", "/etc"), file(name, "x") }))
      end
      -- even a harmless-looking relative link, and a directory through it
      fails("ESCAPE", tar.extract(archive { dir("real/"), symlink("l", "real"), file("l/f", "x") }))
      fails("ESCAPE", tar.extract(archive { symlink("l", "."), dir("l/d/") }))
      fails("ESCAPE", tar.extract(archive { symlink("a/l", "../.."), symlink("a/l/x", "y") }))
      -- skip_unsafe keeps the link (flagged) and drops what goes through it
      local got, rejected = assert(tar.extract(arc, { skip_unsafe = true }))
      assert.are.same({ "link" }, paths(got))
      assert.is_true(got[1].escapes)
      assert.are.equal("link/passwd", rejected[1].path)
      -- list flags it
      assert.are.equal("ESCAPE", by_path(tar.list(arc))["link/passwd"].unsafe)
      -- a symlink arriving after the entries under its name
      fails("ESCAPE", tar.extract(archive { file("d/passwd", "x"), symlink("d", "/etc") }))
      got = assert(tar.extract(archive { file("d/passwd", "x"), symlink("d", "/etc") },
                               { skip_unsafe = true }))
      assert.are.same({ "d" }, paths(got))
    end)

    it("lets a later directory replace a symlink before entries go below it", function()
      local got = assert(tar.extract(archive { symlink("l", "/etc"), dir("l/"), file("l/f", "x") }))
      local t = by_path(got)
      assert.are.equal("dir", t.l.type)
      assert.are.equal("x", t["l/f"].data)
    end)

    it("reports symlinks that leave the root as escapes = true", function()
      local arc = archive {
        dir("a/"), dir("a/b/"),
        symlink("a/in", "../x"),           -- a/../x = x
        symlink("a/out", "../../x"),
        symlink("abs", "/etc/passwd"),
        symlink("a/b/deep", "../../a/b/../in"),
        symlink("l2", "/"),
        symlink("chain", "l2/etc"),        -- through an absolute link
        symlink("up", "a/../.."),
        symlink("top", "a/b/../.."),       -- the root itself
        symlink("sub", "a/b"),
        symlink("viasub", "sub/../../.."), -- a/b/.. /.. /..: above the root
        symlink("viasub_ok", "sub/.."),    -- a
        symlink("loop1", "loop2"), symlink("loop2", "loop1"),
        symlink("dot", "."),
        symlink("dangling", "nope/nothing"),
      }
      local t = by_path(assert(tar.extract(arc)))
      local want = { ["a/in"] = false, ["a/out"] = true, abs = true,
                     ["a/b/deep"] = false, l2 = true, chain = true, up = true, top = false,
                     sub = false, viasub = true, viasub_ok = false, loop1 = true,
                     loop2 = true, dot = false, dangling = false }
      for p, esc in pairs(want) do
        assert.are.equal(esc, t[p].escapes, p)
        assert.are.equal("symlink", t[p].type, p)
      end
      local l = by_path(tar.list(arc))
      for p, esc in pairs(want) do assert.are.equal(esc, l[p].escapes, p) end
      -- a target longer than Linux allows counts as escaping
      t = by_path(assert(tar.extract(archive {
        pax { { "linkpath", string.rep("a/", 2100) } }, symlink("long", "x") })))
      assert.is_true(t.long.escapes)
    end)

    it("resolves duplicates: the later one wins, or EEXIST when strict", function()
      local arc = archive { file("a", "first"), file("b", "b"), file("a", "second") }
      local got = assert(tar.extract(arc))
      assert.are.same({ "a", "b" }, paths(got))
      assert.are.equal("second", got[1].data)
      fails("EEXIST", tar.extract(arc, { strict_duplicates = true }))
      assert.are.equal(3, #tar.list(arc))
      -- a file replacing a symlink stops being a link
      got = assert(tar.extract(archive { symlink("x", "/etc"), file("x", "plain") }))
      assert.are.equal("file", got[1].type)
    end)

    it("returns EPROTO for truncated or corrupt archives, never a partial result", function()
      local good = archive { file("a", string.rep("A", 1000)), file("b", string.rep("B", 3000)) }
      assert(tar.extract(good))
      for _, cut in ipairs { 100, 512, 700, 1536 + 512, 1536 + 600 } do
        fails("EPROTO", tar.extract(good:sub(1, cut)))
        fails("EPROTO", tar.list(good:sub(1, cut)))
        fails("EPROTO", tar.read_one(good:sub(1, cut), { only = "a" }))
      end
      -- a corrupt checksum, first and second member
      fails("EPROTO", tar.extract(archive { member { name = "a", data = "x", checksum = 1 } }))
      fails("EPROTO", tar.extract(archive { file("a", "x"), member { name = "b", checksum = 7 } }))
      -- flipped bytes inside a header
      local bad = good:sub(1, 10) .. "\255" .. good:sub(12)
      fails("EPROTO", tar.extract(bad))
      -- garbage, gzip
      fails("EPROTO", tar.extract("this is not a tar archive at all"))
      fails("EPROTO", tar.extract(string.rep("\1\2\3\4", 1024)))
      local d = scratch()
      spit(d .. "/t.tar", good)
      sh("gzip -k " .. q(d .. "/t.tar"))
      fails("EPROTO", tar.extract(slurp(d .. "/t.tar.gz")))
      fails("EPROTO", tar.list(slurp(d .. "/t.tar.gz")))
      -- empty archives
      assert.are.same({}, tar.extract(""))
      assert.are.same({}, tar.list(""))
      assert.are.same({}, tar.extract(string.rep("\0", 1024)))
    end)

    it("refuses a header claiming 10 GB without allocating it", function()
      local ten = 10 * 1024 * 1024 * 1024
      local claims = {
        archive { pax { { "size", tostring(ten) } }, member { name = "big", data = "short" } },
        -- GNU base-256 size field
        archive { member { name = "big", data = "short",
          size_raw = "\128\0\0\0\0\0\0" .. string.pack(">I5", ten) } },
      }
      for _, arc in ipairs(claims) do
        collectgarbage()
        local before = collectgarbage("count")
        assert.matches(tostring(ten), fails("ETOOBIG", tar.extract(arc)))
        fails({ "ETOOBIG", "EPROTO" }, tar.extract(arc, { max_bytes = math.maxinteger }))
        fails({ "ETOOBIG", "EPROTO" }, tar.read_one(arc, { max_bytes = math.maxinteger }))
        assert.is_true(collectgarbage("count") - before < 64 * 1024, "allocated")
        fails("EPROTO", tar.list(arc))
      end
    end)

    it("enforces max_bytes and max_entry", function()
      local arc = archive { file("a", string.rep("a", 600)), file("b", string.rep("b", 600)) }
      assert(tar.extract(arc, { max_bytes = 1200 }))
      fails("ETOOBIG", tar.extract(arc, { max_bytes = 1199 }))
      assert(tar.extract(arc, { max_entry = 600 }))
      fails("ETOOBIG", tar.extract(arc, { max_entry = 599 }))
      -- only the selected member is read and counted
      assert(tar.extract(arc, { only = "b", max_bytes = 600 }))
      -- ETOOBIG is not an "unsafe entry" that skip_unsafe could drop
      fails("ETOOBIG", tar.extract(arc, { max_entry = 10, skip_unsafe = true }))
    end)

    it("stops at max_entries: 200k tiny entries", function()
      local one = header { name = "f" }
      local huge = string.rep(one, 200000) .. string.rep("\0", 1024)
      local t0 = os.clock()
      fails("ETOOBIG", tar.extract(huge))
      fails("ETOOBIG", tar.list(huge))
      assert.is_true(os.clock() - t0 < 20)
      huge = nil
      collectgarbage()
      -- the limit is checked before anything after it is read
      local arc = {}
      for i = 1, 11 do arc[i] = file("f" .. i, "x") end
      arc = table.concat(arc) .. string.rep("\255", 512)
      fails("ETOOBIG", tar.extract(arc, { max_entries = 10 }))
      fails("EPROTO", tar.extract(arc, { max_entries = 11 }))
      local ok = archive { file("a", "1"), file("b", "2") }
      assert(tar.extract(ok, { max_entries = 2 }))
      fails("ETOOBIG", tar.extract(ok, { max_entries = 1 }))
    end)

    it("selects one member with opts.only", function()
      local arc = archive { dir("d/"), file("d/a", "A"), file("b", "B") }
      local got = assert(tar.extract(arc, { only = "d/a" }))
      assert.are.equal(1, #got)
      assert.are.equal("A", got[1].data)
      assert.are.equal("B", assert(tar.extract(arc, { only = "/b" }))[1].data)
      fails("ENOENT", tar.extract(arc, { only = "c" }))
      fails("ENOENT", tar.extract(arc, { only = "../b" }))
      -- the rest of the archive is still checked
      fails("ESCAPE", tar.extract(archive { symlink("l", "/etc"), file("l/passwd", "x"), file("b", "B") },
                                  { only = "b" }))
    end)

    it("raises on misuse", function()
      local bad = {
        function() tar.extract() end,
        function() tar.extract({}) end,
        function() tar.extract("", { max_entries = "many" }) end,
        function() tar.extract("", { max_bytes = -1 }) end,
        function() tar.extract("", { skip_unsafe = 1 }) end,
        function() tar.extract("", { only = 3 }) end,
        function() tar.extract("", { maxbytes = 1 }) end,
        function() tar.list("", 5) end,
        function() tar.read_one(nil) end,
      }
      for i, f in ipairs(bad) do assert.has_error(f, nil, "case " .. i) end
    end)

    it("survives random corruption of a real archive", function()
      local arc = assert(tar.pack {
        { path = "a/b", data = string.rep("x", 3000) },
        { path = "l", type = "symlink", target = "a" },
        { path = string.rep("n", 150), data = "long name" },
      })
      math.randomseed(42)
      for _ = 1, 300 do
        local b = { arc:byte(1, -1) }
        for _ = 1, math.random(1, 8) do
          b[math.random(1, #b)] = math.random(0, 255)
        end
        local s = string.char(table.unpack(b)):sub(1, math.random(1, #arc))
        local got, msg, code = tar.extract(s)
        if got then
          for _, e in ipairs(got) do
            assert.is_nil(e.path:match("^/"))
            assert.is_nil(("/" .. e.path .. "/"):find("/../", 1, true))
          end
        else
          assert.is_string(msg)
          assert.is_string(code)
        end
        tar.list(s)
      end
    end)
  end)
end)
