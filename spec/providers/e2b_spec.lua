-- providers/e2b.lua against the E2B stand-in (spec/support/standin/e2b.lua,
-- in a process of its own): the error mapping of every answer E2B gives,
-- retries, a create lost behind a 504 that is found by its label instead of
-- made twice, the proxy's 502 for a dead sandbox, gc after SIGKILL, and
-- what `providers`/`doctor` say without a key.
local sbx = require "sbx"
local loop = require "sbx.loop"
local proc = require "sbx.proc"
local fs = require "sbx.fs"
local http = require "sbx.http"
local S = require "spec.support"
local R = require "spec.support.standin.e2b_run"

local s
setup(function()
  s = R.start{}
end)
teardown(function()
  require("sbx.core.config").use{}
  if s then s:stop() end
end)
before_each(function()
  s:clear_faults()
  require("sbx.routing.health").reset()
  R.use(s, { create_deadline = 3, request_timeout = 5 })
end)

local function create() return sbx.sandbox("e2b") end
local function create_fails(f)
  s:fault(f)
  return S.caught(create)
end

describe("e2b: errors", function()
  it("401 and 403 are AuthenticationError with the status and E2B's message", function()
    R.use(s, { api_key_env = "PATH" })                   -- a key the stand-in refuses
    local err = S.caught(create)
    assert.equal("AuthenticationError", err.kind)
    assert.equal(401, err.context.status)
    assert.matches("Invalid API key", err.message, 1, true)
    R.use(s)
    err = create_fails{ route = "POST /sandboxes", status = 403, body = { code = 403, message = "team is blocked" } }
    assert.equal("AuthenticationError", err.kind)
    assert.equal(403, err.context.status)
    assert.matches("team is blocked", err.message, 1, true)
    assert.equal(0, s:stats().live)
  end)

  it("429 is RateLimitError, with retry_after from Retry-After and without it", function()
    -- a pinned create waits out a 429 and goes again (e2b_admission_spec): not here
    R.use(s, { create_deadline = 3 }, { admission_wait_secs = 0 })
    local err = create_fails{ route = "POST /sandboxes", status = 429, headers = { ["Retry-After"] = "7" },
                              body = { code = 429, message = "Rate limit exceeded" } }
    assert.equal("RateLimitError", err.kind)
    assert.equal(429, err.context.status)
    assert.equal(7, err.context.retry_after)
    err = create_fails{ route = "POST /sandboxes", status = 429, body = { code = 429, message = "slow down" } }
    assert.equal("RateLimitError", err.kind)
    assert.is_nil(err.context.retry_after)
  end)

  it("the concurrency limit is QuotaExceededError (a real one: the stand-in's limit)", function()
    local q = R.start{ max_concurrent = 1 }
    local ok, e = pcall(function()
      R.use(q)
      local first <close> = create()
      local err = S.caught(create)
      assert.equal("QuotaExceededError", err.kind)
      assert.equal(429, err.context.status)
      assert.matches("maximum number of concurrent E2B sandboxes (1)", err.message, 1, true)
      assert.equal(1, q:stats().live)
    end)
    q:stop()
    if not ok then error(e, 0) end
  end)

  it("5xx and a connection cut before the answer: the create is retried after a look by label, once made", function()
    s:fault{ route = "POST /sandboxes", status = 500, body = { code = 500, message = "internal" } }
    local before = s:stats().created
    local sb <close> = create()
    assert.equal(before + 1, s:stats().created)
    s:fault{ route = "POST /sandboxes", cut = "head" }
    local sb2 <close> = create()
    assert.equal(before + 2, s:stats().created)
    local err = create_fails{ route = "POST /sandboxes", status = 503, times = -1,
                              body = { code = 503, message = "no capacity", error_code = "sandbox_capacity_unavailable" } }
    assert.equal("SandboxConnectionError", err.kind)
    assert.equal(503, err.context.status)
    assert.matches("no capacity", err.message, 1, true)
    assert.equal(2, s:stats().live)
  end)

  it("a create that succeeds behind a 504 is found by its label, never made twice", function()
    local before = s:stats()
    s:fault{ route = "POST /sandboxes", status = 504, after = true, body = { code = 504, message = "timeout" } }
    local sb = create()
    local now = s:stats()
    assert.equal(before.created + 1, now.created)
    assert.equal(before.live + 1, now.live)
    assert.equal("ok\n", sb:execute_command("echo", { "ok" }).stdout)
    sb:destroy()
    assert.equal(before.live, s:stats().live)
  end)

  it("idempotent calls ride out a cut mid-body and a slow answer", function()
    local sb <close> = create()
    sb:write_file("f.txt", "payload")
    s:fault{ route = "GET /files", cut = "body" }
    assert.equal("payload", sb:read_file("f.txt"))
    R.use(s, { request_timeout = 1 })
    s:fault{ route = "GET /files", delay = 2 }
    local t0 = loop.now()
    assert.equal("payload", sb:read_file("f.txt"))
    assert.is_true(loop.now() - t0 >= 1)
  end)

  it("a sandbox gone behind the proxy's 502 'The sandbox was not found' is SandboxNotFoundError", function()
    local sb = create()
    local sid = sb:session_state().state.sandbox_id
    local r = assert(http.request{ method = "DELETE", url = s.url .. "/sandboxes/" .. sid,
                                   headers = { ["x-api-key"] = s.key } })
    assert.equal(204, r.status)
    local err = S.caught(function() sb:read_file("x") end)
    assert.equal("SandboxNotFoundError", err.kind)
    assert.equal(502, err.context.status)
    assert.is_false(sb:is_alive())
    sb:destroy()
  end)

  it("a timeout kills the command on the provider: SendSignal, not a closed stream", function()
    local sb <close> = create()
    local tag = S.tag("sbxe2b")
    local r = sb:execute_command("bash", { "-c", "exec -a " .. tag .. " sleep 300" }, { timeout = 0.5 })
    assert.is_true(r.timed_out)
    loop.sleep(0.3)
    assert.is_false(S.alive(tag))
  end)
end)

