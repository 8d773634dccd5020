-- sbx.limits: which cgroup controllers limit bwrap sandboxes and which
-- files a limit writes. The real v1 path runs in spec/bwrap and the
-- adversarial fork bomb wherever the machine has v1 controllers; cgroup v2
-- controllers cannot be had on such a machine (v1 holds them), so its
-- logic runs here against a stand-in tree of plain files.
local limits = require "sbx.providers.builtin.limits"
local proc = require "sbx.proc"
local fs = require "sbx.fs"

local TMP = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/limits-" .. proc.getpid()

local function write(path, s)
  local f = assert(io.open(path, "w"))
  f:write(s)
  f:close()
end

local function read(path)
  local f = io.open(path)
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function mkdir(p) assert(fs.mkdir_host(p)) end

describe("sbx.providers.builtin.limits", function()
  before_each(function() fs.rmtree(TMP) mkdir(TMP) end)
  after_each(function() limits.use(nil) fs.rmtree(TMP) end)

  it("reads a hybrid host's v1 hierarchies: mount point plus our own path", function()
    for _, c in ipairs{ "pids", "memory" } do
      mkdir(TMP .. "/" .. c .. (c == "memory" and "/job/7" or "") .. "/sbxlua")
      write(TMP .. "/" .. c .. (c == "memory" and "/job/7" or "") .. "/sbxlua/cgroup.procs", "")
    end
    mkdir(TMP .. "/v2/sbxlua")
    local mountinfo = table.concat({
      "30 25 0:26 / " .. TMP .. "/v2 rw,nosuid - cgroup2 cgroup2 rw",
      "39 31 0:36 / " .. TMP .. "/pids rw,relatime - cgroup cgroup rw,pids",
      "40 31 0:37 / " .. TMP .. "/memory rw,relatime - cgroup cgroup rw,memory",
      "41 31 0:38 /sub " .. TMP .. "/cpu rw,relatime - cgroup cgroup rw,cpu",   -- not its root: skipped
      "42 31 0:39 / /proc rw - proc proc rw",
    }, "\n")
    local selfcg = "8:pids:/\n4:memory:/job/7\n1:cpu:/\n0::/\n"
    local found = limits.detect(TMP .. "/v2/sbxlua", mountinfo, selfcg)
    assert.same({ v = 1, dir = TMP .. "/pids/sbxlua" }, found.pids)
    assert.same({ v = 1, dir = TMP .. "/memory/job/7/sbxlua" }, found.memory)
    assert.is_nil(found.cpu)
    assert.same({}, limits.detect(nil, mountinfo, selfcg))   -- no v2 cgroup: nothing
  end)

  it("takes v2's controllers first, enabling them for its children", function()
    mkdir(TMP .. "/v2/sbxlua")
    write(TMP .. "/v2/cgroup.controllers", "cpu memory pids io\n")
    write(TMP .. "/v2/sbxlua/cgroup.controllers", "memory pids\n")
    local found = limits.detect(TMP .. "/v2/sbxlua", "", "")
    for _, c in ipairs{ "pids", "memory" } do
      assert.same({ v = 2, dir = TMP .. "/v2/sbxlua" }, found[c])
    end
    -- cpu, which only the parent has, was asked of the parent; a kernel
    -- would then list it for sbxlua/, the stand-in file does not
    assert.equal("+cpu", read(TMP .. "/v2/cgroup.subtree_control"))
    assert.is_nil(found.cpu)
    assert.equal("+memory", read(TMP .. "/v2/sbxlua/cgroup.subtree_control"))
  end)

  it("writes the v2 files of a sandbox: memory and no swap, a CFS quota, pids.max", function()
    local base = TMP .. "/v2/sbxlua"
    mkdir(base .. "/s1/sb1")
    write(base .. "/s1/sb1/memory.swap.max", "max")
    limits.use{ pids = { v = 2, dir = base }, memory = { v = 2, dir = base }, cpu = { v = 2, dir = base } }
    local set = assert(limits.apply("s1", "sb1", base .. "/s1/sb1", { pids = 1024, memory_mb = 64, cpu = 0.5 }))
    assert.same({}, set.join)                           -- v2: the sandbox's cgroup is enough
    assert.equal(tostring(64 << 20), read(base .. "/s1/sb1/memory.max"))
    assert.equal("0", read(base .. "/s1/sb1/memory.swap.max"))
    assert.equal("50000 100000", read(base .. "/s1/sb1/cpu.max"))
    assert.equal("1024", read(base .. "/s1/sb1/pids.max"))
    assert.matches("^%+", read(base .. "/s1/cgroup.subtree_control"))  -- enabled for the sandbox
  end)

  it("makes v1 groups per sandbox and returns them to join; removes them after", function()
    local v2 = TMP .. "/v2/sbxlua"
    mkdir(v2 .. "/s1/sb1")
    limits.use{ pids = { v = 1, dir = TMP .. "/pids/sbxlua" }, memory = { v = 1, dir = TMP .. "/mem/sbxlua" } }
    mkdir(TMP .. "/pids/sbxlua")
    mkdir(TMP .. "/mem/sbxlua/s1/sb1")
    write(TMP .. "/mem/sbxlua/s1/sb1/memory.memsw.limit_in_bytes", "")
    local set = assert(limits.apply("s1", "sb1", v2 .. "/s1/sb1", { pids = 100, memory_mb = 32 }))
    assert.same({ TMP .. "/pids/sbxlua/s1/sb1/cgroup.procs", TMP .. "/mem/sbxlua/s1/sb1/cgroup.procs" }, set.join)
    assert.equal("100", read(TMP .. "/pids/sbxlua/s1/sb1/pids.max"))
    assert.equal(tostring(32 << 20), read(TMP .. "/mem/sbxlua/s1/sb1/memory.limit_in_bytes"))
    assert.equal(tostring(32 << 20), read(TMP .. "/mem/sbxlua/s1/sb1/memory.memsw.limit_in_bytes"))
    -- asking for what no controller gives is an error, not a silent pass
    local none, why = limits.apply("s1", "sb2", v2 .. "/s1/sb2", { cpu = 1 })
    assert.is_nil(none)
    assert.matches("no cpu controller", why)
  end)

  it("says which limit uses which controller", function()
    limits.use{ pids = { v = 1, dir = "/x" }, memory = { v = 2, dir = "/y" } }
    assert.equal("pids (cgroup v1, pids.max " .. limits.PIDS .. "), memory_mb (cgroup v2), cpu: not enforced",
                 limits.describe())
  end)
end)
