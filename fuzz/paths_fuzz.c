/*
** libFuzzer target for sbx.paths (lua/sbx/core/paths.lua): resolve() turns a
** sandbox path into an absolute one for the container backends, and
** link_escapes() judges the symlinks of a downloaded tree. The kernel is
** the oracle: openat2() on a fixture tree made once per process.
**
** resolve(W, P) is lexical: it joins P to the working directory W, drops
** "." and empty segments, lets ".." remove the previous segment and raises
** when ".." would climb above "/". It never looks at the file system, so
** it can only agree with the kernel where no symlink is crossed. Checked:
**  R1 it returns a string or raises a PathError (a typed error), nothing
**     else; it raises exactly when P holds a NUL, is longer than 4096
**     bytes, or the lexical walk of W/P climbs above "/" (a C walk);
**  R2 the answer is canonical: "/" or "/" followed by segments that are
**     neither empty, "." nor "..";
**  R3 the answer never names a place outside the root: opened under the
**     fixture root with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS the kernel
**     never reports EXDEV;
**  R4 where the kernel's own walk of W/P inside the root crosses no symlink
**     (openat2 RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS succeeds) and resolve()
**     answers, the answer opens (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS) the
**     same inode (st_dev, st_ino). O_PATH | O_NOFOLLOW on both sides: a
**     last component that is a symlink is the link itself, as resolve()
**     means it;
**  R5 split() of the answer joins back to it.
** link_escapes(rel, target) says whether a symlink at rel (relative to a
** downloaded directory D) points out of D. D holds real directories and
** links that link_escapes() accepts; the input's bytes become a link at
** "l", "a/l" or "a/b/l". Checked:
**  L1 when link_escapes() says no, following the link with openat2
**     RESOLVE_BENEATH from D never reports EXDEV (the kernel would leave D).
** Input: byte 0 picks W (bits 0-1) and the link's directory (bits 2-3);
** the rest is P and the target. Built and run by fuzz/run.sh, which
** defines SBX_LUA_DIR (the source tree's lua/).
*/
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/openat2.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "lauxlib.h"
#include "lua.h"
#include "lualib.h"
#include "luacov.h"

#ifndef SBX_LUA_DIR
#define SBX_LUA_DIR "lua"
#endif

static lua_State *L;
static char tmp[] = "/tmp/sbxpaths.XXXXXX";
static int rootfd = -1, dlfd = -1;

static const char *const workdirs[] = {"/", "/w", "/w/a/b", "/d"};
static const char *const linkdirs[] = {"", "a/", "a/b/", "a/"};

static void die(void);
#define CHECK(c) do { if (!(c)) { \
    fprintf(stderr, "paths_fuzz: property failed at line %d: %s\n", __LINE__, #c); \
    die(); } } while (0)

/* ------------------------------------------------------------ fixture */

/* The tree, relative to the root: d=dir, f=file, p=fifo, l=symlink. */
static const struct { char t; const char *path, *target; } fixture[] = {
  {'d', "w", 0}, {'d', "w/a", 0}, {'d', "w/a/b", 0}, {'d', "w/a/b/c", 0},
  {'d', "d", 0}, {'f', "d/e", 0}, {'f', "w/f", 0}, {'f', "w/a/g", 0},
  {'p', "w/p", 0},
  {'l', "w/l_root", "/"}, {'l', "w/l_up", ".."}, {'l', "w/l_upup", "../.."},
  {'l', "w/l_abs", "/d"}, {'l', "w/l_absfile", "/d/e"}, {'l', "w/l_rel", "a/b"},
  {'l', "w/l_loop1", "l_loop2"}, {'l', "w/l_loop2", "l_loop1"},
  {'l', "w/l_self", "l_self"}, {'l', "w/l_dot", "."},
  {'l', "w/l_etc", "/etc"}, {'l', "w/l_dangling", "nope"},
  {'l', "w/a/l_out", "../../../outside"}, {'l', "w/a/b/l_absup", "/../.."},
  {'l', "w/a/b/c/l_proc", "/proc/self/root"}, {'l', "d/l_w", "../w"},
  /* the downloaded directory: real dirs, and links link_escapes() accepts */
  {'d', "dl", 0}, {'d', "dl/a", 0}, {'d', "dl/a/b", 0}, {'f', "dl/a/b/f", 0},
  {'l', "dl/x", "."}, {'l', "dl/a/y", ".."}, {'l', "dl/a/b/z", "../../a"},
  {'l', "dl/a/s", "b"},
};

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f) {
  (void)st; (void)flag; (void)f;
  return remove(p);
}

