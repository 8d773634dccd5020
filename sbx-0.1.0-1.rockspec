-- luarocks make (in a checkout): builds with CMake and installs the module
-- sbx.so for your Lua 5.4 (and the sbxlua command) into the rocks tree.
rockspec_format = "3.0"
package = "sbx"
version = "0.1.0-1"
source = {
  url = "git+file:///dev/null",   -- built from a checkout: luarocks make
}
description = {
  summary = "Sandbox orchestrator: create, route and clean up sandboxes from Lua 5.4",
  detailed = [[
sbx creates sandboxes (local, bubblewrap, Docker), sends them commands and
files, and routes each request to a backend with policies written in Lua.
require "sbx" in any Lua 5.4; the sbxlua command runs job scripts.]],
  license = "UNLICENSED (the repository has no license file yet)",
  labels = { "sandbox", "docker", "bubblewrap" },
}
dependencies = {
  "lua >= 5.4, < 5.5",
  "lua-cjson >= 2.1",
}
-- libyaml, libcurl and libarchive headers (Debian: libyaml-dev,
-- libcurl4-openssl-dev, libarchive-dev) are found by CMake through pkg-config.
build = {
  type = "cmake",
  variables = {
    CMAKE_BUILD_TYPE = "Release",
    CMAKE_INSTALL_PREFIX = "$(PREFIX)",
    SBX_INSTALL_LUA_CMOD_DIR = "$(LIBDIR)",
    SBX_INSTALL_BIN_DIR = "$(BINDIR)",
  },
}
