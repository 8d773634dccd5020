-- Errors (API.md "Errors"): every field, the hierarchy, sbx.errors.raise
-- for user code, errno names, and the kinds real failures raise.
local sbx = require "sbx"
local errors = require "sbx.core.errors"
local router = require "sbx.routing"
local health = require "sbx.routing.health"
local fs = require "sbx.fs"
local S = require "spec.support"

local caught = S.caught

describe("errors", function()
  it("has the hierarchy of API.md, and is() respects it", function()
    local under = {
      SandboxCreationError = "SandboxError", NoRouteError = "SandboxCreationError",
      WorkspaceError = "SandboxCreationError", SandboxExecutionError = "SandboxError",
      CommandFailedError = "SandboxExecutionError", SandboxConnectionError = "SandboxError",
      SandboxTimeoutError = "SandboxError", AuthenticationError = "SandboxError",
      RateLimitError = "SandboxError", QuotaExceededError = "SandboxError",
      SandboxNotFoundError = "SandboxError", FileNotFoundError = "SandboxError", PathError = "SandboxError",
      BackendNotInstalledError = "SandboxError", FeatureNotSupportedError = "SandboxError",
      ConfigError = "SandboxError", BudgetExceededError = "SandboxError",
    }
    for kind, parent in pairs(under) do
      local e = errors.new(kind, "m")
      assert.is_true(sbx.errors.is(e, kind), kind)
      assert.is_true(sbx.errors.is(e, parent), kind .. " under " .. parent)
      assert.is_true(sbx.errors.is(e, "SandboxError"), kind)
    end
    local cf = errors.new("CommandFailedError", "m")
    assert.is_true(sbx.errors.is(cf, "SandboxExecutionError"))
    assert.is_false(sbx.errors.is(cf, "SandboxCreationError"))
    assert.is_false(sbx.errors.is(errors.new("WorkspaceError", "m"), "SandboxExecutionError"))
    assert.is_false(sbx.errors.is(errors.new("SandboxConnectionError", "m"), "SandboxExecutionError"))
    assert.is_false(sbx.errors.is(errors.new("Cancelled", "m"), "SandboxError"))
    assert.is_false(sbx.errors.is("a string", "SandboxError"))
    -- a misspelt kind is a mistake, not a silent false
    assert.equal("ConfigError", caught(function() sbx.errors.is(cf, "SandboxErorr") end).kind)
  end)

  it("every kind has every field, and a stable code of its own", function()
    local seen = {}
    for kind in pairs(errors.kinds) do
      local e = errors.new(kind, "msg")
      assert.equal(kind, e.kind)
      assert.equal("msg", e.message)
      assert.equal(kind .. ": msg", tostring(e))
      assert.is_string(e.code, kind)
      assert.matches("^[a-z_]+$", e.code)
      assert.is_nil(seen[e.code], "two kinds share the code " .. e.code)
      seen[e.code] = kind
      assert.is_table(e.context)
      assert.is_boolean(e.retryable)
    end
    assert.equal("rate_limited", errors.new("RateLimitError", "x").code)
    assert.equal("not_found", errors.new("SandboxNotFoundError", "x").code)
    assert.equal("timeout", errors.new("SandboxTimeoutError", "x").code)
    assert.equal("command_failed", errors.new("CommandFailedError", "x").code)
    -- retryable by default where API.md says so
    for _, k in ipairs{ "SandboxConnectionError", "SandboxTimeoutError", "RateLimitError" } do
      assert.is_true(errors.new(k, "x").retryable, k)
    end
    assert.is_false(errors.new("QuotaExceededError", "x").retryable)
    assert.is_false(errors.new("RateLimitError", "x", { retryable = false }).retryable)
  end)

  it("sbx.errors.raise gives user code the same kinds, fields, context and cause", function()
    local inner = errors.new("SandboxConnectionError", "link down")
    local e = caught(function()
      sbx.errors.raise("RateLimitError", "slow down", { backend = "e2b", op = "create",
        context = { retry_after = 7 }, cause = inner, status = 429 })
    end)
    assert.equal("RateLimitError", e.kind)
    assert.equal("RateLimitError: slow down", tostring(e))
    assert.equal("e2b", e.backend)
    assert.equal("create", e.op)
    assert.equal(7, e.context.retry_after)
    assert.equal(429, e.context.status)    -- details land in context (and stay readable at the top)
    assert.equal(429, e.status)
    assert.equal(inner, e.cause)
    assert.is_true(e.retryable)
    assert.equal("ConfigError", caught(function() sbx.errors.raise("NoSuchError", "x") end).kind)
    assert.matches("unknown error kind 'NoSuchError'",
                   caught(function() sbx.errors.raise("NoSuchError", "x") end).message)
    assert.equal("ConfigError", caught(function() sbx.errors.raise("PathError", "x", "oops") end).kind)
  end)

  it("names errno values: from a core code, from an errno number, never an own code", function()
    local name, text = fs.errname(2)
    assert.equal("ENOENT", name)
    assert.equal("No such file or directory", text)
    assert.equal("EACCES", fs.errname(13))
    assert.equal("ENOSPC", (errors.errno_name(28)))
    assert.is_nil(fs.errname(0))
    assert.is_nil(fs.errname(100000))
    assert.equal("ENOENT", errors.new("FileNotFoundError", "x", { code = "ENOENT" }).errno)
    assert.equal("EROFS", errors.new("PathError", "x", { errno = 30 }).errno)
    local own = errors.new("PathError", "x", { code = "ESCAPE" })
    assert.is_nil(own.errno)                    -- sbxlua's own code is no OS error
    assert.equal("ESCAPE", own.context.reason)
    assert.equal("invalid_path", own.code)
    -- the agent link's table of names covers every errno, not a handful
    local agentlink = require "sbx.daemon.link"
    assert.equal("ENOEXEC", agentlink.ERRNO[8])
    assert.equal("ETXTBSY", agentlink.ERRNO[26])
    assert.equal("Exec format error", agentlink.STRERROR[8])
  end)

  it("real failures carry errno and code", function()
    local sb <close> = sbx.sandbox("local")
    local e = caught(function() sb:read_file("missing.txt") end)
    assert.equal("FileNotFoundError", e.kind)
    assert.equal("file_not_found", e.code)
    assert.equal("ENOENT", e.errno)
    assert.equal("local", e.backend)
    e = caught(function() sb:execute_command("no-such-program-x", {}) end)
    assert.equal("SandboxExecutionError", e.kind)
    assert.equal("ENOENT", e.errno)
    e = caught(function() sb:execute_code("x", { language = "no-such-lang" }) end)
    assert.equal("ENOENT", e.errno)
    assert.is_table(e.cause)
    e = caught(function() sb:read_file("../../etc/passwd") end)
    assert.equal("PathError", e.kind)
  end)

  describe("routing", function()
    before_each(function() router.reset() end)
    after_each(function() router.reset() end)

    it("classifies the new kinds: connection and timeout retryable, rate and quota capacity, auth unavailable", function()
      assert.equal("retryable", router.classify(errors.new("SandboxConnectionError", "create: reset")))
      assert.equal("retryable", router.classify(errors.new("SandboxTimeoutError", "create: slow")))
      assert.equal("capacity", router.classify(errors.new("RateLimitError", "slow down")))
      assert.equal("capacity", router.classify(errors.new("QuotaExceededError", "10 sandboxes at most")))
      assert.equal("unavailable", router.classify(errors.new("AuthenticationError", "bad key")))
      -- a failed workspace is the request's own fault: never failed over
      assert.equal("terminal", router.classify(errors.new("WorkspaceError", "x", { phase = "prepare" })))
      assert.equal("terminal", router.classify(errors.new("ConfigError", "x")))
    end)

    it("the breaker counts connection errors", function()
      local limit = health.BREAKER_FAILURES
      for _ = 1, limit do
        health.record_create("spec-conn", 1, false, router.classify(errors.new("SandboxConnectionError", "reset")))
      end
      local ok, why = health.breaker_allows("spec-conn")
      assert.is_false(ok)
      assert.matches("circuit open", why)
    end)
  end)
end)
