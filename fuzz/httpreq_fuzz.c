/*
** libFuzzer target for sbx.httpreq (src/lhttpreq.c), the request heads the
** dashboard's server reads from any local client. Properties: no crash or
** sanitizer report; a parsed head ends in CRLF CRLF within the input and
** within the limit; the same head alone parses to the same method and
** path; no prefix of it is taken for a complete request. Built and run by
** fuzz/run.sh.
*/
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "lauxlib.h"
#include "lua.h"
#include "lualib.h"

int luaopen_sbx_httpreq(lua_State *L);

static lua_State *L;

/* parse(data[0..n), max) -> 1: a request (pushed, with its head length
** in *head), 0: incomplete, -1: an error. Leaves one value pushed. */
static int parse(const uint8_t *data, size_t n, lua_Integer max, lua_Integer *head) {
  lua_getglobal(L, "parse");
  lua_pushlstring(L, (const char *)data, n);
  lua_pushinteger(L, max);
  lua_call(L, 2, 2);
  if (lua_istable(L, -2)) {
    *head = lua_tointeger(L, -1);
    lua_pop(L, 1);
    return 1;
  }
  int err = !lua_isnil(L, -1);
  lua_pop(L, 1);
  return err ? -1 : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!L) {
    L = luaL_newstate();
    luaL_openlibs(L);
    luaL_requiref(L, "httpreq", luaopen_sbx_httpreq, 0);
    lua_getfield(L, -1, "parse");
    lua_setglobal(L, "parse");
    lua_pop(L, 1);
  }
  lua_Integer max = size > 0 ? 64 + data[0] * 32 : 64, head = 0, head2 = 0;
  int r = parse(data, size, max, &head);
  if (r == 1) {
    if (head < 4 || (size_t)head > size || head > max) __builtin_trap();
    if (memcmp(data + head - 4, "\r\n\r\n", 4) != 0) __builtin_trap();
    lua_getfield(L, -1, "method");
    lua_getfield(L, -2, "path");               /* req, method, path */
    if (parse(data, (size_t)head, max, &head2) != 1 || head2 != head) __builtin_trap();
    lua_getfield(L, -1, "method");
    lua_getfield(L, -2, "path");               /* req, m, p, req2, m2, p2 */
    if (!lua_rawequal(L, -1, -4) || !lua_rawequal(L, -2, -5)) __builtin_trap();
    lua_pop(L, 3);
    if (parse(data, (size_t)head - 1, max, &head2) == 1) __builtin_trap();
    lua_pop(L, 1);
  }
  lua_settop(L, 0);
  return 0;
}
