/*
** The Lua library is compiled into the binary (and into sbx.so): a searcher
** placed right after package.preload finds `sbx.*` modules there, or under
** $SBX_LUA_PATH when a developer points it at the source tree. Embedded
** modules are bytecode with debug info (cmake/embed.cmake), which carries
** its own chunk name ("@lua/sbx/x.lua"); the name computed here is for
** source.
*/
#include <stdlib.h>
#include <string.h>

#include "lauxlib.h"
#include "lualib.h"
#include "cgroup.h"
#include "loop.h"
#include "sbx.h"

typedef struct embedded { const char *name; const char *src; size_t len; } embedded;
extern const embedded sbx_embedded[];

int luaopen_sbx_proc(lua_State *L);
int luaopen_sbx_fs(lua_State *L);
int luaopen_sbx_stream(lua_State *L);
int luaopen_sbx_http(lua_State *L);
int luaopen_sbx_tar(lua_State *L);
int luaopen_sbx_demux(lua_State *L);
int luaopen_sbx_bwrap(lua_State *L);
int luaopen_sbx_yaml(lua_State *L);
int luaopen_sbx_script(lua_State *L);
int luaopen_sbx_tty(lua_State *L);
int luaopen_sbx_httpreq(lua_State *L);

static const embedded *find_embedded(const char *name) {
  for (const embedded *e = sbx_embedded; e->name; e++)
    if (strcmp(e->name, name) == 0) return e;
  return NULL;
}

static int is_ours(const char *name) {
  return strcmp(name, "sbx") == 0 || strncmp(name, "sbx.", 4) == 0;
}

/* Load `name` from $SBX_LUA_PATH: "sbx.a.b" -> DIR/sbx/a/b.lua, or
** DIR/sbx/a/b/init.lua. 1: the chunk is pushed; 0: neither file exists
** (nothing pushed); -1: a file exists but does not load (its error pushed). */
static int load_from_dir(lua_State *L, const char *dir, const char *name) {
  static const char *const forms[] = {"%s.lua", "%s/init.lua"};
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, dir);
  luaL_addchar(&b, '/');
  for (const char *p = name; *p; p++) luaL_addchar(&b, *p == '.' ? '/' : *p);
  luaL_pushresult(&b);
  const char *base = lua_tostring(L, -1);
  for (int i = 0; i < 2; i++) {
    const char *file = lua_pushfstring(L, forms[i], base);
    int st = luaL_loadfile(L, file);
    lua_remove(L, -2);                          /* the file name */
    if (st == LUA_OK || st != LUA_ERRFILE) {
      lua_remove(L, -2);                        /* the base */
      return st == LUA_OK ? 1 : -1;
    }
    lua_pop(L, 1);                              /* "cannot open": try the next */
  }
  lua_pop(L, 1);
  return 0;
}

/* package.searchers entry */
static int searcher(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  const char *dir = getenv("SBX_LUA_PATH");
  if (!is_ours(name)) {
    lua_pushfstring(L, "no module '%s' in sbxlua", name);
    return 1;
  }
  if (dir && *dir) {
    int got = load_from_dir(L, dir, name);
    if (got > 0) {
      lua_pushstring(L, dir);
      return 2;
    }
    if (got < 0) return lua_error(L);   /* a syntax error, not a missing file */
  }
  const embedded *e = find_embedded(name);
  if (!e) {
    lua_pushfstring(L, "no module '%s' embedded in sbxlua", name);
    return 1;
  }
  char chunk[256];
  size_t n = strlen(name);
  memcpy(chunk, "@lua/", 5);
  for (size_t i = 0; i < n && i < 200; i++)
    chunk[5 + i] = name[i] == '.' ? '/' : name[i];
  strcpy(chunk + 5 + (n < 200 ? n : 200), strchr(name, '.') ? ".lua" : "/init.lua");
  if (luaL_loadbuffer(L, e->src, e->len, chunk) != LUA_OK) return lua_error(L);
  lua_pushstring(L, ":embedded:");
  return 2;
}

extern const unsigned char sbx_agent_blob[];
extern const size_t sbx_agent_blob_len;

/* sbx.agentbin -> the bytes of sbx-agent, to place inside sandboxes */
static int open_agentbin(lua_State *L) {
  lua_pushlstring(L, (const char *)sbx_agent_blob, sbx_agent_blob_len);
  return 1;
}

static void preload(lua_State *L, const char *name, lua_CFunction f) {
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, f);
  lua_setfield(L, -2, name);
  lua_pop(L, 1);
}

void sbx_openlibs(lua_State *L) {
  preload(L, "sbx.loop", luaopen_sbx_loop);
  preload(L, "sbx.proc", luaopen_sbx_proc);
  preload(L, "sbx.fs", luaopen_sbx_fs);
  preload(L, "sbx.cgroup", luaopen_sbx_cgroup);
  preload(L, "sbx.agentbin", open_agentbin);
  preload(L, "sbx.stream", luaopen_sbx_stream);
  preload(L, "sbx.bwrap", luaopen_sbx_bwrap);
#ifdef SBX_HAVE_HTTP
  preload(L, "sbx.http", luaopen_sbx_http);
#endif
#ifdef SBX_HAVE_TAR
  preload(L, "sbx.tar", luaopen_sbx_tar);
#endif
#ifdef SBX_HAVE_DEMUX
  preload(L, "sbx.demux", luaopen_sbx_demux);
#endif
#ifdef SBX_HAVE_YAML
  preload(L, "sbx.yaml", luaopen_sbx_yaml);
#endif
  preload(L, "sbx.script", luaopen_sbx_script);
  preload(L, "sbx.tty", luaopen_sbx_tty);
  preload(L, "sbx.httpreq", luaopen_sbx_httpreq);
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "searchers");
  lua_pushcfunction(L, searcher);
  for (lua_Integer i = luaL_len(L, -2); i >= 2; i--) {  /* insert at 2 */
    lua_rawgeti(L, -2, i);
    lua_rawseti(L, -3, i + 1);
  }
  lua_rawseti(L, -2, 2);
  lua_pop(L, 2);
  lua_pushstring(L, SBX_VERSION);
  lua_setfield(L, LUA_REGISTRYINDEX, "sbx.version");
}

/* require "sbx" from any Lua 5.4 host: the C module sbx.so */
int luaopen_sbx(lua_State *L) {
  sbx_openlibs(L);
  lua_pushcfunction(L, searcher);
  lua_pushstring(L, "sbx");
  lua_call(L, 1, 2);
  if (!lua_isfunction(L, -2)) return luaL_error(L, "%s", lua_tostring(L, -1));
  lua_pushstring(L, "sbx");
  lua_insert(L, -2);
  lua_call(L, 2, 1);
  return 1;
}
