-- The journal's group commit (lua/sbx/state/owner.lua, record): the line
-- before a create is fdatasync'ed before the create goes on (G1), but the
-- creates of one loop turn share one fdatasync instead of paying one each
-- on the loop thread. Every create line is on disk before its sandbox
-- exists; a create cancelled while it waits for the sync leaves nothing.
local S = require "spec.support"
local fs = require "sbx.fs"
local loop = require "sbx.loop"
local owner = require "sbx.state.owner"
require "sbx"

local function journal_lines(event)
  local path = owner.lock_path():gsub("%.lock$", ".jsonl")
  local f = assert(io.open(path))
  local n, ids = 0, {}
  for line in f:lines() do
    if line:find('"event":"' .. event .. '"', 1, true) then
      n = n + 1
      ids[line:match('"id":"([^"]+)"') or "?"] = true
    end
  end
  f:close()
  return n, ids
end

local function sandbox_dirs()
  local dir = assert(os.getenv("SBX_STATE_DIR")) .. "/local/" .. owner.session().id
  return #(fs.list_host(dir) or {})
end

describe("the journal's group commit", function()
  it("gives the creates issued together one fdatasync, each line written before its sandbox", function()
    sbx.sandbox("local"):destroy()               -- the session and its journal exist
    local syncs, creates = fs.journal_syncs(), journal_lines("create")
    local items = {}
    for i = 1, 50 do items[i] = i end
    local seen = sbx.parallel(items, function()
      local sb <close> = sbx.sandbox("local")
      local _, ids = journal_lines("create")   -- the line is there once the sandbox is
      return ids[sb.id] == true
    end, { concurrency = 50 })
    for i = 1, 50 do assert.is_true(seen[i], "create line of sandbox " .. i) end
    assert.equal(creates + 50, (journal_lines("create")))
    local used = fs.journal_syncs() - syncs
    assert.is_true(used >= 1 and used <= 3, "50 creates took " .. used .. " fdatasyncs")
  end)

  it("still syncs a lone create before it returns", function()
    local syncs = fs.journal_syncs()
    local sb <close> = sbx.sandbox("local")
    assert.equal(1, fs.journal_syncs() - syncs)
    local t = loop.spawn(function() return sbx.sandbox("local") end)   -- and one in a task
    local ok, sb2 = t:join()
    assert(ok, tostring(sb2))
    sb2:destroy()
    assert.equal(2, fs.journal_syncs() - syncs)
  end)

  it("leaves nothing of a create cancelled while it waits for the sync", function()
    sbx.sandbox("local"):destroy()
    local base = S.fd_baseline({ collect = true })
    local dirs = sandbox_dirs()
    local ts = {}
    for i = 1, 20 do ts[i] = loop.spawn(function() return sbx.sandbox("local") end) end
    loop.sleep(0)                                -- each has written its line and waits
    for i = 1, 20 do ts[i]:cancel() end
    local cancelled = 0
    for i = 1, 20 do
      local ok, r = ts[i]:join()
      if ok then r:destroy() else cancelled = cancelled + 1 end
    end
    assert.is_true(cancelled > 0, "no create was still waiting for its sync")
    assert.equal(dirs, sandbox_dirs())
    S.expect_fds(base)
    local sb <close> = sbx.sandbox("local")     -- and the next create syncs as usual
    assert.equal("ok\n", sb:execute_command("echo ok").stdout)
  end)
end)
