-- The conformance suite on a real Docker engine, through the Engine API.
-- CI starts dockerd and builds the test image (images/test/build.sh); set
-- SBX_REQUIRE_DOCKER=1 to make an unreachable engine a failure, not a skip.
local docker = require "sbx.backends.docker"
local ok, why = docker.available()
if not ok then
  assert(os.getenv("SBX_REQUIRE_DOCKER") ~= "1", "docker is required here but unavailable: " .. tostring(why))
  describe("conformance: docker", function()
    pending("docker unavailable: " .. tostring(why))
  end)
  return
end
require("spec.conformance.suite")("docker", { image = os.getenv("SBX_TEST_IMAGE") or "sbxlua-test:bookworm" },
                                  _ENV, { own_root = true })
