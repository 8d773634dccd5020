-- A warm pool once sbxlua is shutting down (a signal came: owner.shut_down):
-- acquire hands out what is idle but starts no create, and says why at
-- once; the maintainer stops refilling. Runs in a child sbxlua: shutting
-- down cannot be undone in this process.
local CHILD = [[
  local owner = require "sbx.state.owner"
  local pool = sbx.pool{ backend = "local", size = 1 }
  assert(pool:wait_ready(60), "the pool never filled")
  owner.shut_down()
  local sb = pool:acquire(5)                  -- the idle one: still handed out
  local ok, err = pcall(pool.acquire, pool, 5)
  local st = pool:stats()
  print(sb and sb.backend, ok, type(err) == "table" and err.kind, type(err) == "table" and err.op,
        tostring(type(err) == "table" and err.message), st.created, st.failed, st.creating)
  sb:destroy()
  pool:close()
]]

describe("a warm pool while sbxlua shuts down", function()
  it("hands out its idle sandbox, then refuses at once without creating", function()
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write(CHILD)
    f:close()
    local p = io.popen((os.getenv("SBX_BIN") or "build/sbxlua") .. " " .. script .. " 2>&1")
    local out = p:read("a")
    p:close()
    os.remove(script)
    local backend, ok, kind, op, msg, created, failed, creating =
      out:match("^(%S+)\t(%S+)\t(%S+)\t(%S+)\t([^\t]*)\t(%S+)\t(%S+)\t(%S+)\n$")
    assert(backend, "unexpected output: " .. out)
    assert.equal("local", backend)
    assert.equal("false", ok)
    assert.equal("SandboxCreationError", kind)
    assert.equal("acquire", op)
    assert.equal("sbxlua is shutting down: no new sandboxes", msg)
    assert.equal("1", created)                 -- the one made before: no create after
    assert.equal("0", failed)
    assert.equal("0", creating)
  end)
end)
