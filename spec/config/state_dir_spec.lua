-- The config's state_dir is where the session's journal goes when
-- $SBX_STATE_DIR is not set (owner.set_state_dir, from the config's
-- change hook); $SBX_STATE_DIR still comes first. A child sbxlua each, so
-- this process's own session stays where it is.
local BIN = os.getenv("SBX_BIN") or "build/sbxlua"

local function run(env, dir, cfg)
  local script = os.tmpname()
  local f = assert(io.open(script, "w"))
  f:write(string.format([[
    sbx.config(%q)
    local sb <close> = sbx.sandbox("local")
    print(require("sbx.state.owner").state_dir())
  ]], cfg))
  f:close()
  local p = io.popen(env .. " " .. BIN .. " " .. script .. " 2>&1")
  local out = p:read("a")
  p:close()
  os.remove(script)
  return out
end

describe("the config's state_dir", function()
  local base
  before_each(function()
    base = os.tmpname()
    os.remove(base)
    assert(os.execute("mkdir -p " .. base))
  end)
  after_each(function() os.execute("rm -rf " .. base) end)

  it("holds the session's journal when $SBX_STATE_DIR is unset", function()
    local cfg = base .. "/sbx.yaml"
    local f = assert(io.open(cfg, "w"))
    f:write("state_dir: " .. base .. "/state\n")
    f:close()
    local out = run("env -u SBX_STATE_DIR", base, cfg)
    assert.equal(base .. "/state\n", out)
    local ls = io.popen("ls " .. base .. "/state/sessions 2>&1"):read("a")
    assert.is_nil(ls:find("No such file", 1, true), ls)    -- the session was made there
  end)

  it("gives way to $SBX_STATE_DIR", function()
    local cfg = base .. "/sbx.yaml"
    local f = assert(io.open(cfg, "w"))
    f:write("state_dir: " .. base .. "/state\n")
    f:close()
    local out = run("SBX_STATE_DIR=" .. base .. "/env", base, cfg)
    assert.equal(base .. "/env\n", out)
  end)
end)
