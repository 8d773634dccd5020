-- What only the docker backend does: the hardened create payload, limits,
-- network off, snapshots, image errors, the escape hatch, an unreachable
-- engine, and gc after SIGKILL. Real engine, real containers.
local sbx = require "sbx"
local http = require "sbx.http"
local proc = require "sbx.proc"
local loop = require "sbx.loop"
local fs = require "sbx.fs"
local json = require "cjson"
local docker = require "sbx.providers.builtin.docker"
local S = require "spec.support"

local IMAGE = S.IMAGE
local SOCK = "/var/run/docker.sock"

if not S.gate("docker", "docker backend") then return end

local function engine(method, path, body)
  local r = assert(http.request{ url = "http://docker/v1.41" .. path, unix_socket = SOCK, method = method,
                                 body = body and json.encode(body),
                                 headers = body and { ["Content-Type"] = "application/json" } or nil })
  return r.status, json.decode(r.body ~= "" and r.body or "null")
end

local function container_of(sb) return sb:session_state().state.container end

local function containers_labelled(label)
  local filters = http.escape(json.encode{ label = { label } })
  local _, list = engine("GET", "/containers/json?all=true&filters=" .. filters)
  return list
end

local kind_of = S.kind_of

local H = S.home("docker-spec", { vars = { SBX_TEST_IMAGE = IMAGE } })
local STATE = H.dir

-- sbxlua(args [, extra env "K=V" list]) -> the running process
local function sbxlua(args, extra_env) return H.start(args, { env = extra_env, timeout = 120, keep_stdin = false }) end

