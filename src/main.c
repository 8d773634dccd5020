/*
** sbxlua: a Lua 5.4 interpreter with the sbx library built in. All
** command-line handling lives in lua/sbx/cli/init.lua; this only prepares the
** process and the state.
*/
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "lauxlib.h"
#include "lualib.h"
#include "sbx.h"

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  luaL_traceback(L, L, msg ? msg : luaL_tolstring(L, 1, NULL), 1);
  return 1;
}

/* Children must find fds 0-2 open, or a pipe could land there. */
static void ensure_std_fds(void) {
  for (int fd = 0; fd < 3; fd++)
    if (fcntl(fd, F_GETFD) < 0) open("/dev/null", fd ? O_WRONLY : O_RDONLY);
}

static int run(lua_State *L) {
  int argc = (int)lua_tointeger(L, 1);
  char **argv = lua_touserdata(L, 2);
  luaL_openlibs(L);
  sbx_openlibs(L);
  lua_getglobal(L, "require");
  lua_pushstring(L, "sbx.cli");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, "main");
  lua_createtable(L, argc, 0);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i);
  }
  lua_call(L, 1, 1);
  return 1;
}

int main(int argc, char **argv) {
  int status = 1;
  ensure_std_fds();
  signal(SIGPIPE, SIG_IGN);
  lua_State *L = luaL_newstate();
  if (!L) {
    fprintf(stderr, "sbxlua: cannot create a Lua state (out of memory)\n");
    return 1;
  }
  lua_pushcfunction(L, traceback);
  lua_pushcfunction(L, run);
  lua_pushinteger(L, argc);
  lua_pushlightuserdata(L, argv);
  if (lua_pcall(L, 2, 1, 1) != LUA_OK) {
    fprintf(stderr, "sbxlua: %s\n", lua_tostring(L, -1));
  } else {
    status = (int)luaL_optinteger(L, -1, 0);
  }
  lua_close(L);
  return status;
}
