-- Every option and numeric argument is checked before anything exists: a bad
-- value is a ConfigError naming the call and the option, and leaves no
-- sandbox behind; a pinned backend honours the routing options or says why.
package.path = (os.getenv("SBX_SOURCE_DIR") or ".") .. "/spec/routing/?.lua;" .. package.path
local sbx = require "sbx"
local owner = require "sbx.state.owner"
local proc = require "sbx.proc"

local function fails(fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  assert.is_table(err, "expected a typed error, got " .. tostring(err))
  return err.kind, err.message, err
end

local function docker_up()
  local p = proc.spawn{ argv = { "docker", "image", "inspect", "sbxlua-test:bookworm" }, timeout = 30 }
  return p and p:wait().exit_code == 0
end

local function containers()
  local f = io.popen("docker ps -aq --filter label=sbxlua.session=" .. tostring(owner.session_id()))
  local n = 0
  for _ in f:read("a"):gmatch("%S+") do n = n + 1 end
  f:close()
  return n
end

local BAD = {
  { { env_vars = { ["A=B"] = "1" } }, "env_vars" },
  { { env_vars = { ["A\0B"] = "1" } }, "env_vars" },
  { { env_vars = { A = "x\0y" } }, "env_vars.A" },
  { { env_vars = { A = 0 / 0 } }, "env_vars.A must be a finite number" },
  { { labels = { team = 0 / 0 } }, "labels.team must be a finite number" },
  { { labels = { ["a=b"] = "x" } }, "labels: invalid label name" },
  { { labels = { a = "x\0" } }, "labels.a" },
  { { files = { ["a\0b"] = "x" } }, "dest contains a NUL" },
  { { files = { [""] = "x" } }, "dest is blank" },
  { { files = { a = 0 / 0 } }, "files['a'] must be a finite number" },
  { { git_repo = "-c" }, "git_repo must be a repository" },
  { { git_repo = "--upload-pack=touch /tmp/pwned" }, "git_repo must be a repository" },
  { { git_repo = "/" }, "git_repo must be a repository" },
  { { git_repo = "" }, "git_repo must not be empty" },
  { { git_repo = "https://h/r.git", git_ref = "--orphan" }, "git_ref must be a branch" },
  { { image = "a\0b" }, "image contains a NUL" },
  { { timeout_secs = 0 / 0 }, "timeout_secs must be a finite number" },
  { { timeout_secs = math.huge }, "timeout_secs must be a finite number" },
  { { timeout_secs = 1e300 }, "timeout_secs must be <= " },
  { { command_timeout_secs = 0 / 0 }, "command_timeout_secs must be a finite" },
  { { cpu = 0 / 0 }, "cpu must be a finite" },
  { { memory_mb = -math.huge }, "memory_mb must be a finite" },
  { { disk_mb = 0 }, "disk_mb must be > 0" },
  { { max_price = 0 / 0 }, "max_price must be a finite" },
  { { max_price = -1 }, "max_price must be >= 0" },
  { { gpu = 1.5 }, "gpu must be an integer" },
  { { isolation = "vm" }, "unknown isolation 'vm'" },
}

local function check_bad_options(backend, leftovers)
  for _, case in ipairs(BAD) do
    local before = leftovers()
    local kind, msg = fails(function() sbx.sandbox(backend, case[1]) end)
    assert.equal("ConfigError", kind, msg)
    assert.matches("sandbox: ", msg, 1, true)
    assert.is_truthy(msg:find(case[2], 1, true), "'" .. msg .. "' should name " .. case[2])
    assert.equal(before, leftovers(), "a sandbox was left behind by " .. msg)
    assert.same({}, owner.owned())
  end
end

describe("options are checked before create", function()
  it("on local: each bad value is a ConfigError naming the option, and no directory is left", function()
    check_bad_options("local", function() return #owner.sandbox_dirs("local") end)
    -- routed requests are checked the same way
    assert.equal("ConfigError", (fails(function() sbx.sandbox{ env_vars = { ["A=B"] = "1" } } end)))
    assert.equal("ConfigError", (fails(function() sbx.route{ timeout_secs = 0 / 0 } end)))
  end)

  it("on docker: no container is left", function()
    if not docker_up() then pending("docker or sbxlua-test:bookworm unavailable") return end
    local n = #BAD
    for i = 1, n do BAD[i][1].image = BAD[i][1].image or "sbxlua-test:bookworm" end
    check_bad_options("docker", containers)
    for i = 1, n do if BAD[i][1].image == "sbxlua-test:bookworm" then BAD[i][1].image = nil end end
  end)

  it("git_repo is cloned with '--' before it: a path repository still clones", function()
    local dir = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/val-git-" .. proc.getpid()
    assert.is_true(os.execute("mkdir -p " .. dir .. "/src && cd " .. dir .. "/src && git init -q"
      .. " && echo hi > f.txt && git add f.txt && git -c user.name=t -c user.email=t@t commit -qm x"))
    local sb <close> = sbx.sandbox("local", { git_repo = dir .. "/src" })
    assert.equal("hi\n", sb:read_file("src/f.txt"))
  end)
end)

describe("numeric arguments", function()
  local sb
  setup(function() sb = sbx.sandbox("local") end)
  teardown(function() sb:destroy() end)

  it("commands: timeout and max_output_bytes must be finite and in range", function()
    for _, o in ipairs{ { timeout = 0 / 0 }, { timeout = math.huge }, { timeout = -1 }, { timeout = 0 },
                        { max_output_bytes = 0 / 0 }, { max_output_bytes = math.huge },
                        { max_output_bytes = 1.5 }, { max_output_bytes = -1 } } do
      local k, msg = next(o)
      local kind, m = fails(function() sb:execute_command("true", {}, o) end)
      assert.equal("ConfigError", kind)
      assert.matches("^execute_command: " .. k, m)
      assert.equal("ConfigError", (fails(function() sb:spawn("true", {}, o) end)))
      local _ = msg
    end
    assert.equal(0, sb:execute_command("true", {}, { timeout = 5, max_output_bytes = 10 }).exit_code)
  end)

  it("read_file's max_bytes, p:kill, p:wait and sbx.sleep", function()
    sb:write_file("x", "hello")
    for _, v in ipairs{ 0 / 0, math.huge, -1, 1.5 } do
      local kind, m = fails(function() sb:read_file("x", { max_bytes = v }) end)
      assert.equal("ConfigError", kind)
      assert.matches("^read_file: max_bytes", m)
    end
    local p = sb:spawn("sleep", { "30" })
    for _, v in ipairs{ 999, -1, 0, 0 / 0, math.huge, 2.5 } do
      local kind, m = fails(function() p:kill(v) end)
      assert.equal("ConfigError", kind)
      assert.matches("^kill: signal", m)
    end
    for _, v in ipairs{ 0 / 0, math.huge, -1 } do
      local kind, m = fails(function() p:wait(v) end)
      assert.equal("ConfigError", kind)
      assert.matches("^wait: timeout", m)
    end
    for _, v in ipairs{ 0 / 0, math.huge, -1, "x" } do
      local kind, m = fails(function() sbx.sleep(v) end)
      assert.equal("ConfigError", kind)
      assert.matches("^sleep: seconds", m)
    end
    p:kill(15.0)
    local r = p:wait(10)
    assert.equal("SIGTERM", r.signal)
  end)

  it("on docker, a NaN timeout is refused before the command runs", function()
    if not docker_up() then pending("docker or sbxlua-test:bookworm unavailable") return end
    local d <close> = sbx.sandbox("docker", { image = "sbxlua-test:bookworm" })
    local kind, m = fails(function() d:execute_command("sleep", { "1" }, { timeout = 0 / 0 }) end)
    assert.equal("ConfigError", kind)
    assert.matches("timeout must be a finite number", m)
  end)
end)

describe("a pinned backend checks the routing options", function()
  local S = require "support"
  before_each(function() S.reset() end)
  after_each(function() S.reset() end)

  it("isolation, needs, region: FeatureNotSupportedError", function()
    local kind, m, err = fails(function() sbx.sandbox("local", { isolation = "container" }) end)
    assert.equal("FeatureNotSupportedError", kind)
    assert.equal("local", err.backend)
    assert.matches("isolation 'process' is below 'container'", m)
    kind, m = fails(function() sbx.sandbox("local", { needs = { "snapshot" } }) end)
    assert.equal("FeatureNotSupportedError", kind)
    assert.matches("lacks capability 'snapshot'", m)
    local f = S.fake("fr", { regions = { "eu" } })
    kind, m = fails(function() sbx.sandbox("fr", { region = "us" }) end)
    assert.equal("FeatureNotSupportedError", kind)
    assert.matches("no region 'us' %(eu%)", m)
    assert.equal(0, f.creates)
    local sb <close> = sbx.sandbox("fr", { region = "eu" })
    assert.equal(1, f.created)
  end)

  it("only, ignore, max_price and an unknown policy: ConfigError", function()
    local kind, m = fails(function() sbx.sandbox("local", { only = { "docker" } }) end)
    assert.equal("ConfigError", kind)
    assert.matches("not in 'only'", m)
    kind, m = fails(function() sbx.sandbox("local", { ignore = { "local" } }) end)
    assert.equal("ConfigError", kind)
    assert.matches("in 'ignore'", m)
    local f = S.fake("fp", { price = { per_hour = 0.5 } })
    kind, m = fails(function() sbx.sandbox("fp", { max_price = 0.1 }) end)
    assert.equal("ConfigError", kind)
    assert.matches("over max_price", m)
    kind, m = fails(function() sbx.sandbox("local", { policy = "nope" }) end)
    assert.equal("ConfigError", kind)
    assert.matches("nope", m)
    assert.equal(0, f.creates)
    local sb <close> = sbx.sandbox("local", { only = { "local" }, ignore = { "docker" }, isolation = "process",
                                             needs = { "exec" }, max_price = 1, policy = "cheapest" })
    assert.equal("local", sb.backend)
  end)
end)