static void cleanup(void) {
  if (rootfd >= 0) nftw(tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* abort() for libFuzzer, without leaving the fixture in /tmp */
static void die(void) {
  cleanup();
  abort();
}

static int oa2(int dirfd, const char *path, uint64_t flags, uint64_t resolve) {
  struct open_how how;
  int tries = 0;
  memset(&how, 0, sizeof how);
  how.flags = flags | O_CLOEXEC;
  how.resolve = resolve;
  for (;;) {
    long fd = syscall(SYS_openat2, dirfd, *path ? path : ".", &how, sizeof how);
    if (fd >= 0 || (errno != EAGAIN && errno != EINTR) || ++tries > 64) return (int)fd;
  }
}

static void make_fixture(void) {
  char p[256];
  CHECK(mkdtemp(tmp));
  atexit(cleanup);
  snprintf(p, sizeof p, "%s/root", tmp);
  CHECK(mkdir(p, 0755) == 0);
  snprintf(p, sizeof p, "%s/outside", tmp);
  CHECK(mkdir(p, 0755) == 0);          /* where l_out points */
  snprintf(p, sizeof p, "%s/root", tmp);
  rootfd = open(p, O_PATH | O_DIRECTORY | O_CLOEXEC);
  CHECK(rootfd >= 0);
  for (size_t i = 0; i < sizeof fixture / sizeof fixture[0]; i++) {
    const char *q = fixture[i].path;
    switch (fixture[i].t) {
      case 'd': CHECK(mkdirat(rootfd, q, 0755) == 0); break;
      case 'f': { int fd = openat(rootfd, q, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
                  CHECK(fd >= 0); close(fd); break; }
      case 'p': CHECK(mknodat(rootfd, q, S_IFIFO | 0644, 0) == 0); break;
      case 'l': CHECK(symlinkat(fixture[i].target, rootfd, q) == 0); break;
    }
  }
  dlfd = openat(rootfd, "dl", O_PATH | O_DIRECTORY | O_CLOEXEC);
  CHECK(dlfd >= 0);
}

/* ------------------------------------------------------------ Lua */

/* paths[fn](args...) in protected mode: LUA_OK or not, results on the stack. */
static int call_paths(const char *fn, int nargs, int nres) {
  /* stack: args */
  lua_getglobal(L, "paths");
  lua_getfield(L, -1, fn);
  lua_remove(L, -2);
  lua_insert(L, -nargs - 1);
  return lua_pcall(L, nargs, nres, 0);
}

/* Is the error on top a typed error of this kind (errors.is)? */
static int is_kind(const char *kind) {
  int r;
  lua_getglobal(L, "errors");
  lua_getfield(L, -1, "is");
  lua_remove(L, -2);
  lua_pushvalue(L, -2);
  lua_pushstring(L, kind);
  lua_call(L, 2, 1);
  r = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return r;
}

static void init_lua(void) {
  L = luacov_newstate(SBX_LUA_DIR);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "sbx.core.paths");
  if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
    fprintf(stderr, "paths_fuzz: %s (SBX_LUA_DIR=%s)\n", lua_tostring(L, -1), SBX_LUA_DIR);
    die();
  }
  lua_setglobal(L, "paths");
  lua_getglobal(L, "require");
  lua_pushliteral(L, "sbx.core.errors");
  lua_call(L, 1, 1);
  lua_setglobal(L, "errors");
  /* the fixture's own links must be ones link_escapes() accepts */
  for (size_t i = 0; i < sizeof fixture / sizeof fixture[0]; i++) {
    if (fixture[i].t != 'l' || strncmp(fixture[i].path, "dl/", 3) != 0) continue;
    lua_pushstring(L, fixture[i].path + 3);
    lua_pushstring(L, fixture[i].target);
    CHECK(call_paths("link_escapes", 2, 1) == LUA_OK && !lua_toboolean(L, -1));
    lua_pop(L, 1);
  }
  luacov_start(L);
}

/* ------------------------------------------------------------ oracles */

/* Does the lexical walk of `full` climb above "/"? */
static int climbs(const char *full, size_t n) {
  long depth = 0;
  for (size_t i = 0; i < n;) {
    size_t k = 0;
    while (i + k < n && full[i + k] != '/') k++;
    if (k == 2 && full[i] == '.' && full[i + 1] == '.') {
      if (depth == 0) return 1;
      depth--;
    } else if (k > 0 && !(k == 1 && full[i] == '.')) depth++;
    i += k + 1;
  }
  return 0;
}

static int canonical(const char *r, size_t n) {
  if (n == 0 || r[0] != '/' || memchr(r, '\0', n)) return 0;
  if (n == 1) return 1;
  for (size_t i = 1; i <= n;) {           /* each segment after a "/" */
    size_t k = 0;
    while (i + k < n && r[i + k] != '/') k++;
    if (k == 0 || (k == 1 && r[i] == '.') || (k == 2 && r[i] == '.' && r[i + 1] == '.'))
      return 0;
    i += k + 1;
  }
  return 1;
}

static int same_file(int a, int b) {
  struct stat sa, sb;
  CHECK(fstat(a, &sa) == 0 && fstat(b, &sb) == 0);
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static void check_resolve(const char *w, const char *p, size_t n) {
  static char full[8192 + 8];
  size_t wn = strlen(w), fn;
  int st;
  /* W/P as resolve() builds it (also the kernel's path inside the root) */
  if (n > 0 && p[0] == '/') { memcpy(full, p, n); fn = n; }
  else if (n <= 4096) {
    memcpy(full, w, wn);
    full[wn] = '/';
    memcpy(full + wn + 1, p, n);
    fn = wn + 1 + n;
  } else fn = 0;
  full[fn] = '\0';
  lua_pushstring(L, w);
  lua_pushlstring(L, p, n);
  lua_pushliteral(L, "fuzz");
  st = call_paths("resolve", 3, 1);
  if (st != LUA_OK) {                     /* R1: typed, and justified */
    if (!lua_istable(L, -1) || !is_kind("PathError")) {
      fprintf(stderr, "paths_fuzz: resolve raised an untyped error: %s\n",
              luaL_tolstring(L, -1, NULL));
      die();
    }
    CHECK(memchr(p, '\0', n) || n > 4096 || climbs(full, fn));
    lua_pop(L, 1);
    return;
  }
  size_t rn;
  const char *r = lua_tolstring(L, -1, &rn);
  CHECK(r && lua_type(L, -1) == LUA_TSTRING);
  CHECK(!memchr(p, '\0', n) && n <= 4096 && !climbs(full, fn));   /* R1 */
  CHECK(canonical(r, rn));                                          /* R2 */
  int lfd = oa2(rootfd, r + 1, O_PATH | O_NOFOLLOW, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS);
  CHECK(lfd >= 0 || errno != EXDEV);                                /* R3 */
  int kfd = oa2(rootfd, full, O_PATH | O_NOFOLLOW, RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS);
  if (kfd >= 0) {                                                   /* R4 */
    if (lfd < 0)
      fprintf(stderr, "paths_fuzz: kernel opens '%s' but not resolve()'s '%s': %s\n",
              full, r, strerror(errno));
    CHECK(lfd >= 0);
    if (!same_file(kfd, lfd))
      fprintf(stderr, "paths_fuzz: '%s' is not resolve()'s '%s'\n", full, r);
    CHECK(same_file(kfd, lfd));
    close(kfd);
  }
  if (lfd >= 0) close(lfd);
  /* R5: split(r) */
  lua_pushvalue(L, -1);
  CHECK(call_paths("split", 1, 2) == LUA_OK);
  {
    size_t dn, bn;
    const char *d = lua_tolstring(L, -2, &dn), *b = lua_tolstring(L, -1, &bn);
    CHECK(d && b && !memchr(b, '/', bn));
    lua_pushfstring(L, "%s%s%s", d, (dn == 1 || bn == 0) ? "" : "/", b);
    CHECK(lua_rawequal(L, -1, -4));
    lua_pop(L, 3);
  }
  lua_pop(L, 1);
}

static void check_link(const char *dir, const char *t, size_t n) {
  char rel[16];
  int escapes, fd;
  if (n == 0 || n > 4095 || memchr(t, '\0', n)) return;   /* not a possible link */
  snprintf(rel, sizeof rel, "%sl", dir);
  lua_pushstring(L, rel);
  lua_pushlstring(L, t, n);
  CHECK(call_paths("link_escapes", 2, 1) == LUA_OK && lua_isboolean(L, -1));
  escapes = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (escapes) return;                    /* refused: nothing to check */
  CHECK(symlinkat(t, dlfd, rel) == 0);
  fd = oa2(dlfd, rel, O_PATH, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS);
  if (fd < 0 && errno == EXDEV)
    fprintf(stderr, "paths_fuzz: link_escapes('%s', '%s') is false, yet it leaves the "
            "directory\n", rel, t);
  CHECK(fd >= 0 || errno != EXDEV);                                 /* L1 */
  if (fd >= 0) close(fd);
  CHECK(unlinkat(dlfd, rel, 0) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static char *buf;
  if (!L) {
    make_fixture();
    init_lua();
    buf = malloc(1 << 16);
  }
  if (size < 1 || size > (1 << 16)) return 0;
  luacov_reset();
  memcpy(buf, data + 1, size - 1);        /* NUL-terminated for printing */
  buf[size - 1] = '\0';
  check_resolve(workdirs[data[0] & 3], buf, size - 1);
  check_link(linkdirs[(data[0] >> 2) & 3], buf, size - 1);
  lua_settop(L, 0);
  lua_gc(L, LUA_GCCOLLECT);               /* no leak check per input */
  return 0;
}
