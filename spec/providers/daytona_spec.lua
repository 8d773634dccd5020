-- providers/daytona.lua against its stand-in (run as a process of its own):
-- Daytona's answers become API.md's typed errors with context.status and
-- Daytona's own message; idempotent calls are retried, a create never
-- makes two sandboxes; gc after a SIGKILL leaves nothing on the stand-in;
-- `providers` and `doctor` say what to set when the key is missing.
local loop = require "sbx.loop"
local config = require "sbx.core.config"
local sbx = require "sbx"
local S = require "spec.support"
local DP = require "spec.support.standin.daytona_proc"

-- the provider's settings as a config file gives them (its credentials named)
local function cfg(t)
  t.api_key_env, t.api_url_env = "DAYTONA_API_KEY", "DAYTONA_API_URL"
  return t
end

local function kind_of(fn)
  local err = S.caught(fn)
  return err and err.kind, err
end

describe("daytona provider", function()
  local s
  if not S.gate("bwrap", "daytona provider (its stand-in's sandboxes are bwrap sandboxes)") then return end
  setup(function()
    s = DP.start{ max_cpu = 4 }
    s:use()
  end)
  teardown(function()
    DP.restore()
    if s then s:stop() end
  end)
  before_each(function()
    s:clear()
    require("sbx.routing.health").reset()            -- a 429 of one case throttles the next
    -- a pinned create waits out a 429 and goes again (e2b_admission_spec): not here
    config.use{ providers = { daytona = cfg{ deadline = 3, request_timeout = 2 } },
                routing = { admission_wait_secs = 0 } }
  end)

  local function count(labels)
    local n = 0
    for _, it in ipairs(s:sandboxes(labels)) do if it.state ~= "destroyed" then n = n + 1 end end
    return n
  end

  it("sends the request's resources, image, network, region, lifetime and labels", function()
    local sb <close> = sbx.sandbox("daytona", { cpu = 2, memory_mb = 1536, disk_mb = 3000, allow_internet = false,
      image = "python:3.12-slim", region = "eu", timeout_secs = 600, labels = { team = "evals" } })
    local it = s:sandboxes{ ["sbxlua.id"] = sb.id }[1]
    assert.same({ 2, 2, 3, true, "eu", "evals" }, { it.cpu, it.memory, it.disk, it.networkBlockAll, it.target, it.labels.team })
    assert.matches("^build%-", it.snapshot)                   -- from buildInfo (FROM python:3.12-slim)
    assert.equal(sb.id, it.name)
    assert.equal("600", it.labels["sbxlua.ttl"])
    assert.equal(0, it.autoStopInterval)
    assert.equal("FeatureNotSupportedError",
                 (kind_of(function() sbx.sandbox("daytona", { snapshot_id = "snap", cpu = 2 }) end)))
    assert.equal("FeatureNotSupportedError", (kind_of(function() sbx.sandbox("daytona", { gpu = 1 }) end)))
  end)

  it("401 and 403 are AuthenticationError with the status and Daytona's message", function()
    s:fault{ route = "POST /sandbox", status = 401, body = { statusCode = 401, message = "Invalid API key" } }
    local kind, err = kind_of(function() sbx.sandbox("daytona") end)
    assert.equal("AuthenticationError", kind)
    assert.equal(401, err.context.status)
    assert.matches("Invalid API key", err.message)
    s:fault{ route = "POST /sandbox", status = 403, body = { statusCode = 403, message = "Forbidden resource" } }
    kind, err = kind_of(function() sbx.sandbox("daytona") end)
    assert.equal("AuthenticationError", kind)
    assert.equal(403, err.context.status)
    assert.equal(0, count())
  end)

  it("429 is RateLimitError with retry_after from Retry-After-<bucket>, or none", function()
    s:fault{ route = "POST /sandbox", status = 429, body = { statusCode = 429, message = "ThrottlerException: Too Many Requests" },
             headers = { ["Retry-After-sandbox-create"] = "7", ["Retry-After-authenticated"] = "1" } }
    local kind, err = kind_of(function() sbx.sandbox("daytona") end)
    assert.equal("RateLimitError", kind)
    assert.equal(7, err.context.retry_after)
    assert.equal(429, err.context.status)
    assert.matches("Too Many Requests", err.message)
    s:fault{ route = "POST /sandbox", status = 429, body = { statusCode = 429, message = "ThrottlerException: rate limit exceeded" } }
    kind, err = kind_of(function() sbx.sandbox("daytona") end)
    assert.equal("RateLimitError", kind)
    assert.is_nil(err.context.retry_after)
    assert.equal(0, count())
  end)

  it("'Total CPU limit exceeded' is QuotaExceededError, with nothing made", function()
    local kind, err = kind_of(function() sbx.sandbox("daytona", { cpu = 8 }) end)
    assert.equal("QuotaExceededError", kind)
    assert.equal(400, err.context.status)
    assert.matches("Total CPU limit exceeded%. Maximum allowed: 4%.", err.message)
    s:fault{ route = "POST /sandbox", status = 400,
             body = { statusCode = 400, message = "Total memory limit exceeded. Maximum allowed: 8GiB." } }
    assert.equal("QuotaExceededError", (kind_of(function() sbx.sandbox("daytona") end)))
    assert.equal(0, count())
  end)

  it("idempotent calls ride out a 503, a 429 with Retry-After and a cut answer; a lasting 5xx is SandboxConnectionError", function()
    local sb <close> = sbx.sandbox("daytona")
    sb:write_file("f.txt", "kept")
    s:fault{ route = "GET /toolbox/[^/]+/files/download", status = 503, times = 1 }
    s:fault{ route = "GET /toolbox/[^/]+/files/download", status = 429, headers = { ["Retry-After"] = "0.3" }, times = 1 }
    s:fault{ route = "GET /toolbox/[^/]+/files/download", cut = "body", times = 1 }
    local t0 = loop.now()
    assert.equal("kept", sb:read_file("f.txt"))
    assert.is_true(loop.now() - t0 >= 0.3, "the Retry-After was honoured")
    s:fault{ route = "GET /toolbox/[^/]+/files/download", status = 500, times = -1,
             body = { statusCode = 500, message = "daemon exploded" } }
    local kind, err = kind_of(function() sb:read_file("f.txt") end)
    assert.equal("SandboxConnectionError", kind)
    assert.equal(500, err.context.status)
    assert.matches("daemon exploded", err.message)
    s:clear()
    -- a slow answer inside the request timeout is just slow
    s:fault{ route = "GET /toolbox/[^/]+/files/download", delay = 0.5 }
    assert.equal("kept", sb:read_file("f.txt"))
  end)

  it("a command refused with 429 is sent again after the wait it asks, and runs once", function()
    local sb <close> = sbx.sandbox("daytona")
    s:fault{ route = "POST /toolbox/[^/]+/process/session/[^/]+/exec", status = 429, times = 2,
             headers = { ["Retry-After"] = "0.3" } }
    local t0 = loop.now()
    assert.equal(0, sb:execute_command("sh", { "-c", "echo ran >> count.txt" }).exit_code)
    assert.is_true(loop.now() - t0 >= 0.6, "both waits were honoured")
    assert.equal("ran\n", sb:read_file("count.txt"))
    s:fault{ route = "POST /toolbox/[^/]+/process/session/[^/]+/exec", status = 429, times = -1 }
    local kind, err = kind_of(function() sb:execute_command("true", {}) end)
    assert.equal("RateLimitError", kind)
    assert.equal(429, err.context.status)
  end)

  it("a create that succeeded behind a 504 is found by its label: one sandbox, not two", function()
    local function posts()
      local n = 0
      for _, r in ipairs(s:requests()) do if r == "POST /sandbox" then n = n + 1 end end
      return n
    end
    local before = posts()
    s:fault{ route = "POST /sandbox", status = 504, after = true, body = "<html>504 Gateway Time-out</html>" }
    local sb <close> = sbx.sandbox("daytona")
    assert.equal("hi\n", sb:execute_command("echo hi").stdout)
    assert.equal(1, count{ ["sbxlua.id"] = sb.id })
    assert.equal(1, posts() - before, "the lookup found it: no second create")
  end)

  it("a create whose answer is cut mid-body is found by its label (the lookup retried past a 502)", function()
    s:fault{ route = "POST /sandbox", cut = "body" }
    s:fault{ route = "GET /sandbox", status = 502, times = 1 }      -- the lookup itself hiccups once
    local sb <close> = sbx.sandbox("daytona")
    assert.equal(1, count{ ["sbxlua.id"] = sb.id })
    assert.is_true(sb:is_alive())
  end)

  it("a slow create whose answer came too late is not made twice (its name is its id)", function()
    config.use{ providers = { daytona = cfg{ deadline = 3, request_timeout = 0.5, create_timeout = 20 } } }
    s:fault{ route = "POST /sandbox", delay = 1.5, after = false }
    local sb <close> = sbx.sandbox("daytona")
    loop.sleep(1.5)                                  -- the first create has run by now
    assert.equal(1, count{ ["sbxlua.id"] = sb.id })
  end)

  it("output is the logs' JSON text: a character cut between polls arrives whole, bytes that are not UTF-8 do not", function()
    local sb <close> = sbx.sandbox("daytona")
    local chunks = {}
    local r = sb:execute_command("sh", { "-c", "printf 'h\\303'; sleep 0.6; printf '\\251llo\\n'" },
                                 { on_stdout = function(c) chunks[#chunks + 1] = c end })
    assert.equal("h\u{e9}llo\n", table.concat(chunks))
    assert.equal("h\u{e9}llo\n", r.stdout)
    -- Daytona's daemon (Go's encoding/json) sends U+FFFD for such bytes: binary
    -- output goes through a file (docs/daytona.md)
    assert.equal("a\u{FFFD}b", sb:execute_command("printf", { "a\255b" }).stdout)
    sb:execute_command("sh", { "-c", "printf 'a\\377b' > bin.out" })
    assert.equal("a\255b", sb:read_file("bin.out"))
  end)

  it("a sandbox that ends in Daytona's error state is SandboxCreationError with its reason, and deleted", function()
    local kind, err = kind_of(function()
      sbx.sandbox("daytona", { labels = { ["standin.error"] = "no runner available in region us" } })
    end)
    assert.equal("SandboxCreationError", kind)
    assert.matches("is error: no runner available in region us", err.message)
    assert.equal(0, count{ ["standin.error"] = "no runner available in region us" })
  end)

  it("a destroyed sandbox is SandboxNotFoundError for the facade and gone on the stand-in", function()
    local sb = sbx.sandbox("daytona")
    local id = sb.id
    sb:destroy()
    assert.equal(0, count{ ["sbxlua.id"] = id })
    assert.equal("SandboxNotFoundError", (kind_of(function() sb:read_file("x") end)))
  end)

  it("gc after a SIGKILLed sbxlua leaves nothing of its session on the stand-in", function()
    local home = S.home("daytona-gc")
    local env = home.env{ DAYTONA_API_KEY = s.key, DAYTONA_API_URL = s.url }
    local p = S.sbxlua({ "-e", "local a = sbx.sandbox('daytona'); local b = sbx.sandbox('daytona'); "
                         .. "print('ready ' .. a.id .. ' ' .. b.id); io.stdout:flush(); require('sbx.loop').sleep(300)" },
                       { env = env, stream = true })
    local out = S.expect_output(p, "ready [^\n]+\n")
    local a, b = out:match("ready (%S+) (%S+)")
    assert.equal(1, count{ ["sbxlua.id"] = a })
    p:kill(9)
    p:wait()
    p:close()
    local r = S.sbxlua({ "gc" }, { env = env })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal(0, count{ ["sbxlua.id"] = a })
    assert.equal(0, count{ ["sbxlua.id"] = b })
    home.cleanup()
  end)

  it("gc goes on when the API cannot be reached, saying daytona was not checked", function()
    local l, port = assert(require("sbx.stream").listen{ host = "127.0.0.1", port = 0 })
    l:close()                                              -- a port nobody listens on
    local home = S.home("daytona-gc-down")
    local t0 = loop.now()
    local conf = home.write("sbx.yaml", "providers:\n  daytona:\n    deadline: 2\n")
    local r = S.sbxlua({ "gc" }, { env = home.env{ DAYTONA_API_KEY = "k", SBX_CONFIG = conf,
                                                   DAYTONA_API_URL = "http://127.0.0.1:" .. port } })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("daytona not checked: .*cannot list sandboxes at http://127%.0%.0%.1:" .. port, r.stderr)
    assert.is_true(loop.now() - t0 < 60, "gc gave up on the listing within its deadline")
    home.cleanup()
  end)

  it("providers and doctor say to set DAYTONA_API_KEY when it is missing", function()
    local home = S.home("daytona-nokey")
    local r = S.sbxlua({ "providers" }, { env = home.env() })
    assert.matches("daytona%s+no%s.-set DAYTONA_API_KEY", r.stdout)
    r = S.sbxlua({ "doctor" }, { env = home.env() })
    assert.matches("set DAYTONA_API_KEY", r.stdout .. r.stderr)
    DP.unset()
    local kind, err = kind_of(function() sbx.sandbox("daytona") end)
    s:use()
    assert.equal("BackendNotInstalledError", kind)
    assert.matches("set DAYTONA_API_KEY", err.message)
    home.cleanup()
  end)
end)

-- The stand-in's light sandboxes (--backend light: bench/daytona.sh LIGHT=1
-- measures the clients on them): the provider's whole path works on them,
-- the agent's status record included, with no process behind a sandbox.
describe("daytona provider on light sandboxes", function()
  local s
  setup(function()
    s = DP.start{ max_cpu = 64, backend = "light" }
    s:use()
  end)
  teardown(function()
    DP.restore()
    if s then s:stop() end
  end)
  before_each(function() config.use{ providers = { daytona = cfg{} } } end)

  it("runs commands with exact argv, stdout and stderr apart, exit codes and exit kinds", function()
    local sb <close> = sbx.sandbox("daytona")
    local r = sb:execute_command("echo", { "it's", "a b" })
    assert.same({ 0, "it's a b\n", "" }, { r.exit_code, r.stdout, r.stderr })
    r = sb:execute_command("cat", { "/no/such" })
    assert.equal(1, r.exit_code)
    assert.equal("", r.stdout)
    assert.matches("No such file", r.stderr)
    assert.equal(1, sb:execute_command("false", {}).exit_code)
    local err = S.caught(function() sb:execute_command("no-such-program", {}) end)
    assert.equal("SandboxExecutionError", err and err.kind)          -- as the conformance suite asks
    assert.matches("no%-such%-program", err.message)
    err = S.caught(function() sb:execute_command("true", {}, { cwd = "/no/such/dir" }) end)
    assert.matches("/no/such/dir", err and err.message or "no error for a missing cwd")
  end)

  it("moves files: write, read, list, mkdir, remove", function()
    local sb <close> = sbx.sandbox("daytona")
    sb:write_file("d/a.txt", "one\0two")
    assert.equal("one\0two", sb:read_file("d/a.txt"))
    sb:mkdir("d/sub")
    local names = {}
    for _, e in ipairs(sb:list_files("d")) do names[#names + 1] = e.name .. (e.is_dir and "/" or "") end
    assert.same({ "a.txt", "sub/" }, names)
    sb:remove("d/a.txt")
    assert.equal("FileNotFoundError", (S.caught(function() sb:read_file("d/a.txt") end) or {}).kind)
  end)

  it("destroys: nothing of the job is left on the stand-in", function()
    local sb = sbx.sandbox("daytona")
    local id = sb.id
    sb:execute_command("true", {})
    sb:destroy()
    for _, v in ipairs(s:sandboxes()) do assert.is_not.equal(id, (v.labels or {})["sbxlua.id"]) end
  end)
end)
