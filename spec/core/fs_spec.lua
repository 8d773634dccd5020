-- sbx.fs: the jailed file system (G8) and the host file primitives.
-- Over 400 lines: one describe per area of sbx.fs, sharing the host helpers below.
local fs = require "sbx.fs"
local S = require "spec.support"

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function sh(cmd)
  local ok = os.execute(cmd)
  assert(ok, "command failed: " .. cmd)
end

local function exists(p)
  return os.execute("test -e " .. q(p) .. " || test -L " .. q(p)) == true
end

local function host_write(p, data)
  local f = assert(io.open(p, "wb"))
  f:write(data)
  f:close()
end

local fails = S.fails   -- a nil, msg, code failure; returns msg

describe("sbx.fs", function()
  local dir, root

  before_each(function()
    dir = assert(fs.mkdtemp("/tmp", "fsspec"))
    root = assert(fs.open_root(dir))
  end)

  after_each(function()
    root:close()
    os.execute("chmod -R u+rwx " .. q(dir) .. " 2>/dev/null")
    assert(fs.rmtree(dir))
  end)

  describe("read and write", function()
    it("round-trips 200 KiB of binary data with NUL bytes", function()
      local parts = {}
      for i = 0, 255 do parts[#parts + 1] = string.char(i) end
      local data = string.rep(table.concat(parts), 800) .. "\0tail\0"
      assert.are.equal(204806, #data)
      assert.is_true(root:write("bin.dat", data))
      assert.are.equal(data, root:read("bin.dat"))
      assert.are.equal(data, fs.read_host(dir .. "/bin.dat"))
    end)

    it("writes several MB", function()
      local data = string.rep("0123456789abcdef", 4 * 65536)
      assert.is_true(root:write("/big", data))
      assert.are.equal(#data, root:stat("big").size)
      assert.are.equal(data, root:read("big"))
    end)

    it("creates parent directories", function()
      assert.is_true(root:write("a/b/c/d.txt", "deep"))
      assert.are.equal("dir", root:stat("a/b/c").type)
      assert.are.equal("deep", fs.read_host(dir .. "/a/b/c/d.txt"))
    end)

    it("treats /x and x as the same file", function()
      assert.is_true(root:write("/data/x", "one"))
      assert.are.equal("one", root:read("data/x"))
      assert.are.equal("one", root:read("//data//./x"))
    end)

    it("truncates on write and extends on append", function()
      assert.is_true(root:write("f", "long content"))
      assert.is_true(root:write("f", "short"))
      assert.are.equal("short", root:read("f"))
      assert.is_true(root:append("f", "+more"))
      assert.is_true(root:append("f", "\0"))
      assert.are.equal("short+more\0", root:read("f"))
      assert.is_true(root:append("new/dir/log", "x"))
      assert.are.equal("x", root:read("new/dir/log"))
      assert.is_true(root:write("empty", ""))
      assert.are.equal("", root:read("empty"))
    end)

    it("applies the mode", function()
      assert.is_true(root:write("run.sh", "#!/bin/sh\n", tonumber("755", 8)))
      assert.are.equal(tonumber("755", 8), root:stat("run.sh").mode)
      assert.is_true(root:write("secret", "s", tonumber("600", 8)))
      assert.are.equal(tonumber("600", 8), root:stat("secret").mode)
      assert.is_true(root:write("plain", "p"))
      assert.are.equal(0, root:stat("plain").mode & tonumber("7133", 8))
    end)

    it("reads a missing file as ENOENT", function()
      fails("ENOENT", root:read("nope"))
      fails("ENOENT", root:read("no/such/dir/file"))
    end)

    it("refuses to read a directory", function()
      root:mkdir("d")
      fails({"EISDIR", "ENOTREG"}, root:read("d"))
      fails({"EISDIR", "ENOTREG"}, root:read("/"))
      fails({"EISDIR", "ENOTREG"}, root:read(""))
    end)

    it("refuses to write where a directory is", function()
      root:mkdir("d/e")
      fails("EISDIR", root:write("d/e", "x"))
      fails("EISDIR", root:append("d", "x"))
      fails("EISDIR", root:write("/", "x"))
      assert.are.equal("dir", root:stat("d/e").type)
    end)

    it("refuses a file where a directory is expected", function()
      root:write("file", "x")
      fails({"ENOTDIR", "EEXIST"}, root:write("file/child", "x"))
      fails("ENOTDIR", root:read("file/child"))
      assert.are.equal("x", root:read("file"))
    end)

    it("caps reads with ETOOBIG", function()
      root:write("k", string.rep("k", 1000))
      fails("ETOOBIG", root:read("k", 999))
      fails("ETOOBIG", root:read("k", 0))
      assert.are.equal(1000, #root:read("k", 1000))
      root:write("zero", "")
      assert.are.equal("", root:read("zero", 0))
      fails("ETOOBIG", fs.read_host(dir .. "/k", 10))
      assert.are.equal(1000, #fs.read_host(dir .. "/k", 5000))
    end)

    it("handles names with newlines, a leading '-' and invalid UTF-8", function()
      for _, name in ipairs { "new\nline", "-rf", "--", "\255\254", " sp ace ", "*?" } do
        assert.is_true(root:write(name, name))
        assert.are.equal(name, root:read("/" .. name))
        assert.are.equal(name, fs.read_host(dir .. "/" .. name))
      end
      local names = {}
      for _, e in ipairs(root:list("/")) do names[#names + 1] = e.name end
      assert.are.same({ " sp ace ", "*?", "--", "-rf", "new\nline", "\255\254" }, names)
      assert.is_true(root:remove("-rf"))
      assert.is_true(root:remove("new\nline"))
      assert.is_false(exists(dir .. "/-rf"))
    end)
  end)

  describe("path validation", function()
    local ops = {
      read = function(p) return root:read(p) end,
      write = function(p) return root:write(p, "x") end,
      append = function(p) return root:append(p, "x") end,
      list = function(p) return root:list(p) end,
      stat = function(p) return root:stat(p) end,
      mkdir = function(p) return root:mkdir(p) end,
      remove = function(p) return root:remove(p, true) end,
      resolve = function(p) return root:resolve(p) end,
    }

    it("rejects .. that climbs above the root with ESCAPE", function()
      local probe = "sbx_escape_probe_" .. tostring(os.time())
      for name, op in pairs(ops) do
        for _, p in ipairs { "../" .. probe, "a/../../" .. probe, "/../" .. probe,
                             "..", "/..", "a/b/../../../" .. probe, "./../" .. probe } do
          local msg = fails("ESCAPE", op(p))
          assert.truthy(msg:find(name, 1, true) or name == "append", msg)
        end
      end
      assert.is_false(exists("/tmp/" .. probe))
    end)

    it("allows .. that stays inside", function()
      assert.is_true(root:write("a/../b", "inside"))
      assert.are.equal("inside", root:read("b"))
      assert.is_true(root:write("x/y/../z", "z"))
      assert.are.equal("z", root:read("x/z"))
      assert.are.equal("z", root:read("x/y/../../x/z"))
    end)

    it("rejects NUL bytes with EINVAL", function()
      for _, op in pairs(ops) do
        fails("EINVAL", op("a\0b"))
        fails("EINVAL", op("\0"))
      end
      assert.is_false(exists(dir .. "/a"))
    end)

    it("rejects over-long paths", function()
      for _, op in pairs(ops) do
        fails("EINVAL", op(string.rep("a/", 3000)))
        fails({"EINVAL", "ENAMETOOLONG"}, op(string.rep("n", 300)))
      end
    end)
  end)

  describe("symlinks", function()
    it("refuses an absolute symlink to /etc", function()
      sh("ln -s /etc " .. q(dir .. "/evil"))
      local probe = "sbx_fsspec_probe_" .. tostring(os.time())
      fails("ESCAPE", root:read("evil/passwd"))
      fails("ESCAPE", root:read("/evil/hostname"))
      fails("ESCAPE", root:write("evil/" .. probe, "pwned"))
      fails("ESCAPE", root:append("evil/" .. probe, "pwned"))
      fails("ESCAPE", root:mkdir("evil/" .. probe))
      fails("ESCAPE", root:list("evil"))
      fails("ESCAPE", root:stat("evil"))
      fails("ESCAPE", root:resolve("evil"))
      fails("ESCAPE", root:remove("evil/" .. probe))
      assert.is_false(exists("/etc/" .. probe))
      -- the link itself is listed (not followed) and removable
      local l = root:list("/")
      assert.are.equal("link", l[1].type)
      assert.is_true(root:remove("evil"))
      assert.is_true(exists("/etc/passwd"))
    end)

    it("refuses a relative symlink that climbs out", function()
      sh("mkdir -p " .. q(dir .. "/s/t") .. " && ln -s ../../.. " .. q(dir .. "/s/t/up"))
      fails("ESCAPE", root:read("s/t/up/etc/passwd"))
      fails("ESCAPE", root:list("s/t/up"))
      fails("ESCAPE", root:write("s/t/up/x", "x"))
      sh("ln -s .. " .. q(dir .. "/parent"))
      fails("ESCAPE", root:list("parent"))
    end)

    it("refuses a dangling symlink that would create a file outside", function()
      local target = "/tmp/sbx_fsspec_dangling_" .. tostring(os.time())
      sh("ln -s " .. q(target) .. " " .. q(dir .. "/dang"))
      sh("ln -s ../" .. q(target:match("[^/]+$")) .. " " .. q(dir .. "/dang2"))
      fails("ESCAPE", root:write("dang", "x"))
      fails("ESCAPE", root:append("dang2", "x"))
      assert.is_false(exists(target))
    end)

    it("refuses magic links through /proc", function()
      sh("ln -s /proc/self/cwd " .. q(dir .. "/magic"))
      sh("ln -s /proc/self/root " .. q(dir .. "/magic2"))
      fails("ESCAPE", root:read("magic/etc/passwd"))
      fails("ESCAPE", root:read("magic2/etc/passwd"))
      fails("ESCAPE", root:list("magic2"))
      fails("ESCAPE", root:write("magic/x", "x"))
    end)

    it("follows symlinks that stay inside the root", function()
      root:write("real.txt", "real")
      root:write("sub/f", "in sub")
      sh("ln -s real.txt " .. q(dir .. "/l"))
      sh("ln -s sub " .. q(dir .. "/sl"))
      sh("ln -s ../real.txt " .. q(dir .. "/sub/up"))
      sh("ln -s /real.txt " .. q(dir .. "/sub/abs"))  -- absolute: never allowed
      assert.are.equal("real", root:read("l"))
      assert.are.equal("in sub", root:read("sl/f"))
      assert.are.equal("real", root:read("sub/up"))
      fails("ESCAPE", root:read("sub/abs"))
      assert.is_true(root:write("sl/g", "through link"))
      assert.are.equal("through link", root:read("sub/g"))
      assert.are.equal("file", root:stat("l").type)
      assert.are.equal("dir", root:stat("sl").type)
      assert.is_true(root:write("l", "rewritten"))
      assert.are.equal("rewritten", root:read("real.txt"))
    end)

    it("reports a symlink loop as ESCAPE", function()
      sh("ln -s loop2 " .. q(dir .. "/loop1") .. " && ln -s loop1 " .. q(dir .. "/loop2"))
      fails("ESCAPE", root:read("loop1"))
    end)

    it("never lets a symlink swapped in during the call escape", function()
      local probe = "sbx_race_" .. tostring(os.time())
      local script = [[
        cd "$1" || exit 1
        end=$(( $(date +%s) + 30 ))
        touch started
        while [ ! -e stop ] && [ "$(date +%s)" -lt "$end" ]; do
          rm -rf swap; ln -s /etc swap; ls / >/dev/null
          rm -rf swap; mkdir swap; echo safe > swap/passwd
        done
        touch done
      ]]
      host_write(dir .. "/race.sh", script)
      sh("sh " .. q(dir .. "/race.sh") .. " " .. q(dir) .. " >/dev/null 2>&1 &")
      while not exists(dir .. "/started") do os.execute("sleep 0.01") end
      local passwd = fs.read_host("/etc/passwd")
      -- reads and lists until both states were seen a few times (or 15 s)
      local seen, stop, rounds = {}, os.time() + 15, 0
      while os.time() < stop and not (rounds >= 10 and seen.ESCAPE and seen["safe\n"]) do
        rounds = rounds + 1
        for _ = 1, 200 do
          local data, _, code = root:read("swap/passwd")
          assert.are_not.equal(passwd, data)
          seen[data or code] = true
          for _, e in ipairs(root:list("swap") or {}) do
            assert.are.equal("passwd", e.name)
          end
        end
      end
      -- then writes (whose mkdir -p recreates "swap" and so slows the swaps)
      for _ = 1, 2000 do root:write("swap/" .. probe, "x") end
      host_write(dir .. "/stop", "")
      while not exists(dir .. "/done") do os.execute("sleep 0.05") end
      assert.is_false(exists("/etc/" .. probe))
      assert.is_true(seen["safe\n"] and seen.ESCAPE, "the race was not exercised")
    end)
  end)

  describe("special files", function()
    it("refuses FIFOs without blocking", function()
      sh("mkfifo " .. q(dir .. "/fifo"))
      sh("ln -s fifo " .. q(dir .. "/lfifo"))
      fails("ENOTREG", root:read("fifo"))
      fails("ENOTREG", root:read("lfifo"))
      fails("ENOTREG", root:write("fifo", "x"))
      fails("ENOTREG", root:append("fifo", "x"))
      fails("ENOTREG", root:write("lfifo", "x"))
      fails("ENOTREG", fs.read_host(dir .. "/fifo"))
      assert.are.equal("fifo", root:stat("fifo").type)
    end)

    it("refuses device nodes", function()
      if not os.execute("mknod " .. q(dir .. "/null") .. " c 1 3 2>/dev/null") then
        return  -- not privileged to mknod; FIFOs cover the path
      end
      fails("ENOTREG", root:read("null"))
      fails("ENOTREG", root:write("null", "x"))
      assert.are.equal("char", root:list("/")[1].type)
    end)
  end)

  describe("list", function()
    it("lists sorted entries with sizes and types", function()
      root:write("b", "bbb")
      root:write("a", string.rep("a", 10))
      root:mkdir("c")
      root:write("c/inner", "x")
      sh("ln -s a " .. q(dir .. "/d") .. " && mkfifo " .. q(dir .. "/e"))
      sh("ln -s /etc " .. q(dir .. "/B"))
      local l = assert(root:list("/"))
      local got = {}
      for i, e in ipairs(l) do
        got[i] = { e.name, e.path, e.type, e.is_dir }
        assert.is_true(math.type(e.mtime) == "integer" and e.mtime > 0)
      end
      assert.are.same({
        { "B", "/B", "link", false },
        { "a", "/a", "file", false },
        { "b", "/b", "file", false },
        { "c", "/c", "dir", true },
        { "d", "/d", "link", false },
        { "e", "/e", "fifo", false },
      }, got)
      assert.are.equal(10, l[2].size)
      assert.are.equal(3, l[3].size)
    end)

    it("joins the requested path into entry paths", function()
      root:write("data/in.txt", "x")
      root:write("in.txt", "y")
      assert.are.equal("/data/in.txt", root:list("/data")[1].path)
      assert.are.equal("data/in.txt", root:list("data")[1].path)
      assert.are.equal("/data/in.txt", root:list("/data/")[1].path)
      assert.are.equal("/in.txt", root:list("/")[2].path)
      assert.are.equal("data", root:list("")[1].path)
      assert.are.equal("in.txt", root:list(".")[2].path)
    end)

    it("lists an empty directory as an empty table", function()
      root:mkdir("empty")
      assert.are.same({}, root:list("empty"))
    end)

    it("fails on a missing directory or a file", function()
      fails("ENOENT", root:list("missing"))
      root:write("file", "x")
      fails("ENOTDIR", root:list("file"))
    end)
  end)

  describe("stat, mkdir, resolve", function()
    it("stats files and directories", function()
      root:write("f", "12345", tonumber("640", 8))
      local st = assert(root:stat("/f"))
      assert.are.equal("file", st.type)
      assert.are.equal(5, st.size)
      assert.are.equal(tonumber("640", 8), st.mode)
      assert.is_true(math.type(st.mtime) == "integer")
      assert.are.equal("dir", root:stat("/").type)
      fails("ENOENT", root:stat("nope"))
    end)

    it("mkdir is mkdir -p and idempotent", function()
      assert.is_true(root:mkdir("p/q/r"))
      assert.is_true(root:mkdir("p/q/r"))
      assert.is_true(root:mkdir("/p/q"))
      assert.is_true(root:mkdir("/"))
      assert.are.equal("dir", root:stat("p/q/r").type)
      root:write("p/file", "x")
      fails({"EEXIST", "ENOTDIR"}, root:mkdir("p/file"))
      fails("ENOTDIR", root:mkdir("p/file/sub"))
    end)

    it("resolves to a real host path inside the root", function()
      local real = io.popen("realpath " .. q(dir)):read("*l")
      root:mkdir("work/sub")
      sh("ln -s work/sub " .. q(dir .. "/shortcut"))
      assert.are.equal(real, root:resolve("/"))
      assert.are.equal(real, root:resolve(""))
      assert.are.equal(real .. "/work/sub", root:resolve("/work/sub"))
      assert.are.equal(real .. "/work/sub", root:resolve("shortcut"))
      fails("ENOENT", root:resolve("nope"))
    end)
  end)

  describe("remove", function()
    it("removes files, empty dirs and symlinks (not their targets)", function()
      root:write("f", "x")
      root:mkdir("d")
      root:write("keep/k", "k")
      sh("ln -s keep " .. q(dir .. "/lk"))
      assert.is_true(root:remove("f"))
      assert.is_true(root:remove("/d"))
      assert.is_true(root:remove("lk"))
      assert.are.equal("k", root:read("keep/k"))
      fails("ENOENT", root:remove("f"))
      fails("ENOTEMPTY", root:remove("keep"))
    end)

    it("refuses to remove the root", function()
      for _, p in ipairs { "/", "", ".", "a/..", "//" } do
        fails("EINVAL", root:remove(p, true))
        fails("EINVAL", root:remove(p))
      end
      assert.is_true(exists(dir))
    end)

    it("removes a tree without following symlinks out of it", function()
      local outside = assert(fs.mkdtemp("/tmp", "fsspec-out"))
      host_write(outside .. "/keep.txt", "precious")
      root:write("tree/sub/file", "x")
      root:write("tree/a/b/c/d", "x")
      sh("ln -s " .. q(outside) .. " " .. q(dir .. "/tree/sub/out"))
      sh("ln -s " .. q(outside) .. " " .. q(dir .. "/outlink"))
      sh("mkfifo " .. q(dir .. "/tree/fifo"))
      assert.is_true(root:remove("tree", true))
      assert.is_true(root:remove("outlink", true))
      fails("ENOENT", root:stat("tree"))
      assert.are.equal("precious", fs.read_host(outside .. "/keep.txt"))
      assert.is_true(fs.rmtree(outside))
    end)

    it("removes a single file with recursive=true", function()
      root:write("one", "1")
      assert.is_true(root:remove("one", true))
      fails("ENOENT", root:remove("one", true))
    end)
  end)

  describe("mounts (root with mount privileges only)", function()
    it("refuses /proc magic links and never removes across a mount", function()
      local outside = assert(fs.mkdtemp("/tmp", "fsspec-out"))
      host_write(outside .. "/keep.txt", "precious")
      root:mkdir("m/x")
      root:mkdir("proc")
      if not os.execute("mount --bind " .. q(outside) .. " " .. q(dir .. "/m/x") .. " 2>/dev/null") then
        assert(fs.rmtree(outside))
        return  -- unprivileged: nothing to test
      end
      finally(function()
        os.execute("umount " .. q(dir .. "/m/x") .. " 2>/dev/null")
        os.execute("umount " .. q(dir .. "/proc") .. " 2>/dev/null")
        fs.rmtree(outside)
      end)
      sh("mount --bind /proc " .. q(dir .. "/proc"))
      assert.is_truthy(root:read("proc/version"))
      fails("ESCAPE", root:read("proc/self/root/etc/passwd"))
      fails("ESCAPE", root:read("proc/self/fd/0"))
      fails("ESCAPE", root:list("proc/self/cwd"))
      fails("ESCAPE", root:read("proc/self/exe"))
      fails("EXDEV", root:remove("m/x", true))
      fails("EXDEV", root:remove("m", true))
      fails("EXDEV", fs.rmtree(dir .. "/m"))
      fails("EXDEV", fs.rmtree(dir))
      assert.are.equal("precious", fs.read_host(outside .. "/keep.txt"))
      assert.is_truthy(fs.read_host("/proc/version"))
    end)
  end)

  describe("rmtree", function()
    it("removes a tree with chmod 000 directories and files", function()
      local t = dir .. "/t"
      sh("mkdir -p " .. q(t .. "/a/b") .. " && echo x > " .. q(t .. "/a/b/f"))
      sh("echo y > " .. q(t .. "/a/g") .. " && chmod 000 " .. q(t .. "/a/b/f"))
      sh("chmod 000 " .. q(t .. "/a/b") .. " " .. q(t .. "/a") .. " && chmod 500 " .. q(t))
      assert.is_true(fs.rmtree(t))
      assert.is_false(exists(t))
    end)

    it("treats a missing path as success", function()
      assert.is_true(fs.rmtree(dir .. "/never/was"))
    end)

    it("does not follow symlinks", function()
      local outside = assert(fs.mkdtemp("/tmp", "fsspec-out"))
      host_write(outside .. "/keep.txt", "precious")
      sh("mkdir " .. q(dir .. "/t") .. " && ln -s " .. q(outside) .. " " .. q(dir .. "/t/out"))
      sh("ln -s " .. q(outside) .. " " .. q(dir .. "/top"))
      assert.is_true(fs.rmtree(dir .. "/top/"))   -- a trailing slash must not follow
      assert.is_true(fs.rmtree(dir .. "/t"))
      assert.are.equal("precious", fs.read_host(outside .. "/keep.txt"))
      assert.is_false(exists(dir .. "/top"))
      assert.is_true(fs.rmtree(outside))
      assert.is_false(exists(outside))
    end)

    it("removes trees deeper than PATH_MAX", function()
      -- grow a chain 100 levels at a time by renaming it below a new one
      local chain = string.rep("dd/", 100)
      local cmd = { "cd " .. q(dir), "mkdir -p deep/" .. chain, "touch deep/" .. chain .. "f" }
      for _ = 1, 25 do
        cmd[#cmd + 1] = "mkdir -p new/" .. chain .. " && mv deep new/" .. chain .. "deep && mv new deep"
      end
      sh(table.concat(cmd, " && "))
      assert.is_true(fs.rmtree(dir .. "/deep"))
      assert.is_false(exists(dir .. "/deep"))
    end)

    it("refuses /, . and ..", function()
      for _, p in ipairs { "/", "//", ".", "..", dir .. "/.", dir .. "/..", "" } do
        fails("EINVAL", fs.rmtree(p))
      end
      assert.is_true(exists(dir))
    end)
  end)

  describe("locks", function()
    it("excludes a second holder, even in the same process", function()
      local p = dir .. "/lockfile"
      assert.is_false(fs.is_locked(p))
      local l1 = assert(fs.lock(p))
      assert.is_true(fs.is_locked(p))
      fails("EBUSY", fs.lock(p))
      if os.execute("command -v flock >/dev/null") then
        assert.is_falsy(os.execute("flock -n " .. q(p) .. " true"))
      end
      l1:unlock()
      l1:unlock()
      assert.is_false(fs.is_locked(p))
      local l2 = assert(fs.lock(p))
      assert.is_true(fs.is_locked(p))
      l2:unlock()
      assert.is_false(fs.is_locked(dir .. "/missing"))
      assert.matches("closed", tostring(l2))
    end)

    it("releases on <close> and on collection", function()
      local p = dir .. "/lockfile"
      do
        local l <close> = assert(fs.lock(p))
        assert.is_true(fs.is_locked(p))
      end
      assert.is_false(fs.is_locked(p))
      local l = assert(fs.lock(p))
      assert.is_true(fs.is_locked(p))
      l = nil ---@diagnostic disable-line
      collectgarbage()
      collectgarbage()
      assert.is_false(fs.is_locked(p))
    end)

    it("fails cleanly when the lock file cannot be created", function()
      fails("ENOENT", fs.lock(dir .. "/no/such/dir/lock"))
    end)
  end)

  describe("journal", function()
    it("appends synced lines, creating parents 0700", function()
      local p = dir .. "/state/j/journal.log"
      local j = assert(fs.journal(p))
      assert.is_true(j:append('{"op":"create"}\n'))
      assert.is_true(j:append("bin\0ary\n"))
      assert.are.equal('{"op":"create"}\nbin\0ary\n', fs.read_host(p))
      assert.are.equal(tonumber("700", 8), root:stat("state/j").mode)
      assert.are.equal(tonumber("600", 8), root:stat("state/j/journal.log").mode)
      j:close()
      j:close()
      assert.has_error(function() j:append("x") end)
      local j2 <close> = assert(fs.journal(p))
      assert.is_true(j2:append("more\n"))
      assert.are.equal('{"op":"create"}\nbin\0ary\nmore\n', fs.read_host(p))
    end)
  end)

  describe("host helpers", function()
    it("mkdtemp creates missing parents and unique 0700 dirs", function()
      local parent = dir .. "/x/y"
      local a = assert(fs.mkdtemp(parent, "pre-"))
      local b = assert(fs.mkdtemp(parent .. "/", "pre-"))
      assert.are_not.equal(a, b)
      assert.matches("^" .. dir:gsub("%p", "%%%0") .. "/x/y/pre%-......$", a)
      assert.are.equal(tonumber("700", 8), root:stat(a:sub(#dir + 1)).mode)
      assert.are.equal(tonumber("700", 8), root:stat("x/y").mode)
      root:write("file", "x")
      fails("ENOTDIR", fs.mkdtemp(dir .. "/file", "p"))
    end)

    it("read_host and list_host", function()
      host_write(dir .. "/zeta", "z")
      host_write(dir .. "/alpha", "a")
      sh("mkdir " .. q(dir .. "/Mid"))
      assert.are.same({ "Mid", "alpha", "zeta" }, fs.list_host(dir))
      fails("ENOENT", fs.list_host(dir .. "/none"))
      fails("ENOTDIR", fs.list_host(dir .. "/zeta"))
      assert.are.equal("z", fs.read_host(dir .. "/zeta"))
      fails("ENOENT", fs.read_host(dir .. "/none"))
      fails("EISDIR", fs.read_host(dir))
      fails("EINVAL", fs.read_host(dir .. "/\0zeta"))
    end)

    it("readlink", function()
      sh("ln -s 'some/where' " .. q(dir .. "/ln"))
      assert.are.equal("some/where", fs.readlink(dir .. "/ln"))
      host_write(dir .. "/plain", "")
      fails("EINVAL", fs.readlink(dir .. "/plain"))
      fails("ENOENT", fs.readlink(dir .. "/none"))
    end)
  end)

  describe("Root object", function()
    it("reports its host path and fails to open bad roots", function()
      assert.are.equal(dir, root:path())
      assert.matches("sbx.Root", tostring(root))
      fails("ENOENT", fs.open_root(dir .. "/missing"))
      host_write(dir .. "/file", "")
      fails("ENOTDIR", fs.open_root(dir .. "/file"))
      fails("EINVAL", fs.open_root(dir .. "\0x"))
    end)

    it("close is idempotent and methods on a closed root raise", function()
      local r = assert(fs.open_root(dir))
      r:close()
      r:close()
      assert.matches("closed", tostring(r))
      assert.has_error(function() r:read("x") end)
      assert.has_error(function() r:write("x", "y") end)
      assert.has_error(function() r:path() end)
    end)

    it("closes with <close>", function()
      local keep
      do
        local r <close> = assert(fs.open_root(dir))
        keep = r
        assert.is_true(r:write("c", "closed later"))
      end
      assert.has_error(function() keep:read("c") end)
      assert.are.equal("closed later", root:read("c"))
    end)

    it("raises on wrong argument types", function()
      assert.has_error(function() root:read({}) end)
      assert.has_error(function() root:read() end)
      assert.has_error(function() root:write("x", {}) end)
      assert.has_error(function() root:write("x") end)
      assert.has_error(function() root:write("x", "y", "rw") end)
      assert.has_error(function() root:write("x", "y", tonumber("77777", 8)) end)
      assert.has_error(function() root:read("x", -1) end)
      assert.has_error(function() root:read("x", "big") end)
      assert.has_error(function() root.read("notaroot", "x") end)
      assert.has_error(function() root.read(io.stdout, "x") end)
      assert.has_error(function() fs.open_root() end)
      assert.has_error(function() fs.open_root({}) end)
      assert.has_error(function() fs.mkdtemp("/tmp", "a/b") end)
      assert.has_error(function() fs.mkdtemp("/tmp") end)
      assert.has_error(function() fs.lock(nil) end)
      assert.has_error(function() fs.journal(false) end)
      assert.has_error(function() fs.rmtree() end)
    end)

    it("leaks no fds, on success or failure", function()
      root:write("f", "x")
      sh("mkfifo " .. q(dir .. "/fifo") .. " && ln -s /etc " .. q(dir .. "/evil"))
      local function work()
        root:read("f"); root:read("fifo"); root:read("evil/passwd"); root:read("nope")
        root:write("w/x", "x"); root:write("fifo", "x"); root:append("f", "y")
        root:list("/"); root:list("f"); root:stat("f"); root:resolve("w")
        root:mkdir("m/n"); root:remove("m", true); root:read("f", 0)
        fs.read_host(dir .. "/f"); fs.list_host(dir); fs.is_locked(dir .. "/f")
        pcall(root.write, root, "x", {})
        local l = fs.lock(dir .. "/lk"); fs.lock(dir .. "/lk"); l:unlock()
        local j = fs.journal(dir .. "/j"); j:append("x"); j:close()
        local r = fs.open_root(dir); r:close()
      end
      work()
      local before = S.fd_baseline{ collect = true }
      for _ = 1, 20 do work() end
      S.expect_fds(before)
    end)
  end)
end)
