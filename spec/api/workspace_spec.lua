-- Workspaces (API.md "Workspace"): entries checked before create
-- (ConfigError), materialized in order (content, file, dir, git with ref and
-- depth, materialize), WorkspaceError with context.dest and the cause (the
-- sandbox destroyed at create), apply_workspace on a live sandbox, and the
-- files/git_repo shorthands. Every backend: spec/conformance/suite.lua.
local sbx = require "sbx"
local owner = require "sbx.state.owner"
local fs = require "sbx.fs"
local S = require "spec.support"

local caught = S.caught

local dir = assert(fs.mkdtemp("/tmp", "sbxws"))

-- A host git repository with two commits (tag v1 on the first, a branch
-- "feature"), and a bare copy of it.
local function sh(cmd) assert(os.execute(cmd), cmd) end
sh(table.concat({
  "cd " .. dir, "git init -q -b main src", "cd src", "git config user.email t@t", "git config user.name t",
  "echo one > f.txt", "git add f.txt", "git commit -qm one", "git tag v1",
  "git checkout -q -b feature", "echo feat > f.txt", "git commit -qam feat", "git checkout -q main",
  "echo two > f.txt", "git commit -qam two", "git rev-parse v1 > ../v1.sha",
  "cd ..", "git clone -q --bare src src.git",
  "printf '#!/bin/sh\\necho tool ran\\n' > tool.sh", "chmod 751 tool.sh",
  "mkdir -p tree/sub", "echo data > tree/sub/d.txt", "chmod 640 tree/sub/d.txt",
  "ln -s /etc/passwd tree/out" }, " && "))
local V1 = io.open(dir .. "/v1.sha"):read("l")

local function live_count() return #owner.owned() end

