-- The official E2B Python SDK (e2b, pinned below) against the stand-in:
-- if the vendor's own client can create, run commands, write and read a
-- file, list and destroy, the stand-in speaks E2B's protocol. The venv comes
-- from spec/support/pyvenv.sh; without the package registry the spec is
-- skipped with one line, except in CI (CI=true), where it must run.
local S = require "spec.support"
local R = require "spec.support.standin.e2b_run"

local SDK = "e2b==2.63.0"

describe("e2b: the official Python SDK against the stand-in", function()
  local src = os.getenv("SBX_SOURCE_DIR") or "."
  local out, status = S.host(src .. "/spec/support/pyvenv.sh e2b " .. SDK .. " 2>&1 >/dev/null; echo; "
                             .. src .. "/spec/support/pyvenv.sh e2b " .. SDK .. " 2>/dev/null")
  local py = out:match("(/[^\n]*bin/python)%s*$")
  if not py then
    if os.getenv("CI") == "true" then
      it("has its venv", function() error("pyvenv failed in CI: " .. out) end)
    else
      pending("skipped: the e2b SDK could not be installed (" .. (out:match("pyvenv: [^\n]*") or "pip failed") .. ")")
    end
    return
  end

  it("creates, runs commands, writes and reads a file, lists and destroys", function()
    local s = R.start{}
    local ok, err = pcall(function()
      local r = S.host(s.env .. S.shq(py) .. " " .. src .. "/spec/providers/e2b_sdk.py")
      local id = r:match("created (%w+)")
      assert.is_string(id, r)
      assert.matches("stdout 'hello from /bin/bash\\n' stderr 'to-stderr\\n' exit 0\n", r, 1, true)
      assert.matches("exit3 CommandExitException 3\n", r, 1, true)
      assert.matches("read bytearray(b'\\x00\\x01binary\\xff')\n", r, 1, true)
      assert.matches("entries ['data.bin']\n", r, 1, true)
      assert.matches("listed True\n", r, 1, true)
      assert.matches("alive False\n", r, 1, true)
      local st = s:stats()
      assert.equal(1, st.created)
      assert.equal(0, st.live)
    end)
    s:stop()
    if not ok then error(err, 0) end
  end)
end)
