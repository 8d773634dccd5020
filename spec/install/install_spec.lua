-- cmake --install into a temporary prefix, then, with no LUA_CPATH and no
-- SBX_LUA_PATH, a job run by the installed sbxlua and require "sbx" from a
-- stock lua5.4; the manual page says what --help says; the rockspec agrees
-- with the build.
package.path = (os.getenv("SBX_SOURCE_DIR") or ".") .. "/spec/install/?.lua;" .. package.path
local I = require "installing"
local proc = require "sbx.proc"
local fs = require "sbx.fs"

local TMP = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/install-" .. proc.getpid()
local PREFIX = TMP .. "/prefix"

local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() end
  return f ~= nil
end

describe("cmake --install", function()
  setup(function()
    assert(fs.mkdir_host(TMP))
    local r = I.run({ "cmake", "--install", I.BUILD, "--prefix", PREFIX })
    assert(r.exit_code == 0, r.stdout .. r.stderr)
  end)
  teardown(function() fs.rmtree(TMP) end)

  it("puts each part where its users look for it", function()
    for _, f in ipairs{ "bin/sbxlua", "lib/lua/5.4/sbx.so", "share/sbxlua/policies/default.lua",
                        "share/sbxlua/presets/python.lua", "share/sbxlua/providers/README.md",
                        "share/doc/sbxlua/README.md", "share/doc/sbxlua/docs/README.md",
                        "share/doc/sbxlua/examples/hello.lua", "share/man/man1/sbxlua.1" } do
      assert.is_true(exists(PREFIX .. "/" .. f), f .. " is not installed")
    end
    -- lib/lua/5.4 under /usr/local and /usr is on a stock Lua's default path
    local cpath = I.default_cpath()
    assert.is_truthy(cpath:find("/usr/local/lib/lua/5.4/?.so", 1, true), cpath)
    assert.is_truthy(cpath:find("/usr/lib/lua/5.4/?.so", 1, true), cpath)
  end)

  it("the installed sbxlua runs a job from the prefix with a bare environment", function()
    local r = I.run({ PREFIX .. "/bin/sbxlua", PREFIX .. "/share/doc/sbxlua/examples/hello.lua" },
                    { "PATH=/usr/bin:/bin", "HOME=" .. TMP })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("hello from a sandbox", r.stdout)
    assert.equal("", r.stderr)
  end)

  it("installed as /usr/local: sbxlua and require 'sbx' work with no environment variables", function()
    if not I.need("bwrap") then return end
    -- this machine's filesystem, read-only, with the prefix as /usr/local
    local r = I.run(I.bwrap({ { PREFIX, "/usr/local" } }, I.CHECK))
    assert.equal(0, r.exit_code, r.stdout .. r.stderr)
    assert.equal("job ok\n42\n\n/usr/local/lib/lua/5.4/sbx.so 0.1.0\nmodule ok\n", r.stdout)
  end)

  it("sbxlua(1) is generated from --help: every line of the help is in the page", function()
    local page = fs.read_host(PREFIX .. "/share/man/man1/sbxlua.1", 1 << 20)
    assert.matches("^%.TH SBXLUA 1 ", page)
    local help = I.run({ PREFIX .. "/bin/sbxlua", "--help" }).stdout
    local text = page:gsub("\\%-", "-"):gsub("\\e", "\\"):gsub("\\&", "")
    for line in help:gmatch("[^\n]+") do
      local want = line:gsub("^usage:%s*", ""):gsub("^%a[%w ()]-:%s*$", ""):gsub("^%a+:%s*", ""):match("^%s*(.-)%s*$")
      if want ~= "" then assert.is_truthy(text:find(want, 1, true), "not in the man page: " .. want) end
    end
    for _, section in ipairs{ "NAME", "SYNOPSIS", "COMMANDS", "GLOBAL OPTIONS", "ENVIRONMENT", "FILES", "SEE ALSO" } do
      assert.matches("\n%.SH " .. section .. "\n", page)
    end
    if I.have("groff") then   -- well-formed: groff renders it with every warning on and says nothing
      local g = I.run({ "groff", "-man", "-ww", "-z", PREFIX .. "/share/man/man1/sbxlua.1" })
      assert.equal(0, g.exit_code)
      assert.equal("", g.stderr)
    end
  end)

  it("the rockspec names the version the build has, and passes luarocks lint", function()
    local v = I.run({ PREFIX .. "/bin/sbxlua", "version" }).stdout:match("^sbxlua (%S+)")
    local path = I.SOURCE .. "/sbx-" .. v .. "-1.rockspec"
    local text = assert(fs.read_host(path, 1 << 20), "no " .. path)
    assert.matches('\nversion = "' .. v:gsub("%.", "%%.") .. '%-1"\n', text)
    assert.matches('type = "cmake"', text)
    assert.matches('SBX_INSTALL_LUA_CMOD_DIR = "%$%(LIBDIR%)"', text)
    if not I.need("luarocks") then return end
    local r = I.run({ "luarocks", "lint", path })
    assert.equal(0, r.exit_code, r.stdout .. r.stderr)
  end)
end)
