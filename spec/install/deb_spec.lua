-- cpack -G DEB from the build directory, and the package inspected: its
-- control fields, its files, Depends against what the binaries really
-- link and load, and its contents run with no environment variables.
package.path = (os.getenv("SBX_SOURCE_DIR") or ".") .. "/spec/install/?.lua;" .. package.path
local I = require "installing"
local proc = require "sbx.proc"
local fs = require "sbx.fs"

local TMP = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/deb-" .. proc.getpid()
local ROOT = TMP .. "/root"
local deb

local function field(name)
  local r = I.run({ "dpkg-deb", "-f", deb, name })
  assert(r.exit_code == 0, r.stderr)
  return (r.stdout:gsub("%s+$", ""))
end

-- The Debian package of this machine's architecture that ships library `so`.
local function package_of(so)
  local arch = I.run({ "dpkg", "--print-architecture" }).stdout:gsub("%s+$", "")
  local r = I.run({ "dpkg", "-S", "*/" .. so })
  for pkg, a in r.stdout:gmatch("([^\n:,%s]+):(%w+)[^\n]*/" .. so:gsub("%p", "%%%0") .. "\n") do
    if a == arch then return pkg end
  end
end

describe("the Debian package", function()
  setup(function()
    if not I.have("dpkg-deb") then return end
    assert(fs.mkdir_host(TMP))
    local r = I.run({ "cpack", "--config", I.BUILD .. "/CPackConfig.cmake", "-G", "DEB", "-B", TMP .. "/out" })
    assert(r.exit_code == 0, r.stdout .. r.stderr)
    for _, name in ipairs(fs.list_host(TMP .. "/out") or {}) do
      if name:find("%.deb$") then deb = TMP .. "/out/" .. name end
    end
    assert(deb, "cpack made no .deb: " .. r.stdout)
    r = I.run({ "dpkg-deb", "-x", deb, ROOT })
    assert(r.exit_code == 0, r.stderr)
  end)
  teardown(function() fs.rmtree(TMP) end)

  it("is named and described as Debian expects", function()
    if not I.need("dpkg-deb") then return end
    local v = I.run({ ROOT .. "/usr/bin/sbxlua", "version" }).stdout:match("^sbxlua (%S+)")
    assert.equal("sbxlua", field("Package"))
    assert.equal(v, field("Version"))
    assert.equal(I.run({ "dpkg", "--print-architecture" }).stdout:gsub("%s+$", ""), field("Architecture"))
    assert.matches("^sbxlua_" .. v:gsub("%.", "%%.") .. "_%w+%.deb$", deb:match("[^/]+$"))
    assert.is_truthy(field("Maintainer"):find("@", 1, true))
    assert.matches("sandbox", field("Description"))
  end)

  it("holds the binary, the module on Lua's path, the data, docs and man page", function()
    if not I.need("dpkg-deb") then return end
    local list = I.run({ "dpkg-deb", "-c", deb }).stdout
    for _, f in ipairs{ "./usr/bin/sbxlua", "./usr/lib/lua/5.4/sbx.so", "./usr/share/sbxlua/policies/default.lua",
                        "./usr/share/sbxlua/presets/codex.lua", "./usr/share/doc/sbxlua/README.md",
                        "./usr/share/man/man1/sbxlua.1" } do
      assert.is_truthy(list:find(" " .. f .. "\n", 1, true), f .. " not in the package:\n" .. list)
    end
    assert.is_nil(list:find(" %./usr/local/"), "nothing under /usr/local")
    assert.is_truthy(I.default_cpath():find("/usr/lib/lua/5.4/?.so", 1, true))
  end)

  it("Depends names the package of every library the binaries link or load", function()
    if not I.need("dpkg-deb") then return end
    local depends = {}
    for name in field("Depends"):gmatch("([%w%.%+%-]+)[^,]*") do depends[name] = true end
    local needed = { ["lua-cjson"] = true }      -- require "cjson" (lua/sbx/*.lua)
    for _, bin in ipairs{ ROOT .. "/usr/bin/sbxlua", ROOT .. "/usr/lib/lua/5.4/sbx.so" } do
      -- linked (the dynamic section's NEEDED) and dlopen()ed by name: both
      -- appear in the file as sonames
      local data = assert(fs.read_host(bin, 64 << 20))
      for so in data:gmatch("(lib[%w_%+%-]+%.so%.%d+)%z") do
        local pkg = package_of(so)
        assert.is_truthy(pkg, bin .. " needs " .. so .. ", which no package of this machine ships")
        needed[(pkg:gsub(":.*$", ""))] = so
      end
    end
    assert.is_truthy(needed["libcurl4"], "libcurl.so.4 (dlopen) was not found in the binary")
    for pkg, why in pairs(needed) do
      assert.is_true(depends[pkg] or false, "Depends lacks " .. pkg .. " (" .. tostring(why) .. "): "
                     .. field("Depends"))
    end
  end)

  it("its sbxlua runs a job, and its sbx.so loads from a default path, with no environment variables", function()
    if not I.need("dpkg-deb") then return end
    local r = I.run({ ROOT .. "/usr/bin/sbxlua", ROOT .. "/usr/share/doc/sbxlua/examples/hello.lua" },
                    { "PATH=/usr/bin:/bin", "HOME=" .. TMP })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("hello from a sandbox", r.stdout)
    if not I.need("bwrap") then return end
    -- /usr/lib/lua does not exist here, and /usr cannot be overlaid without
    -- installing: the package's usr/bin and usr/lib/lua/5.4 go to
    -- /usr/local, another directory of the same default path
    r = I.run(I.bwrap({ { "/usr/local", tmpfs = true }, { ROOT .. "/usr/bin", "/usr/local/bin" },
                        { ROOT .. "/usr/lib/lua/5.4", "/usr/local/lib/lua/5.4" } }, I.CHECK))
    assert.equal(0, r.exit_code, r.stdout .. r.stderr)
    assert.equal("job ok\n42\n\n/usr/local/lib/lua/5.4/sbx.so 0.1.0\nmodule ok\n", r.stdout)
  end)
end)
