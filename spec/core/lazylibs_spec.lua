-- libcurl and libarchive are loaded on first use (dlopen): a machine
-- without them still runs local jobs, and their first use says what is
-- missing. Stand-ins with no symbols, first on LD_LIBRARY_PATH, play the
-- missing libraries.
local proc = require "sbx.proc"
local fs = require "sbx.fs"

local S = require "spec.support"

local STATE = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/lazylibs-" .. proc.getpid()

local dir
local function run(code)
  local env = { "PATH=/usr/bin:/bin", "HOME=" .. STATE, "SBX_STATE_DIR=" .. STATE, "LD_LIBRARY_PATH=" .. dir }
  return S.sbxlua({ "-e", code }, { env = env, timeout = 60, preload = true })
end

describe("libraries loaded on first use", function()
  setup(function()
    dir = assert(fs.mkdtemp("/tmp", "sbxlibs"))
    for _, name in ipairs{ "libcurl.so.4", "libarchive.so.13" } do
      local p = assert(proc.spawn{ argv = { "cc", "-shared", "-o", dir .. "/" .. name, "-x", "c", "/dev/null" },
                                   env = { "PATH=/usr/bin:/bin" }, timeout = 60 })
      local r = p:wait()
      assert(r.exit_code == 0, r.stderr)
    end
  end)
  teardown(function() fs.rmtree(dir) end)

  it("runs a local job without them", function()
    local r = run('io.write(sbx.sandbox("local"):execute_command("echo fine").stdout)')
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("fine\n", r.stdout)
  end)

  it("says libcurl is missing (or not the real one) at the first request, and docker is unavailable for it", function()
    local r = run([[
      local ok, msg, code = require("sbx.http").request{ url = "http://127.0.0.1:9/" }
      print(ok, msg, code)
      print(require("sbx.providers.builtin.docker").available())
    ]])
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("^nil\t[^\n]*libcurl[^\n]*: apt%-get install libcurl4[^\n]*\t%u+\n", r.stdout)
    assert.matches("\nfalse\t[^\n]*libcurl[^\n]*apt%-get install libcurl4", r.stdout)
  end)

  it("says libarchive is missing (or not the real one) at the first archive", function()
    local r = run([[print(require("sbx.tar").pack({ { path = "a", data = "x" } }))]])
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("^nil\t[^\n]*libarchive[^\n]*apt%-get install libarchive13", r.stdout)
  end)
end)
