/* luadump IN CHUNKNAME OUT: compiles the Lua source IN under CHUNKNAME
** ("@lua/sbx/x.lua", what tracebacks show) and writes its bytecode, with
** debug info, to OUT (build-time helper; links the same liblua as sbxlua,
** so the bytecode format matches). */
#include <stdio.h>
#include <stdlib.h>

#include "lauxlib.h"

static int writer(lua_State *L, const void *p, size_t n, void *ud) {
  (void)L;
  return fwrite(p, 1, n, ud) != n;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: luadump IN CHUNKNAME OUT\n");
    return 2;
  }
  lua_State *L = luaL_newstate();
  FILE *in = fopen(argv[1], "rb"), *out;
  luaL_Buffer b;
  char buf[8192];
  size_t n;
  if (!L || !in) {
    fprintf(stderr, "luadump: cannot read %s\n", argv[1]);
    return 1;
  }
  luaL_buffinit(L, &b);
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) luaL_addlstring(&b, buf, n);
  luaL_pushresult(&b);
  if (ferror(in) || fclose(in) != 0) return 1;
  n = 0;
  const char *src = lua_tolstring(L, -1, &n);
  if (luaL_loadbufferx(L, src, n, argv[2], "t") != LUA_OK) {
    fprintf(stderr, "luadump: %s\n", lua_tostring(L, -1));
    return 1;
  }
  if ((out = fopen(argv[3], "wb")) == NULL) return 1;
  if (lua_dump(L, writer, out, 0) != 0 || fclose(out) != 0) {
    fprintf(stderr, "luadump: cannot write %s\n", argv[3]);
    return 1;
  }
  lua_close(L);
  return 0;
}
