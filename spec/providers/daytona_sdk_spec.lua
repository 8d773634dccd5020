-- Daytona's official Python SDK (daytona on PyPI, pinned) against the
-- stand-in: if the vendor's own client creates, runs a command, moves a
-- file, lists and destroys through it, the stand-in speaks Daytona's
-- protocol. The venv comes from spec/support/pyvenv.sh; without a
-- reachable registry this is one skip line, except under CI=true.
local json = require "cjson"
local S = require "spec.support"
local DP = require "spec.support.standin.daytona_proc"

local SDK = "daytona==0.226.1"

describe("daytona: the official Python SDK against the stand-in", function()
  if not S.gate("bwrap", "daytona SDK (its stand-in's sandboxes are bwrap sandboxes)") then return end
  local out, status = S.host(S.shq(S.SOURCE .. "/spec/support/pyvenv.sh") .. " daytona " .. S.shq(SDK))
  local py = status == 0 and out:match("([^\n]+)\n?$")
  if not py then
    assert(os.getenv("CI") ~= "true", "the Daytona SDK venv could not be made under CI: " .. out)
    it("needs " .. SDK .. " from the package registry", function()
      require("busted").pending("skipped: " .. (out:match("pyvenv: [^\n]+") or out))
    end)
    return
  end

  local s
  setup(function() s = DP.start() end)
  teardown(function() if s then s:stop() end end)

  it("creates, runs a command, writes and reads a file, lists and destroys", function()
    local text, st = S.host(S.shq(py) .. " " .. S.shq(S.SOURCE .. "/spec/support/standin/daytona_sdk.py") .. " "
                            .. S.shq(s.url) .. " " .. S.shq(s.key))
    local steps = {}
    for line in text:gmatch("[^\n]+") do
      local ok, v = pcall(json.decode, line)
      if ok and type(v) == "table" and v.step then steps[v.step] = v end
    end
    assert(st == 0 and steps.delete, "the SDK failed:\n" .. text)
    assert.equal("started", steps.create.state)
    assert.same({ "out\nerr\n", 3 }, { steps.exec.result, steps.exec.exit_code })
    assert.same({ 0, "so\n", "se\n" }, { steps.session.exit_code, steps.session.stdout, steps.session.stderr })
    assert.same({ true, 16384, { "blob.bin" } }, { steps.files.same, steps.files.size, steps.files.listed })
    local found = false
    for _, id in ipairs(steps.list.ids) do found = found or id == steps.create.id end
    assert.is_true(found, "the new sandbox is in the SDK's list")
    for _, id in ipairs(steps.delete.ids) do assert.not_equal(steps.create.id, id) end
    -- nothing the SDK sent was refused by the checker
    local http = require "sbx.http"
    local r = assert(http.request{ url = s.url .. "/_daytona/rejected" })
    assert.same({}, json.decode(r.body))
  end)
end)
