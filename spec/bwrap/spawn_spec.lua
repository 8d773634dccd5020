-- The sbx.proc options the bwrap backend stands on: extra fds holding data
-- (its seccomp program reaches bwrap on fd 3) and rlimits set in the child.
local proc = require "sbx.proc"
local native = require "sbx.bwrap"
local S = require "spec.support"

local PATH = "PATH=/usr/local/bin:/usr/bin:/bin"

local function run(o)
  o.env = o.env or { PATH }
  local p = assert(proc.spawn(o))
  local r = p:wait()
  p:close()
  return r
end

describe("proc.spawn fds", function()
  it("gives each string to the child on fd 3, 4, ... to its end, and nothing more", function()
    local before = S.fd_baseline()
    local r = run{ argv = { "python3", "-c", [[
import os
print(sorted(int(f) for f in os.listdir('/proc/self/fd')))
print(os.read(3, 100).decode(), os.read(3, 100) == b'')
print(len(os.read(4, 1 << 20)))
]] }, fds = { "first", string.rep("x", 65536) } }
    assert.equal(0, r.exit_code, r.stderr)
    -- 0-2, the two fds, and the one listdir holds open
    assert.matches("^%[0, 1, 2, 3, 4, 5%]\nfirst True\n65536\n$", r.stdout)
    S.expect_fds(before)
  end)

  it("works with no fds and an empty string", function()
    assert.equal("", run{ argv = { "cat" }, fds = { "" }, stdin = "" }.stdout)
    local r = run{ argv = { "sh", "-c", "cat <&3" }, fds = { "" } }
    assert.equal(0, r.exit_code)
  end)

  it("rejects bad fds", function()
    assert.has_error(function() proc.spawn{ argv = { "true" }, env = { PATH }, fds = "x" } end)
    assert.has_error(function() proc.spawn{ argv = { "true" }, env = { PATH }, fds = { 1 } } end)
    assert.has_error(function() proc.spawn{ argv = { "true" }, env = { PATH }, fds = { string.rep("x", 65537) } } end)
    local nine = {}
    for i = 1, 9 do nine[i] = "x" end
    assert.has_error(function() proc.spawn{ argv = { "true" }, env = { PATH }, fds = nine } end)
  end)
end)

describe("proc.spawn rlimits", function()
  it("sets limits in the child only", function()
    local r = run{ argv = { "sh", "-c", "ulimit -n; ulimit -c; ulimit -f" }, rlimits = { nofile = 100, core = 0, fsize = 1024 * 1024 } }
    assert.equal("100\n0\n2048\n", r.stdout)
    r = run{ argv = { "sh", "-c", "ulimit -n" } }
    assert.not_equal("100\n", r.stdout)
  end)

  it("rejects unknown names and bad values; fails cleanly where the kernel refuses", function()
    assert.has_error(function() proc.spawn{ argv = { "true" }, env = { PATH }, rlimits = { bogus = 1 } } end)
    assert.has_error(function() proc.spawn{ argv = { "true" }, env = { PATH }, rlimits = { nofile = -1 } } end)
    assert.has_error(function() proc.spawn{ argv = { "true" }, env = { PATH }, rlimits = { nofile = 1.5 } } end)
    local before = S.fd_baseline()
    local p, err, code = proc.spawn{ argv = { "true" }, env = { PATH }, rlimits = { nofile = 1 << 40 } }
    assert.is_nil(p)
    assert.matches("setrlimit", err)
    assert.equal("EPERM", code)
    S.expect_fds(before)
  end)
end)

describe("the seccomp program", function()
  it("is a whole number of BPF instructions and names what it denies", function()
    local prog = assert(native.seccomp())
    assert.equal(0, #prog % 8)
    assert.is_true(#prog // 8 > 40 and #prog // 8 <= 256)
    assert.is_true(#native.denied() > 30)
  end)
end)
