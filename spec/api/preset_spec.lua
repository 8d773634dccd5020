-- Presets: built-ins, registration, explicit options win, setup commands
-- (run, skipped on the preset's own image, failing), per-backend overrides,
-- files in SBX_PRESET_PATH with hot reload, and the preset's agent.
local sbx = require "sbx"
local presets = require "sbx.sandbox.presets"
local fs = require "sbx.fs"
local docker = require "sbx.providers.builtin.docker"
local S = require "spec.support"
local IMAGE = S.IMAGE

local kind_of = S.kind_of

describe("presets", function()
  it("ships codex and claude-code like the peer (2 GiB, 30 min, the CLI), plus python and node", function()
    local all = sbx.presets()
    for _, n in ipairs{ "codex", "claude-code", "python", "node" } do assert.is_table(all[n], n) end
    assert.equal(2048, all.codex.memory_mb)
    assert.equal(1800, all.codex.timeout_secs)
    assert.same({ "npm install -g @openai/codex" }, all.codex.setup_commands)
    assert.same({ "npm install -g @anthropic-ai/claude-code" }, all["claude-code"].setup_commands)
    assert.equal("codex", all.codex.agent.command[1])
  end)

  it("ships claude-code-codex as the peer does: both CLIs, Claude Code as its agent, codex by name", function()
    local p = sbx.presets()["claude-code-codex"]
    assert.is_table(p)
    assert.equal(2048, p.memory_mb)
    assert.equal(1800, p.timeout_secs)
    assert.equal("sbxlua/claude-code-codex:1", p.image)
    assert.same({ "npm install -g @anthropic-ai/claude-code", "npm install -g @openai/codex" }, p.setup_commands)
    assert.equal("claude", p.agent.command[1])
    assert.equal("stdin", p.agent.input_mode)
    -- on a backend without its image the setup commands install both CLIs
    assert.same(p.setup_commands, presets.setup_for(p, "local", nil, false))
    assert.same({}, presets.setup_for(p, "docker", "sbxlua/claude-code-codex:1", true))
    -- its sandbox can run either agent: its own, or codex's spec by name
    sbx.register_preset{ name = "spec-both", setup_commands = {},
                         agent = { command = { "printf", "%s" }, input_mode = "argv" } }
    local sb <close> = sbx.sandbox("local", { preset = "spec-both" })
    assert.equal("claude-code", sb:agent("claude-code").name)
    assert.equal("codex", sb:agent("codex").name)
  end)

  it("an unknown preset is a ConfigError listing the known ones", function()
    local kind, err = kind_of(function() sbx.sandbox("local", { preset = "nope" }) end)
    assert.equal("ConfigError", kind)
    assert.matches("unknown preset 'nope'", err.message)
    assert.matches("codex", err.message)
  end)

  it("registers presets; explicit options override preset values", function()
    sbx.register_preset{ name = "spec-env", description = "test", timeout_secs = 77,
                         env_vars = { FROM = "preset", KEEP = "yes" }, setup_commands = { "echo set > marker" } }
    local sb <close> = sbx.sandbox("local", { preset = "spec-env", env_vars = { FROM = "explicit" } })
    assert.equal("explicit yes\n", sb:execute_command("sh", { "-c", "echo $FROM $KEEP" }).stdout)
    assert.equal("set\n", sb:read_file("marker"))   -- setup ran after files/git
    assert.equal("ConfigError", kind_of(function() sbx.register_preset{ name = "bad name!" } end))
    assert.equal("ConfigError", kind_of(function() sbx.register_preset{ name = "x", colour = "red" } end))
  end)

  it("a preset's image is a preference: local runs it without the image, with the setup commands", function()
    local sb <close> = sbx.sandbox("local", { preset = "python" })
    assert.equal("local", sb.backend)
  end)

  it("a failing setup command destroys the sandbox and raises with its output", function()
    sbx.register_preset{ name = "spec-fail", setup_commands = { "echo about to fail; echo oops >&2; exit 3" } }
    local before = #require("sbx.state.owner").owned()
    local kind, err = kind_of(function() sbx.sandbox("local", { preset = "spec-fail" }) end)
    assert.equal("WorkspaceError", kind)
    assert.is_true(sbx.errors.is(err, "SandboxCreationError"))
    assert.matches("exit 3", err.message)
    assert.matches("about to fail", err.message)
    assert.matches("oops", err.message)
    assert.equal(before, #require("sbx.state.owner").owned())
  end)

  it("per-backend overrides apply on their backend", function()
    sbx.register_preset{ name = "spec-over", env_vars = { WHERE = "base" },
                         backends = { ["local"] = { env_vars = { WHERE = "local-override" } } } }
    local sb <close> = sbx.sandbox("local", { preset = "spec-over" })
    assert.equal("local-override\n", sb:execute_command("sh", { "-c", "echo $WHERE" }).stdout)
  end)

  it("files in SBX_PRESET_PATH-like paths load sandboxed, reload on change, keep the last good version", function()
    local dir = assert(fs.mkdtemp("/tmp", "sbxpresets"))
    local root = assert(fs.open_root(dir))
    local orig = presets.path
    presets.path = function() return { dir } end
    root:write("spec-file.lua", 'return { name = "spec-file", env_vars = { V = "one" } }')
    assert.equal("one", presets.get("spec-file").env_vars.V)
    require("sbx.loop").sleep(1.1)   -- a new mtime
    root:write("spec-file.lua", 'return { name = "spec-file", env_vars = { V = "two!" } }')
    assert.equal("two!", presets.get("spec-file").env_vars.V)
    require("sbx.loop").sleep(1.1)
    root:write("spec-file.lua", 'return { name = "spec-file", env_vars = { V = ') -- broken
    assert.equal("two!", presets.get("spec-file").env_vars.V)
    root:write("hostile.lua", 'while true do end')
    local kind, err = kind_of(function() presets.get("hostile") end)
    assert.equal("ConfigError", kind)
    assert.matches("hostile", err.message)
    root:write("escape.lua", 'return { name = "escape", description = io.open("/etc/passwd"):read("a") }')
    kind, err = kind_of(function() presets.get("escape") end)
    assert.equal("ConfigError", kind)
    assert.matches("escape%.lua:1", err.message)
    presets.path = orig
    root:close()
    fs.rmtree(dir)
  end)

  it("sb:agent() uses the preset's agent spec", function()
    sbx.register_preset{ name = "spec-agent",
      agent = { command = { "sh", "-c", 'printf "agent got: %s" "$1"', "a" }, input_mode = "argv" } }
    local sb <close> = sbx.sandbox("local", { preset = "spec-agent" })
    assert.equal("agent got: hi", sb:agent():run("hi").stdout)
    assert.equal("ConfigError", kind_of(function() sbx.sandbox("local"):agent() end))
  end)

  local image_exists = S.image_present

  if docker.available() and image_exists("sbxlua/codex:1") then
    it("the codex preset's image has the CLI its agent spec calls", function()
      local sb <close> = sbx.sandbox("docker", { preset = "codex" })
      local v = sb:execute_command("codex", { "--version" })
      assert.equal(0, v.exit_code, v.stderr)
      assert.matches("^codex%-cli %d+%.%d+", v.stdout)
      -- the flags of the spec exist in this CLI (a run needs credentials)
      local help = sb:execute_command("codex", { "exec", "--help" }).stdout
      for _, flag in ipairs{ "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox" } do
        assert.is_truthy(help:find(flag, 1, true), flag)
      end
      assert.equal("codex", sb:agent().name)
    end)
  elseif os.getenv("SBX_REQUIRE_DOCKER") == "1" then
    it("the codex preset's image was built", function()
      assert.is_true(image_exists("sbxlua/codex:1"), "images/build-presets.sh codex did not run")
    end)
  end

  if docker.available() then
    it("on the preset's own image, setup commands are skipped", function()
      sbx.register_preset{ name = "spec-image", image = IMAGE, setup_commands = { "exit 1" } }
      local sb <close> = sbx.sandbox("docker", { preset = "spec-image" })
      assert.equal("ok\n", sb:execute_command("echo ok").stdout)
      -- another image: the setup runs (and here fails)
      sbx.register_preset{ name = "spec-image2", image = "some/other:image",
                           setup_commands = { "echo ran > /tmp/setup-ran" } }
      local sb2 <close> = sbx.sandbox("docker", { preset = "spec-image2", image = IMAGE })
      assert.equal("ran\n", sb2:read_file("/tmp/setup-ran"))
    end)
  end
end)
