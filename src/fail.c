/*
** How the C modules fail (fail.h): nil, "<op>: <detail>", "<CODE>" with
** errno names as codes, and the dlopen loader of the modules that wrap a
** library loaded on first use (lhttp.c: libcurl, ltar.c: libarchive).
*/
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "fail.h"

const char *sbx_errno_name(int err) {
  switch (err) {
#define E(x) case x: return #x;
    E(ENOENT) E(EEXIST) E(EACCES) E(EPERM) E(ENOTDIR) E(EISDIR) E(EINVAL)
    E(ENOSPC) E(EMFILE) E(ENFILE) E(ENOMEM) E(EAGAIN) E(EBUSY) E(ELOOP)
    E(ENAMETOOLONG) E(EXDEV) E(EPIPE) E(ESRCH) E(ECHILD) E(ENOEXEC)
    E(E2BIG) E(EROFS) E(ENOTEMPTY) E(ETIMEDOUT) E(EINTR) E(EIO)
    E(ECONNREFUSED) E(ECONNRESET) E(EHOSTUNREACH) E(ENOTCONN) E(EPROTO)
    E(ENETUNREACH) E(EADDRNOTAVAIL) E(ECANCELED)
#undef E
    default: return "EUNKNOWN";
  }
}

int sbx_fail(lua_State *L, const char *op, const char *detail,
             const char *code) {
  lua_pushnil(L);
  lua_pushfstring(L, "%s: %s", op, detail);
  lua_pushstring(L, code);
  return 3;
}

int sbx_fail_errno(lua_State *L, const char *op, const char *what, int err) {
  lua_pushnil(L);
  if (what)
    lua_pushfstring(L, "%s: %s: %s", op, what, strerror(err));
  else
    lua_pushfstring(L, "%s: %s", op, strerror(err));
  lua_pushstring(L, sbx_errno_name(err));
  return 3;
}

void *sbx_dlopen(const char *soname, const char *lib, const char *pkg, char *why, size_t n) {
  void *h = dlopen(soname, RTLD_LAZY | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(why, n, "%s not found: apt-get install %s (%s)", lib, pkg, e ? e : "?");
  }
  return h;
}

void *sbx_dlsym(void *h, const char *sym, const char *lib, const char *pkg, char *why, size_t n) {
  void *f = dlsym(h, sym);
  if (!f) snprintf(why, n, "%s too old or not the real one (no %s): apt-get install %s", lib, sym, pkg);
  return f;
}
