/*
** sbx.tar: uncompressed tar archives built and read in memory (libarchive),
** or read from a host file (opts.file: an archive received from a sandbox,
** spooled to disk so that its size costs no memory). Entry data goes into
** the result, or piece by piece to opts.sink, or nowhere (data = false).
**
** pack() writes POSIX pax/ustar ("pax restricted": plain ustar headers
** unless a name or number needs an extended header) from trusted entries.
** list(), extract() and read_one() read an archive received from a
** sandbox or the Docker engine and treat it as hostile: tar format only,
** no decompression filters, every limit checked before memory is used,
** nothing followed, and any error means no result at all (never a
** partial one).
**
** Paths are compared after lexical normalization ("." and empty segments
** dropped). Symlinks are tracked in a Lua table (path -> target) plus a
** C set of seeded 64-bit path hashes, so "does this path go through a
** symlink" costs one pass over the path whatever its depth.
**
** libarchive (with libxml2, ICU and libstdc++ behind it) is dlopen'ed on
** first need, not linked: loading it costs every start-up ~3 ms.
*/
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <archive.h>
#include <archive_entry.h>

#include "lua.h"
#include "lauxlib.h"
#include "loop.h"

#define BOX "sbx.TarBox"
#define DEF_ENTRIES 100000
#define DEF_BYTES ((lua_Integer)256 << 20)
#define LINK_MAX 4095       /* longest symlink target Linux can create */
#define MAX_HOPS 40         /* symlinks followed per resolution (as Linux) */

/* ------------------------------------------------------------ libarchive */

/* The libarchive functions used here: ar.<name> is archive_<name>. */
#define ARCHIVE_FUNCS(X) \
  X(read_new) X(read_support_format_tar) X(read_open_memory) \
  X(read_open_filename) \
  X(read_next_header) X(read_data) X(read_free) X(write_new) \
  X(write_set_format_pax_restricted) X(write_set_bytes_per_block) \
  X(write_open) X(write_header) X(write_data) X(write_close) X(write_free) \
  X(error_string) X(set_error) X(entry_new) X(entry_free) \
  X(entry_clear) X(entry_copy_pathname) X(entry_copy_symlink) \
  X(entry_set_filetype) X(entry_set_perm) X(entry_set_size) \
  X(entry_set_mtime) X(entry_set_uid) X(entry_set_gid) X(entry_filetype) \
  X(entry_perm) X(entry_size) X(entry_mtime) X(entry_pathname) \
  X(entry_pathname_utf8) X(entry_symlink) X(entry_symlink_utf8) \
  X(entry_hardlink) X(entry_hardlink_utf8)

/* Process-wide, like the library itself; filled once by load_archive(). */
static struct {
#define X(f) __typeof__(&archive_##f) f;
  ARCHIVE_FUNCS(X)
#undef X
  __typeof__(&archive_errno) errnum;  /* ("errno" is a macro) */
} ar;
static int ar_loaded;               /* 0 not tried, 1 ready, -1 failed */
static char ar_why[256];            /* why it failed */

static void *ar_sym(void *lib, const char *name) {
  return sbx_dlsym(lib, name, "libarchive", "libarchive13", ar_why, sizeof ar_why);
}

