-- The stand-in Modal server kept honest by a second official client: pip's
-- `modal` (Python, pinned) runs a create / exec / terminate against it
-- (spec/providers/modal/client.py). The venv is made once per build
-- directory (build/modal-venv); CI makes it fresh.
local S = require "spec.support"
local M = require "spec.support.modal"
local proc = require "sbx.proc"
local fs = require "sbx.fs"

if not S.gate("modal", "the official Python modal client against the stand-in") then return end

M.PYTHON_CLIENT = "modal==1.6.4"
local VENV = M.BUILD .. "/modal-venv"

local function run(argv, env, timeout)
  local p = assert(proc.spawn{ argv = argv, env = env, timeout = timeout or 300, max_output = 1 << 20 })
  local r = p:wait()
  p:close()
  return r
end

-- The venv with the pinned client: made when missing or holding another version.
local function python()
  local py = VENV .. "/bin/python"
  local have = fs.stat_host(py) and run({ py, "-c", "import modal; print(modal.__version__)" }, { S.PATH })
  if have and have.exit_code == 0 and have.stdout == M.PYTHON_CLIENT:match("==(.*)") .. "\n" then return py end
  fs.rmtree(VENV)
  local r = run({ "python3", "-m", "venv", VENV }, { S.PATH })
  assert(r.exit_code == 0, "python3 -m venv failed (python3-venv installed?): " .. r.stderr)
  r = run({ VENV .. "/bin/pip", "install", "-q", "--disable-pip-version-check", M.PYTHON_CLIENT },
          { S.PATH, "HOME=" .. VENV }, 600)
  assert(r.exit_code == 0, "pip install " .. M.PYTHON_CLIENT .. " failed: " .. r.stdout .. r.stderr)
  return py
end

describe("the official Python modal client against the stand-in", function()
  local s, py, home
  setup(function()
    s = M.start()
    py = python()
    home = S.tmpdir("modal-py")
  end)
  teardown(function() if home then fs.rmtree(home) end end)

  local function client(secret)
    return run({ py, S.SOURCE .. "/spec/providers/modal/client.py" },
               { S.PATH, "HOME=" .. home, "MODAL_SERVER_URL=" .. s.url,
                 "MODAL_TOKEN_ID=" .. os.getenv("MODAL_TOKEN_ID"),
                 "MODAL_TOKEN_SECRET=" .. (secret or os.getenv("MODAL_TOKEN_SECRET")) }, 180)
  end

  it("creates a sandbox, runs commands with stdout, stderr, stdin and exit codes, and terminates it", function()
    local before = #M.calls()
    local r = client()
    assert.equal(0, r.exit_code, r.stdout .. r.stderr)
    local id = r.stdout:match("created (sb%-%x+)\n")
    assert.is_string(id, r.stdout)
    assert.matches("\nstdout 'hello from python\\n'\n", r.stdout, 1, true)
    assert.matches("\nstderr 'to stderr\\n'\n", r.stdout, 1, true)
    assert.matches("\nexit 3\n", r.stdout, 1, true)
    assert.matches("\nstdin 'PING OVER STDIN\\ndone\\n' exit 0\n", r.stdout, 1, true)
    -- an exec past its timeout: Modal's -1 (NOTES.md), as the stand-in answers it
    assert.matches("\ntimeout exit -1\n", r.stdout, 1, true)
    assert.matches("\nterminated True\n", r.stdout, 1, true)
    -- what it asked for reached the stand-in, through the RPCs the bridge uses
    local seen, create = {}, nil
    for i, c in ipairs(M.calls()) do
      if i > before then
        local m = c.method:match("/([^/]+)$")
        seen[m] = true
        if m == "SandboxCreateV2" then create = c.request end
      end
    end
    for _, m in ipairs{ "AppGetOrCreate", "ImageGetOrCreate", "SandboxCreateV2", "TaskExecStart",
                        "TaskExecStdioRead", "TaskExecStdinWrite", "TaskExecWait", "SandboxTerminateV2" } do
      assert.is_true(seen[m], m .. " was not called")
    end
    assert.equal(500, create.definition.resources.milliCpu)
    assert.equal(256, create.definition.resources.memoryMb)
    assert.equal(120, create.definition.timeoutSecs)
    for _, c in ipairs(M.calls()) do assert.is_not.equal("Unimplemented", c.code, c.method) end
    -- terminated: its root is gone from the stand-in
    assert.is_nil(fs.stat_host(s.state .. "/world/sandboxes/" .. id))
  end)

  it("is refused with the client's AuthError for a wrong secret", function()
    local r = client("not-the-secret")
    assert.is_not.equal(0, r.exit_code)
    assert.matches("AuthError: Token ID/Secret are invalid", r.stderr, 1, true)
  end)
end)
