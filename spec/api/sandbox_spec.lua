-- The facade's contract: options, typed errors, routing basics, clients,
-- resume, parallel semantics.
local sbx = require "sbx"
local loop = require "sbx.loop"
local owner = require "sbx.state.owner"
local S = require "spec.support"

local kind_of = S.kind_of

describe("sbx.sandbox options", function()
  it("rejects unknown options with a suggestion", function()
    local kind, err = kind_of(function() sbx.sandbox("local", { imgae = "x" }) end)
    assert.equal("ConfigError", kind)
    assert.matches("unknown option 'imgae'", err.message)
    assert.matches("did you mean 'image'", err.message)
  end)
  it("rejects wrong types naming the option", function()
    local kind, err = kind_of(function() sbx.sandbox("local", { env_vars = "A=1" }) end)
    assert.equal("ConfigError", kind)
    assert.matches("env_vars", err.message)
    assert.equal("ConfigError", kind_of(function() sbx.sandbox("local", { timeout_secs = -5 }) end))
    assert.equal("ConfigError", kind_of(function() sbx.sandbox(42) end))
    assert.equal("ConfigError", kind_of(function() sbx.sandbox("local", { env_vars = { ["A=B"] = "1" } }) end))
  end)
  it("names the known backends for an unknown one", function()
    local kind, err = kind_of(function() sbx.sandbox("dockr") end)
    assert.equal("ConfigError", kind)
    assert.matches("unknown backend 'dockr'", err.message)
    assert.matches("local", err.message)
  end)
  it("never ignores an option the backend cannot honour", function()
    for _, o in ipairs{ { image = "python:3.12-slim" }, { cpu = 2 }, { memory_mb = 512 },
                        { allow_internet = false }, { snapshot_id = "x" }, { gpu = 1 } } do
      local kind, err = kind_of(function() sbx.sandbox("local", o) end)
      assert.equal("FeatureNotSupportedError", kind)
      assert.equal("local", err.backend)
    end
    local sb <close> = sbx.sandbox("local", { allow_internet = true })
    assert.is_true(sb:is_alive())
  end)
  it("rejects lifetimes and resources that are not > 0 on every backend, naming the option", function()
    for _, o in ipairs{ { timeout_secs = 0 }, { command_timeout_secs = -1 }, { cpu = 0 },
                        { memory_mb = -512 }, { cpu = 0 / 0 } } do
      for _, b in ipairs{ "local", "docker", "bwrap" } do
        local kind, err = kind_of(function() sbx.sandbox(b, o) end)
        assert.equal("ConfigError", kind)
        assert.matches((next(o)) .. " must be [>a] [0f]", err.message)
      end
    end
  end)

  it("errors are typed tables with a readable tostring and the hierarchy", function()
    local _, err = kind_of(function() sbx.sandbox("local", { cpu = 2 }) end)
    assert.matches("^FeatureNotSupportedError: ", tostring(err))
    assert.is_true(sbx.errors.is(err, "SandboxError"))
    assert.is_false(sbx.errors.is(err, "ConfigError"))
    local nr = sbx.errors.new("NoRouteError", "x")
    assert.is_true(sbx.errors.is(nr, "SandboxCreationError"))
    assert.is_true(sbx.errors.is(nr, "SandboxError"))
    assert.is_false(sbx.errors.is("a string", "SandboxError"))
  end)
  it("a backend this build lacks is BackendNotInstalledError", function()
    assert.equal("BackendNotInstalledError", kind_of(function() sbx.sandbox("modal") end))
  end)
  it("snapshot is FeatureNotSupportedError on local", function()
    local sb <close> = sbx.sandbox("local")
    assert.equal("FeatureNotSupportedError", kind_of(function() sb:snapshot() end))
  end)
end)

