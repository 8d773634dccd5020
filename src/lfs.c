/*
** sbx.fs: the jailed file system of the local backend, plus the few host
** file primitives the CLI needs (locks, journals, temp dirs, rmtree).
**
** A Root is a host directory that the sandbox's file API treats as "/".
** Every sandbox path is first normalized lexically ("/", "." and empty
** segments dropped, ".." folded; climbing above the root is "ESCAPE"),
** then resolved by the kernel with openat2(RESOLVE_BENEATH |
** RESOLVE_NO_MAGICLINKS) relative to the root fd, so no symlink, magic
** link or rename race can take a lookup outside. EXDEV and ELOOP from
** that lookup both map to "ESCAPE" (a plain symlink loop included).
** ".." is folded lexically, so "link/.." is the directory holding link.
** Trees are removed through directory fds with O_NOFOLLOW, never through
** host path strings, never into another mount (EXDEV), and with at most
** RM_DEPTH fds open: deeper subtrees are renamed up to the top first.
*/
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "lua.h"
#include "lauxlib.h"
#include "spawn.h"

#define FS_MAXREAD ((lua_Integer)256 << 20)  /* default read cap */
#define RM_DEPTH 32         /* dir fds held by a tree walk before relocating */

/* our own codes, beside errno values */
enum { E_ESCAPE = -1, E_INVAL = -2, E_TOOBIG = -3, E_NOTREG = -4,
       E_LOCKED = -5, E_ROOT = -6 };

/* nil, "<op>: <path>: <reason>", "<CODE>" */
static int fs_fail(lua_State *L, const char *op, const char *path, int err) {
  static const struct { const char *code, *msg; } own[] = {
    {"ESCAPE", "path escapes the root"}, {"EINVAL", "invalid path"},
    {"ETOOBIG", "file exceeds the size cap"},
    {"ENOTREG", "not a regular file"},
    {"EBUSY", "locked by another process"},
    {"EINVAL", "refusing to remove the root"}};
  const char *code, *msg;
  if (err < 0) {
    code = own[-err - 1].code;
    msg = own[-err - 1].msg;
  } else {
    code = strerrorname_np(err);
    msg = strerror(err);
    if (!code) code = "EIO";
  }
  luaL_pushfail(L);
  lua_pushfstring(L, "%s: %s: %s", op, path, msg);
  lua_pushstring(L, code);
  return 3;
}

static int fs_ok(lua_State *L) {
  lua_pushboolean(L, 1);
  return 1;
}

/* A host path argument; NULL if it holds a NUL byte. */
static const char *host_path(lua_State *L, int arg) {
  size_t len;
  const char *p = luaL_checklstring(L, arg, &len);
  return strlen(p) == len ? p : NULL;
}

static int write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/*
** Normalize sandbox path p into rel (PATH_MAX bytes): no leading "/", no
** ".", ".." or empty segments; "" is the root. 0 or an error code.
*/
static int norm_path(const char *p, size_t len, char *rel) {
  size_t i = 0, o = 0;
  if (len >= PATH_MAX || memchr(p, '\0', len)) return E_INVAL;
  while (i < len) {
    size_t j;
    while (i < len && p[i] == '/') i++;
    for (j = i; j < len && p[j] != '/'; j++) {}
    if (j - i == 1 && p[i] == '.') { /* skip */ }
    else if (j - i == 2 && p[i] == '.' && p[i + 1] == '.') {
      if (o == 0) return E_ESCAPE;
      while (o > 0 && rel[o - 1] != '/') o--;
      if (o > 0) o--;
    }
    else if (j > i) {
      if (o > 0) rel[o++] = '/';
      memcpy(rel + o, p + i, j - i);
      o += j - i;
    }
    i = j;
  }
  rel[o] = '\0';
  return 0;
}

/* openat2 beneath rootfd; the fd, or -1 with *err set */
static int beneath(int rootfd, const char *rel, int flags, int mode, int *err) {
  struct open_how how;
  int tries = 0;
  memset(&how, 0, sizeof how);
  how.flags = (uint64_t)(unsigned)(flags | O_CLOEXEC);
  how.mode = (flags & O_CREAT) ? (uint64_t)(unsigned)mode : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  for (;;) {
    long fd = syscall(SYS_openat2, rootfd, *rel ? rel : ".", &how, sizeof how);
    if (fd >= 0) return (int)fd;
    if ((errno == EAGAIN && ++tries < 16) || errno == EINTR) continue;
    *err = (errno == EXDEV || errno == ELOOP) ? E_ESCAPE : errno;
    return -1;
  }
}

/* 0 if rel is a regular file or missing, else an error code; looks
** through O_PATH so that a device or FIFO is never opened for real. */
static int check_regular(int rootfd, const char *rel) {
  struct stat st;
  int err, fd = beneath(rootfd, rel, O_PATH, 0, &err);
  if (fd < 0) return err == ENOENT ? 0 : err;
  err = fstat(fd, &st) < 0 ? errno : S_ISDIR(st.st_mode) ? EISDIR
      : S_ISREG(st.st_mode) ? 0 : E_NOTREG;
  close(fd);
  return err;
}

/* mkdir -p of rel (normalized, modified in place and restored) beneath
** rootfd; returns an O_PATH fd of the directory, or -1 with *err set. */
static int mkdir_p(int rootfd, char *rel, int *err) {
  char *p = rel;
  int pfd = -1;
  if (*rel == '\0') return beneath(rootfd, "", O_PATH | O_DIRECTORY, 0, err);
  for (;;) {
    char *slash = strchr(p, '/');
    int mkerr = 0, nfd;
    if (slash) *slash = '\0';
    if (mkdirat(pfd < 0 ? rootfd : pfd, p, 0755) < 0) mkerr = errno;
    if (mkerr && mkerr != EEXIST) {
      *err = mkerr;
      nfd = -1;
    }
    else {
      nfd = beneath(rootfd, rel, O_PATH | O_DIRECTORY, 0, err);
      if (nfd < 0 && *err == ENOTDIR && !slash) *err = EEXIST;
    }
    if (slash) *slash = '/';
    if (pfd >= 0) close(pfd);
    if (nfd < 0 || !slash) return nfd;
    pfd = nfd;
    p = slash + 1;
  }
}

