-- The conformance suite on docker through the fallback path: one engine
-- exec per command and archive calls for files, no sbx-agent stream.
local docker = require "sbx.backends.docker"
local ok, why = docker.available()
if not ok then
  assert(os.getenv("SBX_REQUIRE_DOCKER") ~= "1", "docker is required here but unavailable: " .. tostring(why))
  describe("conformance: docker (engine exec)", function()
    pending("docker unavailable: " .. tostring(why))
  end)
  return
end
docker.exec_mode = "engine"
require("spec.conformance.suite")("docker", { image = os.getenv("SBX_TEST_IMAGE") or "sbxlua-test:bookworm" },
                                  _ENV, { own_root = true })
