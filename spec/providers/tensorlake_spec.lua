-- providers/tensorlake.lua against the Tensorlake stand-in (a process of
-- its own, spec/support/standin/tensorlake.lua): what create sends, the
-- error mapping (401/403, 429 with and without Retry-After, quota, 5xx, a
-- cut answer, a slow one), a create that succeeds behind a 504 or a
-- timeout never becoming two sandboxes, exact output, snapshot, gc after
-- SIGKILL, and what `providers`/`doctor` say without a key.
local sbx = require "sbx"
local S = require "spec.support"
local TL = require "spec.support.standin.tensorlake"
local config = require "sbx.core.config"
local router = require "sbx.routing"
local proc = require "sbx.proc"
local http = require "sbx.http"
local json = require "cjson"

-- the stand-in's sandboxes are bwrap ones here: on local, commands would
-- see the host's / (the provider makes /workspace, and cds there)
if not S.gate("bwrap", "tensorlake provider (stand-in on bwrap)") then return end

local standin

local function control(method, path)
  local res = assert(http.request{ method = method, url = standin.url .. path, timeout = 10,
                                   headers = { authorization = "Bearer " .. standin.key } })
  return res.status, res.body ~= "" and json.decode(res.body) or nil
end

-- providers.tensorlake of a real sbx.yaml (the schema's defaults under it)
local function use_config(body, top)
  local path = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/tl-spec-" .. proc.getpid() .. ".yaml"
  local f = assert(io.open(path, "w"))
  f:write("providers:\n  tensorlake:\n" .. body .. (top or ""))
  f:close()
  config.use(path)
end

local function fresh()
  standin:clear_faults()
  router.reset()
  require("sbx.routing.health").reset()     -- a 429 of one case throttles the next
  config.use{}
end

setup(function()
  standin = TL.start()
  proc.setenv("TENSORLAKE_API_URL", standin.url)
  proc.setenv("TENSORLAKE_API_KEY", standin.key)
end)
teardown(function()
  standin:stop()
  proc.setenv("TENSORLAKE_API_URL", nil)
  proc.setenv("TENSORLAKE_API_KEY", nil)
  config.use{}
end)
before_each(fresh)

describe("tensorlake create", function()
  it("sends image, cpu, memory, lifetime and network off, and names the sandbox with sbxlua's id", function()
    local sb <close> = sbx.sandbox("tensorlake", { image = "python:3.12", cpu = 2, memory_mb = 768,
                                                   timeout_secs = 900, allow_internet = false })
    local status, info = control("GET", "/sandboxes/" .. sb:session_state().state.sandbox_id)
    assert.equal(200, status)
    assert.same({ "python:3.12", 2, 768, 900, false, sb.id, "running" },
                { info.image, info.resources.cpus, info.resources.memory_mb, info.timeout_secs,
                  info.network.allow_internet_access, info.name, info.status })
    -- no sandbox-level env on Tensorlake: every process gets it
    local r = sb:execute_command("sh", { "-c", "echo $A" }, { env = { A = "per process" } })
    assert.equal("per process\n", r.stdout)
  end)

  it("waits for a late sandbox_url and a blocking answer that already runs alike", function()
    local sb <close> = sbx.sandbox("tensorlake")
    local status, info = control("GET", "/sandboxes/" .. sb:session_state().state.sandbox_id)
    assert.equal(200, status)
    assert.equal(standin.url, info.sandbox_url)
    assert.equal("ok\n", sb:execute_command("echo", { "ok" }).stdout)
  end)

  it("an unknown field is a 400 from the stand-in and a SandboxCreationError naming it", function()
    local kind, err = S.kind_of(function()
      sbx.sandbox("tensorlake", { backend_options = { colour = "blue" } })
    end)
    assert.equal("SandboxCreationError", kind)
    assert.matches("HTTP 400", err.message)
    assert.matches("unknown field `colour`", err.message)
    assert.equal(400, err.context.status)
  end)
end)

describe("tensorlake errors", function()
  local function create_error(fault)
    standin:fault(fault)
    return S.caught(function() sbx.sandbox("tensorlake") end)
  end

  it("401 and 403 are AuthenticationError with the status and the provider's words", function()
    local e = create_error{ route = "POST /sandboxes", status = 401, body = "invalid API key" }
    assert.equal("AuthenticationError", e.kind)
    assert.equal(401, e.context.status)
    assert.matches("invalid API key", e.message)
    proc.setenv("TENSORLAKE_API_KEY", "wrong-key")
    local ok, err = pcall(sbx.sandbox, "tensorlake")
    proc.setenv("TENSORLAKE_API_KEY", standin.key)
    assert.is_false(ok)
    assert.equal("AuthenticationError", err.kind)
    assert.matches("invalid API key", err.message)
    e = create_error{ route = "POST /sandboxes", status = 403, body = "forbidden: the project is disabled" }
    assert.equal("AuthenticationError", e.kind)
    assert.equal(403, e.context.status)
  end)

  -- a pinned create waits out a 429 and goes again (e2b_admission_spec): not here
  local function no_waiting() use_config("    request_timeout: 30\n", "routing:\n  admission_wait_secs: 0\n") end

  it("429 is RateLimitError, with retry_after from Retry-After and without", function()
    no_waiting()
    local e = create_error{ route = "POST /sandboxes", status = 429, body = "slow down",
                            headers = { ["Retry-After"] = "7" } }
    assert.equal("RateLimitError", e.kind)
    assert.equal(7, e.context.retry_after)
    assert.equal(429, e.context.status)
    e = create_error{ route = "POST /sandboxes", status = 429, body = "slow down" }
    assert.equal("RateLimitError", e.kind)
    assert.is_nil(e.context.retry_after)
  end)

  it("the stand-in's own create rate limit is a RateLimitError with the wait it asks", function()
    no_waiting()
    local limited = TL.start{ args = { "--creates-per-sec", "1" } }
    proc.setenv("TENSORLAKE_API_URL", limited.url)
    local ok, err = pcall(function()
      local a <close> = sbx.sandbox("tensorlake")
      local e = S.caught(function() sbx.sandbox("tensorlake") end)
      assert.equal("RateLimitError", e.kind)
      assert.equal(429, e.context.status)
      assert.equal(1, e.context.retry_after)
      assert.matches("rate limit exceeded", e.message)
      assert.equal(1, limited:live())
    end)
    proc.setenv("TENSORLAKE_API_URL", standin.url)
    limited:stop()
    assert(ok, err)
  end)

  it("a quota answer is QuotaExceededError", function()
    local limited = TL.start{ args = { "--max-sandboxes", "1" } }
    proc.setenv("TENSORLAKE_API_URL", limited.url)
    local ok, err = pcall(function()
      local a <close> = sbx.sandbox("tensorlake")
      local e = S.caught(function() sbx.sandbox("tensorlake") end)
      assert.equal("QuotaExceededError", e.kind)
      assert.matches("quota exceeded", e.message)
      assert.equal(1, limited:live())
    end)
    proc.setenv("TENSORLAKE_API_URL", standin.url)
    limited:stop()
    assert(ok, err)
  end)

  it("5xx on create is SandboxConnectionError after the lookup found nothing, and leaves nothing", function()
    local before = standin:live()
    local e = create_error{ route = "POST /sandboxes", status = 503, body = "upstream unavailable", times = 3 }
    assert.equal("SandboxConnectionError", e.kind)
    assert.equal(503, e.context.status)
    assert.matches("upstream unavailable", e.message)
    assert.equal(before, standin:live())
  end)

  it("a create that succeeds behind a 504 is one sandbox, found by its name", function()
    local before = #standin:sandboxes()
    standin:fault{ route = "POST /sandboxes", status = 504, body = "gateway timeout", after = true }
    local sb = sbx.sandbox("tensorlake")
    assert.equal(before + 1, #standin:sandboxes())
    assert.equal("one\n", sb:execute_command("echo", { "one" }).stdout)
    sb:destroy()
    assert.equal(0, standin:live())
  end)

  it("a create whose answer is slower than the request timeout is one sandbox", function()
    use_config("    request_timeout: 0.5\n")
    local before = #standin:sandboxes()
    standin:fault{ route = "POST /sandboxes", delay = 2 }       -- the handler runs after the client gave up
    local sb = sbx.sandbox("tensorlake")
    require("sbx.loop").sleep(2.5)                              -- the slow create lands now: a 409, no second one
    assert.equal(before + 1, #standin:sandboxes())
    sb:destroy()
    assert.equal(0, standin:live())
  end)

  it("a cut answer or a 5xx on an idempotent call is tried again; on a run it is SandboxConnectionError", function()
    local sb <close> = sbx.sandbox("tensorlake")
    sb:write_file("f.txt", "data")
    standin:fault{ route = "GET /api/v1/files", cut = "body" }
    assert.equal("data", sb:read_file("f.txt"))
    standin:fault{ route = "GET /api/v1/files", status = 502, body = "bad gateway", times = 2 }
    assert.equal("data", sb:read_file("f.txt"))
    -- (libcurl sends a request again once by itself when a kept-alive
    -- connection closes before any answer: cut it twice)
    standin:fault{ route = "POST /api/v1/processes/run", cut = "head", times = 2 }
    local e = S.caught(function() sb:execute_command("true", {}) end)
    assert.equal("SandboxConnectionError", e.kind)
    standin:fault{ route = "POST /api/v1/processes/run", status = 500, body = { error = "daemon crashed", code = "INTERNAL" } }
    e = S.caught(function() sb:execute_command("true", {}) end)
    assert.equal("SandboxConnectionError", e.kind)
    assert.matches("daemon crashed", e.message)
    assert.equal(500, e.context.status)
  end)

  it("a slow answer past the request timeout is tried again on an idempotent call", function()
    use_config("    request_timeout: 0.5\n")
    local sb <close> = sbx.sandbox("tensorlake")
    sb:write_file("f.txt", "slow")
    standin:fault{ route = "GET /api/v1/files", delay = 2 }
    assert.equal("slow", sb:read_file("f.txt"))
  end)

  it("a gone sandbox is SandboxNotFoundError; a `..` the daemon refuses (403) is PathError", function()
    local sb = sbx.sandbox("tensorlake")
    local state = sb:session_state()
    local id = state.state.sandbox_id
    local p = sbx.resume(state)
    assert.equal("x", p:execute_command("printf", { "x" }).stdout)
    assert.equal(200, (control("DELETE", "/sandboxes/" .. id)))
    assert.equal("SandboxNotFoundError", S.kind_of(function() sbx.resume(state) end))
    assert.is_false(sb:is_alive())
    sb:destroy()
    local live <close> = sbx.sandbox("tensorlake")
    local lid = live:session_state().state.sandbox_id
    -- the daemon refuses a `..` (the provider resolves paths before it asks)
    local res = assert(http.request{ method = "GET", url = standin.url .. "/api/v1/files?path=/a/../../etc/passwd",
      headers = { authorization = "Bearer " .. standin.key, ["x-tensorlake-sandbox-id"] = lid } })
    assert.equal(403, res.status)
    assert.equal("FORBIDDEN", json.decode(res.body).code)
    standin:fault{ route = "GET /api/v1/files", status = 403, body = { error = "path escapes the sandbox", code = "FORBIDDEN" } }
    local e = S.caught(function() live:read_file("x") end)
    assert.equal("PathError", e.kind)
    standin:fault{ route = "GET /api/v1/files", status = 403, body = "token expired" }
    assert.equal("AuthenticationError", S.kind_of(function() live:read_file("x") end))
  end)
end)

describe("tensorlake output and state", function()
  it("keeps binary stdout and a missing last newline exact when not streamed; streams by line", function()
    local sb <close> = sbx.sandbox("tensorlake")
    local r = sb:execute_command("printf", { "\\000\\377\\n\\001no newline" })
    assert.equal("\0\255\n\1no newline", r.stdout)
    local chunks = {}
    r = sb:execute_command("printf", { "a\\nb" }, { on_stdout = function(c) chunks[#chunks + 1] = c end })
    assert.same({ "a\n", "b\n" }, chunks)      -- line-based: the last line gets its newline
  end)

  it("reuses a finished command's output files: a later, shorter output is only its own", function()
    local sb <close> = sbx.sandbox("tensorlake")
    local r = sb:execute_command("sh", { "-c", "printf 'a long first output'; printf 'first err' >&2" })
    assert.same({ "a long first output", "first err" }, { r.stdout, r.stderr })
    r = sb:execute_command("printf", { "x" })
    assert.same({ "x", "" }, { r.stdout, r.stderr })
    -- two at once get two pairs of files
    local a = sb:spawn("sh", { "-c", "sleep 0.5; printf A" }, { stdin = "" })
    local b = sb:spawn("sh", { "-c", "printf B" }, { stdin = "" })
    assert.equal("B", b:wait().stdout)
    assert.equal("A", a:wait().stdout)
    local left = sb:execute_command("sh", { "-c", "ls -a /tmp | grep -c '^.sbxlua-' || true" }).stdout
    assert.is_true(tonumber(left) <= 4, left)    -- at most the pooled pairs, never one per command
  end)

  it("streams across the daemon's SSE heartbeats, and a stream without an exit event is a broken link", function()
    local sb <close> = sbx.sandbox("tensorlake")
    local chunks = {}
    local r = sb:execute_command("sh", { "-c", "echo a; sleep 2.5; echo b" },
                                 { on_stdout = function(c) chunks[#chunks + 1] = c end })
    assert.same({ "a\n", "b\n" }, chunks)      -- two heartbeats (one a second) came between
    assert.equal(0, r.exit_code)
    standin:fault{ route = "POST /api/v1/processes/run", status = 200, body = "data: {\"pid\": 7, \"started_at\": 1}\n\n",
                   headers = { ["Content-Type"] = "text/event-stream" } }
    local e = S.caught(function() sb:execute_command("true", {}) end)
    assert.equal("SandboxConnectionError", e.kind)
    assert.matches("without an exit event", e.message)
  end)

  it("snapshots a sandbox and creates another from it", function()
    local sb <close> = sbx.sandbox("tensorlake")
    sb:write_file("kept.txt", "from the snapshot")
    local snap = sb:snapshot()
    assert.is_string(snap.snapshot_id)
    local copy <close> = sbx.sandbox("tensorlake", { snapshot_id = snap.snapshot_id })
    assert.equal("from the snapshot", copy:read_file("kept.txt"))
  end)

  it("resumes a suspended sandbox (a named one past its timeout) by waking it", function()
    local sb <close> = sbx.sandbox("tensorlake")
    sb:write_file("kept.txt", "still here")
    local state = sb:session_state()
    assert.equal(202, (control("POST", "/sandboxes/" .. state.state.sandbox_id .. "/suspend")))
    local _, info = control("GET", "/sandboxes/" .. state.state.sandbox_id)
    assert.equal("suspended", info.status)
    local again = sbx.resume(state)
    assert.equal("still here", again:read_file("kept.txt"))
    _, info = control("GET", "/sandboxes/" .. state.state.sandbox_id)
    assert.equal("running", info.status)
  end)

  it("gc after SIGKILL leaves nothing on the stand-in", function()
    local h = S.home("tl-gc", { vars = { TENSORLAKE_API_URL = standin.url, TENSORLAKE_API_KEY = standin.key } })
    local job = h.write("killed.lua", [[
      local a = sbx.sandbox("tensorlake")
      local b = sbx.sandbox("tensorlake")
      print("ready " .. a.id .. " " .. b.id) io.stdout:flush()
      sbx.sleep(300)
    ]])
    local before = standin:live()
    local p = h.start({ job })
    S.expect_output(p, "ready [^\n]+\n")
    assert.equal(before + 2, standin:live())
    os.execute("kill -9 " .. p.pid)
    p:wait()
    p:close()
    assert.equal(before + 2, standin:live())
    local r = h.run({ "gc" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("destroyed 2 sandboxes", r.stdout)
    assert.equal(before, standin:live())
    h.cleanup()
  end)

  it("gc after a SIGKILL in the middle of a create finds the sandbox by its name", function()
    local slow = TL.start{ args = { "--pending-secs", "30" } }     -- it stays pending: the create waits
    local h = S.home("tl-gc-mid", { vars = { TENSORLAKE_API_URL = slow.url, TENSORLAKE_API_KEY = slow.key } })
    local ok, err = pcall(function()
      local job = h.write("mid.lua", [[
        print("creating") io.stdout:flush()
        sbx.sandbox("tensorlake")
      ]])
      local p = h.start({ job })
      S.expect_output(p, "creating\n")
      for _ = 1, 200 do
        if #slow:sandboxes() > 0 then break end
        require("sbx.loop").sleep(0.05)
      end
      assert.equal(1, slow:live())
      os.execute("kill -9 " .. p.pid)
      p:wait()
      p:close()
      local r = h.run({ "gc" })
      assert.equal(0, r.exit_code, r.stderr)
      assert.matches("destroyed 1 sandbox", r.stdout)
      assert.equal(0, slow:live())
    end)
    slow:stop()
    h.cleanup()
    assert(ok, err)
  end)

  it("providers and doctor say to set TENSORLAKE_API_KEY when it is missing", function()
    local h = S.home("tl-nokey")
    local r = h.run({ "providers" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("tensorlake[^\n]*set TENSORLAKE_API_KEY", r.stdout)
    r = h.run({ "doctor" })
    assert.matches("set TENSORLAKE_API_KEY", r.stdout .. r.stderr)
    local k = S.home("tl-key", { vars = { TENSORLAKE_API_URL = standin.url, TENSORLAKE_API_KEY = standin.key } })
    r = k.run({ "providers" })
    assert.not_matches("tensorlake[^\n]*set TENSORLAKE_API_KEY", r.stdout)
    h.cleanup()
    k.cleanup()
  end)
end)