describe("routing without a backend", function()
  it("picks local by default", function()
    local sb <close> = sbx.sandbox()
    assert.equal("local", sb.backend)
  end)
  it("raises NoRouteError explaining each skip", function()
    local kind, err = kind_of(function() sbx.sandbox{ needs = { "gpu" } } end)
    assert.equal("NoRouteError", kind)
    assert.matches("local: lacks capability 'gpu'", err.message)
    assert.matches("docker: ", err.message)
    assert.matches("modal: ", err.message)        -- unavailable (no credentials here), or no gpu
    kind, err = kind_of(function() sbx.sandbox{ isolation = "gvisor" } end)
    assert.equal("NoRouteError", kind)
    assert.matches("isolation 'process' is below 'gvisor'", err.message)
    kind = kind_of(function() sbx.sandbox{ only = { "local" }, ignore = { "local" } } end)
    assert.equal("NoRouteError", kind)
    kind = kind_of(function() sbx.sandbox{ isolation = "bogus" } end)
    assert.equal("ConfigError", kind)
  end)
  it("uses a policy function's order, and survives a broken one", function()
    local sb <close> = sbx.sandbox{ policy = function(req, cands) return { order = cands } end }
    assert.equal("local", sb.backend)
    local sb2 <close> = sbx.sandbox{ policy = function() error("policy bug") end }
    assert.equal("local", sb2.backend)
  end)
end)

describe("files and env_vars at create", function()
  it("writes files and sets env_vars for every command", function()
    local sb <close> = sbx.sandbox("local", { files = { ["a/b.txt"] = "B", ["/c.txt"] = "C" },
                                             env_vars = { GREETING = "hello", N = 3 } })
    assert.equal("B", sb:read_file("a/b.txt"))
    assert.equal("C", sb:read_file("c.txt"))
    assert.equal("hello 3\n", sb:execute_command("sh", { "-c", "echo $GREETING $N" }).stdout)
  end)
  it("one command's env stays with it, and session_state's env_vars is a copy", function()
    -- (the environment list without opts.env is made once per sandbox)
    local sb <close> = sbx.sandbox("local", { env_vars = { GREETING = "hello" } })
    local echo = { "-c", "echo $GREETING $EXTRA" }
    assert.equal("hello\n", sb:execute_command("sh", echo).stdout)
    assert.equal("hi x\n", sb:execute_command("sh", echo, { env = { GREETING = "hi", EXTRA = "x" } }).stdout)
    assert.equal("hello\n", sb:execute_command("sh", echo).stdout)
    sb:session_state().env_vars.GREETING = "changed"
    assert.equal("hello\n", sb:execute_command("sh", echo).stdout)
    assert.equal("hello", sb:session_state().env_vars.GREETING)
    assert.equal("hello\n", sb:spawn("sh", echo):wait().stdout)
  end)
  it("clones a git repository at a ref, and fails cleanly on a bad one", function()
    local repo = os.tmpname() .. "-repo"
    assert(os.execute(table.concat({
      "git init -q -b main " .. repo, "cd " .. repo, "git config user.email t@t", "git config user.name t",
      "echo one > f.txt", "git add f.txt", "git commit -qm one", "git checkout -q -b feature",
      "echo two > f.txt", "git commit -qam two", "git checkout -q main" }, " && ")))
    local sb <close> = sbx.sandbox("local", { git_repo = repo, git_ref = "feature",
                                             files = { ["extra.txt"] = "x" } })
    local name = repo:match("[^/]+$")
    assert.equal("two\n", sb:read_file(name .. "/f.txt"))
    local before = #owner.owned()
    local kind, err = kind_of(function() sbx.sandbox("local", { git_repo = repo .. "-missing" }) end)
    assert.equal("WorkspaceError", kind)      -- a SandboxCreationError
    assert.is_true(sbx.errors.is(err, "SandboxCreationError"))
    assert.equal(name .. "-missing", err.context.dest)
    assert.matches("git clone", err.message)
    assert.equal(before, #owner.owned())
    os.execute("rm -rf " .. repo)
  end)
end)

describe("workdir", function()
  it("uses an existing host directory and never deletes it", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir))
    local f = io.open(dir .. "/mine.txt", "w") f:write("user data") f:close()
    do
      local sb <close> = sbx.sandbox("local", { workdir = dir })
      assert.equal("user data", sb:read_file("mine.txt"))
      assert.equal(dir .. "\n", sb:execute_command("pwd").stdout)
      sb:write_file("made.txt", "x")
    end
    local g = io.open(dir .. "/made.txt")
    assert.is_not_nil(g)
    g:close()
    os.execute("rm -rf " .. dir)
  end)
  it("a missing workdir is a ConfigError", function()
    assert.equal("ConfigError", kind_of(function() sbx.sandbox("local", { workdir = "/no/such/dir" }) end))
  end)
