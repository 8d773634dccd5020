/*
** Coverage feedback for libFuzzer from Lua code: the Lua VM is not built
** with sanitizer coverage, so a target that tests a Lua module would fuzz
** blind. A line hook hashes (chunk, line) transitions into libFuzzer's
** extra counters (AFL-style edges), which libFuzzer treats like its own.
** Only chunks loaded from files count: a harness written in Lua and
** loaded from a string adds no noise.
** Header-only; included by the targets that load lua/sbx/ modules.
*/
#ifndef SBX_FUZZ_LUACOV_H
#define SBX_FUZZ_LUACOV_H

#include <stdint.h>

#include "lauxlib.h"
#include "lua.h"
#include "lualib.h"

#define LUACOV_SIZE 65536

__attribute__((section("__libfuzzer_extra_counters"), used))
static uint8_t luacov_counters[LUACOV_SIZE];
static uintptr_t luacov_prev;

static void luacov_hook(lua_State *L, lua_Debug *ar) {
  uintptr_t cur;
  if (!lua_getinfo(L, "S", ar) || ar->source[0] != '@') return;  /* files only */
  cur = ((uintptr_t)ar->source * 31u + (uintptr_t)ar->currentline)
        * (uintptr_t)0x9e3779b97f4a7c15u;
  cur >>= 40;
  luacov_counters[(cur ^ luacov_prev) % LUACOV_SIZE]++;
  luacov_prev = cur >> 1;
}

/* A state with the standard libraries whose require finds the lua/sbx/
** modules under dir (the source tree's lua/). */
static inline lua_State *luacov_newstate(const char *dir) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  lua_getglobal(L, "package");
  lua_pushfstring(L, "%s/?.lua", dir);
  lua_setfield(L, -2, "path");
  lua_pop(L, 1);
  return L;
}

/* Start recording line transitions in L (and every coroutine it makes). */
static void luacov_start(lua_State *L) {
  lua_sethook(L, luacov_hook, LUA_MASKLINE, 0);
}

/* One input begins: edges do not run across inputs. */
static void luacov_reset(void) { luacov_prev = 0; }

#endif