describe("workspace", function()
  teardown(function() fs.rmtree(dir) end)

  describe("checked before anything is created", function()
    local cases = {
      { "no dest", { { content = "x" } }, "has no dest" },
      { "a blank dest", { { dest = "  ", content = "x" } }, "dest is blank" },
      { "an empty dest", { { dest = "", content = "x" } }, "dest is blank" },
      { "a dest that climbs out", { { dest = "../up.txt", content = "x" } }, "leaves the working directory" },
      { "an absolute dest above /", { { dest = "/../x", content = "x" } }, "leaves the sandbox" },
      { "two sources", { { dest = "a", content = "x", file = dir .. "/tool.sh" } }, "two sources" },
      { "no source", { { dest = "a" } }, "has no source" },
      { "a missing host file", { { dest = "a", file = dir .. "/nope" } }, "No such file" },
      { "a host dir given as file", { { dest = "a", file = dir .. "/tree" } }, "not a regular file" },
      { "a missing host dir", { { dest = "a", dir = dir .. "/nope" } }, "No such file" },
      { "ref without git", { { dest = "a", content = "x", ref = "main" } }, "ref and depth go with git only" },
      { "depth 0", { { dest = "a", git = dir .. "/src", depth = 0 } }, "depth must be >= 1" },
      { "an option-like url", { { dest = "a", git = "--upload-pack=touch /tmp/x" } }, "repository URL" },
      { "an option-like ref", { { dest = "a", git = dir .. "/src", ref = "--evil" } }, "ref must be" },
      { "an unknown field", { { dest = "a", content = "x", mode = 7 } }, "unknown option 'mode'" },
      { "content into the working directory itself", { { dest = ".", content = "x" } }, "names a directory" },
      { "a file into a path ending in /", { { dest = "d/", file = dir .. "/tool.sh" } }, "names a directory" },
      { "a non-table entry", { "a.txt" }, "must be a table" },
    }
    for _, c in ipairs(cases) do
      it(c[1] .. " is a ConfigError, and no sandbox is made", function()
        local before = live_count()
        local e = caught(function() sbx.sandbox("local", { workspace = c[2] }) end)
        assert.equal("ConfigError", e.kind, tostring(e))
        assert.matches(c[3], e.message, 1, true)
        assert.equal(before, live_count())
      end)
    end

    it("a blank files destination is a ConfigError before create (was: 'write: : Is a directory' after)", function()
      local before = live_count()
      local e = caught(function() sbx.sandbox("local", { files = { [""] = "x" } }) end)
      assert.equal("ConfigError", e.kind, tostring(e))
      assert.matches("dest is blank", e.message)
      assert.equal(before, live_count())
    end)

    it("the entry is named in the message, and a routed create checks too", function()
      local e = caught(function()
        sbx.sandbox{ workspace = { { dest = "ok", content = "x" }, { dest = "bad", file = "/no/such" } } }
      end)
      assert.equal("ConfigError", e.kind)
      assert.matches("workspace entry 2", e.message)
      assert.equal("ConfigError", caught(function() sbx.sandbox("local", { workspace = "x" }) end).kind)
    end)
  end)

  it("materializes every kind of entry in list order, after git_repo and files", function()
    local order = {}
    local sb <close> = sbx.sandbox("local", {
      git_repo = dir .. "/src.git", files = { ["seen-by-materialize.txt"] = "from files" },
      workspace = {
        { dest = "repo", git = "file://" .. dir .. "/src.git", ref = "v1", depth = 1 },
        { dest = "repo2", git = dir .. "/src", ref = "feature" },
        { dest = "at-commit", git = dir .. "/src", ref = V1 },
        { dest = "bin/tool.sh", file = dir .. "/tool.sh" },
        { dest = "tools", dir = dir .. "/tree" },
        { dest = "task.txt", content = "solve it" },
        { dest = "out", materialize = function(s, dest)
            order[#order + 1] = s:read_file("seen-by-materialize.txt")
            order[#order + 1] = s:read_file("task.txt")     -- earlier entries are in place
            order[#order + 1] = s:read_file("src/f.txt")    -- and the git_repo shorthand's clone
            s:mkdir(dest)
          end },
      } })
    assert.equal("one\n", sb:read_file("repo/f.txt"))
    assert.equal("1\n", sb:execute_command("git", { "-C", "repo", "rev-list", "--count", "HEAD" }).stdout)
    assert.equal("feat\n", sb:read_file("repo2/f.txt"))
    assert.equal("one\n", sb:read_file("at-commit/f.txt"))
    assert.equal(V1 .. "\n", sb:execute_command("git", { "-C", "at-commit", "rev-parse", "HEAD" }).stdout)
    assert.equal("tool ran\n", sb:execute_command("bin/tool.sh", {}).stdout)
    assert.equal("751\n640\n", sb:execute_command("stat", { "-c", "%a", "bin/tool.sh", "tools/sub/d.txt" }).stdout)
    assert.is_nil(io.open(sb.workdir .. "/tools/out"))     -- the link out was not followed
    assert.equal("solve it", sb:read_file("task.txt"))
    assert.same({ "from files", "solve it", "two\n" }, order)
    assert.is_true(sb:list_files("out") ~= nil)
  end)

  it("a failing entry is a WorkspaceError with context.dest and the cause, and destroys the sandbox", function()
    local before = live_count()
    local e = caught(function()
      sbx.sandbox("local", { workspace = {
        { dest = "fine.txt", content = "x" },
        { dest = "repo", git = dir .. "/no-such-repo" } } })
    end)
    assert.equal("WorkspaceError", e.kind, tostring(e))
    assert.is_true(sbx.errors.is(e, "SandboxCreationError"))
    assert.equal("workspace_failed", e.code)
    assert.equal("repo", e.context.dest)
    assert.equal(2, e.context.index)
    assert.equal("git", e.context.source)
    assert.matches("git clone", e.message)
    assert.matches("no%-such%-repo", e.message)
    assert.equal(128, e.context.exit_code)
    assert.equal(before, live_count())

    -- a materialize function that raises: its error is the cause
    e = caught(function()
      sbx.sandbox("local", { workspace = { { dest = "x", materialize = function() error("custom broke") end } } })
    end)
    assert.equal("WorkspaceError", e.kind)
    assert.equal("x", e.context.dest)
    assert.matches("custom broke", tostring(e.cause))
    assert.equal(before, live_count())

    -- a typed error from the sandbox is the cause, kind and all
    e = caught(function()
      sbx.sandbox("local", { workspace = { { dest = "f", content = "file" }, { dest = "f/under", content = "x" } } })
    end)
    assert.equal("WorkspaceError", e.kind)
    assert.equal("f/under", e.context.dest)
    assert.is_true(sbx.errors.is(e.cause, "SandboxError"), tostring(e.cause))
    assert.equal(before, live_count())
  end)

  it("apply_workspace on a live sandbox returns the count; failures leave the sandbox alive", function()
    local sb <close> = sbx.sandbox("local")
    assert.equal(2, sb:apply_workspace{ { dest = "extra.txt", content = "later" },
                                        { dest = "r", git = dir .. "/src" } })
    assert.equal("later", sb:read_file("extra.txt"))
    assert.equal("two\n", sb:read_file("r/f.txt"))
    assert.equal(0, sb:apply_workspace{})
    local e = caught(function() sb:apply_workspace{ { dest = "", content = "x" } } end)
    assert.equal("ConfigError", e.kind)
    assert.matches("apply_workspace", e.message)
    e = caught(function() sb:apply_workspace{ { dest = "r", git = dir .. "/src" } } end)   -- exists already
    assert.equal("WorkspaceError", e.kind)
    assert.equal("r", e.context.dest)
    assert.is_true(sb:is_alive())
    sb:destroy()
    assert.equal("SandboxNotFoundError", caught(function() sb:apply_workspace{} end).kind)
  end)

  it("a dest that starts with '-' is a path, never an option of git", function()
    local sb <close> = sbx.sandbox("local")
    assert.equal(1, sb:apply_workspace{ { dest = "-repo", git = dir .. "/src", depth = 1 } })
    assert.equal("two\n", sb:read_file("-repo/f.txt"))
  end)

  it("a failing preset setup command is a WorkspaceError (a SandboxCreationError) with the command", function()
    sbx.register_preset{ name = "spec-ws-fail", setup_commands = { "echo before; exit 4" } }
    local before = live_count()
    local e = caught(function() sbx.sandbox("local", { preset = "spec-ws-fail" }) end)
    assert.equal("WorkspaceError", e.kind)
    assert.is_true(sbx.errors.is(e, "SandboxCreationError"))
    assert.equal(4, e.context.exit_code)
    assert.equal("echo before; exit 4", e.context.command)
    assert.equal(before, live_count())
  end)
end)
