/*
** sbx.bwrap: the C primitives of the bwrap backend (lua/sbx/providers/builtin/
** bwrap.lua): its seccomp program, and a look at one path beneath a host
** directory that never follows a symlink, which the backend's resolver
** uses to walk sandbox paths across the sandbox's mounts.
*/
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "lauxlib.h"
#include "loop.h"
#include "seccomp.h"

/* bwrap.seccomp() -> program bytes | nil, msg, "ENOSYS" */
static int bwrap_seccomp(lua_State *L) {
  struct sock_filter prog[SBX_SECCOMP_MAX];
  size_t n = sbx_seccomp_program(prog, SBX_SECCOMP_MAX);
  if (n == 0)
    return sbx_fail(L, "seccomp", "no filter for this architecture", "ENOSYS");
  lua_pushlstring(L, (const char *)prog, n * sizeof *prog);
  return 1;
}

/* bwrap.denied() -> { name, ... }: what the filter refuses */
static int bwrap_denied(lua_State *L) {
  lua_newtable(L);
  for (size_t i = 0; sbx_seccomp_denied(i); i++) {
    lua_pushstring(L, sbx_seccomp_denied(i));
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return 1;
}

static const char *type_name(mode_t m) {
  return S_ISREG(m) ? "file" : S_ISDIR(m) ? "dir" : S_ISLNK(m) ? "link"
       : S_ISFIFO(m) ? "fifo" : S_ISSOCK(m) ? "socket" : S_ISCHR(m) ? "char"
       : S_ISBLK(m) ? "block" : "other";
}

/* bwrap.lookup(host_dir, rel) -> {type, size, mtime, mode, [target]}
**   | nil, msg, code. rel ("" is host_dir itself) is resolved beneath
** host_dir: a symlink on the way that points out fails with "ESCAPE", and
** the last component is never followed (a link reports its target). */
static int bwrap_lookup(lua_State *L) {
  size_t dlen, rlen;
  const char *dir = luaL_checklstring(L, 1, &dlen);
  const char *rel = luaL_checklstring(L, 2, &rlen);
  char target[4096];
  struct open_how how;
  struct stat st;
  ssize_t tn = -1;
  int err = 0;
  if (strlen(dir) != dlen || strlen(rel) != rlen || rel[0] == '/')
    return sbx_fail(L, "lookup", "invalid path", "EINVAL");
  int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return sbx_fail_errno(L, "lookup", dir, errno);
  memset(&how, 0, sizeof how);
  how.flags = O_PATH | O_NOFOLLOW | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  long fd;
  do fd = syscall(SYS_openat2, dfd, *rel ? rel : ".", &how, sizeof how);
  while (fd < 0 && (errno == EAGAIN || errno == EINTR));
  if (fd < 0) err = errno;
  close(dfd);
  if (fd < 0) {
    if (err == EXDEV || err == ELOOP)
      return sbx_fail(L, "lookup", lua_pushfstring(L, "%s: path escapes its mount", rel),
                      "ESCAPE");
    return sbx_fail_errno(L, "lookup", rel, err);
  }
  if (fstat((int)fd, &st) < 0) err = errno;
  else if (S_ISLNK(st.st_mode) &&
           (tn = readlinkat((int)fd, "", target, sizeof target)) < 0)
    err = errno;
  close((int)fd);
  if (err) return sbx_fail_errno(L, "lookup", rel, err);
  lua_createtable(L, 0, 5);
  lua_pushstring(L, type_name(st.st_mode));
  lua_setfield(L, -2, "type");
  lua_pushinteger(L, (lua_Integer)st.st_size);
  lua_setfield(L, -2, "size");
  lua_pushinteger(L, (lua_Integer)st.st_mtim.tv_sec);
  lua_setfield(L, -2, "mtime");
  lua_pushinteger(L, (lua_Integer)(st.st_mode & 07777));
  lua_setfield(L, -2, "mode");
  if (tn >= 0) {
    lua_pushlstring(L, target, (size_t)tn < sizeof target ? (size_t)tn : sizeof target);
    lua_setfield(L, -2, "target");
  }
  return 1;
}

/* bwrap.populate(host_dir, { {name=, type="dir"|"file"|"link", mode=,
**   target=}, ... }) -> true | nil, msg, code: create the entries directly
** beneath host_dir (names without '/'); existing ones are left alone. */
static int bwrap_populate(lua_State *L) {
  const char *dir = luaL_checkstring(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC), err;
  if (dfd < 0) return sbx_fail_errno(L, "populate", dir, errno);
  lua_Integer n = luaL_len(L, 2);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, 2, i);
    lua_getfield(L, -1, "name");
    lua_getfield(L, -2, "type");
    lua_getfield(L, -3, "mode");
    lua_getfield(L, -4, "target");
    const char *name = lua_tostring(L, -4), *type = lua_tostring(L, -3);
    const char *target = lua_tostring(L, -1);
    int isint;
    lua_Integer m = lua_tointegerx(L, -2, &isint);
    mode_t mode = isint ? (mode_t)(m & 07777) : 0755;
    if (!name || !*name || strchr(name, '/') || strcmp(name, ".") == 0 ||
        strcmp(name, "..") == 0 || !type) {
      close(dfd);
      return luaL_error(L, "populate: entry %d needs a plain name and a type", (int)i);
    }
    int r;
    if (strcmp(type, "dir") == 0) {
      r = mkdirat(dfd, name, mode);
      if (r == 0) r = fchmodat(dfd, name, mode, 0);   /* past the umask */
    } else if (strcmp(type, "link") == 0) {
      r = target ? symlinkat(target, dfd, name) : (errno = EINVAL, -1);
    } else {
      r = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, mode);
      if (r >= 0) r = close(r);
    }
    if (r < 0 && errno != EEXIST) {
      err = errno;
      close(dfd);
      return sbx_fail_errno(L, "populate", lua_pushfstring(L, "%s/%s", dir, name), err);
    }
    lua_pop(L, 5);
  }
  close(dfd);
  lua_pushboolean(L, 1);
  return 1;
}

