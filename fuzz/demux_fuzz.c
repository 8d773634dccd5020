/*
** libFuzzer target for sbx.demux (src/ldemux.c), Docker's multiplexed
** stream: the bytes come from the engine and the container. The input is
** fed whole and again in pieces whose sizes come from the input itself:
** both must fail alike or deliver the same bytes per stream, in order.
** Built and run by fuzz/run.sh.
*/
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "lauxlib.h"
#include "lua.h"
#include "lualib.h"

int luaopen_sbx_demux(lua_State *L);

static lua_State *L;

/* Pushes stdin+stdout+stderr payloads as one string per stream id (3
** strings), or three nils when the demuxer failed. */
static void run(const uint8_t *data, size_t size, const uint8_t *cuts, size_t ncuts) {
  lua_getglobal(L, "demux");
  lua_getfield(L, -1, "new");
  lua_call(L, 0, 1);
  lua_remove(L, -2);                       /* stack: d */
  int d = lua_gettop(L);
  lua_pushliteral(L, "");
  lua_pushliteral(L, "");
  lua_pushliteral(L, "");                  /* d, s0, s1, s2 */
  size_t off = 0, k = 0;
  while (off < size) {
    size_t n = ncuts ? (size_t)cuts[k++ % ncuts] + 1 : size;
    if (n > size - off) n = size - off;
    lua_getfield(L, d, "feed");
    lua_pushvalue(L, d);
    lua_pushlstring(L, (const char *)data + off, n);
    lua_call(L, 2, 1);
    if (lua_isnil(L, -1)) {
      lua_settop(L, d - 1);
      lua_pushnil(L); lua_pushnil(L); lua_pushnil(L);
      return;
    }
    lua_Integer m = luaL_len(L, -1);
    for (lua_Integer i = 1; i <= m; i++) {
      lua_geti(L, -1, i);
      lua_getfield(L, -1, "stream");
      int sid = (int)lua_tointeger(L, -1);
      lua_getfield(L, -2, "data");         /* list, part, sid, data */
      if (sid < 0 || sid > 2) __builtin_trap();
      lua_pushvalue(L, d + 1 + sid);
      lua_insert(L, -2);
      lua_concat(L, 2);
      lua_replace(L, d + 1 + sid);
      lua_pop(L, 2);
    }
    lua_pop(L, 1);
    off += n;
  }
  lua_remove(L, d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!L) {
    L = luaL_newstate();
    luaL_requiref(L, "sbx.demux", luaopen_sbx_demux, 0);
    lua_setglobal(L, "demux");
  }
  if (size < 2) return 0;
  size_t ncuts = data[0] % 8;
  if (ncuts + 1 > size) return 0;
  const uint8_t *cuts = data + 1, *body = data + 1 + ncuts;
  size_t blen = size - 1 - ncuts;
  run(body, blen, NULL, 0);                /* 1..3 */
  run(body, blen, cuts, ncuts);            /* 4..6 */
  for (int s = 1; s <= 3; s++)
    if (!lua_rawequal(L, s, s + 3)) __builtin_trap();
  lua_settop(L, 0);
  lua_gc(L, LUA_GCCOLLECT);
  return 0;
}