/* stack: table -> table; sets the stat fields shared by list and stat */
static void set_stat(lua_State *L, const struct stat *st) {
  mode_t m = st->st_mode;
  lua_pushstring(L, S_ISREG(m) ? "file" : S_ISDIR(m) ? "dir"
                 : S_ISLNK(m) ? "link" : S_ISFIFO(m) ? "fifo"
                 : S_ISSOCK(m) ? "socket" : S_ISCHR(m) ? "char"
                 : S_ISBLK(m) ? "block" : "other");
  lua_setfield(L, -2, "type");
  lua_pushinteger(L, (lua_Integer)st->st_size);
  lua_setfield(L, -2, "size");
  lua_pushinteger(L, (lua_Integer)st->st_mtim.tv_sec);
  lua_setfield(L, -2, "mtime");
}

/* ---------------------------------------------------------------------
** Box: a Lua-owned fd or DIR*, closed by __gc if Lua raises mid-call.
*/
typedef struct Box { int fd; DIR *dir; } Box;

static void box_release(Box *b) {
  DIR *d = b->dir;
  int fd = b->fd;
  b->dir = NULL;
  b->fd = -1;
  if (d) closedir(d);
  else if (fd >= 0) close(fd);
}

static int box_close(lua_State *L) {
  box_release(luaL_checkudata(L, 1, "sbx.FsBox"));
  return 0;
}

static int box_tostring(lua_State *L) {
  lua_pushstring(L, "sbx.FsBox");
  return 1;
}

static int box_fail(lua_State *L, Box *bx, const char *op, const char *path,
                    int err) {
  box_release(bx);
  return fs_fail(L, op, path, err);
}

static Box *box_new(lua_State *L) {
  Box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->fd = -1;
  b->dir = NULL;
  luaL_setmetatable(L, "sbx.FsBox");
  return b;
}

/* Read the regular file in bx->fd, at most max bytes; pushes the results. */
static int read_box(lua_State *L, Box *bx, const char *op, const char *path,
                    lua_Integer max) {
  struct stat st;
  luaL_Buffer b;
  size_t total = 0, want;
  int err = 0;
  if (fstat(bx->fd, &st) < 0) err = errno;
  else if (S_ISDIR(st.st_mode)) err = EISDIR;
  else if (!S_ISREG(st.st_mode)) err = E_NOTREG;
  else if (st.st_size > max) err = E_TOOBIG;
  if (err) return box_fail(L, bx, op, path, err);
  want = (size_t)st.st_size + 1;  /* +1 notices a file that grew */
  luaL_buffinitsize(L, &b, want);
  for (;;) {
    char *p = luaL_prepbuffsize(&b, want);
    ssize_t n = read(bx->fd, p, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) { err = errno; break; }
    if (n == 0) break;
    luaL_addsize(&b, (size_t)n);
    total += (size_t)n;
    if (total > (size_t)max) { err = E_TOOBIG; break; }
    want = 64 * 1024;
  }
  if (err) return box_fail(L, bx, op, path, err);
  box_release(bx);
  luaL_pushresult(&b);
  return 1;
}

