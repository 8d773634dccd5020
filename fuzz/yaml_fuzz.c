/*
** libFuzzer target for sbx.yaml (src/lyaml.c), the parser of sbx.yaml and
** any other untrusted YAML: every input must come back as a value or as
** nil + message, within the limits, without a crash, a leak or UB.
** Built and run by fuzz/run.sh (clang, -fsanitize=fuzzer,address,undefined).
*/
#include <stddef.h>
#include <stdint.h>

#include "lauxlib.h"
#include "lua.h"
#include "lualib.h"

int luaopen_sbx_yaml(lua_State *L);

static lua_State *L;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!L) {
    L = luaL_newstate();
    luaL_requiref(L, "sbx.yaml", luaopen_sbx_yaml, 0);
    lua_setglobal(L, "yaml");
  }
  lua_getglobal(L, "yaml");
  lua_getfield(L, -1, "decode");
  lua_pushlstring(L, (const char *)data, size);
  /* tight limits so the fuzzer reaches them */
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, 16);
  lua_setfield(L, -2, "max_depth");
  lua_pushinteger(L, 8);
  lua_setfield(L, -2, "max_aliases");
  lua_pushinteger(L, 2000);
  lua_setfield(L, -2, "max_nodes");
  /* value, positions | nil, positions (empty) | nil, message */
  if (lua_pcall(L, 2, 2, 0) == LUA_OK && lua_isnil(L, -2) && !lua_isstring(L, -1)
      && !lua_istable(L, -1))
    __builtin_trap();
  lua_settop(L, 0);
  lua_gc(L, LUA_GCCOLLECT);
  return 0;
}
