-- sbxlua selftest and doctor: the escape probes pass on the isolating
-- backends this machine has, and each probe really fails where the
-- protection is missing (on `local`, which is not a boundary); doctor says
-- per backend what works and how to fix what does not.
local sbx = require "sbx"
local proc = require "sbx.proc"
local selftest = require "sbx.cli.selftest"
local bwrap = require "sbx.providers.builtin.bwrap"
local docker = require "sbx.providers.builtin.docker"
local json = require "cjson"
local S = require "spec.support"

local IMAGE = S.IMAGE
local H = S.home("selftest", { timeout = 300 })
local STATE = H.dir

-- sbxlua(args [, extra env "K=V" list]) -> result
local function sbxlua(args, extra_env) return H.run(args, { env = extra_env }) end

local function by_probe(rows)
  local t = {}
  for _, row in ipairs(rows) do t[row.probe] = row end
  return t
end

describe("sbxlua selftest", function()
  local have_bwrap = bwrap.available()

  it("blocks every probe on bwrap", function()
    if not have_bwrap then return pending("bwrap unavailable") end
    local r = sbxlua{ "selftest", "--backend", "bwrap", "--json" }
    assert.equal(0, r.exit_code, r.stdout .. r.stderr)
    local report = json.decode(r.stdout)
    assert.equal(0, report.failed)
    local rows = by_probe(report.results[1].probes)
    for _, p in ipairs(selftest.probes) do
      assert.equal("ok", rows[p.name].status, p.name .. ": " .. tostring(rows[p.name].detail))
    end
    if bwrap.descriptor.limits.memory_mb then   -- the cgroup's limit: the kernel kills
      assert.matches("refused %(SIGKILL%)", rows["exhaust memory"].detail)
    else                                        -- the rlimit: the allocation fails
      assert.matches("MemoryError", rows["exhaust memory"].detail)
    end
    if bwrap.descriptor.limits.pids then
      assert.matches("stopped at %d+ processes %(limit", rows["exhaust pids"].detail)
    else
      assert.matches("all killed", rows["exhaust pids"].detail)
    end
  end)

  it("blocks every probe on docker", function()
    if not docker.available() then return pending("docker unavailable") end
    local r = sbxlua({ "selftest", "--backend", "docker", "--image", IMAGE })
    assert.equal(0, r.exit_code, r.stdout .. r.stderr)
    assert.matches("0 FAILED", r.stdout)
    assert.matches("exhaust pids: stopped at %d+ processes %(limit", r.stdout)
    assert.is_nil(r.stdout:find("FAIL ", 1, true))
  end)

  it("has probes that fail where the protection is missing (local is no boundary)", function()
    local rows = {}
    local failed = selftest.run_backend("local", nil, function(name, status, detail)
      rows[name] = { status = status, detail = detail }
    end)
    os.remove("/tmp/.sbx-selftest-mnt")     -- made on the host: local has no /tmp of its own
    assert.equal("FAIL", rows["write outside the root"].status, rows["write outside the root"].detail)
    assert.matches("wrote host /tmp/sbx%-selftest%-", rows["write outside the root"].detail)
    assert.equal("FAIL", rows["read the host's secrets"].status)
    assert.equal("FAIL", rows["see host processes"].status)
    assert.equal("FAIL", rows["reach the host's loopback"].status, rows["reach the host's loopback"].detail)
    if require("sbx.bwrap").getuid() == 0 then
      assert.equal("FAIL", rows["raise privileges"].status)
      assert.matches("CAP_SYS_ADMIN", rows["raise privileges"].detail)
    end
    assert.equal("skip", rows["reach the network when it is off"].status)
    assert.is_true(failed >= 3)
  end)

  it("has a mountinfo probe that fails where a bind mount's host path is reachable", function()
    -- commands in a mount namespace of the spec's own where /tmp/<a> is bound
    -- on /tmp/<b>: mountinfo names /tmp/<a>, which is reachable there
    if proc.which("unshare", "/usr/bin:/bin") == nil then return pending("no unshare") end
    local a = assert(require("sbx.fs").mkdtemp("/tmp", "sbx-mi-a-"))
    local b = assert(require("sbx.fs").mkdtemp("/tmp", "sbx-mi-b-"))
    local lo <close> = sbx.sandbox("local")
    local sb = { execute_command = function(_, script, _, opts)
      return lo:execute_command("unshare", { "--mount", "--propagation", "private", "sh", "-c",
        'mount --bind "$1" "$2" || exit 9; shift 2; exec sh -c "$1"', "sh", a, b, script }, opts)
    end }
    local probe
    for _, p in ipairs(selftest.probes) do if p.name == "reach mountinfo's host paths" then probe = p end end
    local status, detail = probe.run{ sb = sb, claims = {} }
    require("sbx.fs").rmtree(a)
    require("sbx.fs").rmtree(b)
    assert.equal("FAIL", status, detail)
    assert.matches(a:gsub("%p", "%%%0") .. " %(mounted at " .. b:gsub("%p", "%%%0"), detail)
  end)

  it("has a network probe that fails when the network is on", function()
    if not have_bwrap then return pending("bwrap unavailable") end
    if #selftest.host_addresses() == 0 then return pending("no host address to reach") end
    local on <close> = sbx.sandbox("bwrap")
    local probe
    for _, p in ipairs(selftest.probes) do if p.name == "reach the network when it is off" then probe = p end end
    local status, detail = probe.run{ off = on, sb = on, claims = {} }
    assert.equal("FAIL", status)
    assert.matches("iface", detail)
  end)

  it("fails when a backend misses the limit it claims", function()
    if not have_bwrap then return pending("bwrap unavailable") end
    local probe
    for _, p in ipairs(selftest.probes) do if p.name == "exhaust memory" then probe = p end end
    local ctx = { claims = { memory = { mb = 64 } }, new = function(o) return sbx.sandbox("bwrap", o) end }
    local status = probe.run(ctx)      -- no rlimit: 64 MiB is allocated
    assert.equal("FAIL", status)
    ctx.claims.pids = 50
    local pprobe
    for _, p in ipairs(selftest.probes) do if p.name == "exhaust pids" then pprobe = p end end
    local sb <close> = sbx.sandbox("bwrap")
    ctx.sb, ctx.tag = sb, proc.random_hex(8)
    local pstatus, pdetail = pprobe.run(ctx)       -- bwrap has no pids limit: 250 get made
    assert.equal("FAIL", pstatus)
    assert.matches("past the claimed limit 50", pdetail)
  end)

  it("refuses backends that do not isolate and unknown ones", function()
    local r = sbxlua{ "selftest", "--backend", "local" }
    assert.equal(2, r.exit_code)
    assert.matches("does not isolate", r.stderr)
    r = sbxlua{ "selftest", "--backend", "nope" }
    assert.equal(2, r.exit_code)
    assert.matches("unknown backend", r.stderr)
  end)
end)

describe("sbxlua doctor", function()
  it("lists each backend with what works and the fix for what does not", function()
    local r = sbxlua({ "doctor" }, { "DOCKER_HOST=unix:///nonexistent/docker.sock" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("ok    backend local: available", r.stdout)
    assert.matches("warn  backend docker: [^\n]+\n      fix: apt%-get install docker%.io", r.stdout)
    if bwrap.available() then
      assert.matches("ok    backend bwrap: available", r.stdout)
      assert.matches("ok   user namespaces: work", r.stdout)
      assert.matches("ok   network namespaces", r.stdout)
      assert.matches("ok   seccomp filter: %d+ calls refused", r.stdout)
      if bwrap.descriptor.limits.memory_mb then
        assert.matches("limits: pids %(cgroup v%d, pids.max %d+%), memory_mb %(cgroup v%d%)", r.stdout)
      else
        assert.matches("limits: [^\n]*memory_mb: not enforced", r.stdout)
      end
    end
    assert.matches("sbxlua selftest", r.stdout)
  end)
end)