/* Array of names in a directory, sorted by bytes. stack: +names, +ptrs */
static int cmp_name(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static const char **sorted_names(lua_State *L, DIR *d, int *n, int *err) {
  struct dirent *e;
  const char **v;
  int i = 0;
  lua_newtable(L);
  for (;;) {
    errno = 0;
    if (!(e = readdir(d))) break;
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    lua_pushstring(L, e->d_name);
    lua_rawseti(L, -2, ++i);
  }
  *err = errno;
  *n = i;
  v = lua_newuserdatauv(L, sizeof *v * (size_t)(i ? i : 1), 0);
  for (int k = 0; k < i; k++) {
    lua_rawgeti(L, -2, k + 1);
    v[k] = lua_tostring(L, -1);   /* kept alive by the names table */
    lua_pop(L, 1);
  }
  qsort(v, (size_t)i, sizeof *v, cmp_name);
  return v;
}

/* ---------------------------------------------------------------------
** Tree removal through dir fds, never following a symlink.
*/
typedef struct Rm { int topfd, err; unsigned long seq; uint64_t mnt; } Rm;

static void rm_note(Rm *rm, int err) {
  if (!rm->err) rm->err = err;
}

/* The mount id of dfd/name (0 if unknown; never follows a symlink);
** *mroot: is it the root of a mount? */
static uint64_t mount_of(int dfd, const char *name, int *mroot) {
  struct statx sx;
  int flags = AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT;
  if (!*name) flags |= AT_EMPTY_PATH;
  *mroot = 0;
  if (statx(dfd, name, flags, STATX_MNT_ID, &sx) < 0) return 0;
  *mroot = (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0;
  return (sx.stx_mask & STATX_MNT_ID) ? sx.stx_mnt_id : 0;
}

/* Is dfd/name (or the open dir fd, name "") on another mount than the
** walk, or a mount point? Checked by name before rm_fix touches it, and
** again on the opened fd. */
static int rm_foreign(Rm *rm, int dfd, const char *name) {
  int mroot;
  uint64_t id = mount_of(dfd, name, &mroot);
  return mroot || id != rm->mnt;
}

/* Give the owner rwx on directory dfd/name, if it lacks it. */
static void rm_fix(int dfd, const char *name) {
  struct stat st;
  if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      S_ISDIR(st.st_mode) && (st.st_mode & S_IRWXU) != S_IRWXU)
    fchmodat(dfd, name, (st.st_mode & 07777) | S_IRWXU, AT_SYMLINK_NOFOLLOW);
}

/* Move dfd/name to the top of the walk, so that deep trees need no more
** than RM_DEPTH fds; 1 if moved. */
static int rm_relocate(Rm *rm, int dfd, const char *name) {
  char tmp[64];
  for (int i = 0; i < 100; i++) {
    snprintf(tmp, sizeof tmp, ".sbx-rm-%ld-%lu", (long)getpid(), ++rm->seq);
    if (renameat2(dfd, name, rm->topfd, tmp, RENAME_NOREPLACE) == 0) return 1;
    if (errno != EEXIST) break;
  }
  rm_note(rm, errno);
  return 0;
}

/* Empty the directory dfd (taken over and closed). */
static void rm_contents(Rm *rm, int dfd, int depth) {
  DIR *d = fdopendir(dfd);
  int progress;
  if (!d) {
    rm_note(rm, errno);
    close(dfd);
    return;
  }
  do {
    struct dirent *e;
    progress = 0;
    for (;;) {
      int fd = dirfd(d), err, cfd;
      errno = 0;
      if (!(e = readdir(d))) break;
      const char *n = e->d_name;
      if (strcmp(n, ".") == 0 || strcmp(n, "..") == 0) continue;
      if (unlinkat(fd, n, 0) == 0) { progress = 1; continue; }
      err = errno;
      if (err == ENOENT) continue;
      if (err != EISDIR && err != EPERM) { rm_note(rm, err); continue; }
      if (rm_foreign(rm, fd, n)) {  /* never cross into another mount */
        rm_note(rm, EXDEV);
        continue;
      }
      rm_fix(fd, n);
      if (depth >= RM_DEPTH) {
        progress |= rm_relocate(rm, fd, n);
        continue;
      }
      cfd = openat(fd, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (cfd < 0) {
        rm_note(rm, errno == ENOTDIR || errno == ELOOP ? err : errno);
        continue;
      }
      if (rm_foreign(rm, cfd, "")) {
        rm_note(rm, EXDEV);
        close(cfd);
        continue;
      }
      rm_contents(rm, cfd, depth + 1);
      if (unlinkat(fd, n, AT_REMOVEDIR) == 0) progress = 1;
      else if (errno != ENOENT) rm_note(rm, errno);
    }
    if (errno) rm_note(rm, errno);
    if (progress) rewinddir(d);
  } while (progress);
  closedir(d);
}

/* Open the directory dfd/name and empty it, staying on its mount: 0 and
** its fd in *fdp (the caller closes it; rm->err says what could not go),
** or an errno. */
static int rm_empty(int dfd, const char *name, Rm *rm, int *fdp) {
  int fd, mroot;
  rm->mnt = mount_of(dfd, name, &mroot);
  if (mroot) return EXDEV;  /* a mount point: not ours to empty */
  rm_fix(dfd, name);
  fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno;
  rm->topfd = fd;
  if (rm_foreign(rm, fd, "")) {
    close(fd);
    return EXDEV;
  }
  int wfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (wfd < 0) rm_note(rm, errno);
  else rm_contents(rm, wfd, 0);
  *fdp = fd;
  return 0;
}

/* Remove dfd/name and everything below it; 0 or an errno. */
static int rm_tree(int dfd, const char *name) {
  Rm rm = {-1, 0, 0, 0};
  int fd;
  if (unlinkat(dfd, name, 0) == 0) return 0;
  if (errno != EISDIR && errno != EPERM) return errno;
  int err = rm_empty(dfd, name, &rm, &fd);
  if (err) return err;
  close(fd);
  if (unlinkat(dfd, name, AT_REMOVEDIR) == 0 || errno == ENOENT) return 0;
  return rm.err ? rm.err : errno;
}

/* ---------------------------------------------------------------------
** Root
*/
typedef struct Root { int fd; } Root;

static Root *check_root(lua_State *L) {
  Root *r = luaL_checkudata(L, 1, "sbx.Root");
  if (r->fd < 0) luaL_error(L, "attempt to use a closed sbx.Root");
  return r;
}

/* The sandbox path at arg 2, normalized into rel; 0 or an error code. */
static int root_arg(lua_State *L, char *rel, const char **path) {
  size_t len;
  *path = luaL_checklstring(L, 2, &len);
  return norm_path(*path, len, rel);
}

/* root:read(path, [max_bytes]) -> data | nil, msg, code */
static int root_read(lua_State *L) {
  char rel[PATH_MAX];
  const char *path;
  Root *r = check_root(L);
  int err = root_arg(L, rel, &path);
  lua_Integer max = luaL_optinteger(L, 3, FS_MAXREAD);
  luaL_argcheck(L, max >= 0, 3, "negative size cap");
  if (err || (err = check_regular(r->fd, rel)) != 0)
    return fs_fail(L, "read", path, err);
  Box *bx = box_new(L);
  bx->fd = beneath(r->fd, rel, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0, &err);
  if (bx->fd < 0) return fs_fail(L, "read", path, err);
  return read_box(L, bx, "read", path, max);
}

/* Open rel (normalized; modified and restored) beneath rootfd to write:
** parents made, a regular file only, truncated and given `mode` unless
** `append` (set_mode: the caller named a mode). The fd, or -1 and *err. */
static int put_open(int rootfd, char *rel, int append, int mode, int set_mode,
                    int *err) {
  int fd;
  if (*rel == '\0') { *err = EISDIR; return -1; }
  char *slash = strrchr(rel, '/');
  if (slash) {  /* mkdir -p the parent */
    *slash = '\0';
    fd = mkdir_p(rootfd, rel, err);
    *slash = '/';
    if (fd < 0) return -1;
    close(fd);
  }
  if ((*err = check_regular(rootfd, rel)) != 0) return -1;
  fd = beneath(rootfd, rel, O_WRONLY | O_CREAT | O_NONBLOCK | O_NOCTTY |
               (append ? O_APPEND : 0), mode, err);
  if (fd < 0) {
    if (*err == ENXIO) *err = E_NOTREG;
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) < 0) *err = errno;
  else if (!S_ISREG(st.st_mode)) *err = E_NOTREG;
  else if (!append && ftruncate(fd, 0) < 0) *err = errno;
  else if (!append && set_mode && fchmod(fd, (mode_t)mode) < 0) *err = errno;
  else return fd;
  close(fd);
  return -1;
}

/* Shared by write and append. */
static int root_put(lua_State *L, const char *op, int append) {
  char rel[PATH_MAX];
  const char *path, *data;
  size_t len;
  Root *r = check_root(L);
  int err = root_arg(L, rel, &path), fd;
  data = luaL_checklstring(L, 3, &len);
  lua_Integer mode = append ? 0644 : luaL_optinteger(L, 4, 0644);
  luaL_argcheck(L, mode >= 0 && mode <= 07777, 4, "invalid mode");
  if (err) return fs_fail(L, op, path, err);
  fd = put_open(r->fd, rel, append, (int)mode, !append && !lua_isnoneornil(L, 4), &err);
  if (fd < 0) return fs_fail(L, op, path, err);
  err = write_all(fd, data, len);
  close(fd);
  return err ? fs_fail(L, op, path, err) : fs_ok(L);
}

/* root:write(path, data, [mode]) -> true | nil, msg, code */
static int root_write(lua_State *L) {
  return root_put(L, "write", 0);
}

/* root:append(path, data) -> true | nil, msg, code */
static int root_append(lua_State *L) {
  return root_put(L, "append", 1);
}

/* root:read_at(path, offset, len) -> data (shorter at the end; "" past
** it) | nil, msg, code: a regular file read a piece at a time */
static int root_read_at(lua_State *L) {
  char rel[PATH_MAX];
  const char *path;
  Root *r = check_root(L);
  int err = root_arg(L, rel, &path);
  lua_Integer off = luaL_checkinteger(L, 3), len = luaL_checkinteger(L, 4);
  luaL_argcheck(L, off >= 0, 3, "negative offset");
  luaL_argcheck(L, len >= 0 && len <= (64 << 20), 4, "length out of 0..64 MiB");
  if (err || (err = check_regular(r->fd, rel)) != 0)
    return fs_fail(L, "read", path, err);
  Box *bx = box_new(L);
  bx->fd = beneath(r->fd, rel, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0, &err);
  if (bx->fd < 0) return fs_fail(L, "read", path, err);
  struct stat st;
  if (fstat(bx->fd, &st) < 0) return box_fail(L, bx, "read", path, errno);
  if (!S_ISREG(st.st_mode)) return box_fail(L, bx, "read", path, E_NOTREG);
  if (st.st_size - off < len) len = st.st_size > off ? st.st_size - off : 0;
  luaL_Buffer b;
  size_t got = 0;
  char *p = luaL_buffinitsize(L, &b, (size_t)len);
  while (got < (size_t)len) {
    ssize_t n = pread(bx->fd, p + got, (size_t)len - got, (off_t)(off + (lua_Integer)got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) { err = errno; break; }
    if (n == 0) break;
    got += (size_t)n;
  }
  if (err) return box_fail(L, bx, "read", path, err);
  luaL_pushresultsize(&b, got);
  box_release(bx);
  return 1;
}

/* root:copy(path, dst_root, dst_path, [mode]) -> bytes | nil, msg, code:
** a regular file to another root (parents made) through one small
** buffer, whatever its size; neither side follows a link out */
static int root_copy(lua_State *L) {
  char rel[PATH_MAX], drel[PATH_MAX], buf[64 * 1024];
  const char *path, *dpath;
  size_t dlen;
  Root *r = check_root(L);
  Root *d = luaL_checkudata(L, 3, "sbx.Root");
  int err = root_arg(L, rel, &path), fd;
  dpath = luaL_checklstring(L, 4, &dlen);
  lua_Integer mode = luaL_optinteger(L, 5, 0644);
  luaL_argcheck(L, d->fd >= 0, 3, "closed sbx.Root");
  luaL_argcheck(L, mode >= 0 && mode <= 07777, 5, "invalid mode");
  if (err || (err = check_regular(r->fd, rel)) != 0)
    return fs_fail(L, "copy", path, err);
  if ((err = norm_path(dpath, dlen, drel)) != 0) return fs_fail(L, "copy", dpath, err);
  Box *bx = box_new(L);             /* the source */
  bx->fd = beneath(r->fd, rel, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0, &err);
  if (bx->fd < 0) return fs_fail(L, "copy", path, err);
  struct stat st;
  if (fstat(bx->fd, &st) < 0) return box_fail(L, bx, "copy", path, errno);
  if (!S_ISREG(st.st_mode)) return box_fail(L, bx, "copy", path, E_NOTREG);
  fd = put_open(d->fd, drel, 0, (int)mode, 1, &err);
  if (fd < 0) return box_fail(L, bx, "copy", dpath, err);
  lua_Integer total = 0;
  for (;;) {
    ssize_t n = read(bx->fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) { err = errno; break; }
    if (n == 0) break;
    if ((err = write_all(fd, buf, (size_t)n)) != 0) break;
    total += n;
  }
  if (close(fd) < 0 && !err) err = errno;
  if (err) return box_fail(L, bx, "copy", dpath, err);
  box_release(bx);
  lua_pushinteger(L, total);
  return 1;
}

/* root:list(path) -> { {name, path, is_dir, size, mtime, type}, ... } */
static int root_list(lua_State *L) {
  char rel[PATH_MAX];
  const char *path;
  size_t plen;
  Root *r = check_root(L);
  int err = root_arg(L, rel, &path), n;
  if (err) return fs_fail(L, "list", path, err);
  plen = strlen(path);
  Box *bx = box_new(L);
  bx->fd = beneath(r->fd, rel, O_RDONLY | O_DIRECTORY, 0, &err);
  if (bx->fd < 0) return fs_fail(L, "list", path, err);
  if (!(bx->dir = fdopendir(bx->fd)))
    return box_fail(L, bx, "list", path, errno);
  const char **v = sorted_names(L, bx->dir, &n, &err);
  if (err) return box_fail(L, bx, "list", path, err);
  /* stack: box, names, ptrs, result */
  lua_createtable(L, n, 0);
  for (int i = 0, k = 0; i < n; i++) {
    struct stat st;
    if (fstatat(dirfd(bx->dir), v[i], &st, AT_SYMLINK_NOFOLLOW) < 0) {
      if (errno == ENOENT) continue;  /* removed meanwhile */
      return box_fail(L, bx, "list", path, errno);
    }
    lua_createtable(L, 0, 6);
    lua_pushstring(L, v[i]);
    lua_setfield(L, -2, "name");
    if (plen == 0 || strcmp(path, ".") == 0) lua_pushstring(L, v[i]);
    else lua_pushfstring(L, path[plen - 1] == '/' ? "%s%s" : "%s/%s",
                         path, v[i]);
    lua_setfield(L, -2, "path");
    lua_pushboolean(L, S_ISDIR(st.st_mode));
    lua_setfield(L, -2, "is_dir");
    set_stat(L, &st);
    lua_rawseti(L, -2, ++k);
  }
  box_release(bx);
  return 1;
}

/* root:stat(path) -> {type, size, mtime, mode} | nil, msg, code */
static int root_stat(lua_State *L) {
  char rel[PATH_MAX];
  const char *path;
  struct stat st;
  Root *r = check_root(L);
  int err = root_arg(L, rel, &path), fd;
  if (err) return fs_fail(L, "stat", path, err);
  if ((fd = beneath(r->fd, rel, O_PATH, 0, &err)) < 0)
    return fs_fail(L, "stat", path, err);
  err = fstat(fd, &st) < 0 ? errno : 0;
  close(fd);
  if (err) return fs_fail(L, "stat", path, err);
  lua_createtable(L, 0, 4);
  set_stat(L, &st);
  lua_pushinteger(L, (lua_Integer)(st.st_mode & 07777));
  lua_setfield(L, -2, "mode");
  return 1;
}

/* root:mkdir(path) -> true | nil, msg, code */
static int root_mkdir(lua_State *L) {
  char rel[PATH_MAX];
  const char *path;
  Root *r = check_root(L);
  int err = root_arg(L, rel, &path), fd;
  if (err || (fd = mkdir_p(r->fd, rel, &err)) < 0)
    return fs_fail(L, "mkdir", path, err);
  close(fd);
  return fs_ok(L);
}

/* root:remove(path, [recursive]) -> true | nil, msg, code */
static int root_remove(lua_State *L) {
  char rel[PATH_MAX];
  const char *path, *name;
  Root *r = check_root(L);
  int err = root_arg(L, rel, &path), pfd;
  int recursive = lua_toboolean(L, 3);
  if (err) return fs_fail(L, "remove", path, err);
  if (*rel == '\0') return fs_fail(L, "remove", path, E_ROOT);
  char *slash = strrchr(rel, '/');
  if (slash) {
    *slash = '\0';
    name = slash + 1;
    pfd = beneath(r->fd, rel, O_PATH | O_DIRECTORY, 0, &err);
    *slash = '/';
  }
  else {
    name = rel;
    pfd = beneath(r->fd, "", O_PATH | O_DIRECTORY, 0, &err);
  }
  if (pfd < 0) return fs_fail(L, "remove", path, err);
  if (recursive) err = rm_tree(pfd, name);
  else if (unlinkat(pfd, name, 0) == 0) err = 0;
  else if (errno == EISDIR || errno == EPERM)
    err = unlinkat(pfd, name, AT_REMOVEDIR) == 0 ? 0 : errno;
  else err = errno;
  close(pfd);
  return err ? fs_fail(L, "remove", path, err) : fs_ok(L);
}

/* root:resolve(path) -> host_path | nil, msg, code */
static int root_resolve(lua_State *L) {
  char rel[PATH_MAX], link[64], buf[PATH_MAX];
  const char *path;
  Root *r = check_root(L);
  int err = root_arg(L, rel, &path), fd;
  ssize_t n;
  if (err || (fd = beneath(r->fd, rel, O_PATH, 0, &err)) < 0)
    return fs_fail(L, "resolve", path, err);
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  n = readlink(link, buf, sizeof buf);
  err = n < 0 ? errno : (size_t)n >= sizeof buf ? ENAMETOOLONG : 0;
  close(fd);
  if (err) return fs_fail(L, "resolve", path, err);
  lua_pushlstring(L, buf, (size_t)n);
  return 1;
}

/* root:path() -> host_dir */
static int root_path(lua_State *L) {
  check_root(L);
  lua_getiuservalue(L, 1, 1);
  return 1;
}

/* root:close() */
static int root_close(lua_State *L) {
  Root *r = luaL_checkudata(L, 1, "sbx.Root");
  int fd = r->fd;
  r->fd = -1;
  if (fd >= 0) close(fd);
  return 0;
}

static int root_tostring(lua_State *L) {
  Root *r = luaL_checkudata(L, 1, "sbx.Root");
  lua_getiuservalue(L, 1, 1);
  lua_pushfstring(L, r->fd < 0 ? "sbx.Root (closed)" : "sbx.Root (%s)",
                  lua_tostring(L, -1));
  return 1;
}

/* fs.open_root(host_dir) -> Root | nil, msg, code */
static int fs_open_root(lua_State *L) {
  const char *dir = host_path(L, 1);
  if (!dir) return fs_fail(L, "open_root", lua_tostring(L, 1), E_INVAL);
  Root *r = lua_newuserdatauv(L, sizeof *r, 1);
  r->fd = -1;
  luaL_setmetatable(L, "sbx.Root");
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  r->fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (r->fd < 0) return fs_fail(L, "open_root", dir, errno);
  r->fd = sbx_fd_keep(r->fd);      /* one per sandbox: see spawn.c */
  return 1;
}

/* ---------------------------------------------------------------------
** Lock and Journal: an fd each.
*/
static int *check_fdobj(lua_State *L, const char *tname, int open) {
  int *fd = luaL_checkudata(L, 1, tname);
  if (open && *fd < 0) luaL_error(L, "attempt to use a closed %s", tname);
  return fd;
}

static int fdobj_close(lua_State *L, const char *tname) {
  int *p = check_fdobj(L, tname, 0);
  int fd = *p;
  *p = -1;
  if (fd >= 0) close(fd);  /* releases the flock */
  return 0;
}

static int fdobj_tostring(lua_State *L, const char *tname) {
  int *fd = check_fdobj(L, tname, 0);
  lua_pushfstring(L, *fd < 0 ? "%s (closed)" : "%s (fd %d)", tname, *fd);
  return 1;
}

static int *fdobj_new(lua_State *L, const char *tname) {
  int *fd = lua_newuserdatauv(L, sizeof *fd, 0);
  *fd = -1;
  luaL_setmetatable(L, tname);
  return fd;
}

/* lock:unlock() (also __gc, __close; idempotent) */
static int lock_unlock(lua_State *L) {
  return fdobj_close(L, "sbx.Lock");
}

static int lock_tostring(lua_State *L) {
  return fdobj_tostring(L, "sbx.Lock");
}

/* fs.lock(path) -> Lock | nil, msg, code ("EBUSY" when held) */
static int fs_lock(lua_State *L) {
  const char *path = host_path(L, 1);
  if (!path) return fs_fail(L, "lock", lua_tostring(L, 1), E_INVAL);
  int *fd = fdobj_new(L, "sbx.Lock");
  int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOCTTY, 0600);
  if (f < 0) return fs_fail(L, "lock", path, errno);
  *fd = f = sbx_fd_keep(f);        /* the session's: out of the children's copies */
  while (flock(f, LOCK_EX | LOCK_NB) < 0) {
    int err = errno == EWOULDBLOCK ? E_LOCKED : errno;
    if (errno == EINTR) continue;
    *fd = -1;
    close(f);
    return fs_fail(L, "lock", path, err);
  }
  return 1;
}

/* fs.is_locked(path) -> bool: does anyone (any fd, this process too)
** hold the flock? Probes with LOCK_SH so two probes never collide. */
static int fs_is_locked(lua_State *L) {
  const char *path = host_path(L, 1);
  int held = 0, fd;
  if (path &&
      (fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)) >= 0) {
    int r;
    while ((r = flock(fd, LOCK_SH | LOCK_NB)) < 0 && errno == EINTR) {}
    held = r < 0 && errno == EWOULDBLOCK;
    close(fd);  /* drops a probe lock we got */
  }
  lua_pushboolean(L, held);
  return 1;
}