static int load_archive(void) {
  void *lib;
  if (ar_loaded) return ar_loaded > 0;
  ar_loaded = -1;
  if ((lib = sbx_dlopen("libarchive.so.13", "libarchive", "libarchive13", ar_why, sizeof ar_why)) == NULL)
    return 0;
#define X(f) \
  if (!(ar.f = (__typeof__(ar.f))ar_sym(lib, "archive_" #f))) return 0;
  ARCHIVE_FUNCS(X)
#undef X
  if (!(ar.errnum = (__typeof__(ar.errnum))ar_sym(lib, "archive_errno")))
    return 0;
  ar_loaded = 1;
  return 1;
}

/* ------------------------------------------------------------ the box */

/* Everything a call allocates outside Lua, freed by one idempotent close. */
typedef struct {
  struct archive *a;
  struct archive_entry *e;
  int writing;
  char *out;                  /* pack: the archive being written */
  size_t len, cap;
  uint64_t *set;              /* read: hashes of symlink paths (0 = empty) */
  char *chunk;                /* read with a sink: one piece of entry data */
  size_t setn, setcap;
  uint64_t seed;
} tar_box;

static void box_close(tar_box *bx) {
  struct archive *a = bx->a;
  bx->a = NULL;
  if (a) {
    if (bx->writing) ar.write_free(a);  /* may still call pack_write */
    else ar.read_free(a);
  }
  if (bx->e) ar.entry_free(bx->e);
  bx->e = NULL;
  free(bx->out);
  bx->out = NULL;
  free(bx->set);
  bx->set = NULL;
  free(bx->chunk);
  bx->chunk = NULL;
}

static int box_gc(lua_State *L) {
  box_close(luaL_checkudata(L, 1, BOX));
  return 0;
}

/* Push a closed box; the caller acquires resources into it. */
static tar_box *box_new(lua_State *L) {
  tar_box *bx = lua_newuserdatauv(L, sizeof *bx, 0);
  memset(bx, 0, sizeof *bx);
  luaL_setmetatable(L, BOX);
  bx->seed = (uint64_t)(uintptr_t)bx ^ (uint64_t)time(NULL) * 0x9e3779b97f4a7c15u;
  return bx;
}

/* ------------------------------------------------------------ paths */

enum { P_OK, P_ABS, P_DOTDOT, P_NUL };

/*
** Normalize `s` into `out` (room for n bytes): drop empty and "."
** segments. Reports a leading "/" (P_ABS), a ".." segment or a NUL byte.
*/
static int norm_path(const char *s, size_t n, char *out, size_t *olen) {
  int st = n > 0 && s[0] == '/' ? P_ABS : P_OK;
  size_t i = 0, o = 0;
  if (memchr(s, '\0', n)) st = P_NUL;
  while (i < n) {
    size_t k = 0;
    while (i + k < n && s[i + k] != '/') k++;
    if (k == 2 && s[i] == '.' && s[i + 1] == '.') {
      if (st == P_OK || st == P_ABS) st = P_DOTDOT;
    } else if (k > 0 && !(k == 1 && s[i] == '.')) {
      if (o > 0) out[o++] = '/';
      memcpy(out + o, s + i, k);
      o += k;
    }
    i += k + 1;
  }
  *olen = o;
  return st;
}

/* Push the normalized form of s; returns the P_* status. */
static int push_norm(lua_State *L, const char *s, size_t n) {
  luaL_Buffer b;
  size_t o;
  char *out = luaL_buffinitsize(L, &b, n + 1);
  int st = norm_path(s, n, out, &o);
  luaL_pushresultsize(&b, o);
  return st;
}

#define FNV_PRIME 0x100000001b3u
static uint64_t hash_step(uint64_t h, unsigned char c) {
  return (h ^ c) * FNV_PRIME;
}

static int set_has(tar_box *bx, uint64_t h) {
  if (bx->setn == 0) return 0;
  h = h ? h : 1;
  for (size_t i = h & (bx->setcap - 1); bx->set[i]; i = (i + 1) & (bx->setcap - 1))
    if (bx->set[i] == h) return 1;
  return 0;
}

static void set_add(lua_State *L, tar_box *bx, uint64_t h) {
  h = h ? h : 1;
  if (set_has(bx, h)) return;
  if (2 * (bx->setn + 1) > bx->setcap) {
    size_t cap = bx->setcap ? 2 * bx->setcap : 64;
    uint64_t *old = bx->set, *set = calloc(cap, sizeof *set);
    if (!set) luaL_error(L, "not enough memory");
    for (size_t j = 0; j < bx->setcap; j++)
      if (old[j]) {
        size_t i = old[j] & (cap - 1);
        while (set[i]) i = (i + 1) & (cap - 1);
        set[i] = old[j];
      }
    bx->set = set;
    bx->setcap = cap;
    free(old);
  }
  size_t i = h & (bx->setcap - 1);
  while (bx->set[i]) i = (i + 1) & (bx->setcap - 1);
  bx->set[i] = h;
  bx->setn++;
}

static uint64_t path_hash(tar_box *bx, const char *p, size_t n) {
  uint64_t h = bx->seed;
  for (size_t i = 0; i < n; i++) h = hash_step(h, (unsigned char)p[i]);
  return h;
}

/*
** Length of the longest proper prefix of normalized `p` that is a symlink
** in `links` (a table path -> target), 0 if none. Exact lookups only
** happen on a hash hit.
*/
static size_t through_link(lua_State *L, tar_box *bx, int links,
                           const char *p, size_t n) {
  uint64_t h = bx->seed;
  size_t found = 0;
  if (bx->setn == 0) return 0;
  for (size_t i = 0; i < n; i++) {
    if (p[i] == '/' && set_has(bx, h)) {
      lua_pushlstring(L, p, i);
      if (lua_rawget(L, links) != LUA_TNIL) found = i;
      lua_pop(L, 1);
      if (found) return found;
    }
    h = hash_step(h, (unsigned char)p[i]);
  }
  return 0;
}

/*
** Would following the symlink at normalized `path` leave the archive
** root? Resolves `target` component by component from the link's
** directory, through the archive's own symlinks (at most MAX_HOPS), as
** the kernel would. Absolute targets, targets longer than LINK_MAX,
** loops and over-long intermediate paths count as escaping.
*/
static int link_escapes(lua_State *L, tar_box *bx, int links,
                        const char *path, size_t plen,
                        const char *target, size_t tlen) {
  char cur[LINK_MAX + 1];
  uint64_t hs[LINK_MAX / 2 + 2];      /* hash of cur at each depth */
  size_t offs[LINK_MAX / 2 + 2];      /* length of cur at each depth */
  struct { const char *s; size_t n, i; int look; } st[MAX_HOPS + 2];
  size_t depth = 0, dlen = plen;
  int top = 2, hops = 0;
  if (tlen == 0) return 0;            /* no target: nothing to follow */
  if (target[0] == '/' || tlen > LINK_MAX) return 1;
  while (dlen > 0 && path[dlen - 1] != '/') dlen--;
  hs[0] = bx->seed;
  offs[0] = 0;
  /* stack: the target, then on top the link's directory (already checked) */
  st[0].s = target; st[0].n = tlen; st[0].i = 0; st[0].look = 1;
  st[1].s = path; st[1].n = dlen; st[1].i = 0; st[1].look = 0;
  while (top > 0) {
    const char *c = st[top - 1].s + st[top - 1].i;
    size_t k = 0, o;
    uint64_t h;
    if (st[top - 1].i >= st[top - 1].n) { top--; continue; }
    while (st[top - 1].i + k < st[top - 1].n && c[k] != '/') k++;
    st[top - 1].i += k + 1;
    if (k == 0 || (k == 1 && c[0] == '.')) continue;
    if (k == 2 && c[0] == '.' && c[1] == '.') {
      if (depth == 0) return 1;
      depth--;
      continue;
    }
    o = offs[depth] + (depth > 0) + k;
    if (o > LINK_MAX) return 1;       /* depth < LINK_MAX / 2 follows */
    h = hs[depth];
    if (depth > 0) {
      cur[offs[depth]] = '/';
      h = hash_step(h, '/');
    }
    memcpy(cur + o - k, c, k);
    for (size_t j = 0; j < k; j++) h = hash_step(h, (unsigned char)c[j]);
    hs[++depth] = h;
    offs[depth] = o;
    if (st[top - 1].look && set_has(bx, h)) {
      size_t n;
      const char *t;
      lua_pushlstring(L, cur, o);
      lua_rawget(L, links);
      t = lua_tolstring(L, -1, &n);   /* anchored by `links` */
      lua_pop(L, 1);
      if (t) {
        if (++hops > MAX_HOPS || n == 0 || t[0] == '/' || n > LINK_MAX)
          return 1;
        depth--;                      /* the link is replaced by its target */
        st[top].s = t; st[top].n = n; st[top].i = 0; st[top].look = 1;
        top++;
      }
    }
  }
  return 0;
}

/* ------------------------------------------------------------ options */

/* Raise on keys of opts (at idx) not in `known`. */
static void check_opts(lua_State *L, int idx, const char *const known[]) {
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    int i = 0;
    lua_pop(L, 1);
    if (lua_type(L, -1) == LUA_TSTRING)
      for (; known[i]; i++)
        if (strcmp(lua_tostring(L, -1), known[i]) == 0) break;
    if (lua_type(L, -1) != LUA_TSTRING || !known[i])
      luaL_argerror(L, idx, lua_pushfstring(L, "unknown option '%s'",
                                            luaL_tolstring(L, -1, NULL)));
  }
}

/* Argument `idx` as an options table (an empty one when absent). */
static void opts_arg(lua_State *L, int idx, const char *const known[]) {
  lua_settop(L, idx);
  if (lua_isnil(L, idx)) {
    lua_newtable(L);
    lua_replace(L, idx);
  }
  luaL_checktype(L, idx, LUA_TTABLE);
  check_opts(L, idx, known);
}

static lua_Integer opt_int(lua_State *L, int idx, const char *k,
                           lua_Integer def, lua_Integer min) {
  lua_Integer v = def;
  int isnum;
  if (lua_getfield(L, idx, k) != LUA_TNIL) {
    v = lua_tointegerx(L, -1, &isnum);
    if (!isnum || v < min)
      luaL_argerror(L, idx, lua_pushfstring(L, "'%s' must be an integer >= %I",
                                            k, (LUAI_UACINT)min));
  }
  lua_pop(L, 1);
  return v;
}

static int opt_bool(lua_State *L, int idx, const char *k) {
  int t = lua_getfield(L, idx, k), v = lua_toboolean(L, -1);
  if (t != LUA_TNIL && t != LUA_TBOOLEAN)
    luaL_argerror(L, idx, lua_pushfstring(L, "'%s' must be a boolean", k));
  lua_pop(L, 1);
  return v;
}

/* opts[k] as a string left on the stack (NULL, nothing pushed, if absent). */
static const char *opt_str(lua_State *L, int idx, const char *k, size_t *n) {
  int t = lua_getfield(L, idx, k);
  if (t == LUA_TNIL) {
    lua_pop(L, 1);
    return NULL;
  }
  if (t != LUA_TSTRING)
    luaL_argerror(L, idx, lua_pushfstring(L, "'%s' must be a string", k));
  return lua_tolstring(L, -1, n);
}

/* ------------------------------------------------------------ pack */

enum { K_FILE, K_DIR, K_SYMLINK, K_HARDLINK, K_CHR, K_BLK, K_FIFO, K_SOCK,
       K_OTHER };
static const char *const kind_names[] = {"file", "dir", "symlink",
  "hardlink", "chardev", "blockdev", "fifo", "socket", "other", NULL};

/* One entry to write; its strings are anchored in the `anchor` table. */
typedef struct {
  const char *path, *data;    /* data: file contents or symlink target */
  size_t plen, dlen;
  int kind, mode;
  lua_Integer mtime;
} pk_item;

typedef struct {
  tar_box *bx;
  const char *prefix;         /* normalized, "" for none */
  lua_Integer uid, gid;
} pk_ctx;

static la_ssize_t pack_write(struct archive *a, void *ud, const void *buf,
                             size_t n) {
  tar_box *bx = ud;
  if (n > bx->cap - bx->len) {
    size_t cap = bx->cap ? bx->cap : 16384;
    char *p;
    while (cap - bx->len < n) {
      if (cap > SIZE_MAX / 2) goto nomem;
      cap *= 2;
    }
    if (!(p = realloc(bx->out, cap))) goto nomem;
    bx->out = p;
    bx->cap = cap;
  }
  memcpy(bx->out + bx->len, buf, n);
  bx->len += n;
  return (la_ssize_t)n;
nomem:
  ar.set_error(a, ENOMEM, "out of memory");
  return -1;
}

static int archive_fail(lua_State *L, const char *op, struct archive *a,
                        const char *code) {
  const char *msg = ar.error_string(a);
  int err = ar.errnum(a);
  if (!code) code = err == ENOMEM ? "ENOMEM" : "EIO";
  return sbx_fail(L, op, msg ? msg : "libarchive failed", code);
}

/* Write one header (and data); 0, or 3 with a failure pushed. */
static int pack_emit(lua_State *L, pk_ctx *c, const pk_item *it) {
  struct archive *a = c->bx->a;
  struct archive_entry *e = c->bx->e;
  int r;
  ar.entry_clear(e);
  if (*c->prefix)
    lua_pushfstring(L, "%s/%s", c->prefix, it->path);  /* no NULs in either */
  else
    lua_pushstring(L, it->path);
  ar.entry_copy_pathname(e, lua_tostring(L, -1));
  lua_pop(L, 1);
  ar.entry_set_filetype(e, it->kind == K_DIR ? AE_IFDIR
                        : it->kind == K_SYMLINK ? AE_IFLNK : AE_IFREG);
  ar.entry_set_perm(e, (mode_t)it->mode);
  ar.entry_set_size(e, it->kind == K_FILE ? (la_int64_t)it->dlen : 0);
  ar.entry_set_mtime(e, (time_t)it->mtime, 0);
  ar.entry_set_uid(e, (la_int64_t)c->uid);
  ar.entry_set_gid(e, (la_int64_t)c->gid);
  if (it->kind == K_SYMLINK) ar.entry_copy_symlink(e, it->data);
  r = ar.write_header(a, e);
  if ((r != ARCHIVE_OK && r != ARCHIVE_WARN) ||
      (it->kind == K_FILE && it->dlen > 0 &&
       ar.write_data(a, it->data, it->dlen) != (la_ssize_t)it->dlen))
    return archive_fail(L, "tar.pack", a, NULL);
  return 0;
}

/*
** Emit the missing parents of `path` (explicit dir entries where given,
** else mode 0755) and mark them in `done`; 0, or 3 with a failure pushed.
*/
static int pack_parents(lua_State *L, pk_ctx *c, const pk_item *items,
                        const char *path, size_t plen, int byname, int done,
                        int explicit) {
  for (size_t i = 0; i < plen; i++) {
    pk_item auto_dir;
    const pk_item *it = &auto_dir;
    int t;
    if (path[i] != '/') continue;
    memset(&auto_dir, 0, sizeof auto_dir);
    auto_dir.kind = K_DIR;
    auto_dir.mode = 0755;
    lua_pushlstring(L, path, i);
    if (explicit && lua_rawget(L, byname) == LUA_TNUMBER) {
      it = &items[lua_tointeger(L, -1) - 1];
      if (it->kind != K_DIR) {
        lua_pushfstring(L, "'%s' is not a directory but has entries under it",
                        it->path);
        return sbx_fail(L, "tar.pack", lua_tostring(L, -1), "ENOTDIR");
      }
    }
    lua_pop(L, 1);
    lua_pushlstring(L, path, i);
    t = lua_rawget(L, done);
    lua_pop(L, 1);
    if (t != LUA_TNIL) continue;
    lua_pushlstring(L, path, i);
    auto_dir.path = lua_tostring(L, -1);  /* anchored until the pop below */
    if ((t = pack_emit(L, c, it))) return t;
    lua_pushboolean(L, 1);
    lua_rawset(L, done);
  }
  return 0;
}

static int item_cmp(const void *x, const void *y) {
  const pk_item *a = x, *b = y;
  int c = memcmp(a->path, b->path, a->plen < b->plen ? a->plen : b->plen);
  return c ? c : (a->plen > b->plen) - (a->plen < b->plen);
}

/* Field k of the entry table on top: its type, value left on the stack. */
static int field(lua_State *L, const char *k, int want, int i) {
  int t = lua_getfield(L, -1, k);
  if (t != LUA_TNIL && t != want)
    luaL_argerror(L, 1, lua_pushfstring(L, "entry %d: '%s' must be a %s", i,
                                        k, lua_typename(L, want)));
  return t;
}

/*
** Integer field k of the entry table on top. Lua has no octal literals
** (0644 is six hundred forty-four), so a mode may also be an octal string.
*/
static lua_Integer field_int(lua_State *L, const char *k, lua_Integer def,
                             lua_Integer min, lua_Integer max, int i) {
  lua_Integer v = def;
  int isnum = 1;
  int t = lua_getfield(L, -1, k);
  if (t == LUA_TSTRING && strcmp(k, "mode") == 0) {
    const char *s = lua_tostring(L, -1);
    char *end;
    v = (lua_Integer)strtol(s, &end, 8);
    isnum = *s && !*end && strspn(s, "01234567") == strlen(s);
  } else if (t != LUA_TNIL) {
    v = lua_tointegerx(L, -1, &isnum);
  }
  if (!isnum || v < min || v > max)
    luaL_argerror(L, 1, lua_pushfstring(L, "entry %d: bad '%s'", i, k));
  lua_pop(L, 1);
  return v;
}

/*
** Read entry i (a table on top) into `it`, anchoring its strings in
** `anchor`; 0, or 3 with a failure pushed.
*/
static int pack_item(lua_State *L, pk_item *it, int i, int anchor) {
  static const char *const kinds[] = {"file", "dir", "symlink", NULL};
  size_t n;
  const char *s;
  int st;
  if (!lua_istable(L, -1))
    luaL_argerror(L, 1, lua_pushfstring(L, "entry %d is not a table", i));
  if (field(L, "path", LUA_TSTRING, i) == LUA_TNIL)
    luaL_argerror(L, 1, lua_pushfstring(L, "entry %d has no 'path'", i));
  s = lua_tolstring(L, -1, &n);
  st = push_norm(L, s, n);                   /* stack: entry path norm */
  if (st == P_NUL || st == P_DOTDOT || lua_rawlen(L, -1) == 0) {
    lua_pushfstring(L, "'%s': %s", s, st == P_NUL ? "path contains NUL"
                    : st == P_DOTDOT ? "path contains '..'" : "empty path");
    return sbx_fail(L, "tar.pack", lua_tostring(L, -1), "EINVAL");
  }
  it->path = lua_tolstring(L, -1, &it->plen);
  lua_rawseti(L, anchor, 2 * i - 1);
  lua_pop(L, 1);                             /* stack: entry */
  it->kind = K_FILE;
  if (field(L, "type", LUA_TSTRING, i) != LUA_TNIL) {
    for (it->kind = 0; kinds[it->kind]; it->kind++)
      if (strcmp(kinds[it->kind], lua_tostring(L, -1)) == 0) break;
    if (!kinds[it->kind])
      luaL_argerror(L, 1, lua_pushfstring(L, "entry %d: bad type '%s'", i,
                                          lua_tostring(L, -1)));
  }
  lua_pop(L, 1);
  if (field(L, "data", LUA_TSTRING, i) != LUA_TNIL && it->kind != K_FILE)
    luaL_argerror(L, 1, lua_pushfstring(L, "entry %d: 'data' on a %s", i,
                                        kinds[it->kind]));
  lua_pop(L, 1);
  if (field(L, it->kind == K_SYMLINK ? "target" : "data", LUA_TSTRING, i)
      == LUA_TNIL) {
    if (it->kind == K_SYMLINK)
      luaL_argerror(L, 1, lua_pushfstring(L, "entry %d: symlink without "
                                          "'target'", i));
    lua_pop(L, 1);
    lua_pushliteral(L, "");
  }
  it->data = lua_tolstring(L, -1, &it->dlen);
  if (it->kind == K_SYMLINK && memchr(it->data, '\0', it->dlen)) {
    lua_pushfstring(L, "'%s': symlink target contains NUL", it->path);
    return sbx_fail(L, "tar.pack", lua_tostring(L, -1), "EINVAL");
  }
  lua_rawseti(L, anchor, 2 * i);
  if (it->kind != K_SYMLINK) {
    if (field(L, "target", LUA_TSTRING, i) != LUA_TNIL)
      luaL_argerror(L, 1, lua_pushfstring(L, "entry %d: 'target' on a %s", i,
                                          kinds[it->kind]));
    lua_pop(L, 1);
  }
  it->mode = (int)field_int(L, "mode", it->kind == K_DIR ? 0755 :
                            it->kind == K_SYMLINK ? 0777 : 0644, 0, 07777, i);
  it->mtime = field_int(L, "mtime", 0, LUA_MININTEGER, LUA_MAXINTEGER, i);
  return 0;
}

/*
** tar.pack(entries, [opts]) -> string | nil, msg, code
** entries: a list of {path=, data=, type=, target=, mode=, mtime=} or a
** map {[path] = data}; opts: prefix, uid, gid, parents (default true: add
** missing parent directories; false leaves them to the extracting side,
** which must not re-mode directories that already exist there).
*/
static int tar_pack(lua_State *L) {
  static const char *const known[] = {"prefix", "uid", "gid", "parents", NULL};
  pk_ctx c, c0;
  pk_item *items;
  tar_box *bx;
  lua_Integer n = 0, i;
  size_t plen = 0;
  const char *pre;
  int r, ismap;
  luaL_checktype(L, 1, LUA_TTABLE);
  opts_arg(L, 2, known);
  c.uid = opt_int(L, 2, "uid", 0, 0);
  c.gid = opt_int(L, 2, "gid", 0, 0);
  int parents = 1;
  if (lua_istable(L, 2)) {
    lua_getfield(L, 2, "parents");
    if (!lua_isnil(L, -1)) parents = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  if (!(pre = opt_str(L, 2, "prefix", &plen))) pre = lua_pushliteral(L, "");
  r = push_norm(L, pre, plen);              /* stack: entries opts pre npre */
  if (r == P_NUL || r == P_DOTDOT)
    return sbx_fail(L, "tar.pack", "invalid prefix", "EINVAL");
  c.prefix = lua_tostring(L, 4);
  /* 5: anchor, 6: items, 7: byname, 8: done */
  ismap = lua_geti(L, 1, 1) == LUA_TNIL;
  lua_pop(L, 1);
  if (ismap)
    for (lua_pushnil(L); lua_next(L, 1); lua_pop(L, 1)) n++;
  else
    n = luaL_len(L, 1);
  if (n > INT32_MAX / 2) luaL_argerror(L, 1, "too many entries");
  lua_createtable(L, (int)(2 * n), 0);
  items = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *items, 0);
  i = 0;
  if (ismap) {
    for (lua_pushnil(L); lua_next(L, 1); lua_pop(L, 1)) {
      pk_item *it = &items[i++];
      size_t kn;
      const char *k;
      if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
        luaL_argerror(L, 1, "a map of entries must map path strings to "
                            "data strings");
      if (i > n) luaL_argerror(L, 1, "entries changed while reading");
      k = lua_tolstring(L, -2, &kn);
      r = push_norm(L, k, kn);
      if (r == P_NUL || r == P_DOTDOT || lua_rawlen(L, -1) == 0) {
        lua_pushfstring(L, "'%s': %s", k, r == P_NUL ? "path contains NUL"
                        : r == P_DOTDOT ? "path contains '..'" : "empty path");
        return sbx_fail(L, "tar.pack", lua_tostring(L, -1), "EINVAL");
      }
      memset(it, 0, sizeof *it);
      it->path = lua_tolstring(L, -1, &it->plen);
      lua_rawseti(L, 5, (lua_Integer)(2 * i - 1));
      it->data = lua_tolstring(L, -1, &it->dlen);   /* anchored by entries */
      it->kind = K_FILE;
      it->mode = 0644;
    }
    qsort(items, (size_t)n, sizeof *items, item_cmp);
  } else {
    for (i = 1; i <= n; i++) {
      lua_geti(L, 1, i);
      if ((r = pack_item(L, &items[i - 1], (int)i, 5))) return r;
      lua_pop(L, 1);
    }
  }
  lua_createtable(L, 0, (int)n);            /* 7: byname path -> index */
  for (i = 1; i <= n; i++) {
    lua_pushlstring(L, items[i - 1].path, items[i - 1].plen);
    lua_pushvalue(L, -1);
    if (lua_rawget(L, 7) != LUA_TNIL) {
      lua_pushfstring(L, "duplicate path '%s'", items[i - 1].path);
      return sbx_fail(L, "tar.pack", lua_tostring(L, -1), "EEXIST");
    }
    lua_pop(L, 1);
    lua_pushinteger(L, i);
    lua_rawset(L, 7);
  }
  if (!load_archive()) return sbx_fail(L, "tar.pack", ar_why, "ENOSYS");
  lua_newtable(L);                          /* 8: done (relative paths) */
  lua_newtable(L);                          /* 9: done (prefix dirs) */
  bx = box_new(L);                          /* 10 */
  bx->writing = 1;
  if (!(bx->a = ar.write_new()) || !(bx->e = ar.entry_new()))
    return sbx_fail(L, "tar.pack", "out of memory", "ENOMEM");
  if (ar.write_set_format_pax_restricted(bx->a) != ARCHIVE_OK ||
      ar.write_set_bytes_per_block(bx->a, 0) != ARCHIVE_OK ||
      ar.write_open(bx->a, bx, NULL, pack_write, NULL) != ARCHIVE_OK)
    return archive_fail(L, "tar.pack", bx->a, NULL);
  c.bx = bx;
  c0 = c;
  c0.prefix = "";
  if (*c.prefix && parents) {
    lua_pushfstring(L, "%s/", c.prefix);
    if ((r = pack_parents(L, &c0, items, lua_tostring(L, -1),
                          lua_rawlen(L, -1), 7, 9, 0))) return r;
    lua_pop(L, 1);
  }
  for (i = 0; i < n; i++) {
    const pk_item *it = &items[i];
    if (parents && (r = pack_parents(L, &c, items, it->path, it->plen, 7, 8, 1)))
      return r;
    lua_pushlstring(L, it->path, it->plen);
    if (lua_rawget(L, 8) == LUA_TNIL) {
      if ((r = pack_emit(L, &c, it))) return r;
      lua_pushlstring(L, it->path, it->plen);
      lua_pushboolean(L, 1);
      lua_rawset(L, 8);
    }
    lua_pop(L, 1);
  }
  if (ar.write_close(bx->a) != ARCHIVE_OK)
    return archive_fail(L, "tar.pack", bx->a, NULL);
  lua_pushlstring(L, bx->out, bx->len);
  box_close(bx);
  return 1;
}

/* ------------------------------------------------------------ read */

enum { M_LIST, M_EXTRACT };

/* tar_read's stack slots */
enum { R_ARC = 1, R_OPTS, R_ONLY, R_BOX, R_RESULT, R_REJECTED, R_KINDS,
       R_SLOTS, R_LINKS };

typedef struct {
  const char *op;
  int mode;
  lua_Integer max_entries, max_bytes, max_entry, total;
  int skip_unsafe, allow_hardlinks, strict, sink;
  size_t alen;
} rd_ctx;

#define SINK_CHUNK (256 * 1024)     /* entry data handed to a sink at once */

static const char *const read_known[] = {"max_entries", "max_bytes",
  "max_entry", "skip_unsafe", "allow_hardlinks", "strict_duplicates", "only",
  "file", "sink", "data", NULL};

static int kind_of(struct archive_entry *e) {
  if (ar.entry_hardlink(e) || ar.entry_hardlink_utf8(e))
    return K_HARDLINK;
  switch (ar.entry_filetype(e)) {
    case AE_IFREG: return K_FILE;
    case AE_IFDIR: return K_DIR;
    case AE_IFLNK: return K_SYMLINK;
    case AE_IFCHR: return K_CHR;
    case AE_IFBLK: return K_BLK;
    case AE_IFIFO: return K_FIFO;
    case AE_IFSOCK: return K_SOCK;
    default: return K_OTHER;
  }
}

/*
** An unsafe entry: fail (3, failure pushed) or, with skip_unsafe, record
** it in `rejected` and return 0.
*/
static int reject(lua_State *L, rd_ctx *c, const char *path, const char *why,
                  const char *code) {
  if (!c->skip_unsafe) {
    lua_pushfstring(L, "'%s': %s", path, why);
    return sbx_fail(L, c->op, lua_tostring(L, -1), code);
  }
  lua_createtable(L, 0, 3);
  lua_pushstring(L, path);
  lua_setfield(L, -2, "path");
  lua_pushstring(L, code);
  lua_setfield(L, -2, "code");
  lua_pushstring(L, why);
  lua_setfield(L, -2, "reason");
  lua_rawseti(L, R_REJECTED, (lua_Integer)lua_rawlen(L, R_REJECTED) + 1);
  return 0;
}

/* Push the current entry's data (size bytes); 0, or 3 with a failure. */
static int read_data(lua_State *L, rd_ctx *c, struct archive *a,
                     la_int64_t size) {
  luaL_Buffer b;
  size_t got = 0;
  luaL_buffinit(L, &b);
  while (got < (size_t)size) {
    size_t rem = (size_t)size - got;
    size_t chunk = rem < c->alen + 4096 ? rem : c->alen + 4096;
    la_ssize_t n = ar.read_data(a, luaL_prepbuffsize(&b, chunk), chunk);
    if (n < 0) return archive_fail(L, c->op, a, "EPROTO");
    if (n == 0) return sbx_fail(L, c->op, "truncated entry data", "EPROTO");
    luaL_addsize(&b, (size_t)n);
    got += (size_t)n;
  }
  luaL_pushresult(&b);
  return 0;
}

/* Hand the current entry's data (size bytes) to opts.sink(path, chunk) a
** piece at a time; 0, or 3 with a failure. The sink may raise. */
static int sink_data(lua_State *L, rd_ctx *c, tar_box *bx, int P,
                     la_int64_t size) {
  la_int64_t got = 0;
  if (!bx->chunk && !(bx->chunk = malloc(SINK_CHUNK)))
    return sbx_fail(L, c->op, "out of memory", "ENOMEM");
  while (got < size) {
    size_t want = size - got < SINK_CHUNK ? (size_t)(size - got) : SINK_CHUNK;
    la_ssize_t n = ar.read_data(bx->a, bx->chunk, want);
    if (n < 0) return archive_fail(L, c->op, bx->a, "EPROTO");
    if (n == 0) return sbx_fail(L, c->op, "truncated entry data", "EPROTO");
    lua_getfield(L, R_OPTS, "sink");
    lua_pushvalue(L, P);
    lua_pushlstring(L, bx->chunk, (size_t)n);
    lua_call(L, 2, 0);
    got += n;
  }
  return 0;
}

/*
** Check a hard link's target (normalized, pushed): inside the archive,
** not through a symlink, naming an earlier regular file. NULL if fine.
*/
static const char *hardlink_why(lua_State *L, tar_box *bx, const char *t) {
  size_t n;
  int st = push_norm(L, t, strlen(t));
  const char *p = lua_tolstring(L, -1, &n);
  if (st != P_OK || n == 0) return "hard link target outside the archive";
  if (through_link(L, bx, R_LINKS, p, n))
    return "hard link target goes through a symlink";
  lua_pushvalue(L, -1);
  lua_rawget(L, R_KINDS);
  p = lua_tostring(L, -1);
  lua_pop(L, 1);
  if (!p || (strcmp(p, "file") != 0 && strcmp(p, "hardlink") != 0))
    return "hard link to a missing or non-regular entry";
  return NULL;
}

static void set_str(lua_State *L, const char *k, const char *v) {
  lua_pushstring(L, v);
  lua_setfield(L, -2, k);
}

static void set_int(lua_State *L, const char *k, lua_Integer v) {
  lua_pushinteger(L, v);
  lua_setfield(L, -2, k);
}

/* Process one header; 0, or 3 with a failure pushed. */
static int read_entry(lua_State *L, rd_ctx *c, tar_box *bx,
                      struct archive_entry *e, const char *raw) {
  int kind = kind_of(e), st, member, top = lua_gettop(L);
  int P = top + 1;                          /* the normalized path */
  const char *why = NULL, *code = "ESCAPE", *target = NULL, *p;
  la_int64_t size = ar.entry_size(e);
  lua_Integer perm = (lua_Integer)ar.entry_perm(e) & 07777;
  size_t plen, k;
  if (kind == K_SYMLINK)
    target = ar.entry_symlink(e) ? ar.entry_symlink(e)
           : ar.entry_symlink_utf8(e);
  else if (kind == K_HARDLINK)
    target = ar.entry_hardlink(e) ? ar.entry_hardlink(e)
           : ar.entry_hardlink_utf8(e);
  if ((kind == K_SYMLINK || kind == K_HARDLINK) && !target)
    return sbx_fail(L, c->op, "link without a readable target", "EPROTO");
  st = push_norm(L, raw, strlen(raw));
  p = lua_tolstring(L, P, &plen);
  if (st == P_ABS) why = "absolute path";
  else if (st == P_DOTDOT) why = "path contains '..'";
  else if (plen == 0) {
    if (kind == K_DIR) { lua_settop(L, top); return 0; }  /* "./" */
    why = "entry replaces the archive root";
  } else if (kind >= K_CHR) {
    why = "device, FIFO or socket";
    code = "ENOTREG";
  } else if (kind == K_HARDLINK && !c->allow_hardlinks && c->mode == M_EXTRACT)
    why = "hard link";
  else if ((k = through_link(L, bx, R_LINKS, p, plen)))
    why = lua_pushfstring(L, "goes through the symlink '%s'",
                          lua_pushlstring(L, p, k));
  else if (kind == K_HARDLINK)
    why = hardlink_why(L, bx, target);
  if (why && c->mode == M_EXTRACT) {
    if ((st = reject(L, c, raw, why, code))) return st;
    lua_settop(L, top);
    return 0;
  }
  /* dup: later wins, unless strict */
  member = lua_isnil(L, R_ONLY) || lua_rawequal(L, R_ONLY, P);
  if (c->mode == M_EXTRACT) {
    lua_pushvalue(L, P);
    if (lua_rawget(L, R_KINDS) != LUA_TNIL && c->strict) {
      lua_pushfstring(L, "'%s': duplicate entry", p);
      return sbx_fail(L, c->op, lua_tostring(L, -1), "EEXIST");
    }
    if (kind == K_FILE && member) {
      if (size < 0 || size > c->max_entry || size > c->max_bytes - c->total) {
        lua_pushfstring(L, "'%s': %I bytes exceeds %s", p, (LUAI_UACINT)size,
                        size > c->max_entry ? "max_entry" : "max_bytes");
        return sbx_fail(L, c->op, lua_tostring(L, -1), "ETOOBIG");
      }
      c->total += size;
      if (c->sink == 1) {                   /* data to the sink, none kept */
        if ((st = sink_data(L, c, bx, P, size))) return st;
        lua_pushinteger(L, (lua_Integer)size);
      } else if (c->sink == 2) {
        lua_pushinteger(L, (lua_Integer)size);   /* data = false: skipped */
      } else if ((st = read_data(L, c, bx->a, size))) return st;
    } else {
      lua_pushnil(L);
    }                                       /* stack: path ... data */
  }
  lua_createtable(L, 0, 8);
  if (c->mode == M_LIST && (st != P_OK || plen == 0)) set_str(L, "path", raw);
  else {
    lua_pushvalue(L, P);
    lua_setfield(L, -2, "path");
  }
  set_str(L, "type", kind_names[kind]);
  set_int(L, "mtime", (lua_Integer)ar.entry_mtime(e));
  if (c->mode == M_LIST) {
    set_int(L, "mode", perm);
    set_int(L, "size", kind == K_FILE ? (lua_Integer)size : 0);
    if (target) set_str(L, "target", target);
    if (why) set_str(L, "unsafe", code);
    lua_rawseti(L, R_RESULT, (lua_Integer)lua_rawlen(L, R_RESULT) + 1);
  } else {
    if (perm & 07000) {
      lua_pushboolean(L, 1);
      lua_setfield(L, -2, "mode_stripped");
    }
    set_int(L, "mode", perm & 0777);
    if (kind == K_SYMLINK) set_str(L, "target", target);
    if (kind == K_HARDLINK) {               /* target: the normalized path */
      lua_pushvalue(L, P + 1);
      lua_setfield(L, -2, "target");
      lua_pushvalue(L, P + 1);              /* stack: ... data entry slot */
      if (lua_rawget(L, R_SLOTS) == LUA_TNUMBER) {
        lua_rawgeti(L, R_RESULT, lua_tointeger(L, -1));
        lua_getfield(L, -1, "data");        /* ... data entry slot file fdata */
        lua_replace(L, -5);                 /* the linked file's data */
        lua_pop(L, 1);
      }
      lua_pop(L, 1);
    }
    lua_rotate(L, -2, 1);                   /* stack: ... entry data */
    if (lua_isinteger(L, -1)) {             /* a sink took it: its size */
      lua_setfield(L, -2, "size");
    } else if (!lua_isnil(L, -1)) {
      lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
      lua_setfield(L, -2, "data");
      set_int(L, "size", n);
    } else lua_pop(L, 1);
    if (member) {
      lua_Integer slot;
      lua_pushvalue(L, P);
      slot = lua_rawget(L, R_SLOTS) == LUA_TNUMBER ? lua_tointeger(L, -1)
           : (lua_Integer)lua_rawlen(L, R_RESULT) + 1;
      lua_pop(L, 1);
      lua_rawseti(L, R_RESULT, slot);
      lua_pushvalue(L, P);
      lua_pushinteger(L, slot);
      lua_rawset(L, R_SLOTS);
    } else lua_pop(L, 1);
  }
  if (!why) {                               /* the tree as it now stands */
    lua_pushvalue(L, P);
    lua_pushstring(L, kind_names[kind]);
    lua_rawset(L, R_KINDS);
    lua_pushvalue(L, P);
    if (kind == K_SYMLINK) {
      lua_pushstring(L, target);
      set_add(L, bx, path_hash(bx, p, plen));
    } else lua_pushnil(L);
    lua_rawset(L, R_LINKS);
  }
  lua_settop(L, top);
  return 0;
}

/*
** Against the final tree: nothing may sit below a symlink (one that came
** later than its children included), and every symlink gets `escapes`.
** Compacts `result` when entries are dropped; 0, or 3 with a failure.
*/
static int read_finish(lua_State *L, rd_ctx *c, tar_box *bx) {
  lua_Integer n = (lua_Integer)lua_rawlen(L, R_RESULT), i, j = 0;
  for (i = 1; i <= n; i++) {
    int top = lua_gettop(L), unsafe = 0, drop = 0, r;
    size_t plen, tlen = 0, k;
    const char *p, *t = NULL;
    lua_rawgeti(L, R_RESULT, i);            /* stack: entry */
    if (c->mode == M_LIST) {
      unsafe = lua_getfield(L, top + 1, "unsafe") != LUA_TNIL;
      lua_pop(L, 1);
    }
    lua_getfield(L, top + 1, "type");
    lua_getfield(L, top + 1, "target");
    lua_getfield(L, top + 1, "path");       /* stack: entry type target path */
    p = lua_tolstring(L, -1, &plen);
    if (lua_isstring(L, -2)) t = lua_tolstring(L, -2, &tlen);
    if (!unsafe) {
      k = through_link(L, bx, R_LINKS, p, plen);
      if (!k && t && strcmp(lua_tostring(L, top + 2), "hardlink") == 0 &&
          through_link(L, bx, R_LINKS, t, tlen))
        k = tlen;
      if (k) {
        const char *why = "goes through a symlink";
        if (c->mode == M_LIST) {
          lua_pushliteral(L, "ESCAPE");
          lua_setfield(L, top + 1, "unsafe");
          unsafe = 1;
        } else if ((r = reject(L, c, p, why, "ESCAPE"))) return r;
        else drop = 1;
      }
    }
    if (!drop && strcmp(lua_tostring(L, top + 2), "symlink") == 0) {
      lua_pushboolean(L, unsafe || link_escapes(L, bx, R_LINKS, p, plen,
                                                t, tlen));
      lua_setfield(L, top + 1, "escapes");
    }
    lua_settop(L, top + 1);
    if (drop) lua_pop(L, 1);
    else lua_rawseti(L, R_RESULT, ++j);
  }
  for (i = j + 1; i <= n; i++) {
    lua_pushnil(L);
    lua_rawseti(L, R_RESULT, i);
  }
  return 0;
}

/*
** Read the archive (arg 1) with options (arg 2); pushes result, rejected
** and returns 2, or returns 3 with a failure pushed.
*/
static int tar_read(lua_State *L, int mode, const char *op) {
  rd_ctx c;
  tar_box *bx;
  struct archive_entry *e;
  const char *arc = luaL_optlstring(L, 1, NULL, &c.alen), *s, *file = NULL;
  lua_Integer count = 0;
  size_t n;
  int r;
  if (!arc) c.alen = SINK_CHUNK;            /* file: read_data's piece size */
  opts_arg(L, 2, read_known);
  if (lua_getfield(L, 2, "file") != LUA_TNIL) {   /* kept alive by opts */
    if (!lua_isstring(L, -1)) luaL_argerror(L, 2, "'file' must be a path");
    file = lua_tostring(L, -1);
  }
  lua_pop(L, 1);
  luaL_argcheck(L, (arc != NULL) != (file != NULL), 1,
                "expected an archive string or opts.file, not both");
  c.sink = 0;
  if (lua_getfield(L, 2, "sink") != LUA_TNIL) {
    luaL_argcheck(L, lua_isfunction(L, -1), 2, "'sink' must be a function");
    c.sink = 1;
  }
  lua_pop(L, 1);
  if (lua_getfield(L, 2, "data") != LUA_TNIL) {   /* data = false: sizes only */
    luaL_argcheck(L, lua_isboolean(L, -1), 2, "'data' must be a boolean");
    if (!lua_toboolean(L, -1) && !c.sink) c.sink = 2;
  }
  lua_pop(L, 1);
  c.op = op;
  c.mode = mode;
  c.total = 0;
  c.max_entries = opt_int(L, 2, "max_entries", DEF_ENTRIES, 0);
  c.max_bytes = opt_int(L, 2, "max_bytes", DEF_BYTES, 0);
  c.max_entry = opt_int(L, 2, "max_entry", c.max_bytes, 0);
  c.skip_unsafe = opt_bool(L, 2, "skip_unsafe");
  c.allow_hardlinks = opt_bool(L, 2, "allow_hardlinks");
  c.strict = opt_bool(L, 2, "strict_duplicates");
  if (!load_archive()) return sbx_fail(L, op, ar_why, "ENOSYS");
  if ((s = opt_str(L, 2, "only", &n))) {  /* R_ONLY */
    if (push_norm(L, s, n) <= P_ABS) lua_remove(L, -2);
    else lua_pop(L, 1);                     /* raw: with "..", matches nothing */
  } else lua_pushnil(L);
  bx = box_new(L);                          /* R_BOX */
  lua_newtable(L);                          /* R_RESULT */
  lua_newtable(L);                          /* R_REJECTED */
  lua_newtable(L);                          /* R_KINDS: path -> type */
  lua_newtable(L);                          /* R_SLOTS: path -> result index */
  lua_newtable(L);                          /* R_LINKS: path -> target */
  if ((arc && c.alen > 0) || file) {
    if (!(bx->a = ar.read_new()))
      return sbx_fail(L, op, "out of memory", "ENOMEM");
    /* tar only, and no decompression filter: anything else is EPROTO */
    if (ar.read_support_format_tar(bx->a) != ARCHIVE_OK ||
        (file ? ar.read_open_filename(bx->a, file, 64 * 1024)
              : ar.read_open_memory(bx->a, arc, c.alen)) != ARCHIVE_OK)
      return archive_fail(L, op, bx->a, file ? "EIO" : "EPROTO");
    while ((r = ar.read_next_header(bx->a, &e)) != ARCHIVE_EOF) {
      const char *raw;
      /* RETRY (a damaged header) is no better than FATAL here */
      if (r != ARCHIVE_OK && r != ARCHIVE_WARN)
        return archive_fail(L, op, bx->a, "EPROTO");
      if (++count > c.max_entries) {
        lua_pushfstring(L, "more than %I entries", (LUAI_UACINT)c.max_entries);
        return sbx_fail(L, op, lua_tostring(L, -1), "ETOOBIG");
      }
      if (!(raw = ar.entry_pathname(e)) &&
          !(raw = ar.entry_pathname_utf8(e)))
        return sbx_fail(L, op, "entry without a readable name", "EPROTO");
      if ((r = read_entry(L, &c, bx, e, raw))) return r;
    }
  }
  if ((r = read_finish(L, &c, bx))) return r;
  box_close(bx);
  lua_pushvalue(L, R_RESULT);
  lua_pushvalue(L, R_REJECTED);
  return 2;
}

/*
** tar.list(archive, [opts]) -> {{path=, type=, size=, mode=, mtime=,
**   target=, unsafe=, escapes=}, ...} | nil, msg, code
*/
static int tar_list(lua_State *L) {
  int r = tar_read(L, M_LIST, "tar.list");
  if (r != 2) return r;
  lua_pop(L, 1);                            /* nothing is rejected here */
  return 1;
}

/*
** tar.extract(archive, [opts]) -> {{path=, type=, mode=, data=, target=,
**   ...}, ...}, rejected | nil, msg, code
** archive may be nil with opts.file; with opts.sink (function(path, chunk))
** or opts.data = false, file entries carry size= instead of data=.
*/
static int tar_extract(lua_State *L) {
  int r = tar_read(L, M_EXTRACT, "tar.extract");
  if (r == 2 && !lua_isnil(L, R_ONLY) && lua_rawlen(L, -2) == 0) {
    lua_pushfstring(L, "no member '%s'", lua_tostring(L, R_ONLY));
    return sbx_fail(L, "tar.extract", lua_tostring(L, -1), "ENOENT");
  }
  return r;
}

/* tar.read_one(archive, [opts]) -> data, entry | nil, msg, code */
static int tar_read_one(lua_State *L) {
  static const char *const fail[][2] = {
    {"dir", "EISDIR"}, {"symlink", "ESCAPE"}, {"hardlink", "ESCAPE"}};
  int r = tar_read(L, M_EXTRACT, "tar.read_one");
  lua_Integer n;
  const char *type;
  if (r != 2) return r;
  lua_pop(L, 1);                            /* stack: ... result */
  if ((n = (lua_Integer)lua_rawlen(L, -1)) == 0)
    return sbx_fail(L, "tar.read_one", lua_isnil(L, R_ONLY)
                    ? "the archive is empty" : "no such member", "ENOENT");
  lua_rawgeti(L, -1, 1);                    /* stack: ... result entry */
  lua_getfield(L, -1, "type");
  type = lua_tostring(L, -1);
  for (size_t i = 0; i < sizeof fail / sizeof fail[0]; i++)
    if (strcmp(type, fail[i][0]) == 0) {
      lua_getfield(L, -2, "path");
      lua_pushfstring(L, "'%s' is a %s, not a regular file",
                      lua_tostring(L, -1), type);
      return sbx_fail(L, "tar.read_one", lua_tostring(L, -1), fail[i][1]);
    }
  if (n > 1) {
    lua_pushfstring(L, "expected one member, found %I", (LUAI_UACINT)n);
    return sbx_fail(L, "tar.read_one", lua_tostring(L, -1), "EPROTO");
  }
  lua_pop(L, 1);
  lua_getfield(L, -1, "data");              /* stack: ... result entry data */
  lua_pushnil(L);
  lua_setfield(L, -3, "data");
  lua_rotate(L, -2, 1);
  return 2;
}

static int box_tostring(lua_State *L) {
  tar_box *bx = luaL_checkudata(L, 1, BOX);
  lua_pushfstring(L, "sbx.TarBox (%s)", bx->a ? "open" : "closed");
  return 1;
}

static const luaL_Reg box_meta[] = {
  {"__gc", box_gc},
  {"__close", box_gc},
  {"__tostring", box_tostring},
  {NULL, NULL}
};

static const luaL_Reg tar_funcs[] = {
  {"pack", tar_pack},
  {"list", tar_list},
  {"extract", tar_extract},
  {"read_one", tar_read_one},
  {NULL, NULL}
};

int luaopen_sbx_tar(lua_State *L) {
  luaL_newmetatable(L, BOX);
  luaL_setfuncs(L, box_meta, 0);
  lua_pop(L, 1);
  luaL_newlib(L, tar_funcs);
  return 1;
}
