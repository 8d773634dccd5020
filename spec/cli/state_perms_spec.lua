-- The state directory names every sandbox: what sbxlua creates in it is
-- its user's alone (files 0600, directories 0700), decisions.jsonl too; a
-- state directory that already existed open to others is made 0700.
local proc = require "sbx.proc"
local fs = require "sbx.fs"

local BIN = os.getenv("SBX_BIN") or "build/sbxlua"
local TMP = os.getenv("SBX_STATE_DIR") or "/tmp"

local function run(state, code)
  return assert(proc.spawn{ argv = { BIN, "-e", code }, timeout = 60,
    env = { "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" .. state, "SBX_STATE_DIR=" .. state } }):wait()
end

describe("state directory permissions", function()
  it("every file sbxlua makes is 0600 and every directory 0700, decisions.jsonl included", function()
    local parent = assert(fs.mkdtemp(TMP, "perm."))
    local state = parent .. "/state"
    -- a routed create (decision log), a ledger line, sessions/ and local/
    local r = run(state, [[
      local sb = sbx.sandbox{ labels = { job = "perm" } }
      print(sb:execute_command("echo hi").stdout)
    ]])
    assert.equal(0, r.exit_code, r.stderr)
    local root = assert(fs.open_root(state))
    local seen = {}
    local function walk(rel)
      for _, e in ipairs(assert(root:list(rel))) do
        local p = rel == "" and e.name or rel .. "/" .. e.name
        local st = assert(root:stat(p))
        seen[p] = string.format("%04o", st.mode)
        if e.type == "dir" then walk(p) end
      end
    end
    walk("")
    assert.equal("0700", string.format("%04o", root:stat(".").mode))
    assert.truthy(seen["decisions.jsonl"], "no decision log was written")
    for p, mode in pairs(seen) do
      local st = root:stat(p)
      assert.equal(st.type == "dir" and "0700" or "0600", mode, p)
    end
    root:close()
    fs.rmtree(parent)
  end)

  it("a state directory open to others is made 0700, without a word", function()
    local state = assert(fs.mkdtemp(TMP, "perm-open."))
    assert(os.execute("chmod 755 " .. state))
    local r = run(state, 'sbx.sandbox("local"):destroy() sbx.sandbox("local"):destroy()')
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("", r.stderr)
    local root = assert(fs.open_root(state))
    assert.equal("0700", string.format("%04o", root:stat(".").mode))
    root:close()
    fs.rmtree(state)
  end)
end)
