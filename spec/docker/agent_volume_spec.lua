-- An agent volume whose `current` names a file that is not there (or not
-- whole) is filled again, not handed to every container: on this shared
-- machine one was found that way, and every container then exited 127
-- ("exec /.sbx/bin/sbx-agent-... failed: No such file or directory").
local sbx = require "sbx"
local proc = require "sbx.proc"
local docker = require "sbx.providers.builtin.docker"

local IMAGE = os.getenv("SBX_TEST_IMAGE") or "sbxlua-test:bookworm"

local ok, why = docker.available()
if not ok then
  describe("docker agent volume", function() pending("docker unavailable: " .. tostring(why)) end)
  return
end

local function sh(cmd)
  assert(os.execute(cmd .. " >/dev/null 2>&1"), cmd)
end

describe("docker agent volume", function()
  for _, case in ipairs{ { "names a missing file", "" },
                         { "names a cut-short file", "head -c 65024 /dev/zero > /v/$n && chmod 755 /v/$n && " } } do
    it("is filled again when its current " .. case[1], function()
      local prefix = docker.VOLUME_PREFIX
      docker.VOLUME_PREFIX = "sbxlua-agentspec-" .. proc.random_hex(4) .. "-"
      local vol = docker.VOLUME_PREFIX .. require("sbx.daemon.link").hash(require "sbx.agentbin")
      local okr, err = pcall(function()
        sh("docker volume create --label sbxlua.agent=1 " .. vol)
        sh("docker run --rm -v " .. vol .. ":/v --entrypoint sh " .. IMAGE .. " -c 'n=sbx-agent-"
           .. require("sbx.daemon.link").hash(require "sbx.agentbin") .. "dead00; " .. case[2]
           .. "printf %s $n > /v/current'")
        local sb <close> = sbx.sandbox("docker", { image = IMAGE })
        assert.equal("works\n", sb:execute_command("echo works").stdout)
      end)
      docker.VOLUME_PREFIX = prefix
      os.execute("docker volume rm -f " .. vol .. " >/dev/null 2>&1")
      assert(okr, err)
    end)
  end
end)