describe("docker backend", function()
  it("creates hardened, labelled containers (G1)", function()
    local sb <close> = sbx.sandbox("docker", { image = IMAGE, cpu = 1.5, memory_mb = 300,
                                               labels = { run = "42" } })
    local _, c = engine("GET", "/containers/" .. container_of(sb) .. "/json")
    local hc = c.HostConfig
    assert.same({ "ALL" }, hc.CapDrop)
    assert.same(docker.CAPS, hc.CapAdd)
    assert.same({ "no-new-privileges" }, hc.SecurityOpt)
    assert.equal(docker.DEFAULTS.pids, hc.PidsLimit)
    assert.equal(300 * 1024 * 1024, hc.Memory)
    assert.equal(hc.Memory, hc.MemorySwap)
    assert.equal(1.5e9, hc.NanoCpus)
    -- the first process is sbx-agent, serving the attached stdio: it is
    -- the init (no docker-init holding that stdio), and nothing it writes
    -- there (the agent protocol) is logged
    assert.is_false(hc.Init)
    assert.equal("none", hc.LogConfig.Type)
    assert.is_true(c.Config.OpenStdin and c.Config.StdinOnce)
    assert.same({ "sleep", "--serve" }, c.Config.Cmd)
    local l = c.Config.Labels
    assert.equal("42", l.run)
    assert.equal(sb.id, l["sbxlua.id"])
    for _, k in ipairs{ "sbxlua.host", "sbxlua.session", "sbxlua.created", "sbxlua.ttl", "sbxlua.lock" } do
      assert.is_string(l[k], k)
    end
    assert.equal("3600", l["sbxlua.ttl"])
    -- inside: no capabilities beyond the profile, no new privileges
    local r = sb:execute_command("sh", { "-c", "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status" })
    assert.matches("NoNewPrivs:%s+1", r.stdout)
    assert.not_matches("CapEff:%s+000001ffffffffff", r.stdout)
    -- as an init it reaps orphans: a process whose parent (an engine exec's
    -- command) exits is reparented to it and reaped when it ends
    local eid = select(2, engine("POST", "/containers/" .. container_of(sb) .. "/exec",
      { Cmd = { "sh", "-c", "sleep 0.3 & echo $!" }, AttachStdout = true })).Id
    local out = assert(http.request{ url = "http://docker/v1.41/exec/" .. eid .. "/start", unix_socket = SOCK,
      method = "POST", body = '{"Detach":false}', headers = { ["Content-Type"] = "application/json" } }).body
    local orphan = assert(out:match("(%d+)%s*$"), out)
    local state
    for _ = 1, 40 do
      state = sb:execute_command("sh", { "-c", "cut -d' ' -f3,4 /proc/" .. orphan .. "/stat 2>/dev/null || echo gone" }).stdout
      if state == "gone\n" then break end
      loop.sleep(0.1)
    end
    assert.equal("gone\n", state)
  end)

  it("turns the network off when allow_internet = false", function()
    local sb <close> = sbx.sandbox("docker", { image = IMAGE, allow_internet = false })
    local _, c = engine("GET", "/containers/" .. container_of(sb) .. "/json")
    assert.equal("none", c.HostConfig.NetworkMode)
    assert.equal("lo\n", sb:execute_command("ls", { "/sys/class/net" }).stdout)
  end)

  it("merges backend_options into the create call", function()
    local sb <close> = sbx.sandbox("docker", { image = IMAGE,
      backend_options = { HostConfig = { ShmSize = 32 * 1024 * 1024 }, Hostname = "sbxspec" } })
    local _, c = engine("GET", "/containers/" .. container_of(sb) .. "/json")
    assert.equal(32 * 1024 * 1024, c.HostConfig.ShmSize)
    assert.same({ "ALL" }, c.HostConfig.CapDrop)      -- the rest of HostConfig stays
    assert.equal("sbxspec\n", sb:execute_command("hostname").stdout)
  end)

  it("snapshots and restores", function()
    local snap
    do
      local sb <close> = sbx.sandbox("docker", { image = IMAGE })
      sb:write_file("state.txt", "before snapshot")
      snap = sb:snapshot()
      assert.is_string(snap.snapshot_id)
    end
    local again <close> = sbx.sandbox("docker", { snapshot_id = snap.snapshot_id })
    assert.equal("before snapshot", again:read_file("state.txt"))
    assert.equal("ok\n", again:execute_command("echo ok").stdout)
    again:destroy()
    local status = engine("DELETE", "/images/" .. snap.snapshot_id .. "?force=true")
    assert.equal(200, status)
    assert.equal("SandboxCreationError",
                 kind_of(function() sbx.sandbox("docker", { snapshot_id = snap.snapshot_id }) end))
  end)

  it("a missing image is SandboxCreationError naming it, with nothing left behind", function()
    local kind, err = kind_of(function()
      sbx.sandbox("docker", { image = "sbxlua-no-such-image:never" })
    end)
    assert.equal("SandboxCreationError", kind)
    assert.matches("sbxlua%-no%-such%-image:never", err.message)
    -- this session's containers: none left by the failed create
    local mine = containers_labelled("sbxlua.session=" .. require("sbx.state.owner").session_id())
    assert.equal(0, #mine)
  end)

  it("honours env_vars and runs in /workspace", function()
    local sb <close> = sbx.sandbox("docker", { image = IMAGE, env_vars = { GREETING = "hi" } })
    assert.equal("hi /workspace\n", sb:execute_command("sh", { "-c", "echo $GREETING $PWD" }).stdout)
    assert.equal("/workspace", sb.workdir)
  end)

  it("destroy removes the container", function()
    local sb = sbx.sandbox("docker", { image = IMAGE })
    local cid = container_of(sb)
    sb:destroy()
    assert.equal(404, (engine("GET", "/containers/" .. cid .. "/json")))
    assert.is_false(sb:is_alive())
  end)

  it("reports an unreachable engine with the reason, as unavailable", function()
    local p = sbxlua({ "providers", "--json" }, { "DOCKER_HOST=unix:///nonexistent/docker.sock" })
    local r = p:wait()
    local d = json.decode(r.stdout).docker
    assert.is_false(d.available)
    assert.matches("no Docker socket at /nonexistent/docker.sock", d.reason)
    p = sbxlua({ "-e", "sbx.sandbox('docker')" }, { "DOCKER_HOST=unix:///nonexistent/docker.sock" })
    r = p:wait()
    assert.equal(1, r.exit_code)
    assert.matches("BackendNotInstalledError", r.stderr)
    p = sbxlua({ "-e", "sbx.sandbox('docker')" }, { "DOCKER_HOST=tcp://127.0.0.1:1" })
    r = p:wait()
    assert.matches("not running", r.stderr)
  end)

  it("gc removes a snapshot image its killed sbxlua never heard back about, and keeps finished ones", function()
    os.execute("mkdir -p " .. STATE)
    local job = STATE .. "/snapkill.lua"
    local f = io.open(job, "w")
    -- the second commit completes in the engine, then sbxlua dies before
    -- it can journal the result
    f:write([[
      local docker = require "sbx.providers.builtin.docker"
      local sb = sbx.sandbox("docker", { image = os.getenv("SBX_TEST_IMAGE") })
      local kept = sb:snapshot().snapshot_id
      local commit = docker.snapshot
      docker.snapshot = function(h)
        local res = commit(h)
        print("kept " .. kept .. " lost " .. res.snapshot_id) io.stdout:flush()
        os.execute("kill -9 " .. require("sbx.proc").getpid())
        sbx.sleep(300)
      end
      sb:snapshot()
    ]])
    f:close()
    local p = sbxlua({ job })
    local out = ""
    while true do
      local which, chunk = p:read()
      if not which then break end
      if which == "stdout" then out = out .. chunk end
    end
    p:wait()
    local kept, lost = out:match("kept (%S+) lost (%S+)")
    assert.is_string(lost, out)
    assert.equal(200, (engine("GET", "/images/" .. lost .. "/json")))
    local r = sbxlua({ "gc", "--dry-run" }):wait()
    assert.matches("would remove docker snapshot image " .. lost:gsub("%p", "%%%0"), r.stdout)
    assert.is_nil(r.stdout:find(kept, 1, true))
    r = sbxlua({ "gc" }):wait()
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("removed 1 unfinished snapshot images", r.stdout)
    assert.equal(404, (engine("GET", "/images/" .. lost .. "/json")))
    assert.equal(200, (engine("GET", "/images/" .. kept .. "/json")))   -- finished: the user's
    engine("DELETE", "/images/" .. kept .. "?force=true")
    fs.rmtree(STATE)
  end)

  it("fills its agent volume again when it was removed meanwhile (docker volume prune)", function()
    local prefix = docker.VOLUME_PREFIX
    docker.VOLUME_PREFIX = "sbxlua-agentspec-" .. proc.random_hex(4) .. "-"
    local ok, err = pcall(function()
      local a = sbx.sandbox("docker", { image = IMAGE })
      local vol = docker.VOLUME_PREFIX .. require("sbx.daemon.link").hash(require "sbx.agentbin")
      assert.equal("a\n", a:execute_command("echo a").stdout)
      a:destroy()
      assert.equal(204, (engine("DELETE", "/volumes/" .. vol)))
      local b <close> = sbx.sandbox("docker", { image = IMAGE })
      assert.equal("b\n", b:execute_command("echo b").stdout)
      b:destroy()
      engine("DELETE", "/volumes/" .. vol)
    end)
    docker.VOLUME_PREFIX = prefix
    assert(ok, err)
  end)

  it("gc removes agent volumes of other builds that no container uses, never this build's", function()
    local sb <close> = sbx.sandbox("docker", { image = IMAGE })       -- this build's volume is in use
    local mine = "sbxlua-agent-" .. require("sbx.daemon.link").hash(require "sbx.agentbin")
    local host = require("sbx.state.owner").hostname()
    -- Any gc on this machine may take the volume first (the cli and outage
    -- specs run theirs beside this one): then it is gone all the same, and
    -- the case is tried again with a new one, so this gc's report is seen.
    local reported
    for _ = 1, 4 do
      local other = "sbxlua-agent-" .. proc.random_hex(6)
      -- filled by a session of this host that is dead (gc_volumes_spec: the rest)
      assert.equal(201, (engine("POST", "/volumes/create", { Name = other, Labels = { ["sbxlua.agent"] = "1",
        ["sbxlua.host"] = host, ["sbxlua.session"] = host .. "-1-dead", ["sbxlua.lock"] = STATE .. "/gone.lock" } })))
      local r = sbxlua({ "gc", "--dry-run" }):wait()
      assert.is_nil(r.stdout:find(mine, 1, true))
      local listed = r.stdout:find("would remove docker volume " .. other, 1, true)
      r = sbxlua({ "gc" }):wait()
      assert.equal(0, r.exit_code, r.stderr)
      assert.equal(404, (engine("GET", "/volumes/" .. other)))
      assert.equal(200, (engine("GET", "/volumes/" .. mine)))
      reported = listed and r.stdout:find("agent volumes of other builds", 1, true)
      if reported then break end
    end
    assert.truthy(reported, "gc never reported removing another build's agent volume")
  end)

  it("gc removes the containers of a SIGKILLed sbxlua, and only those", function()
    local keep <close> = sbx.sandbox("docker", { image = IMAGE })  -- a live session's
    os.execute("mkdir -p " .. STATE)
    local job = STATE .. "/killed.lua"
    local f = io.open(job, "w")
    f:write([[
      local a = sbx.sandbox("docker", { image = os.getenv("SBX_TEST_IMAGE") })
      local b = sbx.sandbox("docker", { image = os.getenv("SBX_TEST_IMAGE") })
      print("ready " .. a.id .. " " .. b.id) io.stdout:flush()
      sbx.sleep(300)
    ]])
    f:close()
    local p = sbxlua({ job })
    local out = ""
    while not out:find("ready [^\n]+\n") do
      local which, chunk = p:read()
      assert(which, "the job ended early")
      if which == "stdout" then out = out .. chunk end
    end
    os.execute("kill -9 " .. p.pid)
    p:wait()
    local a, b = out:match("ready (%S+) (%S+)")
    assert.equal(1, #containers_labelled("sbxlua.id=" .. a))
    local r = sbxlua({ "gc" }):wait()
    assert.equal(0, r.exit_code, r.stderr)
    -- its two, plus any a concurrently running spec's killed jobs left
    -- (gc takes every dead session's containers, from any state directory)
    local n = tonumber(r.stdout:match("destroyed (%d+) sandboxes"))
    assert.is_true(n ~= nil and n >= 2, r.stdout)
    assert.equal(0, #containers_labelled("sbxlua.id=" .. a))
    assert.equal(0, #containers_labelled("sbxlua.id=" .. b))
    assert.is_true(keep:is_alive())
    fs.rmtree(STATE)
  end)
end)