/* journal:append(line, [durable]) -> true | nil, msg, code: written, and
** with durable (default true) fdatasync'ed before returning. A line another
** process must see after a SIGKILL needs only the write (the page cache
** outlives the process); durable is for what must survive the machine. */
static lua_Integer journal_syncs;  /* fdatasyncs done: fs.journal_syncs() */

static int journal_append(lua_State *L) {
  size_t len;
  int *fd = check_fdobj(L, "sbx.Journal", 1);
  const char *s = luaL_checklstring(L, 2, &len);
  int durable = lua_isnoneornil(L, 3) || lua_toboolean(L, 3);
  int err = write_all(*fd, s, len);
  if (!err && durable) journal_syncs++;
  while (!err && durable && fdatasync(*fd) < 0)
    if (errno != EINTR) err = errno;
  return err ? fs_fail(L, "journal", "append", err) : fs_ok(L);
}

/* fs.journal_syncs() -> how many durable appends this process made (one
** fdatasync each): how tests see that creates share them. */
static int fs_journal_syncs(lua_State *L) {
  lua_pushinteger(L, journal_syncs);
  return 1;
}

/* journal:close() (also __gc, __close; idempotent) */
static int journal_close(lua_State *L) {
  return fdobj_close(L, "sbx.Journal");
}

