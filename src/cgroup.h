/* sbx.cgroup, the Lua module over proctree.c. */
#ifndef SBX_CGROUP_H
#define SBX_CGROUP_H

#include "lua.h"

int luaopen_sbx_cgroup(lua_State *L);

#endif
