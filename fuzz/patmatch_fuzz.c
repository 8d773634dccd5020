/*
** libFuzzer target for src/patmatch.c, the bounded Lua pattern matcher that
** scripts (policies, presets) get: the stock string library is the oracle.
** The input is cut at its first two 0xFF bytes into subject, pattern and
** replacement (pattern and subject kept short: stock backtracks without a
** bound). For find (plain and not), match, gmatch (all matches, at most 64)
** and gsub (with the replacement as a string, a table and a function),
** from an init taken from the input:
**  P1 both succeed with the same values (types included), or both raise
**     the same message;
**  P2 nothing the bounded matcher does crashes or trips the sanitizers.
** Built and run by fuzz/run.sh.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lauxlib.h"
#include "lua.h"
#include "lualib.h"
#include "patmatch.h"

static lua_State *L;

static void no_limit(lua_State *Ls, pm_meter *m, long steps, const char *fname) {
  (void)Ls; (void)m; (void)steps; (void)fname;
}
static pm_meter meter = { no_limit };

static const char harness[] =
  "local S = { find = string.find, match = string.match, gmatch = string.gmatch, gsub = string.gsub }\n"
  "local function pack(ok, ...) return { ok = ok, n = select('#', ...), ... } end\n"
  "local function all(g, s, p, init)\n"
  "  return pack(pcall(function()\n"
  "    local out = {}\n"
  "    for a, b, c in g(s, p, init) do\n"
  "      out[#out + 1] = tostring(a) .. '|' .. tostring(math.type(a)) .. tostring(b) .. '|' .. tostring(c)\n"
  "      if #out >= 64 then break end\n"
  "    end\n"
  "    return table.concat(out, '\\n') end))\n"
  "end\n"
  "local function same(what, a, b)\n"
  "  local ok = a.ok == b.ok and a.n == b.n\n"
  "  for i = 1, math.max(a.n, b.n) do\n"
  "    if a[i] ~= b[i] or math.type(a[i]) ~= math.type(b[i]) then ok = false end\n"
  "  end\n"
  "  if not ok then\n"
  "    local function show(t) local o = {} for i = 1, t.n do o[i] = string.format('%q', tostring(t[i])) end\n"
  "      return tostring(t.ok) .. ': ' .. table.concat(o, ', ') end\n"
  "    error(what .. '\\n  stock:   ' .. show(a) .. '\\n  bounded: ' .. show(b), 0)\n"
  "  end\n"
  "end\n"
  "function check(s, p, r, init)\n"
  "  local case = string.format('subject %q pattern %q repl %q init %d', s, p, r, init)\n"
  "  same('find ' .. case, pack(pcall(S.find, s, p, init)), pack(pcall(B.find, s, p, init)))\n"
  "  same('plain find ' .. case, pack(pcall(S.find, s, p, init, true)), pack(pcall(B.find, s, p, init, true)))\n"
  "  same('match ' .. case, pack(pcall(S.match, s, p, init)), pack(pcall(B.match, s, p, init)))\n"
  "  same('gmatch ' .. case, all(S.gmatch, s, p, init), all(B.gmatch, s, p, init))\n"
  "  same('gsub ' .. case, pack(pcall(S.gsub, s, p, r)), pack(pcall(B.gsub, s, p, r)))\n"
  "  local t = { [s:sub(1, 1)] = r, a = false, b = 7 }\n"
  "  same('gsub table ' .. case, pack(pcall(S.gsub, s, p, t)), pack(pcall(B.gsub, s, p, t)))\n"
  "  local f = function(...) local n = select('#', ...) if n == 1 then return nil end\n"
  "    return n .. table.concat({ ... }, ',') end\n"
  "  same('gsub function ' .. case, pack(pcall(S.gsub, s, p, f, 3)), pack(pcall(B.gsub, s, p, f, 3)))\n"
  "end\n";

static void init_lua(void) {
  L = luaL_newstate();
  luaL_openlibs(L);
  lua_newtable(L);
  lua_pushlightuserdata(L, &meter);
  pm_install(L, -2, -1);
  lua_pop(L, 1);
  lua_setglobal(L, "B");
  if (luaL_dostring(L, harness) != LUA_OK) {
    fprintf(stderr, "patmatch_fuzz: %s\n", lua_tostring(L, -1));
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!L) init_lua();
  if (size < 1) return 0;
  int init = (int)(data[0] % 11) - 5;          /* -5 .. 5 */
  const char *s = (const char *)data + 1, *end = (const char *)data + size;
  const char *c1 = memchr(s, 0xFF, (size_t)(end - s));
  if (!c1) return 0;
  const char *p = c1 + 1;
  const char *c2 = memchr(p, 0xFF, (size_t)(end - p));
  const char *pe = c2 ? c2 : end;
  const char *r = c2 ? c2 + 1 : end;
  if (c1 - s > 48 || pe - p > 24) return 0;    /* stock has no bound */
  lua_getglobal(L, "check");
  lua_pushlstring(L, s, (size_t)(c1 - s));
  lua_pushlstring(L, p, (size_t)(pe - p));
  lua_pushlstring(L, r, (size_t)(end - r));
  lua_pushinteger(L, init);
  if (lua_pcall(L, 4, 0, 0) != LUA_OK) {
    fprintf(stderr, "patmatch_fuzz: %s\n", lua_tostring(L, -1));
    abort();
  }
  lua_settop(L, 0);
  lua_gc(L, LUA_GCCOLLECT);
  return 0;
}