static int journal_tostring(lua_State *L) {
  return fdobj_tostring(L, "sbx.Journal");
}

/* mkdir -p of a host directory, mode 0700; buf is a writable copy. */
static int host_mkdir_p(char *buf) {
  for (char *p = buf + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    char c = *p;
    *p = '\0';
    int r = mkdir(buf, 0700);
    *p = c;
    if (r < 0 && errno != EEXIST) return errno;
    if (c == '\0') return 0;
  }
}

/* A Lua-owned, NUL-terminated writable copy of s (len bytes). */
static char *scratch(lua_State *L, const char *s, size_t len) {
  char *b = lua_newuserdatauv(L, len + 1, 0);
  memcpy(b, s, len);
  b[len] = '\0';
  return b;
}

/* fs.journal(path) -> Journal | nil, msg, code */
static int fs_journal(lua_State *L) {
  const char *path = host_path(L, 1);
  if (!path) return fs_fail(L, "journal", lua_tostring(L, 1), E_INVAL);
  const char *slash = strrchr(path, '/');
  if (slash && slash > path) {
    int err = host_mkdir_p(scratch(L, path, (size_t)(slash - path)));
    if (err) return fs_fail(L, "journal", path, err);
  }
  int *fd = fdobj_new(L, "sbx.Journal");
  *fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0600);
  if (*fd < 0) return fs_fail(L, "journal", path, errno);
  *fd = sbx_fd_keep(*fd);
  return 1;
}

