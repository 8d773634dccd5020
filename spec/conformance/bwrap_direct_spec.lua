-- The conformance suite on bwrap without its agent: a new bwrap (and new
-- namespaces) for every command, as for sandboxes with per-process rlimits.
local bwrap = require "sbx.backends.bwrap"
local ok, why = bwrap.available()
if not ok then
  assert(os.getenv("SBX_REQUIRE_BWRAP") ~= "1", "bwrap is required here but unavailable: " .. tostring(why))
  describe("conformance: bwrap (direct)", function()
    pending("bwrap unavailable: " .. tostring(why))
  end)
  return
end
bwrap.exec_mode = "direct"
require("spec.conformance.suite")("bwrap", {}, _ENV, { own_root = true })
