/*
** libFuzzer target for sbx.tar's readers (src/ltar.c): archives from a
** container engine are hostile. Every input must come back as entries or as
** nil + message + code, within the caps, without a crash, a leak or UB; and
** no returned entry may name a path that leaves the archive's root.
** Built and run by fuzz/run.sh.
*/
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "lauxlib.h"
#include "lua.h"
#include "lualib.h"

int luaopen_sbx_tar(lua_State *L);

static lua_State *L;

/* An entry path must be relative, without "..", without NUL. */
static void check_entries(void) {
  if (!lua_istable(L, -1)) return;
  lua_Integer n = luaL_len(L, -1);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_geti(L, -1, i);
    lua_getfield(L, -1, "path");
    size_t len;
    const char *p = lua_tolstring(L, -1, &len);
    if (p && (p[0] == '/' || strstr(p, "../") || (len >= 2 && !strcmp(p + len - 2, "..")) ||
              strlen(p) != len))
      __builtin_trap();
    lua_pop(L, 2);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char *const fns[] = {"extract", "list", "read_one"};
  if (!L) {
    L = luaL_newstate();
    luaL_requiref(L, "sbx.tar", luaopen_sbx_tar, 0);
    lua_setglobal(L, "tar");
  }
  for (int f = 0; f < 3; f++) {
    lua_getglobal(L, "tar");
    lua_getfield(L, -1, fns[f]);
    lua_pushlstring(L, (const char *)data, size);
    lua_createtable(L, 0, 3);
    lua_pushinteger(L, 64);
    lua_setfield(L, -2, "max_entries");
    lua_pushinteger(L, 1 << 20);
    lua_setfield(L, -2, "max_bytes");
    lua_pushboolean(L, f == 0 && (size & 1));   /* both strict and skipping */
    lua_setfield(L, -2, "skip_unsafe");
    if (lua_pcall(L, 2, 2, 0) != LUA_OK) __builtin_trap();  /* never raises on data */
    lua_pop(L, 1);
    if (f == 0) check_entries();
    lua_settop(L, 0);
  }
  lua_gc(L, LUA_GCCOLLECT);
  return 0;
}