/* fs.mkdtemp(parent_dir, prefix) -> path | nil, msg, code */
static int fs_mkdtemp(lua_State *L) {
  size_t plen, xlen;
  const char *parent = host_path(L, 1);
  const char *prefix = luaL_checklstring(L, 2, &xlen);
  luaL_argcheck(L, !memchr(prefix, '/', xlen) && strlen(prefix) == xlen, 2,
                "prefix must not contain '/' or NUL");
  if (!parent) return fs_fail(L, "mkdtemp", lua_tostring(L, 1), E_INVAL);
  plen = strlen(parent);
  lua_pushfstring(L, "%s%s%sXXXXXX", parent,
                  plen && parent[plen - 1] != '/' ? "/" : "", prefix);
  size_t tlen;
  const char *t = lua_tolstring(L, -1, &tlen);
  char *buf = scratch(L, t, tlen);
  /* the parent is made only when missing: mkdir -p of an existing path
  ** is one failing mkdir per component, every time */
  char *made = mkdtemp(buf);
  if (!made && errno == ENOENT && plen) {
    int err = host_mkdir_p(scratch(L, parent, plen));
    if (err) return fs_fail(L, "mkdtemp", parent, err);
    memcpy(buf, t, tlen + 1);
    made = mkdtemp(buf);
  }
  if (!made) return fs_fail(L, "mkdtemp", parent, errno);
  lua_pushstring(L, buf);
  return 1;
}