describe("e2b: gc", function()
  it("after SIGKILL, gc destroys what the dead session left on E2B", function()
    local state = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/e2b-gc-" .. proc.getpid()
    assert(fs.mkdir_host(state))
    local job = state .. "/job.lua"
    local f = assert(io.open(job, "w"))
    f:write('local a = sbx.sandbox("e2b") local b = sbx.sandbox("e2b")\n',
            'print("ready") io.stdout:flush() sbx.sleep(300)\n')
    f:close()
    local env = { S.PATH, "HOME=" .. state, "SBX_STATE_DIR=" .. state, "E2B_API_KEY=" .. s.key,
                  "E2B_API_URL=" .. s.url, "E2B_SANDBOX_URL=" .. s.url }
    local before = s:stats().live
    local p = S.sbxlua({ job }, { env = env, stream = true })
    S.expect_output(p, "ready\n")
    assert.equal(before + 2, s:stats().live)
    os.execute("kill -9 " .. p.pid)
    p:wait()
    p:close()
    assert.equal(before + 2, s:stats().live)        -- E2B keeps them: nothing of sbxlua is left to stop them
    local r = S.sbxlua({ "gc" }, { env = env })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal(before, s:stats().live)
    fs.rmtree(state)
  end)
end)

describe("e2b: without a key", function()
  it("providers and doctor say to set E2B_API_KEY", function()
    local r = S.sbxlua({ "providers" }, { env = { S.PATH } })
    assert.matches("e2b[^\n]*set E2B_API_KEY", r.stdout)
    r = S.sbxlua({ "doctor" }, { env = { S.PATH } })
    assert.matches("set E2B_API_KEY", r.stdout .. r.stderr, 1, true)
    -- the reason is the fix: no "provider check" for a script that loads and answered
    assert.is_nil((r.stdout .. r.stderr):match("fix: sbxlua provider check [^\n]*e2b%.lua"))
    assert.equal("FeatureNotSupportedError", S.kind_of(function() sbx.sandbox("e2b", { cpu = 2 }) end))
  end)
end)
