-- An agent volume whose `current` names a file that is not there (or not
-- whole) is filled again, not handed to every container: on this shared
-- machine one was found that way, and every container then exited 127
-- ("exec /.sbx/bin/sbx-agent-... failed: No such file or directory").
-- `current` is a symlink (read with HEAD, no tar), or in a volume an older
-- build filled a file naming the agent (read with GET, then made a symlink).
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

local function out(cmd)
  local f = assert(io.popen(cmd .. " 2>/dev/null"))
  local s = f:read("a")
  f:close()
  return s
end

describe("docker agent volume", function()
  local HASH = require("sbx.daemon.link").hash(require "sbx.agentbin")
  local function current(vol)      -- "link <target>" or "file <content>"
    return out("docker run --rm -v " .. vol .. ":/v --entrypoint sh " .. IMAGE
               .. " -c 'if [ -L /v/current ]; then echo link $(readlink /v/current); "
               .. "else echo file $(cat /v/current); fi'")
  end

  it("is filled with the agent and a symlink current to it; an older fill's file current is made one", function()
    local prefix = docker.VOLUME_PREFIX
    local a = "sbxlua-agentspec-" .. proc.random_hex(4) .. "-"
    local c = "sbxlua-agentspec-" .. proc.random_hex(4) .. "-"
    local okr, err = pcall(function()
      docker.VOLUME_PREFIX = a
      do
        local sb <close> = sbx.sandbox("docker", { image = IMAGE })
        assert.equal("works\n", sb:execute_command("echo works").stdout)
      end
      local cur = current(a .. HASH)
      assert.is_truthy(cur:match("^link sbx%-agent%-" .. HASH .. "%x+\n$"), cur)
      -- the same agent as an older build left it: `current` a file naming it
      sh("docker volume create --label sbxlua.agent=1 " .. c .. HASH)
      sh("docker run --rm -v " .. a .. HASH .. ":/src:ro -v " .. c .. HASH .. ":/v --entrypoint sh " .. IMAGE
         .. " -c 'n=$(readlink /src/current); cp -p /src/$n /v/$n && printf %s $n > /v/current'")
      local name = cur:match("^link (%S+)")
      assert.equal("file " .. name .. "\n", current(c .. HASH))
      docker.VOLUME_PREFIX = c
      do
        local sb <close> = sbx.sandbox("docker", { image = IMAGE })
        assert.equal("works\n", sb:execute_command("echo works").stdout)
      end
      assert.equal("link " .. name .. "\n", current(c .. HASH))   -- used as it was, not filled again
    end)
    docker.VOLUME_PREFIX = prefix
    os.execute("docker volume rm -f " .. a .. HASH .. " " .. c .. HASH .. " >/dev/null 2>&1")
    assert(okr, err)
  end)

  for _, case in ipairs{ { "names a missing file", "", "printf %s $n > /v/current" },
                         { "names a cut-short file", "head -c 65024 /dev/zero > /v/$n && chmod 755 /v/$n && ",
                           "printf %s $n > /v/current" },
                         { "links to a missing file", "", "ln -s $n /v/current" },
                         { "links to a cut-short file", "head -c 65024 /dev/zero > /v/$n && chmod 755 /v/$n && ",
                           "ln -s $n /v/current" } } do
    it("is filled again when its current " .. case[1], function()
      local prefix = docker.VOLUME_PREFIX
      docker.VOLUME_PREFIX = "sbxlua-agentspec-" .. proc.random_hex(4) .. "-"
      local vol = docker.VOLUME_PREFIX .. require("sbx.daemon.link").hash(require "sbx.agentbin")
      local okr, err = pcall(function()
        sh("docker volume create --label sbxlua.agent=1 " .. vol)
        sh("docker run --rm -v " .. vol .. ":/v --entrypoint sh " .. IMAGE .. " -c 'n=sbx-agent-"
           .. require("sbx.daemon.link").hash(require "sbx.agentbin") .. "dead00; " .. case[2]
           .. case[3] .. "'")
        local sb <close> = sbx.sandbox("docker", { image = IMAGE })
        assert.equal("works\n", sb:execute_command("echo works").stdout)
      end)
      docker.VOLUME_PREFIX = prefix
      os.execute("docker volume rm -f " .. vol .. " >/dev/null 2>&1")
      assert(okr, err)
    end)
  end
end)
