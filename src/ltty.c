/*
** sbx.tty: is a file descriptor a terminal, and how wide is it. For the
** live progress line (lua/sbx/core/progress.lua), which is drawn only on a
** terminal and must not wrap.
*/
#include <errno.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "lauxlib.h"
#include "loop.h"

static int check_fd(lua_State *L) {
  lua_Integer fd = luaL_checkinteger(L, 1);
  luaL_argcheck(L, fd >= 0 && fd <= 1024 * 1024, 1, "not a file descriptor");
  return (int)fd;
}

/* tty.isatty(fd) -> boolean */
static int tty_isatty(lua_State *L) {
  lua_pushboolean(L, isatty(check_fd(L)));
  return 1;
}

/* tty.size(fd) -> columns, rows | nil, msg, code */
static int tty_size(lua_State *L) {
  struct winsize ws;
  int fd = check_fd(L);
  if (ioctl(fd, TIOCGWINSZ, &ws) < 0) return sbx_fail_errno(L, "tty.size", NULL, errno);
  lua_pushinteger(L, ws.ws_col);
  lua_pushinteger(L, ws.ws_row);
  return 2;
}

static const luaL_Reg tty_funcs[] = {
  {"isatty", tty_isatty},
  {"size", tty_size},
  {NULL, NULL}
};

int luaopen_sbx_tty(lua_State *L) {
  luaL_newlib(L, tty_funcs);
  return 1;
}
