-- The conformance suite on bwrap: its own root filesystem (absolute paths
-- and symlinks resolve inside the sandbox). Set SBX_REQUIRE_BWRAP=1 to
-- make a machine without working bubblewrap a failure, not a skip.
local bwrap = require "sbx.backends.bwrap"
local ok, why = bwrap.available()
if not ok then
  assert(os.getenv("SBX_REQUIRE_BWRAP") ~= "1", "bwrap is required here but unavailable: " .. tostring(why))
  describe("conformance: bwrap", function()
    pending("bwrap unavailable: " .. tostring(why))
  end)
  return
end
require("spec.conformance.suite")("bwrap", {}, _ENV, { own_root = true })
