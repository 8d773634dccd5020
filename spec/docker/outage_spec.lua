-- The Docker engine going away mid-job: clear errors, no hang, and gc
-- cleans up afterwards. The "engine" the job talks to is a relay to the real
-- one that this spec can cut at any moment.
local stream = require "sbx.stream"
local proc = require "sbx.proc"
local loop = require "sbx.loop"
local fs = require "sbx.fs"
local json = require "cjson"
local http = require "sbx.http"
local S = require "spec.support"

local IMAGE, BIN = S.IMAGE, S.BIN

if not S.gate("docker", "docker outage") then return end

local dir = S.tmpdir("sbxoutage")

-- A relay to the engine, on a unix socket (`path`) or on loopback TCP (a
-- table of listen options: the engine as a remote one looks); cut() drops
-- every connection and stops listening, which is what a stopped daemon
-- looks like to a client. Returns cut and, for TCP, the port.
local function relay(path)
  local l, port = assert(stream.listen(type(path) == "table" and path or { unix = path }))
  local conns, stopped = {}, false
  local function pipe(a, b)
    while true do
      local chunk = a:read()
      if not chunk or not b:write(chunk) then break end
    end
    pcall(b.shutdown, b)
  end
  loop.spawn(function()
    while not stopped do
      local c = l:accept()
      if not c then break end
      local up = assert(stream.connect{ unix = "/var/run/docker.sock" })
      conns[#conns + 1] = c
      conns[#conns + 1] = up
      loop.spawn(pipe, c, up)
      loop.spawn(pipe, up, c)
    end
  end)
  return function()
    stopped = true
    l:close()
    if type(path) == "string" then os.remove(path) end
    for _, c in ipairs(conns) do c:close() end
  end, port
end

local function job(code, sock)
  local path = dir .. "/job" .. require("sbx.proc").random_hex(8) .. ".lua"
  local f = io.open(path, "w") f:write(code) f:close()
  return S.sbxlua({ path }, { stream = true, timeout = 120,
    env = { "PATH=/usr/bin:/bin", "HOME=" .. dir, "SBX_STATE_DIR=" .. dir .. "/state",
            "DOCKER_HOST=" .. (sock:match("^tcp://") and sock or ("unix://" .. sock)), "SBX_TEST_IMAGE=" .. IMAGE } })
end

local wait_for = S.expect_output

-- The containers of the state directory `state` (a gc running elsewhere at
-- the same time may have taken them first: that is fine too), with the
-- newest one's creation time.
local function containers_of(state)
  local filters = http.escape(json.encode{ label = { "sbxlua.host" } })
  local res = assert(http.request{ url = "http://docker/v1.41/containers/json?all=true&filters=" .. filters,
                                   unix_socket = "/var/run/docker.sock" })
  local n, newest = 0, 0
  for _, c in ipairs(json.decode(res.body)) do
    if (c.Labels["sbxlua.lock"] or ""):match("^(.*)/sessions/") == state then
      n, newest = n + 1, math.max(newest, c.Created)
    end
  end
  return n, newest
end

local function gc(state)
  local g = assert(proc.spawn{ argv = { BIN, "gc" }, timeout = 120,
    env = { "PATH=/usr/bin:/bin", "HOME=" .. dir, "SBX_STATE_DIR=" .. state } }):wait()
  assert.equal(0, g.exit_code, g.stderr)
end

-- gc from the job's state directory leaves none of its containers. A create
-- the job sent just before the engine went away may be finished by the
-- engine after gc listed (the engine does not cancel it when its client
-- goes): such a container is newer than that gc's start, and the next gc
-- removes it.
local function gc_cleans_up(state)
  local t0 = os.time()
  gc(state)
  local n, newest = containers_of(state)
  if n == 0 then return end
  assert.is_true(newest >= t0 - 1, "a container that existed before gc survived it")
  gc(state)
  assert.equal(0, (containers_of(state)), "a container of the job survived a second gc")
end

describe("docker outage", function()
  teardown(function() fs.rmtree(dir) end)

  it("the engine vanishing during a command gives a clear error, no hang, and gc cleans up", function()
    local sock = dir .. "/engine1.sock"
    local cut = relay(sock)
    local p = job([[
      local sb = sbx.sandbox("docker", { image = os.getenv("SBX_TEST_IMAGE") })
      print("ready") io.stdout:flush()
      sb:execute_command("sleep", { "60" })
    ]], sock)
    wait_for(p, "ready\n")
    loop.sleep(0.5)
    local t0 = loop.now()
    cut()
    local r = p:wait()
    assert.is_true(loop.now() - t0 < 30, "the job hung after the engine went away")
    assert.equal(1, r.exit_code, r.stderr)
    assert.matches("SandboxConnectionError", r.stderr)   -- retryable: the link broke
    -- the engine is back (the relay is gone, the real socket never was):
    -- gc from the same state directory removes what the job could not
    gc(dir .. "/state")
    assert.equal(0, (containers_of(dir .. "/state")), "a container of the job survived gc")
  end)

  -- The engine going away while a create or a copy is in flight: a typed
  -- error, no hang, and gc from the same state directory leaves nothing.
  for _, case in ipairs{
    { "create", [[
      print("ready") io.stdout:flush()
      for _ = 1, 50 do sbx.sandbox("docker", { image = os.getenv("SBX_TEST_IMAGE") }) end
    ]], 0.3, { "SandboxConnectionError",
                -- cut between two creates: the next one finds the socket gone
                "BackendNotInstalledError: no Docker socket at" } },
    { "copy", [[
      local sb = sbx.sandbox("docker", { image = os.getenv("SBX_TEST_IMAGE") })
      local big = string.rep("x", 8 << 20)
      print("ready") io.stdout:flush()
      for i = 1, 1000 do sb:write_file("big" .. i, big) assert(#sb:read_file("big" .. i) == #big) end
    ]], 0.3, { "SandboxConnectionError" } },
  } do
    it("the engine vanishing during a " .. case[1] .. " gives a typed error, no hang, and gc cleans up", function()
      local sock = dir .. "/engine-" .. case[1] .. ".sock"
      local cut = relay(sock)
      local p = job(case[2], sock)
      wait_for(p, "ready\n")
      loop.sleep(case[3])
      local t0 = loop.now()
      cut()
      local r = p:wait()
      assert.is_true(loop.now() - t0 < 30, "the job hung after the engine went away")
      assert.equal(1, r.exit_code, r.stderr)
      local typed = false
      for _, kind in ipairs(case[4]) do typed = typed or r.stderr:find(kind, 1, true) ~= nil end
      assert.is_true(typed, r.stderr)
      assert.is_nil(r.stderr:find("attempt to", 1, true), r.stderr)      -- no untyped Lua error
      gc_cleans_up(dir .. "/state")
    end)
  end

  it("works with an engine reached over TCP: create, the agent's stream, files, stdin, destroy", function()
    local cut, port = relay{ host = "127.0.0.1", port = 0 }
    local r = job([[
      local sb = sbx.sandbox("docker", { image = os.getenv("SBX_TEST_IMAGE") })
      sb:write_file("a.txt", "over tcp")
      local p = sb:spawn("cat", {})
      p:write("fed")
      p:close_stdin()
      print(sb:execute_command("cat a.txt").stdout, p:wait().stdout,
            sb._h.link and "agent" or ("engine: " .. tostring(sb._h.no_agent)))
      sb:destroy()
    ]], "tcp://127.0.0.1:" .. port):wait()
    cut()
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("over tcp\tfed\tagent\n", r.stdout)
  end)

  it("an engine that is gone before create is BackendNotInstalledError at once", function()
    local sock = dir .. "/engine2.sock"
    local cut = relay(sock)
    cut()
    local t0 = loop.now()
    local r = job([[ sbx.sandbox("docker", { image = os.getenv("SBX_TEST_IMAGE") }) ]], sock):wait()
    assert.equal(1, r.exit_code)
    assert.matches("BackendNotInstalledError: docker: no Docker socket", r.stderr)
    assert.is_true(loop.now() - t0 < 10)
  end)
end)
