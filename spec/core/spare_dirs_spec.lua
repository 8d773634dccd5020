-- A destroyed local sandbox's directory is emptied and kept in
-- <state>/local/.spare, then renamed into a later sandbox's name (a mkdir
-- and an rmdir on ext4 cost more than the rest of a create and a destroy).
-- The next sandbox must never see what the last one left: files, deep or
-- read-only trees, a mode or an xattr on its root. gc leaves the spares.
local S = require "spec.support"
local fs = require "sbx.fs"
local owner = require "sbx.state.owner"

local function spare_dir() return owner.state_dir() .. "/local/.spare" end
local function spares() return #(fs.list_host(spare_dir()) or {}) end
local function inode(path) return S.host("stat -c %i " .. S.shq(path)):match("%d+") end

describe("spare local sandbox directories", function()
  -- spares of an earlier run of this spec: gone before this process looks
  setup(function() fs.rmtree(spare_dir()) end)

  it("a destroyed sandbox's directory comes back empty, 0700, as the next sandbox's", function()
    local a = sbx.sandbox("local")
    local dir = a:session_state().state.dir
    local ino = inode(dir)
    a:execute_command("sh", { "-c", "echo x > f; mkdir -p d/e/f; echo y > d/e/f/g; chmod 500 d/e; " ..
                                    "ln -s / root; mkfifo p; i=0; mkdir deep; cd deep; " ..
                                    "while [ $i -lt 40 ]; do mkdir n; cd n; i=$((i+1)); done; touch leaf" })
    local before = spares()
    a:destroy()
    assert.equal(before + 1, spares())
    assert.is_nil(fs.stat_host(dir), "the old name is gone")
    local b <close> = sbx.sandbox("local")
    local bdir = b:session_state().state.dir
    assert.equal(ino, inode(bdir), "the spare was renamed, not a new directory made")
    assert.matches("^" .. b.id:gsub("%-", "%%-") .. "%.", bdir:match("[^/]+$"))
    assert.equal(before, spares())
    assert.equal("", b:execute_command("ls", { "-A" }).stdout)
    assert.equal(tonumber("700", 8), fs.stat_host(bdir).mode)
    assert.same({}, b:list_files("/"))
  end)

  it("a root whose mode the sandbox changed is removed, not kept", function()
    local a = sbx.sandbox("local")
    local dir = a:session_state().state.dir
    a:execute_command("chmod", { "755", "." })
    local before = spares()
    a:destroy()
    assert.equal(before, spares())
    assert.is_nil(fs.stat_host(dir))
  end)

  it("a root with an xattr the sandbox set is removed, not kept", function()
    local a = sbx.sandbox("local")
    local dir = a:session_state().state.dir
    local r = a:execute_command("python3", { "-c", "import os; os.setxattr('.', 'user.sbxmark', b'1')" })
    if r.exit_code ~= 0 then
      a:destroy()
      return pending("no user xattrs here: " .. r.stderr)
    end
    local before = spares()
    a:destroy()
    assert.equal(before, spares())
    assert.is_nil(fs.stat_host(dir))
  end)

  it("a root the sandbox replaced by a symlink: the link goes, its target stays", function()
    local target = S.tmpdir("sbxspare-target")
    finally(function() fs.rmtree(target) end)
    S.host("echo keep > " .. S.shq(target .. "/keep"))
    local a = sbx.sandbox("local")
    local dir = a:session_state().state.dir
    S.host("rm -rf " .. S.shq(dir) .. " && ln -s " .. S.shq(target) .. " " .. S.shq(dir))
    a:destroy()
    assert.is_nil(fs.stat_host(dir))
    assert.equal("keep\n", fs.read_host(target .. "/keep"))
  end)

  it("a spare another process took is skipped: the create makes a new directory", function()
    local sbs = {}
    for i = 1, 3 do sbs[i] = sbx.sandbox("local") end
    for i = 1, 3 do sbs[i]:destroy() end
    -- another sbxlua on the same state directory takes every spare there
    local r = S.sbxlua({ "-e", [[
      local t = {}
      for i = 1, 300 do t[i] = sbx.sandbox("local") end
      io.write(#require("sbx.fs").list_host(require("sbx.state.owner").state_dir() .. "/local/.spare"))
      for i = 1, 300 do t[i]:destroy() end
    ]] }, { env = { S.PATH, "SBX_STATE_DIR=" .. owner.state_dir(), "SBX_LOCAL_SPARES=256" }, timeout = 120 })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("0", r.stdout)
    -- it kept 256 (its SBX_LOCAL_SPARES) of its 300 when it closed them;
    -- this process's list is stale
    assert.equal(256, spares())
    local c <close> = sbx.sandbox("local")
    assert.equal("ok\n", c:execute_command("echo", { "ok" }).stdout)
  end)

  it("gc neither lists nor removes the spares", function()
    local a = sbx.sandbox("local")
    a:destroy()
    local n = spares()
    assert.is_true(n > 0)
    local r = S.sbxlua({ "gc" }, { env = { S.PATH, "SBX_STATE_DIR=" .. owner.state_dir() }, timeout = 60 })
    assert.equal(0, r.exit_code, r.stderr)
    assert.not_matches("spare", r.stdout .. r.stderr)
    assert.equal(n, spares())
  end)
end)