/* fs.mkdir_host(path) -> true | nil, msg, code: mkdir -p (0700) of a host
** directory the user named (download targets) */
static int fs_mkdir_host(lua_State *L) {
  const char *path = host_path(L, 1);
  if (!path) return fs_fail(L, "mkdir", lua_tostring(L, 1), E_INVAL);
  size_t plen = strlen(path);
  char *buf = scratch(L, path, plen);
  int err = plen ? host_mkdir_p(buf) : 0;
  if (err) return fs_fail(L, "mkdir", path, err);
  return fs_ok(L);
}

/* fs.chmod_host(path, mode) -> true | nil, msg, code (sbxlua's state
** directory, made private) */
static int fs_chmod_host(lua_State *L) {
  const char *path = host_path(L, 1);
  lua_Integer mode = luaL_checkinteger(L, 2);
  luaL_argcheck(L, mode >= 0 && mode <= 07777, 2, "invalid mode");
  if (!path) return fs_fail(L, "chmod", lua_tostring(L, 1), E_INVAL);
  if (chmod(path, (mode_t)mode) < 0) return fs_fail(L, "chmod", path, errno);
  return fs_ok(L);
}

/* fs.rmtree(host_path) -> true | nil, msg, code (missing is success) */
static int fs_rmtree(lua_State *L) {
  const char *path = host_path(L, 1), *base;
  size_t len = path ? strlen(path) : 0;
  while (len > 1 && path[len - 1] == '/') len--;  /* "link/" would follow */
  if (!path) return fs_fail(L, "rmtree", lua_tostring(L, 1), E_INVAL);
  char *p = scratch(L, path, len);
  base = strrchr(p, '/') ? strrchr(p, '/') + 1 : p;
  if (!*base || strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
    return fs_fail(L, "rmtree", path, E_INVAL);   /* "", "/", ".", ".." */
  int err = rm_tree(AT_FDCWD, p);
  return err && err != ENOENT ? fs_fail(L, "rmtree", path, err) : fs_ok(L);
}

/* ---------------------------------------------------------------------
** Spare sandbox directories. On ext4 a mkdir costs 0.2-0.4 ms of CPU
** after many deletions (the inode allocator skips every recently deleted
** inode, reading inode table blocks) and an rmdir as much again; a rename
** costs neither. So a destroyed sandbox's emptied directory is kept and
** renamed into the next sandbox's name.
*/

/* Is fd an empty 0700 directory of ours without xattrs (no ACL, nothing
** a sandbox set on its own root that the next one would see)? */
static int pristine(int fd) {
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISDIR(st.st_mode) || (st.st_mode & 07777) != 0700 ||
      st.st_uid != geteuid() || st.st_nlink != 2)
    return 0;
  if (flistxattr(fd, NULL, 0) != 0) return 0;
  DIR *d = fdopendir(fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!d) return 0;
  struct dirent *e;
  int empty = 1;
  while (empty && (e = readdir(d)))
    empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
  closedir(d);
  return empty;
}

/* fs.spare_dir(dir, spare) -> true | false | nil, msg, code: empty dir
** and, if it is then pristine, rename it to spare (never over an existing
** one); false: it is empty but not reusable (the caller removes it). */
static int fs_spare_dir(lua_State *L) {
  const char *dir = host_path(L, 1), *spare = host_path(L, 2);
  if (!dir || !spare) return fs_fail(L, "spare", lua_tostring(L, 1), E_INVAL);
  Rm rm = {-1, 0, 0, 0};
  int fd, err = rm_empty(AT_FDCWD, dir, &rm, &fd);
  if (err) return fs_fail(L, "spare", dir, err);
  int ok = !rm.err && pristine(fd);
  close(fd);
  if (rm.err) return fs_fail(L, "spare", dir, rm.err);
  ok = ok && renameat2(AT_FDCWD, dir, AT_FDCWD, spare, RENAME_NOREPLACE) == 0;
  lua_pushboolean(L, ok);
  return 1;
}

/* fs.take_dir(spare, parent, prefix) -> path | nil, msg, code: the spare
** directory renamed to parent/prefixXXXXXX (parent made as mkdtemp does). */
static int fs_take_dir(lua_State *L) {
  static const char chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  const char *spare = host_path(L, 1), *parent = host_path(L, 2);
  size_t plen, xlen;
  const char *prefix = luaL_checklstring(L, 3, &xlen);
  luaL_argcheck(L, !memchr(prefix, '/', xlen) && strlen(prefix) == xlen, 3,
                "prefix must not contain '/' or NUL");
  if (!spare || !parent) return fs_fail(L, "take", lua_tostring(L, 1), E_INVAL);
  plen = strlen(parent);
  for (int i = 0, made = 0; i < 16; i++) {
    unsigned char r[6];
    char x[7];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) return fs_fail(L, "take", spare, errno);
    for (int k = 0; k < 6; k++) x[k] = chars[r[k] % (sizeof chars - 1)];
    x[6] = '\0';
    lua_settop(L, 3);
    const char *to = lua_pushfstring(L, "%s/%s%s", parent, prefix, x);
    if (renameat2(AT_FDCWD, spare, AT_FDCWD, to, RENAME_NOREPLACE) == 0) return 1;
    if (errno == ENOENT && !made++) {   /* the parent first: mkdir -p */
      int err = plen ? host_mkdir_p(scratch(L, parent, plen)) : 0;
      if (err) return fs_fail(L, "take", parent, err);
      continue;
    }
    if (errno != EEXIST) return fs_fail(L, "take", spare, errno);
  }
  return fs_fail(L, "take", spare, EEXIST);
}

