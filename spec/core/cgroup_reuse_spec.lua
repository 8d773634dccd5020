-- A command cgroup that went through cgroup.kill is never reused: this
-- kernel (and others) kill every child later cloned into such a group, so
-- after one p:kill() every later command of the sandbox died at once
-- (signal = "SIGKILL"). Issue 15, item 4.
local proc = require "sbx.proc"
local cgroup = require "sbx.cgroup"
local fs = require "sbx.fs"
require "sbx"

local PATH = "PATH=/usr/local/bin:/usr/bin:/bin"

local function subgroups(dir)
  local n = 0
  for _, name in ipairs(assert(fs.list_host(dir))) do   -- command groups: c<pid>.<n>
    if name:match("^c%d+%.%d+$") then n = n + 1 end
  end
  return n
end

describe("command cgroups after a kill", function()
  local base = cgroup.base()

  it("proc: a killed command's group is removed, and the next command runs", function()
    if not base then pending("no writable cgroup v2 here") return end
    local dir = base .. "/spec-reuse-" .. proc.getpid()
    assert(cgroup.create(dir))
    finally(function() cgroup.remove(dir) end)
    local ok = assert(proc.spawn{ argv = { "true" }, env = { PATH }, cgroup = dir })
    assert.equal(0, ok:wait().exit_code)
    assert.equal(1, subgroups(dir))           -- an empty group is kept for reuse
    for i = 1, 5 do
      local p = assert(proc.spawn{ argv = { "sleep", "60" }, env = { PATH }, cgroup = dir })
      p:kill()
      local r = p:wait()
      assert.equal("SIGKILL", r.signal)
      assert.equal(0, subgroups(dir), "round " .. i .. ": the killed group was kept")
      local q = assert(proc.spawn{ argv = { "echo", "after" .. i }, env = { PATH }, cgroup = dir })
      local rq = q:wait()
      assert.is_nil(rq.signal, "round " .. i)
      assert.equal(0, rq.exit_code)
      assert.equal("after" .. i .. "\n", rq.stdout)
    end
  end)

  local function after_kill(backend, opts)
    local sb <close> = sbx.sandbox(backend, opts)
    for i = 1, 10 do      -- bwrap: the group is sometimes still populated at exit
      local p = sb:spawn("sleep", { "60" })
      assert.equal("x\n", sb:execute_command("echo", { "x" }).stdout)   -- p has started
      p:kill()
      assert.equal("SIGKILL", p:wait().signal)
      local r = sb:execute_command("echo", { "hi" .. i })
      assert.is_nil(r.signal, backend .. " round " .. i)
      assert.equal(0, r.exit_code)
      assert.equal("hi" .. i .. "\n", r.stdout)
    end
  end

  it("local: commands after p:kill() run", function()
    if not base then pending("no writable cgroup v2 here") return end
    after_kill("local", {})
  end)

  it("bwrap with rlimits (a bwrap per command): commands after p:kill() run", function()
    local ok, why = require("sbx.providers.builtin.bwrap").available()
    if not ok then pending("bwrap unavailable: " .. tostring(why)) return end
    if not base then pending("no writable cgroup v2 here") return end
    after_kill("bwrap", { backend_options = { rlimits = { nofile = 256 } } })
  end)
end)
