-- Docker through the sbx-agent stream: one `sbx-agent serve` per container
-- carries every command and file operation. Real engine, real containers.
local sbx = require "sbx"
local http = require "sbx.http"
local json = require "cjson"
local loop = require "sbx.loop"
local docker = require "sbx.providers.builtin.docker"
local S = require "spec.support"

local IMAGE = S.IMAGE
local SOCK = "/var/run/docker.sock"

if not S.gate("docker", "docker agent") then return end

local function engine(method, path)
  local r = assert(http.request{ url = "http://docker/v1.41" .. path, unix_socket = SOCK, method = method })
  return r.status, json.decode(r.body ~= "" and r.body or "null")
end

-- Engine execs started in a container so far (the engine keeps their ids).
local function exec_count(sb)
  local _, c = engine("GET", "/containers/" .. sb:session_state().state.container .. "/json")
  return type(c.ExecIDs) == "table" and #c.ExecIDs or 0
end

local kind_of = S.kind_of

describe("docker agent", function()
  it("runs every command and file operation over one agent stream", function()
    local sb <close> = sbx.sandbox("docker", { image = IMAGE })
    sb:execute_command("true")            -- the agent starts with create, in the background
    assert.truthy(sb._h.link, "no agent link: " .. tostring(docker.fallback))
    assert.matches("^sbx%-agent ", sb._h.link.hello)
    local before = exec_count(sb)
    assert.equal(0, before)                -- the first link is the container's own stdio
    for i = 1, 20 do
      assert.equal(tostring(i) .. "\n", sb:execute_command("echo " .. i).stdout)
    end
    sb:write_file("a/b/c.txt", "hello")
    assert.equal("hello", sb:read_file("a/b/c.txt"))
    assert.equal("c.txt", sb:list_files("a/b")[1].name)
    sb:remove("a", { recursive = true })
    assert.equal("FileNotFoundError", kind_of(function() sb:list_files("a") end))
    -- no new engine exec for any of it
    assert.equal(before, exec_count(sb))
  end)

  it("keeps 100 commands in flight on one sandbox", function()
    local sb <close> = sbx.sandbox("docker", { image = IMAGE })
    local items = {}
    for i = 1, 100 do items[i] = i end
    local t0 = loop.now()
    local res = sbx.parallel(items, function(i)
      local r = sb:execute_command("sh", { "-c", "sleep 0.5; echo x-" .. i })
      return r
    end, { concurrency = 100 })
    for i = 1, 100 do
      assert.equal(0, res[i].exit_code)
      assert.equal("x-" .. i .. "\n", res[i].stdout)
    end
    -- in flight together, not one after another
    assert.is_true(loop.now() - t0 < 25, "took " .. (loop.now() - t0) .. " s")
  end)

  it("cannot be killed by a command: the first agent is the container's init", function()
    local sb <close> = sbx.sandbox("docker", { image = IMAGE })
    -- the command's parent is its supervisor, whose parent is the agent:
    -- pid 1, which the kernel keeps from SIGKILL sent inside its namespace
    local r = sb:execute_command("sh", { "-c", "a=$(cut -d' ' -f4 /proc/$PPID/stat); kill -9 $a; sleep 0.2; echo $a" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("1\n", r.stdout)
    assert.equal("still\n", sb:execute_command("echo still").stdout)
    assert.equal(0, exec_count(sb))
  end)

  it("docker stop ends it at once: the agent as init exits on SIGTERM, its commands with it", function()
    local sb <close> = sbx.sandbox("docker", { image = IMAGE })
    local p = sb:spawn("sleep", { "300" })
    assert.equal("up\n", sb:execute_command("echo up").stdout)      -- p has started
    local cid = sb:session_state().state.container
    -- without a handler the kernel drops SIGTERM sent to an init, and the
    -- engine sends SIGKILL after t seconds: exit code 137 instead of 143
    local r = assert(http.request{ url = "http://docker/v1.41/containers/" .. cid .. "/stop?t=40",
                                   unix_socket = SOCK, method = "POST", timeout = 90 })
    assert.equal(204, r.status, r.body)
    local _, c = engine("GET", "/containers/" .. cid .. "/json")
    assert.is_false(c.State.Running)
    assert.equal(143, c.State.ExitCode)
    local kind = kind_of(function() p:wait() end)
    assert.is_true(kind == "SandboxConnectionError" or kind == "SandboxNotFoundError", tostring(kind))
  end)

  it("an agent killed mid-command is a clear error; the sandbox still works and is destroyable", function()
    local sb = sbx.sandbox("docker", { image = IMAGE })
    local cid = sb:session_state().state.container
    local bg = sb:spawn("sleep 300")
    local bgpid = bg.pid
    -- the first link ends (its commands stopped, as a link over an exec
    -- stops them; the container kept): the next one is an `sbx-agent
    -- serve` over an engine exec, which a command can kill
    sb._h.link:close()
    assert.equal("two\n", sb:execute_command("echo two").stdout)
    assert.equal(1, exec_count(sb))
    local gone
    for _ = 1, 50 do
      gone = sb:execute_command("kill -0 " .. bgpid .. " 2>/dev/null || echo gone").stdout == "gone\n"
      if gone then break end
      loop.sleep(0.1)
    end
    assert.is_true(gone, "the first link's background command outlived it")
    local kind, err = kind_of(function()
      sb:execute_command("sh", { "-c", "kill -9 $(cut -d' ' -f4 /proc/$PPID/stat); sleep 5" })
    end)
    assert.equal("SandboxConnectionError", kind)   -- the link broke: retryable
    assert.is_true(err.retryable)
    assert.matches("agent", err.message)
    -- the next operation opens a new stream
    assert.equal("again\n", sb:execute_command("echo again").stdout)
    sb:destroy()
    local status = engine("GET", "/containers/" .. cid .. "/json")
    assert.equal(404, status)
  end)

  it("out of memory, the kernel kills a command, never the agent or the container", function()
    local sb <close> = sbx.sandbox("docker", { image = IMAGE, memory_mb = 64 })
    assert.equal("up\n", sb:execute_command("echo up").stdout)
    local link = sb._h.link
    local r = sb:execute_command("for i in $(seq 1 900); do sleep 30 & done; wait", nil, { timeout = 10 })
    assert.is_true(r.signal == "SIGKILL" or r.timed_out, "not killed: exit " .. tostring(r.exit_code))
    r = sb:execute_command("python3", { "-c", "b = bytearray(200 << 20); print('allocated')" })
    assert.equal("SIGKILL", r.signal)
    -- the first command's background sleeps may outlive its shell (the
    -- kernel killed the shell, not them) and hold the 64 MB for up to 30 s:
    -- a command can be killed until they are gone; the agent never is
    local out
    for _ = 1, 40 do
      out = sb:execute_command("echo ok").stdout
      if out == "ok\n" then break end
      sbx.sleep(1)
    end
    assert.equal("ok\n", out)
    assert.equal(link, sb._h.link)                 -- the same agent, the same stream
  end)

  it("streams output chunks as they come", function()
    local sb <close> = sbx.sandbox("docker", { image = IMAGE })
    local seen, times = {}, {}
    local t0 = loop.now()
    local r = sb:execute_command("for i in 1 2 3; do echo $i; sleep 0.2; done", nil, {
      on_stdout = function(c) seen[#seen + 1] = c times[#times + 1] = loop.now() - t0 end })
    assert.equal("1\n2\n3\n", r.stdout)
    assert.equal("1\n2\n3\n", table.concat(seen))
    assert.is_true(#seen >= 2)
    -- delivered as they came, not all at the end (the script sleeps 0.4 s between 1 and 3)
    assert.is_true(times[#times] - times[1] >= 0.3, "chunks came at " .. table.concat(times, ", "))
  end)

  it("background processes take stdin, signals and kill over the stream", function()
    local sb <close> = sbx.sandbox("docker", { image = IMAGE })
    local p = sb:spawn("cat")
    assert.is_number(p.pid)
    p:write("one\n")
    p:write("two\n")
    p:close_stdin()
    local r = p:wait()
    assert.equal("one\ntwo\n", r.stdout)
    local q = sb:spawn("trap 'echo got-term; exit 3' TERM; echo ready; while :; do sleep 0.05; done",
                       nil, { on_stdout = function() end })
    loop.sleep(0.3)
    q:kill("SIGTERM")
    local rq = q:wait()
    assert.equal(3, rq.exit_code)
    local k = sb:spawn("sleep 100")
    k:kill()
    local rk = k:wait()
    assert.equal("SIGKILL", rk.signal)
  end)

  it("falls back to the engine's exec when the agent cannot start, and says so", function()
    docker.SERVE = { "/bin/sh", "-c", "echo no agent here >&2; exit 3" }
    docker.fallback = nil
    local okc, sb = pcall(sbx.sandbox, "docker", { image = IMAGE })
    assert(okc, tostring(sb))
    local first = sb:execute_command("echo first")
    docker.SERVE = nil
    assert.equal("first\n", first.stdout)
    assert.is_nil(sb._h.link)
    assert.matches("no agent here", docker.fallback)
    assert.equal("still works\n", sb:execute_command("echo still works").stdout)
    sb:write_file("f", "x")
    assert.equal("x", sb:read_file("f"))
    local checks = docker.doctor()
    local text = {}
    for _, c in ipairs(checks) do text[#text + 1] = c.what .. ": " .. tostring(c.detail) end
    assert.matches("fallback used: sbx%-agent serve did not start", table.concat(text, "\n"))
    sb:destroy()
    docker.fallback = nil
  end)
end)
