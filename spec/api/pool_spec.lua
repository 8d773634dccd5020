-- Warm pools (API.md, "Warm pools"): acquire at once while warm, refill,
-- released sandboxes destroyed and never handed out again, max_idle_secs,
-- close, churn without leaks, creation failures, options, routing, and
-- cleanup at exit / SIGINT. Local always; docker when an engine and the test
-- image are there (SBX_REQUIRE_DOCKER=1 makes their absence a failure).
-- Over 400 lines: the cases share the counting helpers below (owned_ids,
-- count, p50).
local sbx = require "sbx"
local loop = require "sbx.loop"
local owner = require "sbx.state.owner"
local fs = require "sbx.fs"
local proc = require "sbx.proc"
local json = require "cjson"
local S = require "spec.support"

local IMAGE = S.IMAGE
local kind_of = S.kind_of

local function p50(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  return s[math.ceil(#s / 2)]
end

local function owned_ids()
  local set = {}
  for _, sb in ipairs(owner.owned()) do set[sb.id] = true end
  return set
end

local function count(set)
  local n = 0
  for _ in pairs(set) do n = n + 1 end
  return n
end

-- Sandbox directories the local backend keeps for this session.
local function local_dirs()
  local sid = owner.session_id()
  if not sid then return {} end
  return fs.list_host(owner.state_dir() .. "/local/" .. sid) or {}
end

local function docker_ready() return S.available("docker", IMAGE) end

-- Containers of `session` (default: this one) the engine still has.
local function containers(session)
  local f = io.popen("docker ps -aq --filter label=sbxlua.session=" .. (session or owner.session_id() or "none"))
  local out = f:read("a")
  f:close()
  local ids = {}
  for id in out:gmatch("%S+") do ids[#ids + 1] = id end
  return ids
end

describe("sbx.pool options", function()
  it("rejects unknown options with a suggestion, and bad values", function()
    local kind, err = kind_of(function() sbx.pool{ backend = "local", sise = 2 } end)
    assert.equal("ConfigError", kind)
    assert.matches("unknown option 'sise'", err.message)
    assert.matches("did you mean 'size'", err.message)
    kind, err = kind_of(function() sbx.pool{ backend = "local", max_idle_sec = 2 } end)
    assert.matches("did you mean 'max_idle_secs'", err.message)
    assert.equal("ConfigError", kind_of(function() sbx.pool{ backend = "local", size = 0 } end))
    assert.equal("ConfigError", kind_of(function() sbx.pool{ backend = "local", size = 1.5 } end))
    assert.equal("ConfigError", kind_of(function() sbx.pool{ backend = "local", size = "4" } end))
    assert.equal("ConfigError", kind_of(function() sbx.pool{ backend = "local", max_idle_secs = 0 } end))
    kind, err = kind_of(function() sbx.pool{ backend = "local", probe_secs = -1 } end)
    assert.equal("ConfigError", kind)
    assert.matches("probe_secs must be > 0", err.message)
    assert.equal("ConfigError", kind_of(function() sbx.pool{ backend = "local", probe_secs = "often" } end))
    assert.equal("ConfigError", kind_of(function() sbx.pool{ backend = "local", reuse = "keep" } end))
    assert.equal("ConfigError", kind_of(function() sbx.pool{ backend = "local", timeout_secs = -1 } end))
    assert.equal("ConfigError", kind_of(function() sbx.pool{ backend = "dockr" } end))
    assert.equal("ConfigError", kind_of(function() sbx.pool("local") end))
    assert.equal("ConfigError", kind_of(function() sbx.pool{ backend = "local", preset = "no-such-preset" } end))
    kind, err = kind_of(function() sbx.pool{ backend = "local", workdir = "/tmp" } end)
    assert.equal("ConfigError", kind)
    assert.matches("own directory", err.message)
    assert.equal(0, require("sbx.pool").open())
  end)
  it("refuses reuse = \"reset\", naming the backend", function()
    local kind, err = kind_of(function() sbx.pool{ backend = "local", reuse = "reset" } end)
    assert.equal("FeatureNotSupportedError", kind)
    assert.equal("local", err.backend)
    assert.matches("local cannot", err.message)
    local p <close> = sbx.pool{ backend = "local", reuse = "destroy", size = 1 }
    assert.equal("local", p.backend)
  end)
  it("refuses at once what every create would refuse", function()
    local kind, err = kind_of(function() sbx.pool{ backend = "local", image = "python:3.12-slim" } end)
    assert.equal("FeatureNotSupportedError", kind)
    assert.matches("image", err.message)
    assert.equal("NoRouteError", kind_of(function() sbx.pool{ needs = { "gpu" } } end))
    assert.equal("BackendNotInstalledError", kind_of(function() sbx.pool{ backend = "modal" } end))
    assert.equal(0, require("sbx.pool").open())
  end)
  it("routes once to pick the backend when none is given", function()
    local p <close> = sbx.pool{ size = 1 }
    assert.equal("local", p.backend)
  end)
  it("rejects bad arguments to its methods", function()
    local p <close> = sbx.pool{ backend = "local", size = 1 }
    assert.equal("ConfigError", kind_of(function() p:acquire("soon") end))
    assert.equal("ConfigError", kind_of(function() p:acquire(-1) end))
    assert.equal("ConfigError", kind_of(function() p:release("x") end))
    local other <close> = sbx.sandbox("local")
    local kind, err = kind_of(function() p:release(other) end)
    assert.equal("ConfigError", kind)
    assert.matches("not from pool", err.message)
    assert.is_true(other:is_alive())
  end)
end)

describe("sbx.pool on local", function()
  it("acquire while warm takes far less than a create, and the pool refills", function()
    local p <close> = sbx.pool{ backend = "local", size = 4, name = "warm" }
    assert.is_true(p:wait_ready(10))
    assert.same({ idle = 4, creating = 0, acquired = 0, created = 4, failed = 0 },
                { idle = p:stats().idle, creating = p:stats().creating, acquired = p:stats().acquired,
                  created = p:stats().created, failed = p:stats().failed })
    local warm, cold = {}, {}
    for i = 1, 7 do
      assert.is_true(p:wait_ready(10))
      local t0 = loop.now()
      local sb = p:acquire()
      warm[i] = loop.now() - t0
      assert.equal("hi\n", sb:execute_command("echo hi").stdout)
      p:release(sb)
      t0 = loop.now()
      local c = sbx.sandbox("local")
      cold[i] = loop.now() - t0
      c:destroy()
    end
    -- relative, not a fixed number of ms: the machine may be slow or loaded
    assert.is_true(p50(warm) * 10 < p50(cold),
                   string.format("acquire p50 %.3f ms vs create p50 %.3f ms", p50(warm) * 1e3, p50(cold) * 1e3))
    assert.is_true(p:wait_ready(10))
    local s = p:stats()
    assert.equal(4, s.idle)
    assert.equal(11, s.created)
    assert.equal(7, s.handed_out)
    assert.equal(0, s.acquired)
  end)

  it("destroys a released sandbox and never hands one out twice", function()
    local p <close> = sbx.pool{ backend = "local", size = 2 }
    local seen, dirs = {}, {}
    for i = 1, 12 do
      local sb = p:acquire(10)
      assert.is_nil(seen[sb.id], "sandbox handed out twice")
      assert.is_nil(dirs[sb.workdir])
      seen[sb.id], dirs[sb.workdir] = true, true
      assert.same({}, sb:list_files("."))          -- clean: nothing from a previous user
      sb:write_file("dirty.txt", "used")
      if i % 3 == 0 then p:release(sb)
      elseif i % 3 == 1 then sb:destroy()
      else do local c <close> = sb end end           -- closing it releases it too
      assert.is_false(sb:is_alive())
      assert.is_nil(fs.open_root(sb.workdir))        -- its directory is gone
      p:release(sb)                                  -- twice: a no-op
    end
    assert.equal(0, p:stats().acquired)
    assert.equal(12, p:stats().handed_out)
  end)

  it("destroys idle sandboxes older than max_idle_secs and replaces them", function()
    local before = owned_ids()
    local p <close> = sbx.pool{ backend = "local", size = 2, max_idle_secs = 0.3 }
    assert.is_true(p:wait_ready(10))
    local first = {}
    for _, sb in ipairs(owner.owned()) do
      if not before[sb.id] then first[#first + 1] = sb end
    end
    assert.equal(2, #first)
    loop.sleep(0.9)
    local s = p:stats()
    assert.is_true(s.expired >= 2, "expired " .. s.expired)
    for _, sb in ipairs(first) do
      assert.is_false(sb:is_alive())
      assert.is_nil(fs.open_root(sb.workdir))
    end
    assert.is_true(p:wait_ready(10))
    local sb <close> = p:acquire()
    assert.is_not.equal(first[1].id, sb.id)
    assert.is_not.equal(first[2].id, sb.id)
  end)

  it("an idle sandbox that died is destroyed and replaced, never handed out", function()
    local before = owned_ids()
    local p <close> = sbx.pool{ backend = "local", size = 2, probe_secs = 0.1 }
    assert.is_true(p:wait_ready(10))
    local victim
    for _, sb in ipairs(owner.owned()) do
      if not before[sb.id] then victim = sb break end
    end
    assert.is_true(fs.rmtree(victim.workdir))     -- gone behind the pool's back
    local deadline = loop.now() + 10
    while p:stats().dead == 0 and loop.now() < deadline do loop.sleep(0.02) end
    assert.equal(1, p:stats().dead)
    assert.is_nil(victim._h)                     -- destroyed: out of the session
    assert.is_nil(owned_ids()[victim.id])
    assert.is_true(p:wait_ready(10))
    for _ = 1, 2 do
      local sb <close> = p:acquire()
      assert.is_not.equal(victim.id, sb.id)
      assert.equal("ok\n", sb:execute_command("echo ok").stdout)
    end
    assert.equal(1, p:stats().dead)              -- the live ones were probed and kept
  end)

  it("lifetime (timeout_secs) counts from acquire; idle ones whose lifetime ends are replaced", function()
    local p <close> = sbx.pool{ backend = "local", size = 1, timeout_secs = 1 }
    assert.is_true(p:wait_ready(10))
    loop.sleep(0.7)
    local sb <close> = p:acquire()
    loop.sleep(0.6)                      -- 1.3 s after its create, 0.6 s after acquire
    assert.is_true(sb:is_alive())
    local t0 = loop.now()
    while sb:is_alive() and loop.now() - t0 < 5 do loop.sleep(0.05) end
    assert.is_false(sb:is_alive())
    assert.is_true(p:wait_ready(10))
    local created = p:stats().created
    loop.sleep(1.5)                      -- the idle one's lifetime ends: replaced
    assert.is_true(p:wait_ready(10))
    assert.is_true(p:stats().created > created)
  end)

  it("close destroys the idle ones, keeps acquired ones, and refuses acquire after", function()
    local before = owned_ids()
    local p = sbx.pool{ backend = "local", size = 3 }
    assert.is_true(p:wait_ready(10))
    local held = p:acquire()
    assert.is_true(p:wait_ready(10))
    local idle = {}
    for _, sb in ipairs(owner.owned()) do
      if not before[sb.id] and sb ~= held then idle[#idle + 1] = sb end
    end
    assert.equal(3, #idle)
    p:close()
    for _, sb in ipairs(idle) do
      assert.is_false(sb:is_alive())
      assert.is_nil(fs.open_root(sb.workdir))
    end
    assert.is_true(held:is_alive())
    local s = p:stats()
    assert.is_true(s.closed)
    assert.equal(0, s.idle)
    assert.equal(0, s.creating)
    local kind, err = kind_of(function() p:acquire() end)
    assert.equal("ConfigError", kind)
    assert.matches("closed", err.message)
    p:close()                            -- twice: a no-op
    held:destroy()
    assert.equal(0, p:stats().acquired)
    assert.equal(count(before), count(owned_ids()))
    assert.equal(0, require("sbx.pool").open())
  end)

  it("a pool dropped without close is closed by the garbage collector", function()
    local before = owned_ids()
    local n0 = require("sbx.pool").open()
    local function make()                -- the pool is referenced only in here
      local p = sbx.pool{ backend = "local", size = 2 }
      assert.is_true(p:wait_ready(10))
    end
    make()
    assert.equal(n0 + 1, require("sbx.pool").open())
    assert.equal(count(before) + 2, count(owned_ids()))
    collectgarbage()
    collectgarbage()
    assert.equal(n0, require("sbx.pool").open())
    local t0 = loop.now()                -- its task destroys the idle ones
    while count(owned_ids()) > count(before) and loop.now() - t0 < 5 do loop.sleep(0.02) end
    assert.same(before, owned_ids())
  end)

  it("a closed pool wakes the acquires waiting on it", function()
    sbx.register_preset{ name = "pool-slow", setup_commands = { "sleep 1" } }
    local p = sbx.pool{ backend = "local", size = 1, preset = "pool-slow" }
    local t = loop.spawn(function() return p:acquire() end)
    loop.sleep(0.1)
    p:close()
    local ok, err = t:join()
    assert.is_false(ok)
    assert.equal("ConfigError", err.kind)
    assert.matches("closed", err.message)
  end)

  it("churn: 50 tasks acquire, run, release concurrently from a pool of 4; nothing leaks", function()
    local before, dirs_before = owned_ids(), #local_dirs()
    local p = sbx.pool{ backend = "local", size = 4 }
    local ids, peak = {}, 0
    local results = sbx.parallel((function() local t = {} for i = 1, 50 do t[i] = i end return t end)(),
      function(i)
        local sb <close> = p:acquire(60)
        assert.is_nil(ids[sb.id])
        ids[sb.id] = true
        peak = math.max(peak, p:stats().acquired)
        local r = sb:execute_command("sh", { "-c", "echo $0", tostring(i) })
        if i % 2 == 0 then p:release(sb) end
        return r.stdout
      end)
    for i = 1, 50 do assert.equal(i .. "\n", results[i]) end
    assert.equal(50, count(ids))
    assert.is_true(peak > 1, "acquires ran concurrently")
    local s = p:stats()
    assert.equal(0, s.acquired)
    assert.equal(50, s.handed_out)
    assert.equal(0, s.failed)
    p:close()
    assert.same(before, owned_ids())
    assert.equal(dirs_before, #local_dirs())
    for id in pairs(ids) do
      for _, name in ipairs(local_dirs()) do assert.is_nil(name:find(id, 1, true)) end
    end
  end)

  it("a creation failure reaches acquire as SandboxCreationError, with backoff, no leak", function()
    local before = owned_ids()
    -- every create fails while preparing it (a workspace entry that fails;
    -- a bad entry would be a ConfigError at sbx.pool already)
    local p <close> = sbx.pool{ backend = "local", size = 2,
      workspace = { { dest = "x", materialize = function() error("cannot make x") end } } }
    local t0 = loop.now()
    local kind, err = kind_of(function() p:acquire(30) end)
    assert.equal("WorkspaceError", kind)        -- a SandboxCreationError
    assert.is_true(sbx.errors.is(err, "SandboxCreationError"))
    assert.equal("local", err.backend)
    assert.matches("cannot make x", err.message)
    assert.is_not_nil(err.cause)
    assert.is_true(loop.now() - t0 < 5)
    assert.is_true(sbx.errors.is(select(2, pcall(p.wait_ready, p, 5)), "SandboxCreationError"))
    loop.sleep(1)
    local s = p:stats()
    -- backing off: 0.1, 0.2, 0.4, ... s between failures, one at a time
    assert.is_true(s.failed >= 2 and s.failed <= 8, "failed " .. s.failed)
    assert.equal(0, s.idle)
    assert.same(before, owned_ids())
    -- a fresh acquire fails at once while creates keep failing
    t0 = loop.now()
    assert.is_true(sbx.errors.is(select(2, pcall(p.acquire, p)), "SandboxCreationError"))
    assert.is_true(loop.now() - t0 < 1)
    -- and a bad entry is refused before any create
    assert.equal("ConfigError", kind_of(function()
      sbx.pool{ backend = "local", size = 1, files = { ["../escape.txt"] = "x" } } end))
  end)

  it("acquire with a timeout raises SandboxCreationError when nothing is ready in time", function()
    sbx.register_preset{ name = "pool-slow2", setup_commands = { "sleep 1" } }
    local p <close> = sbx.pool{ backend = "local", size = 1, preset = "pool-slow2" }
    local t0 = loop.now()
    local kind, err = kind_of(function() p:acquire(0.2) end)
    assert.equal("SandboxCreationError", kind)
    assert.matches("no sandbox ready within 0.2 s", err.message)
    assert.is_true(err.retryable)
    assert.is_true(loop.now() - t0 < 0.9)
    assert.equal(0, p:stats().waiting)
    local sb <close> = p:acquire(30)   -- the one in flight arrives
    assert.is_true(sb:is_alive())
  end)

  it("a cancelled acquire leaves nothing behind; its sandbox goes to the pool", function()
    sbx.register_preset{ name = "pool-slow3", setup_commands = { "sleep 0.5" } }
    local p <close> = sbx.pool{ backend = "local", size = 1, preset = "pool-slow3" }
    local t = loop.spawn(function() return p:acquire() end)
    loop.sleep(0.1)
    t:cancel()
    local ok, err = t:join()
    assert.is_false(ok)
    assert.equal("Cancelled", err.kind)
    assert.equal(0, p:stats().waiting)
    assert.is_true(p:wait_ready(10))
    assert.equal(0, p:stats().acquired)
  end)

  it("sbx.parallel destroys what a failed item acquired, like what it created", function()
    local p <close> = sbx.pool{ backend = "local", size = 3 }
    assert.is_true(p:wait_ready(10))
    local made = {}
    local _, err = kind_of(function()
      sbx.parallel({ 1, 2, 3 }, function(n)
        local sb = p:acquire()             -- no <close>: parallel's cleanup must get it
        made[n] = sb
        if n == 2 then sbx.sleep(0.05) error("item two failed") end
        sb:execute_command("sleep", { "30" })
      end)
    end)
    assert.matches("item two failed", tostring(err))
    for n = 1, 3 do assert.is_false(made[n]:is_alive()) end
    assert.equal(0, p:stats().acquired)
  end)
end)

describe("routing with warm pools", function()
  local function last_decision()
    local f = assert(io.open(owner.state_dir() .. "/decisions.jsonl"))
    local last
    for line in f:lines() do last = line end
    f:close()
    return json.decode(last)
  end

  it("a routed create takes a matching warm sandbox and says so in the decision", function()
    local p <close> = sbx.pool{ backend = "local", size = 2, name = "route-me", env_vars = { POOL = "1" } }
    assert.is_true(p:wait_ready(10))
    local seen
    local sb <close> = sbx.sandbox{ env_vars = { POOL = "1" }, policy = function(req, cands)
      seen = cands
      return { order = cands }
    end }
    assert.equal(1, p:stats().handed_out)
    assert.equal("1\n", sb:execute_command("sh", { "-c", "echo $POOL" }).stdout)
    local d = last_decision()
    assert.equal("route-me", d.warm.pool)
    assert.equal(sb.id, d.outcome.id)
    assert.matches("warm sandbox from pool 'route%-me'", d.warm.reason)
    -- the policy saw the warm candidate with ~0 create latency
    assert.equal("local", seen[1].name)
    assert.equal(2, seen[1].warm)
    assert.equal(0, seen[1].stats.p50_create_ms)
    -- the dry run says what would happen
    assert.is_true(p:wait_ready(10))
    local r = sbx.route{ env_vars = { POOL = "1" } }
    assert.equal("route-me", r.warm.pool)
    -- released like any acquired one
    sb:destroy()
    assert.equal(0, p:stats().acquired)
  end)

  it("never takes a warm sandbox for a request that differs, or a pinned create", function()
    local p <close> = sbx.pool{ backend = "local", size = 1, env_vars = { POOL = "1" } }
    assert.is_true(p:wait_ready(10))
    for _, req in ipairs{ {}, { env_vars = { POOL = "2" } }, { env_vars = { POOL = "1" }, timeout_secs = 60 },
                          { env_vars = { POOL = "1" }, files = { ["a.txt"] = "a" } } } do
      local sb <close> = sbx.sandbox(req)
      assert.is_nil(last_decision().warm)
      assert.is_nil(sb._pool)
    end
    local sb <close> = sbx.sandbox("local", { env_vars = { POOL = "1" } })
    assert.is_nil(sb._pool)
    assert.equal(0, p:stats().handed_out)
    assert.is_nil(sbx.route{}.warm)
    -- routing-only options do not matter when the pool's backend passes them
    local sb2 <close> = sbx.sandbox{ env_vars = { POOL = "1" }, only = { "local" }, isolation = "process" }
    assert.equal(1, p:stats().handed_out)
    -- and a closed pool is never used
    p:close()
    local sb3 <close> = sbx.sandbox{ env_vars = { POOL = "1" } }
    assert.is_nil(sb3._pool)
  end)
end)

describe("pools at exit and on signals", function()
  local H = S.home("pool", { vars = { SBX_TEST_IMAGE = IMAGE, SBX_LUA_PATH = os.getenv("SBX_LUA_PATH"),
                                       DOCKER_HOST = os.getenv("DOCKER_HOST") } })
  local STATE = H.dir

  local function job(code)
    local path = STATE .. "/job-" .. proc.random_hex(4) .. ".lua"
    local f = assert(io.open(path, "w"))
    f:write(code)
    f:close()
    return path
  end

  local sbxlua, expect_output = H.start, S.expect_output

  local function live_sandboxes()
    local r = H.run({ "ls", "--json" }, { timeout = 60 })
    assert.equal(0, r.exit_code, r.stderr)
    return json.decode(r.stdout)
  end

  teardown(H.cleanup)

  local function scenario(backend, how)
    local opts = backend == "docker" and ("image = '" .. IMAGE .. "', ") or ""
    local p = sbxlua({ job([[
      local owner = require "sbx.state.owner"
      local pool = sbx.pool{ backend = "]] .. backend .. [[", ]] .. opts .. [[ size = 3 }
      assert(pool:wait_ready(120))
      local sb = pool:acquire()            -- the pool starts refilling at once
      print("ready " .. owner.session_id()) io.stdout:flush()
      if "]] .. how .. [[" == "signal" then sbx.sleep(300) end
    ]]) })
    local sid = expect_output(p, "ready %S+\n"):match("ready (%S+)")
    if how == "signal" then
      loop.sleep(0.2)
      p:kill(2)
    end
    local r = p:wait()
    assert.equal(how == "signal" and 130 or 0, r.exit_code)
    assert.same({}, live_sandboxes())
    assert.same({}, fs.list_host(STATE .. "/local/" .. sid) or {})
    if backend == "docker" then assert.same({}, containers(sid)) end
  end

  for _, how in ipairs{ "exit", "signal" } do
    it("local: " .. how .. " destroys idle, acquired and in-flight pool sandboxes", function()
      scenario("local", how)
    end)
  end
  if docker_ready() then
    for _, how in ipairs{ "exit", "signal" } do
      it("docker: " .. how .. " destroys idle, acquired and in-flight pool sandboxes", function()
        scenario("docker", how)
      end)
    end
  end
end)

local dok, dwhy = docker_ready()
if not dok then
  describe("sbx.pool on docker", function() pending("docker unavailable: " .. tostring(dwhy)) end)
  return
end

describe("sbx.pool on docker", function()
  local docker = require "sbx.providers.builtin.docker"

  local function container_gone(sb)
    local cid = sb._cid
    local f = io.popen("docker inspect " .. cid .. " >/dev/null 2>&1 && echo present")
    local out = f:read("a")
    f:close()
    return out == ""
  end

  it("acquire while warm takes far less than a create; released containers are removed", function()
    local p <close> = sbx.pool{ backend = "docker", image = IMAGE, size = 2 }
    assert.is_true(p:wait_ready(120))
    local warm, cold = {}, {}
    for i = 1, 3 do
      assert.is_true(p:wait_ready(120))
      local t0 = loop.now()
      local sb = p:acquire()
      warm[i] = loop.now() - t0
      local cid = sb:session_state().state.container
      assert.equal("hi\n", sb:execute_command("echo hi").stdout)
      p:release(sb)
      sb._cid = cid
      assert.is_true(container_gone(sb))
      t0 = loop.now()
      local c = sbx.sandbox("docker", { image = IMAGE })
      cold[i] = loop.now() - t0
      c:destroy()
    end
    assert.is_true(p50(warm) * 10 < p50(cold),
                   string.format("acquire p50 %.3f ms vs create p50 %.3f ms", p50(warm) * 1e3, p50(cold) * 1e3))
  end)

  it("churn: 50 tasks from a pool of 4; no container left", function()
    local before = owned_ids()
    local p = sbx.pool{ backend = "docker", image = IMAGE, size = 4 }
    local ids = {}
    local results = sbx.parallel((function() local t = {} for i = 1, 50 do t[i] = i end return t end)(),
      function(i)
        local sb <close> = p:acquire(120)
        assert.is_nil(ids[sb.id])
        ids[sb.id] = true
        return sb:execute_command("echo", { tostring(i) }).stdout
      end)
    for i = 1, 50 do assert.equal(i .. "\n", results[i]) end
    p:close()
    assert.equal(0, p:stats().acquired)
    assert.same(before, owned_ids())
    local left = 0
    for _, c in ipairs(docker.list_owned()) do
      if ids[c.id] then left = left + 1 end
    end
    assert.equal(0, left)
  end)

  it("an image that does not exist surfaces as SandboxCreationError at acquire", function()
    local p <close> = sbx.pool{ backend = "docker", image = "sbxlua-no-such-image:nope", size = 2 }
    local t0 = loop.now()
    local kind, err = kind_of(function() p:acquire(120) end)
    assert.equal("SandboxCreationError", kind)
    assert.equal("docker", err.backend)
    assert.matches("sbxlua%-no%-such%-image", err.message)
    assert.is_true(loop.now() - t0 < 60)
    assert.is_true(p:stats().failed >= 1)
  end)

  it("a container killed while idle is replaced, never handed out", function()
    local before = owned_ids()
    local p <close> = sbx.pool{ backend = "docker", image = IMAGE, size = 1, probe_secs = 0.2 }
    assert.is_true(p:wait_ready(120))
    local victim
    for _, sb in ipairs(owner.owned()) do
      if not before[sb.id] then victim = sb break end
    end
    local cid = victim:session_state().state.container
    assert.is_true(os.execute("docker kill " .. cid .. " >/dev/null"))
    local deadline = loop.now() + 30
    while p:stats().dead == 0 and loop.now() < deadline do loop.sleep(0.05) end
    assert.equal(1, p:stats().dead)
    victim._cid = cid
    -- counted dead as its destroy starts: the engine's DELETE may take a while
    deadline = loop.now() + 60
    while not container_gone(victim) and loop.now() < deadline do loop.sleep(0.1) end
    assert.is_true(container_gone(victim))
    local sb <close> = p:acquire(120)
    assert.is_not.equal(victim.id, sb.id)
    assert.equal("ok\n", sb:execute_command("echo ok").stdout)
  end)

  it("close destroys the idle containers", function()
    local before = owned_ids()
    local p = sbx.pool{ backend = "docker", image = IMAGE, size = 2 }
    assert.is_true(p:wait_ready(120))
    local idle = {}
    for _, sb in ipairs(owner.owned()) do
      if not before[sb.id] then
        sb._cid = sb:session_state().state.container
        idle[#idle + 1] = sb
      end
    end
    assert.equal(2, #idle)
    p:close()
    for _, sb in ipairs(idle) do assert.is_true(container_gone(sb)) end
    assert.same(before, owned_ids())
  end)
end)
