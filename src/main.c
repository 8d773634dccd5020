/*
** sbxlua: a Lua 5.4 interpreter with the sbx library built in. All
** command-line handling lives in lua/sbx/cli/init.lua; this only prepares the
** process and the state.
*/
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include "lauxlib.h"
#include "lualib.h"
#include "sbx.h"
#include "spawn.h"

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

/* The loop is the one serial part of a job: with two hundred commands
** starting at once on two cores, a loop at their priority gets a share
** of one of them and every command waits for it to start the next. So
** where the process may (root, CAP_SYS_NICE, RLIMIT_NICE), its threads
** run SBX_LOOP_BOOST (default 5, 0: off) nice steps above where it was
** started; every command starts at that original value (sbx_child_nice),
** and so do os.execute's and io.popen's, which are wrapped below. */
static int boosted = INT_MIN;  /* the threads' nice; the original is sbx_child_nice */

static void boost_loop(void) {
  const char *v = getenv("SBX_LOOP_BOOST");
  int steps = v ? atoi(v) : 5;
  if (steps <= 0) return;
  if (steps > 10) steps = 10;
  errno = 0;
  int nice = getpriority(PRIO_PROCESS, 0);
  if (errno) return;
  int target = nice - steps < -20 ? -20 : nice - steps;
  if (target == nice || setpriority(PRIO_PROCESS, 0, target) < 0) return;
  boosted = target;
  sbx_child_nice = nice;
}

/* os.execute and io.popen start their child from this thread: at the
** original priority, then back to the boost. */
static int unboosted(lua_State *L) {
  int n = lua_gettop(L);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  if (boosted != INT_MIN) setpriority(PRIO_PROCESS, 0, sbx_child_nice);
  int status = lua_pcall(L, n, LUA_MULTRET, 0);
  if (boosted != INT_MIN) setpriority(PRIO_PROCESS, 0, boosted);
  if (status != LUA_OK) return lua_error(L);
  return lua_gettop(L);
}

static void wrap(lua_State *L, const char *lib, const char *name) {
  lua_getglobal(L, lib);
  lua_getfield(L, -1, name);
  lua_pushcclosure(L, unboosted, 1);
  lua_setfield(L, -2, name);
  lua_pop(L, 1);
}

static int run(lua_State *L) {
  int argc = (int)lua_tointeger(L, 1);
  char **argv = lua_touserdata(L, 2);
  luaL_openlibs(L);
  sbx_openlibs(L);
  if (boosted != INT_MIN) {
    wrap(L, "os", "execute");
    wrap(L, "io", "popen");
  }
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
  boost_loop();          /* before any thread starts: they inherit it */
  lua_State *L = luaL_newstate();
  if (!L) {
    fprintf(stderr, "sbxlua: cannot create a Lua state (out of memory)\n");
    return 1;
  }
  /* A job's garbage is young (each command's request, result and proc:
  ** ~3 KB), its old data long-lived (modules, sandboxes): generational
  ** collection took 10% less of sbxlua's own CPU than incremental in
  ** bench/concurrent.lua 200 x 10, for 1 MB more peak RSS at 1,000
  ** sandboxes. Embedders keep the mode of their own state. */
  lua_gc(L, LUA_GCGEN, 0, 0);
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
