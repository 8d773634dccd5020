-- The examples in examples/ run as documented (on the local backend).
local S = require "spec.support"

local run = S.home("examples").run

describe("examples", function()
  it("hello.lua", function()
    local r = run({ "examples/hello.lua" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("hello from a sandbox\n", r.stdout)
    assert.matches("\n42\n", r.stdout)
  end)
  it("eval.lua over 10 tasks", function()
    local r = run({ "examples/eval.lua", "10", "local" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("10/10 tasks passed", r.stdout)
  end)
  it("codex_agent.lua explains itself without credentials", function()
    local r = run({ "examples/codex_agent.lua" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("needs an OpenAI API key", r.stdout)
  end)
  it("external_agent.lua", function()
    local r = run({ "examples/external_agent.lua", "local" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("test exit 1 before the patch, 0 after %(ok%)", r.stdout)
  end)
end)
