-- Agents on every available backend: the four input modes (quotes, $(),
-- newlines, 300 KB), external runners with granted capabilities only,
-- patch apply and reject.
local sbx = require "sbx"
local docker = require "sbx.providers.builtin.docker"
local S = require "spec.support"

local BACKENDS = { { "local", {} } }
if require("sbx.providers.builtin.bwrap").available() then BACKENDS[#BACKENDS + 1] = { "bwrap", {} } end
if docker.available() then
  BACKENDS[#BACKENDS + 1] = { "docker", { image = S.IMAGE } }
end

local kind_of = S.kind_of

local TRICKY = "say \"hi\" and 'bye'; $(rm -rf /) `id` \\ \nsecond line\n\ttab"
local BIG = string.rep("0123456789abcdef", 300 * 1024 // 16)   -- 300 KB

for _, b in ipairs(BACKENDS) do
  describe("agents on " .. b[1], function()
    local sb
    before_each(function() sb = sbx.sandbox(b[1], b[2]) end)
    after_each(function() sb:destroy() end)

    it("argv mode passes the prompt as one exact argument", function()
      local a = sb:agent(sbx.agent.inside{ name = "echo", command = { "printf", "%s" }, input_mode = "argv" })
      assert.equal(TRICKY, a:run(TRICKY).stdout)
      local kind, err = kind_of(function() a:run(BIG) end)
      assert.equal("ConfigError", kind)
      assert.matches("use input_mode", err.message)
    end)

    it("stdin mode feeds the prompt on stdin, any size", function()
      local a = sb:agent(sbx.agent.inside{ name = "cat", command = { "cat" }, input_mode = "stdin" })
      assert.equal(TRICKY, a:run(TRICKY).stdout)
      assert.equal(#BIG, #a:run(BIG).stdout)
    end)

    it("file mode writes the prompt to input_path and passes the path", function()
      local a = sb:agent(sbx.agent.inside{ name = "wc", command = { "sh", "-c", 'printf "%s:" "$1"; wc -c < "$1"', "agent" },
                                           input_mode = "file", input_path = "prompt.txt" })
      local r = a:run(BIG)
      -- the absolute path the agent can open (on local: the host path in the sandbox directory)
      assert.equal(sb.workdir .. "/prompt.txt:" .. #BIG .. "\n", r.stdout)
      assert.equal(BIG, sb:read_file("prompt.txt"))
      a:run(TRICKY)
      assert.equal(TRICKY, sb:read_file("prompt.txt"))
    end)

    it("the default input_mode is the peer's: stdin", function()
      assert.equal("stdin", sbx.agent.inside{ name = "cat", command = { "cat" } }.input_mode)
      local a = sb:agent(sbx.agent.inside{ name = "cat", command = { "cat" } })
      assert.equal(TRICKY, a:run(TRICKY).stdout)
      assert.equal(#BIG, #a:run(BIG).stdout)
    end)

    it("none mode runs the command alone, with cwd and env", function()
      sb:mkdir("work")
      local a = sb:agent(sbx.agent.inside{ name = "env", command = { "sh", "-c", "echo $AGENT_MODE $(basename $PWD)" },
                                           input_mode = "none", cwd = "work", env = { AGENT_MODE = "quiet" } })
      assert.equal("quiet work\n", a:run("ignored").stdout)
    end)

    it("external runners get only what was granted", function()
      local seen
      local a = sb:agent(sbx.agent.external{ name = "eval", capabilities = { "shell", "files" },
        runner = function(ctx, prompt)
          ctx:write_file("t.txt", prompt)
          seen = ctx:shell("cat", { "t.txt" }).stdout
          local names = {}
          for _, e in ipairs(ctx:list_files(".")) do names[#names + 1] = e.name end
          local ok, err = pcall(function() return ctx:patch("x") end)
          return { ok = ok, err = err, names = names, read = ctx:read_file("t.txt") }
        end })
      local out = a:run("the prompt")
      assert.equal("the prompt", seen)
      assert.equal("the prompt", out.read)
      assert.is_false(out.ok)
      assert.equal("FeatureNotSupportedError", out.err.kind)
      local tools = sb:agent_tools{ capabilities = { "files" } }
      assert.equal("FeatureNotSupportedError", kind_of(function() tools:shell("true") end))
      assert.equal("FeatureNotSupportedError", kind_of(function() return tools.destroy() end))
      assert.is_false(getmetatable(tools))    -- no way back to the sandbox
      assert.equal("ConfigError", kind_of(function() sb:agent_tools{ capabilities = { "root" } } end))
    end)

    it("patch applies a unified diff and rejects what does not fit, writing nothing", function()
      sb:write_file("src/app.py", "def greet():\n    return 'hello'\n\nprint(greet())\n")
      sb:write_file("src/keep.txt", "one\ntwo\n")
      local tools = sb:agent_tools{ capabilities = { "patch", "files", "shell" } }
      local diff = table.concat({
        "--- a/app.py", "+++ b/app.py", "@@ -1,4 +1,4 @@", " def greet():",
        "-    return 'hello'", "+    return 'hello, world'", " ", " print(greet())",
        "--- /dev/null", "+++ b/new.txt", "@@ -0,0 +1,2 @@", "+fresh", "+file", "" }, "\n")
      local r = tools:patch(diff, { cwd = "src" })
      assert.equal(2, #r.files)
      assert.equal("hello, world\n", tools:shell("python3", { "src/app.py" }).stdout)
      assert.equal("fresh\nfile\n", sb:read_file("src/new.txt"))
      local bad = table.concat({
        "--- a/keep.txt", "+++ b/keep.txt", "@@ -1,2 +1,2 @@", " one", "-three", "+four",
        "--- a/app.py", "+++ b/app.py", "@@ -1,1 +1,1 @@", "-def greet():", "+def hi():", "" }, "\n")
      local kind, err = kind_of(function() tools:patch(bad, { cwd = "src" }) end)
      assert.equal("SandboxExecutionError", kind)
      assert.matches("keep%.txt: hunk 1", err.message)
      assert.matches("def greet", sb:read_file("src/app.py"))    -- nothing applied
    end)

    it("rejects bad specs", function()
      assert.equal("ConfigError", kind_of(function() sbx.agent.inside{ name = "x", command = {} } end))
      assert.equal("ConfigError", kind_of(function() sbx.agent.inside{ name = "x", command = { "a" }, input_mode = "tcp" } end))
      assert.equal("ConfigError", kind_of(function() sbx.agent.external{ name = "x" } end))
      assert.equal("ConfigError", kind_of(function() sb:agent() end))
      assert.equal("ConfigError", kind_of(function() sb:agent({ kind = "inside" }) end))
    end)
  end)
end
