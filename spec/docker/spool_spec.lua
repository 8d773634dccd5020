-- docker's download_dir spools the engine's archive to <state>/spool: an
-- sbxlua SIGKILLed while it does leaves that file, and `sbxlua gc` removes
-- it with the container (G2 for the spool; issue 15, item 12).
local proc = require "sbx.proc"
local loop = require "sbx.loop"
local fs = require "sbx.fs"
local docker = require "sbx.providers.builtin.docker"

local BIN = os.getenv("SBX_BIN") or "build/sbxlua"
local IMAGE = os.getenv("SBX_TEST_IMAGE") or "sbxlua-test:bookworm"

local ok, why = docker.available()
if not ok then
  describe("docker spool", function() pending("docker unavailable: " .. tostring(why)) end)
  return
end

describe("docker spool", function()
  it("a SIGKILL mid-download leaves a spool file that gc removes", function()
    local state = assert(fs.mkdtemp("/var/tmp", "sbx-spoolspec."))
    local dest = state .. "/dest"
    finally(function() fs.rmtree(state) end)
    local env = { "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" .. state, "SBX_STATE_DIR=" .. state }
    local job = proc.spawn{ argv = { BIN, "-e", [[
      local sb = sbx.sandbox("docker", { image = "]] .. IMAGE .. [[" })
      sb:execute_command("sh", { "-c", "mkdir t && head -c 2000000000 /dev/zero > t/big" }, { timeout = 600 })
      print("filled")
      sb:download_dir("t", "]] .. dest .. [[")
    ]] }, env = env, stream = true, max_output = 4096 }
    local spool = state .. "/spool"
    local t0 = loop.now()
    while #(fs.list_host(spool) or {}) == 0 do     -- the archive is coming in
      assert(job:running(), "the job ended before spooling")
      assert(loop.now() - t0 < 300, "no spool file appeared")
      loop.sleep(0.02)
    end
    job:kill()
    job:wait()
    assert.equal(1, #fs.list_host(spool))
    local gc = assert(proc.spawn{ argv = { BIN, "gc" }, env = env }):wait()
    assert.equal(0, gc.exit_code, gc.stderr .. gc.stdout)
    assert.same({}, fs.list_host(spool))
  end)
end)