/* Add the entries beneath dfd (taken over and closed) that others may
** not read to the list at stack index 2; returns the count so far (n).
** Bounded in depth and count. Lua may raise here (memory): the DIR of
** each level leaks then, as a failed allocation is fatal anyway. */
static int hidden_walk(lua_State *L, int dfd, const char *prefix, int depth, int n) {
  DIR *d = fdopendir(dfd);
  struct dirent *e;
  if (!d) {
    close(dfd);
    return n;
  }
  while ((e = readdir(d)) != NULL && n < 100000) {
    struct stat st;
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
    if (S_ISLNK(st.st_mode)) continue;
    int isdir = S_ISDIR(st.st_mode);
    int open_to_all = (st.st_mode & S_IROTH) && (!isdir || (st.st_mode & S_IXOTH));
    luaL_checkstack(L, 4, "hidden");
    const char *path = lua_pushfstring(L, "%s/%s", prefix, e->d_name);
    if (!open_to_all) {
      lua_createtable(L, 0, 2);
      lua_pushvalue(L, -2);
      lua_setfield(L, -2, "path");
      lua_pushboolean(L, isdir);
      lua_setfield(L, -2, "dir");
      lua_rawseti(L, 2, ++n);      /* the list is at 2 */
    } else if (isdir && depth < 16) {
      int cfd = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (cfd >= 0) n = hidden_walk(L, cfd, path, depth + 1, n);
    }
    lua_pop(L, 1);
  }
  closedir(d);
  return n;
}

/* bwrap.hidden(host_dir) -> { {path=, dir=}, ... }: everything beneath
** host_dir that is not readable by everyone (not descending into it, not
** following symlinks): what a sandbox must not see of a bound directory. */
static int bwrap_hidden(lua_State *L) {
  const char *dir = luaL_checkstring(L, 1);
  lua_settop(L, 1);
  lua_newtable(L);                 /* 2 */
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return sbx_fail_errno(L, "hidden", dir, errno);
  hidden_walk(L, dfd, strcmp(dir, "/") == 0 ? "" : dir, 0, 0);
  return 1;
}

/* bwrap.realpath(host_path) -> resolved | nil, msg, code */
static int bwrap_realpath(lua_State *L) {
  char buf[PATH_MAX];
  const char *path = luaL_checkstring(L, 1);
  if (!realpath(path, buf)) return sbx_fail_errno(L, "realpath", path, errno);
  lua_pushstring(L, buf);
  return 1;
}

/* bwrap.chown(dir, rel, uid, gid) -> true | nil, msg, code: each existing
** component of rel beneath host directory dir (rel "": dir itself) given
** to uid:gid, no symlink followed (a link itself is chowned). */
static int bwrap_chown(lua_State *L) {
  const char *dir = luaL_checkstring(L, 1);
  const char *rel = luaL_checkstring(L, 2);
  uid_t uid = (uid_t)luaL_checkinteger(L, 3);
  gid_t gid = (gid_t)luaL_checkinteger(L, 4);
  char part[PATH_MAX];
  int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return sbx_fail_errno(L, "chown", dir, errno);
  int err = fchownat(dfd, "", uid, gid, AT_EMPTY_PATH) < 0 ? errno : 0;
  for (size_t i = 0, n = strlen(rel); !err && i <= n; i++) {
    if (rel[i] != '/' && rel[i] != '\0') continue;
    if (i == 0 || i >= sizeof part) continue;
    memcpy(part, rel, i);
    part[i] = '\0';
    struct open_how how = {.flags = O_PATH | O_NOFOLLOW | O_CLOEXEC,
                           .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS};
    int fd = (int)syscall(SYS_openat2, dfd, part, &how, sizeof how);
    if (fd < 0) {
      if (errno != ENOENT) err = errno;
      break;
    }
    if (fchownat(fd, "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) err = errno;
    close(fd);
  }
  close(dfd);
  if (err) return sbx_fail_errno(L, "chown", rel, err);
  lua_pushboolean(L, 1);
  return 1;
}

/* bwrap.getuid() -> the real uid and gid of sbxlua */
static int bwrap_getuid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)getuid());
  lua_pushinteger(L, (lua_Integer)getgid());
  return 2;
}

static const luaL_Reg bwrap_funcs[] = {
  {"populate", bwrap_populate},
  {"hidden", bwrap_hidden},
  {"realpath", bwrap_realpath},
  {"getuid", bwrap_getuid},
  {"chown", bwrap_chown},
  {"seccomp", bwrap_seccomp},
  {"denied", bwrap_denied},
  {"lookup", bwrap_lookup},
  {NULL, NULL}
};

int luaopen_sbx_bwrap(lua_State *L) {
  luaL_newlib(L, bwrap_funcs);
  return 1;
}