/* fs.read_host(path, [max_bytes]) -> data | nil, msg, code */
static int fs_read_host(lua_State *L) {
  const char *path = host_path(L, 1);
  lua_Integer max = luaL_optinteger(L, 2, FS_MAXREAD);
  luaL_argcheck(L, max >= 0, 2, "negative size cap");
  if (!path) return fs_fail(L, "read", lua_tostring(L, 1), E_INVAL);
  Box *bx = box_new(L);
  bx->fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (bx->fd < 0) return fs_fail(L, "read", path, errno);
  return read_box(L, bx, "read", path, max);
}

/* fs.stat_host(path) -> {type, size, mtime, mode} | nil, msg, code
** (a host path, final symlink followed: what open() would read) */
static int fs_stat_host(lua_State *L) {
  const char *path = host_path(L, 1);
  struct stat st;
  if (!path) return fs_fail(L, "stat", lua_tostring(L, 1), E_INVAL);
  if (stat(path, &st) < 0) return fs_fail(L, "stat", path, errno);
  lua_createtable(L, 0, 4);
  set_stat(L, &st);
  lua_pushinteger(L, (lua_Integer)(st.st_mode & 07777));
  lua_setfield(L, -2, "mode");
  return 1;
}

/* fs.errname(n) -> "ENOENT", "No such file or directory" | nil
** (the name and text of an errno number, e.g. one an agent reported) */
static int fs_errname(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  const char *name = (n > 0 && n < 4096) ? strerrorname_np((int)n) : NULL;
  if (!name) {
    luaL_pushfail(L);
    return 1;
  }
  lua_pushstring(L, name);
  lua_pushstring(L, strerror((int)n));
  return 2;
}

/* fs.list_host(dir) -> { names... } sorted | nil, msg, code */
static int fs_list_host(lua_State *L) {
  const char *dir = host_path(L, 1);
  int n, err;
  if (!dir) return fs_fail(L, "list", lua_tostring(L, 1), E_INVAL);
  Box *bx = box_new(L);
  if (!(bx->dir = opendir(dir))) return fs_fail(L, "list", dir, errno);
  const char **v = sorted_names(L, bx->dir, &n, &err);
  if (err) return box_fail(L, bx, "list", dir, err);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushstring(L, v[i]);
    lua_rawseti(L, -2, i + 1);
  }
  box_release(bx);
  return 1;
}

/* fs.readlink(path) -> target | nil, msg, code */
static int fs_readlink(lua_State *L) {
  char buf[PATH_MAX];
  const char *path = host_path(L, 1);
  if (!path) return fs_fail(L, "readlink", lua_tostring(L, 1), E_INVAL);
  ssize_t n = readlink(path, buf, sizeof buf);
  if (n < 0) return fs_fail(L, "readlink", path, errno);
  if ((size_t)n >= sizeof buf)
    return fs_fail(L, "readlink", path, ENAMETOOLONG);
  lua_pushlstring(L, buf, (size_t)n);
  return 1;
}

static void new_type(lua_State *L, const char *name, const luaL_Reg *methods,
                     lua_CFunction close, lua_CFunction tostring) {
  luaL_newmetatable(L, name);
  if (methods) {
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
  }
  lua_pushcfunction(L, close);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, close);
  lua_setfield(L, -2, "__close");
  lua_pushcfunction(L, tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
}

static const luaL_Reg root_methods[] = {
  {"read", root_read}, {"write", root_write}, {"append", root_append},
  {"read_at", root_read_at}, {"copy", root_copy},
  {"list", root_list}, {"stat", root_stat}, {"mkdir", root_mkdir},
  {"remove", root_remove}, {"resolve", root_resolve}, {"path", root_path},
  {"close", root_close}, {NULL, NULL}
};

static const luaL_Reg lock_methods[] = {
  {"unlock", lock_unlock}, {NULL, NULL}
};

static const luaL_Reg journal_methods[] = {
  {"append", journal_append}, {"close", journal_close}, {NULL, NULL}
};

static const luaL_Reg fs_funcs[] = {
  {"open_root", fs_open_root}, {"mkdtemp", fs_mkdtemp},
  {"rmtree", fs_rmtree}, {"spare_dir", fs_spare_dir}, {"take_dir", fs_take_dir}, {"lock", fs_lock}, {"is_locked", fs_is_locked},
  {"journal", fs_journal}, {"journal_syncs", fs_journal_syncs}, {"read_host", fs_read_host},
  {"list_host", fs_list_host}, {"readlink", fs_readlink},
  {"mkdir_host", fs_mkdir_host}, {"chmod_host", fs_chmod_host}, {"stat_host", fs_stat_host},
  {"errname", fs_errname}, {NULL, NULL}
};

int luaopen_sbx_fs(lua_State *L) {
  new_type(L, "sbx.FsBox", NULL, box_close, box_tostring);
  new_type(L, "sbx.Root", root_methods, root_close, root_tostring);
  new_type(L, "sbx.Lock", lock_methods, lock_unlock, lock_tostring);
  new_type(L, "sbx.Journal", journal_methods, journal_close, journal_tostring);
  luaL_newlib(L, fs_funcs);
  return 1;
}
