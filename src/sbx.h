/* The host's C side as one unit: C modules plus the embedded Lua library. */
#ifndef SBX_H
#define SBX_H

#include "lua.h"

#define SBX_VERSION "0.1.0"

/* Register the C modules in package.preload and the searcher that finds
** the Lua library (embedded, or under $SBX_LUA_PATH when that is set). */
void sbx_openlibs(lua_State *L);
int luaopen_sbx(lua_State *L);

#endif
