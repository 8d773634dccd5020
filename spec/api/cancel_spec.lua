-- Cancelling reaches what a task waits for: a wait whose event comes in the
-- same turn as the cancel still raises Cancelled; commands running through
-- the agent link (bwrap, docker) die with their sbx.parallel item; a docker
-- create in flight is undone, fails as Cancelled and charges no breaker.
-- Issue 15, item 9. No timing margins: the commands sleep 60 s, the checks
-- wait for real states (processes seen, tasks done).
local sbx = require "sbx"
local loop = require "sbx.loop"
local proc = require "sbx.proc"
local http = require "sbx.http"
local health = require "sbx.routing.health"

local IMAGE = os.getenv("SBX_TEST_IMAGE") or "sbxlua-test:bookworm"

local function pids_of(pattern)
  -- "[x]..." keeps the popen shell's own command line from matching
  local f = io.popen("pgrep -f '[" .. pattern:sub(1, 1) .. "]" .. pattern:sub(2) .. "'")
  local out = f:read("a")
  f:close()
  local n = 0
  for _ in out:gmatch("%d+") do n = n + 1 end
  return n
end

describe("cancelling a waiting task", function()
  it("raises Cancelled even when its event comes before it runs again", function()
    local e = loop.event()
    local a = loop.spawn(function() e:wait() return "woken" end)
    local b = loop.spawn(function()
      loop.sleep(0)
      a:cancel()
      e:notify()        -- same turn: a has not run since the cancel
    end)
    local ok, err = a:join()
    assert.is_true(b:join())
    assert.is_false(ok, "the cancel was lost: the task returned " .. tostring(err))
    assert.equal("Cancelled", err.kind)
  end)
end)

-- The job runs in a fresh sbxlua, as a job script would: its first creates
-- probe the backend (bwrap runs probes, docker pings) while the cancel comes.
local CHILD = [[
  local backend, image, tag, wait_running = arg[1], arg[2], arg[3], arg[4] == "1"
  local loop = require "sbx.loop"
  local function running()
    local f = io.popen("pgrep -f '[s]leep " .. tag .. "'")
    local n = select(2, f:read("a"):gsub("%d+", ""))
    f:close()
    return n
  end
  local t0 = loop.now()
  local ok, err = pcall(sbx.parallel, { 1, 2, 3 }, function(i)
    local sb <close> = sbx.sandbox(backend, backend == "docker" and { image = image } or {})
    if i == 1 then
      while wait_running and running() < 2 do
        assert(loop.now() - t0 < 60, "the sleeps never started")
        sbx.sleep(0.02)
      end
      error("boom")
    end
    return sb:execute_command("sleep", { tag })
  end)
  print(ok, tostring(err):match("boom") or tostring(err), loop.now() - t0, #require("sbx.state.owner").owned())
]]

local function parallel_stops(backend, wait_running)
  local tag = string.format("60.%06d1", math.random(0, 999999))   -- sleeps 60 s, names them
  local script = os.tmpname()
  local f = assert(io.open(script, "w"))
  f:write(CHILD)
  f:close()
  local p = io.popen(table.concat({ os.getenv("SBX_BIN") or "build/sbxlua", script, backend, IMAGE, tag,
                                    wait_running and "1" or "0" }, " ") .. " 2>&1")
  local out = p:read("a")
  p:close()
  os.remove(script)
  local ok, err, took, owned = out:match("^(%S+)\t(%S+)\t(%S+)\t(%S+)\n$")
  assert(ok, "unexpected output: " .. out)
  assert.equal("false", ok)
  assert.equal("boom", err)
  assert.is_true(tonumber(took) < 30, backend .. ": sbx.parallel returned after " .. took .. " s")
  assert.equal("0", owned)
  assert.equal(0, pids_of("sleep " .. tag), "a sleep survived")
end

local bwrap_ok, bwrap_why = require("sbx.providers.builtin.bwrap").available()
describe("sbx.parallel over bwrap", function()
  if not bwrap_ok then pending("bwrap unavailable: " .. tostring(bwrap_why)) return end
  it("an item that raises at once stops the others' commands", function()
    for _ = 1, 3 do parallel_stops("bwrap", false) end
  end)
  it("an item that raises while the others' commands run stops them", function()
    parallel_stops("bwrap", true)
  end)
end)

local docker = require "sbx.providers.builtin.docker"
local docker_ok, docker_why = docker.available()
describe("docker", function()
  if not docker_ok then pending("docker unavailable: " .. tostring(docker_why)) return end

  it("sbx.parallel: an item that raises stops the others' commands (agent link)", function()
    parallel_stops("docker", false)
    parallel_stops("docker", true)
  end)

  local function containers(label)
    local f = io.popen("docker ps -aq --filter label=" .. label)
    local out = f:read("a")
    f:close()
    return out
  end

  -- Cancel the creating task while the engine call matching `pattern` is in
  -- flight (the cancel is delivered while the task waits for its answer).
  local function cancel_during(pattern)
    health.reset()
    local tag = "spec-cancel-" .. proc.random_hex(6)
    local real = http.request
    local t
    local hit = false
    http.request = function(o)
      if not hit and o.url:find(pattern, 1, true) then
        hit = true
        loop.spawn(function() t:cancel() end)
      end
      return real(o)
    end
    t = loop.spawn(function()
      return sbx.sandbox("docker", { image = IMAGE, labels = { spec_cancel = tag } })
    end)
    local ok, err = t:join()
    http.request = real
    assert.is_true(hit, "no engine call matched " .. pattern)
    if ok then err:destroy() end
    assert.is_false(ok, "cancelled during " .. pattern .. ", the create finished anyway")
    assert.equal("Cancelled", err.kind, tostring(err))
    assert.equal("", containers("spec_cancel=" .. tag), "the create was not undone")
    local b = health.breaker("docker")
    assert.is_true(b == nil or b.failures == 0, "the breaker was charged")
    assert.equal(0, health.snapshot("docker").samples, "the cancel counted as a create outcome")
    assert.equal(0, health.snapshot("docker").in_flight)
  end

  it("t:cancel() during the engine's create call undoes it and fails as Cancelled", function()
    cancel_during("/containers/create?name=sbxlua-")
  end)
  it("t:cancel() during the container's start undoes it and fails as Cancelled", function()
    cancel_during("/start")
  end)
  it("t:cancel() during the image lookup fails as Cancelled", function()
    cancel_during("/images/")
  end)
  it("t:cancel() during a process's first engine call (the ping) is Cancelled, not BackendNotInstalledError", function()
    -- a fresh sbxlua: its docker backend has not connected yet
    local script = os.tmpname()
    finally(function() os.remove(script) end)
    local f = assert(io.open(script, "w"))
    f:write([[
      local loop, http = require "sbx.loop", require "sbx.http"
      local real, t, hit = http.request, nil, false
      http.request = function(o)
        if not hit and o.url:find("/_ping", 1, true) then hit = true; loop.spawn(function() t:cancel() end) end
        return real(o)
      end
      t = loop.spawn(function() return sbx.sandbox("docker", { image = arg[1] }) end)
      local ok, err = t:join()
      if ok then err:destroy() end
      local b = require("sbx.routing.health").breaker("docker")
      print(hit, ok, ok or err.kind, b and b.failures or 0, require("sbx.routing.health").snapshot("docker").samples)
    ]])
    f:close()
    local p = io.popen((os.getenv("SBX_BIN") or "build/sbxlua") .. " " .. script .. " " .. IMAGE .. " 2>&1")
    local out = p:read("a")
    p:close()
    assert.equal("true\tfalse\tCancelled\t0\t0\n", out)
  end)
end)
