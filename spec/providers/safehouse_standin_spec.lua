-- spec/support/safehouse, the stand-in for Agent Safehouse v0.11.1 that
-- safehouse_spec.lua and the conformance row run the safehouse provider
-- through, kept honest on its own: the real one's grammar (options with a
-- separate or inline value, unknown options refused before --, NAME=VALUE
-- tokens up to the command), its launch environment (sanitized, --env,
-- --env-pass, the K=V tokens last) and its refusals, with their messages.
local proc = require "sbx.proc"
local S = require "spec.support"

local SOURCE = S.SOURCE:sub(1, 1) == "/" and S.SOURCE or (os.getenv("PWD") .. "/" .. S.SOURCE)
local STANDIN = SOURCE .. "/spec/support/safehouse"
local TOOLS_PATH = "PATH=/usr/bin:/bin:/usr/sbin:/sbin"

local function set_of(list)
  local out = {}
  for _, kv in ipairs(list) do
    local k, v = kv:match("^([^=]*)=(.*)$")
    out[k] = v
  end
  return out
end

describe("the safehouse stand-in (spec/support/safehouse) keeps v0.11.1's grammar", function()
  local function run(args, env)
    local argv = { STANDIN }
    for _, a in ipairs(args) do argv[#argv + 1] = a end
    local p = assert(proc.spawn{ argv = argv, env = env or { TOOLS_PATH, "HOME=/tmp" }, cwd = "/tmp", timeout = 30 })
    local r = p:wait()
    p:close()
    return r
  end

  it("refuses an unknown option before --, as the real one does", function()
    local r = run{ "--bogus", "--", "true" }
    assert.equal(1, r.exit_code)
    assert.equal("Unknown option: --bogus\nIf this is a command argument, pass it after --\n", r.stderr)
    r = run{ "--workdir" }
    assert.equal("Missing value for --workdir\n", r.stderr)
    r = run{ "--trust-workdir-config=maybe", "--", "true" }
    assert.matches("^Invalid value for %-%-trust%-workdir%-config: maybe", r.stderr)
    r = run{ "--", "A=1" }
    assert.equal("Wrapped command env assignments require a command after NAME=VALUE tokens.\n", r.stderr)
    r = run{ "--env", "--env-pass=X", "--", "true" }
    assert.equal("--env-pass cannot be combined with --env.\n", r.stderr)
  end)

  it("takes options with separate or inline values, then NAME=VALUE tokens up to the command", function()
    local r = run{ "--workdir", "/tmp", "--enable=docker", "--add-dirs-ro=/usr", "--explain", "--",
                   "A=1", "B=x=y", "printenv", "A", "B" }
    assert.equal("1\nx=y\n", r.stdout, r.stderr)
    assert.matches("workdir /tmp", r.stderr, 1, true)
    -- after `--` an option-looking word is the command's; before it, the first word starts the command
    r = run{ "--", "echo", "--bogus" }
    assert.equal("--bogus\n", r.stdout)
    r = run{ "echo", "A=1", "hi" }
    assert.equal("A=1 hi\n", r.stdout)
  end)

  it("builds the environment from its own: sanitized by default, all of it with --env, named with --env-pass", function()
    local env = { TOOLS_PATH, "HOME=/tmp", "SECRET=s1", "LANG=C" }
    local r = run({ "--", "env" }, env)
    local lines = {}
    for l in r.stdout:gmatch("[^\n]+") do lines[#lines + 1] = l end
    local got = set_of(lines)
    assert.is_nil(got.SECRET)
    assert.equal("C", got.LANG)
    assert.equal("agent-safehouse", got.APP_SANDBOX_CONTAINER_ID)
    assert.equal("/tmp", got.PWD)
    r = run({ "--env", "--", "printenv", "SECRET" }, env)
    assert.equal("s1\n", r.stdout)
    r = run({ "--env-pass=SECRET", "--", "printenv", "SECRET" }, env)
    assert.equal("s1\n", r.stdout)
    r = run({ "--", "SECRET=mine", "printenv", "SECRET" }, env)
    assert.equal("mine\n", r.stdout)
  end)

  it("exits with the command's status, and refuses without HOME", function()
    assert.equal(7, run{ "--", "sh", "-c", "exit 7" }.exit_code)
    local r = run({ "--", "true" }, { TOOLS_PATH })
    assert.equal(1, r.exit_code)
    assert.equal("HOME is not set; set HOME in the environment before running this script.\n", r.stderr)
  end)
end)