end)

describe("clients and resume", function()
  it("a client creates on its backend and refuses foreign state", function()
    local c = sbx.client("local", { env_vars = { FROM = "client" } })
    local sb <close> = c:create{}
    assert.equal("client\n", sb:execute_command("sh", { "-c", "echo $FROM" }).stdout)
    local again = c:resume(sb:session_state())
    assert.equal(sb.id, again.id)
    assert.equal("ConfigError", kind_of(function() c:resume({ backend = "docker", id = "x", state = {} }) end))
    assert.equal("ConfigError", kind_of(function() sbx.resume("nonsense") end))
  end)
  it("resuming a destroyed sandbox is SandboxNotFoundError", function()
    local sb = sbx.sandbox("local")
    local st = sb:session_state()
    sb:destroy()
    assert.equal("SandboxNotFoundError", kind_of(function() sbx.resume(st) end))
  end)
  -- A sandbox on a user's workdir whose directory is gone: SandboxNotFoundError
  -- at resume on local and bwrap alike (bwrap used to resume, and every later
  -- call then named the host directory).
  for _, backend in ipairs{ "local", "bwrap" } do
    local available = require("sbx.providers.builtin." .. backend).available()
    local test = available and it or pending
    test(backend .. ": resuming a sandbox whose working directory is gone is SandboxNotFoundError", function()
      local dir = assert(require("sbx.fs").mkdtemp("/tmp", "sbxgone"))
      local sb <close> = sbx.sandbox(backend, { workdir = dir })
      sb:write_file("a.txt", "x")
      local st = sb:session_state()
      assert.equal("x", sbx.resume(st):read_file("a.txt"))
      assert(require("sbx.fs").rmtree(dir))
      local kind, err = kind_of(function() sbx.resume(st) end)
      assert.equal("SandboxNotFoundError", kind)
      assert.matches("is gone", err.message)
    end)
  end
  it("session_state is JSON-safe", function()
    local sb <close> = sbx.sandbox("local")
    local st = sbx.json.decode(sbx.json.encode(sb:session_state()))
    assert.equal("local", st.backend)
    assert.equal(sb.id, st.id)
  end)
end)

describe("sbx.parallel", function()
  it("keeps input order and honours concurrency", function()
    local running, peak = 0, 0
    local res = sbx.parallel({ 5, 4, 3, 2, 1 }, function(n)
      running = running + 1
      peak = math.max(peak, running)
      sbx.sleep(n / 100)
      running = running - 1
      return n * 10
    end, { concurrency = 2 })
    assert.same({ 50, 40, 30, 20, 10 }, res)
    assert.equal(2, peak)
  end)
  it("cancels the rest on an error, destroys their sandboxes, and re-raises", function()
    local made = {}
    local t0 = loop.now()
    local kind, err = kind_of(function()
      sbx.parallel({ 1, 2, 3 }, function(n)
        local sb = sbx.sandbox("local")
        made[#made + 1] = sb
        if n == 2 then sbx.sleep(0.05) error("item two failed") end
        sb:execute_command("sleep", { "30" })
      end)
    end)
    assert.matches("item two failed", tostring(err))
    assert.is_true(loop.now() - t0 < 5)
    assert.equal(3, #made)
    for _, sb in ipairs(made) do assert.is_false(sb:is_alive()) end
  end)
  it("collect_errors returns results and errors", function()
    local res, errs = sbx.parallel({ 1, 2, 3 }, function(n)
      if n == 2 then error("two") end
      return n
    end, { collect_errors = true })
    assert.equal(1, res[1])
    assert.is_nil(res[2])
    assert.equal(3, res[3])
    assert.matches("two", errs[2])
  end)
  it("returns an empty list for no items", function()
    assert.same({}, sbx.parallel({}, function() error("never called") end))
  end)
  it("rejects bad arguments", function()
    assert.equal("ConfigError", kind_of(function() sbx.parallel(nil, print) end))
    assert.equal("ConfigError", kind_of(function() sbx.parallel({}, print, { concurrency = 0 }) end))
    assert.equal("ConfigError", kind_of(function() sbx.parallel({}, print, { concurency = 2 }) end))
  end)
end)
