/*
** Lua patterns (the manual's section 6.4.1) matched by a backtracking
** interpreter that counts its steps, so a pathological pattern such as
** ("a?"):rep(34) .. ("a"):rep(34) stops at the meter's budget instead of
** running for hours. Behaviour follows the stock string library: the same
** results, the same errors, raised as lazily (a malformed tail is only an
** error once the matcher reaches it). spec/core/patmatch_spec.lua compares
** the two on generated subjects and patterns.
*/
#include <ctype.h>
#include <string.h>

#include "lauxlib.h"
#include "patmatch.h"

#define PM_CAPS 32            /* as LUA_MAXCAPTURES */
#define PM_DEPTH 200          /* recursion of the matcher, as stock */
#define CAP_OPEN (-1)         /* a capture not closed yet */
#define CAP_POS (-2)          /* a position capture () */
#define SPECIALS "^$*+?.([%-"

typedef struct Cap { const char *at; ptrdiff_t len; } Cap;

typedef struct Match {
  lua_State *L;
  const char *s0, *se;        /* the subject; *se is its terminating NUL */
  const char *pe;             /* the pattern's end (a NUL too) */
  int ncap;
  int depth;                  /* recursion left */
  long left;                  /* steps left before the next charge */
  pm_meter *m;
  const char *fname;
  Cap cap[PM_CAPS];
} Match;

static void charge(Match *ms) {
  ms->m->charge(ms->L, ms->m, PM_CHUNK, ms->fname);
  ms->left = PM_CHUNK;
}

#define STEP(ms) do { if (--(ms)->left <= 0) charge(ms); } while (0)

static void settle(Match *ms) {
  long used = PM_CHUNK - ms->left;
  ms->left = PM_CHUNK;
  if (used > 0) ms->m->charge(ms->L, ms->m, used, ms->fname);
}

/* ------------------------------------------------------------ classes */

/* c against the class letter after '%' */
static int in_class(int c, int letter) {
  int r;
  switch (tolower(letter)) {
    case 'a': r = isalpha(c); break;
    case 'c': r = iscntrl(c); break;
    case 'd': r = isdigit(c); break;
    case 'g': r = isgraph(c); break;
    case 'l': r = islower(c); break;
    case 'p': r = ispunct(c); break;
    case 's': r = isspace(c); break;
    case 'u': r = isupper(c); break;
    case 'w': r = isalnum(c); break;
    case 'x': r = isxdigit(c); break;
    case 'z': r = c == 0; break;
    default: return letter == c;          /* %. %% %( ...: the char itself */
  }
  if (isupper(letter)) r = !r;
  return r != 0;
}

/* c in the set from '[' at p to its closing ']' at close */
static int in_set(int c, const char *p, const char *close) {
  int want = 1;
  p++;
  if (*p == '^') { want = 0; p++; }
  for (; p < close; p++) {
    unsigned char a = (unsigned char)*p;
    if (a == '%') {
      p++;
      if (in_class(c, (unsigned char)*p)) return want;
    } else if (p[1] == '-' && p + 2 < close) {
      if (a <= c && c <= (unsigned char)p[2]) return want;
      p += 2;
    } else if (a == c) {
      return want;
    }
  }
  return !want;
}

/* where the single-character item at p ends */
static const char *item_end(Match *ms, const char *p) {
  if (*p == '%') {
    if (p + 1 >= ms->pe) luaL_error(ms->L, "malformed pattern (ends with '%%')");
    return p + 2;
  }
  if (*p == '[') {
    p++;
    if (*p == '^') p++;
    /* the first member may be ']' itself */
    do {
      if (p >= ms->pe) luaL_error(ms->L, "malformed pattern (missing ']')");
      if (*p++ == '%' && p < ms->pe) p++;
    } while (*p != ']');
    return p + 1;
  }
  return p + 1;
}

/* does the item p..ep match the character at s? */
static int one(Match *ms, const char *s, const char *p, const char *ep) {
  if (s >= ms->se) return 0;
  int c = (unsigned char)*s;
  switch (*p) {
    case '.': return 1;
    case '%': return in_class(c, (unsigned char)p[1]);
    case '[': return in_set(c, p, ep - 1);
    default: return (unsigned char)*p == c;
  }
}

/* ------------------------------------------------------------ matching */

static const char *run(Match *ms, const char *s, const char *p);

/* item* and item+: take as many as match, then give back one at a time */
static const char *greedy(Match *ms, const char *s, const char *p, const char *ep) {
  ptrdiff_t n = 0;
  while (one(ms, s + n, p, ep)) { n++; STEP(ms); }
  for (; n >= 0; n--) {
    const char *r = run(ms, s + n, ep + 1);
    if (r) return r;
    STEP(ms);
  }
  return NULL;
}

/* item-: take as few as the rest allows */
static const char *lazy(Match *ms, const char *s, const char *p, const char *ep) {
  for (;;) {
    const char *r = run(ms, s, ep + 1);
    if (r) return r;
    if (!one(ms, s, p, ep)) return NULL;
    s++;
    STEP(ms);
  }
}

static const char *open_cap(Match *ms, const char *s, const char *p, ptrdiff_t kind) {
  if (ms->ncap >= PM_CAPS) luaL_error(ms->L, "too many captures");
  ms->cap[ms->ncap].at = s;
  ms->cap[ms->ncap].len = kind;
  ms->ncap++;
  const char *r = run(ms, s, p);
  if (!r) ms->ncap--;
  return r;
}

static const char *close_cap(Match *ms, const char *s, const char *p) {
  int i = ms->ncap - 1;
  while (i >= 0 && ms->cap[i].len != CAP_OPEN) i--;
  if (i < 0) luaL_error(ms->L, "invalid pattern capture");
  ms->cap[i].len = s - ms->cap[i].at;
  const char *r = run(ms, s, p);
  if (!r) ms->cap[i].len = CAP_OPEN;
  return r;
}

/* %bxy at s: the end of the balanced run, or NULL */
static const char *balanced(Match *ms, const char *s, const char *p) {
  if (p + 1 >= ms->pe) luaL_error(ms->L, "malformed pattern (missing arguments to '%%b')");
  if (s >= ms->se || *s != p[0]) return NULL;
  int open = 1;
  while (++s < ms->se) {
    STEP(ms);
    if (*s == p[1]) {
      if (--open == 0) return s + 1;
    } else if (*s == p[0]) {
      open++;
    }
  }
  return NULL;
}

/* %1..%9 at s: the end of the repeated capture, or NULL */
static const char *backref(Match *ms, const char *s, int digit) {
  int i = digit - '1';
  if (i < 0 || i >= ms->ncap || ms->cap[i].len == CAP_OPEN)
    luaL_error(ms->L, "invalid capture index %%%d", i + 1);
  ptrdiff_t len = ms->cap[i].len;
  if (len < 0 || ms->se - s < len) return NULL;    /* a position never repeats */
  if (memcmp(ms->cap[i].at, s, (size_t)len) != 0) return NULL;
  return s + len;
}

/* match the pattern from p at s: the end of the match, or NULL */
static const char *run(Match *ms, const char *s, const char *p) {
  const char *r = NULL;
  if (ms->depth-- == 0) luaL_error(ms->L, "pattern too complex");
  for (;;) {
    STEP(ms);
    if (p == ms->pe) { r = s; break; }
    if (*p == '(') {
      r = p[1] == ')' ? open_cap(ms, s, p + 2, CAP_POS) : open_cap(ms, s, p + 1, CAP_OPEN);
      break;
    }
    if (*p == ')') { r = close_cap(ms, s, p + 1); break; }
    if (*p == '$' && p + 1 == ms->pe) { r = s == ms->se ? s : NULL; break; }
    if (*p == '%' && p[1] == 'b') {
      s = balanced(ms, s, p + 2);
      if (!s) break;
      p += 4;
      continue;
    }
    if (*p == '%' && p[1] == 'f') {
      p += 2;
      if (*p != '[') luaL_error(ms->L, "missing '[' after '%%f' in pattern");
      const char *ep = item_end(ms, p);
      int before = s == ms->s0 ? 0 : (unsigned char)s[-1];
      int here = (unsigned char)*s;             /* NUL at the end */
      if (in_set(before, p, ep - 1) || !in_set(here, p, ep - 1)) break;
      p = ep;
      continue;
    }
    if (*p == '%' && isdigit((unsigned char)p[1])) {
      s = backref(ms, s, (unsigned char)p[1]);
      if (!s) break;
      p += 2;
      continue;
    }
    /* a single-character item, maybe with a repetition */
    const char *ep = item_end(ms, p);
    int hit = one(ms, s, p, ep);
    if (*ep == '?') {
      if (hit && (r = run(ms, s + 1, ep + 1)) != NULL) break;
      p = ep + 1;
      continue;
    }
    if (*ep == '+') { r = hit ? greedy(ms, s + 1, p, ep) : NULL; break; }
    if (*ep == '*') { r = greedy(ms, s, p, ep); break; }
    if (*ep == '-') { r = lazy(ms, s, p, ep); break; }
    if (!hit) break;
    s++;
    p = ep;
  }
  ms->depth++;
  return r;
}

/* ------------------------------------------------------------ results */

/* push capture i (or the whole match s..e when there are none) */
static void push_cap(Match *ms, int i, const char *s, const char *e) {
  if (i >= ms->ncap) {
    if (i != 0) luaL_error(ms->L, "invalid capture index %%%d", i + 1);
    lua_pushlstring(ms->L, s, (size_t)(e - s));
    return;
  }
  Cap *c = &ms->cap[i];
  if (c->len == CAP_OPEN) luaL_error(ms->L, "unfinished capture");
  if (c->len == CAP_POS) lua_pushinteger(ms->L, (lua_Integer)(c->at - ms->s0) + 1);
  else lua_pushlstring(ms->L, c->at, (size_t)c->len);
}

/* push every capture (or the whole match when s is given and there are
** none); returns how many */
static int push_caps(Match *ms, const char *s, const char *e) {
  int n = ms->ncap == 0 && s ? 1 : ms->ncap;
  luaL_checkstack(ms->L, n, "too many captures");
  for (int i = 0; i < n; i++) push_cap(ms, i, s, e);
  return n;
}

static void begin(Match *ms, lua_State *L, const char *fname, const char *s, size_t ls,
                  const char *p, size_t lp) {
  ms->L = L;
  ms->m = lua_touserdata(L, lua_upvalueindex(1));
  ms->fname = fname;
  ms->s0 = s;
  ms->se = s + ls;
  ms->pe = p + lp;
  ms->left = PM_CHUNK;
}

static void reset(Match *ms) {
  ms->ncap = 0;
  ms->depth = PM_DEPTH;
}

/* a 1-based (negative: from the end) start -> an offset, as stock */
static size_t start_at(lua_Integer pos, size_t len) {
  if (pos > 0) return (size_t)pos - 1;
  if (pos == 0 || pos < -(lua_Integer)len) return 0;
  return (size_t)((lua_Integer)len + pos);
}

static int has_specials(const char *p, size_t lp) {
  for (size_t i = 0; i < lp; i++)
    if (p[i] && strchr(SPECIALS, p[i])) return 1;
  return 0;
}

static int find_or_match(lua_State *L, int find) {
  size_t ls, lp;
  const char *s = luaL_checklstring(L, 1, &ls);
  const char *p = luaL_checklstring(L, 2, &lp);
  size_t init = start_at(luaL_optinteger(L, 3, 1), ls);
  if (init > ls) { luaL_pushfail(L); return 1; }
  if (find && (lua_toboolean(L, 4) || !has_specials(p, lp))) {
    /* linear, whatever the sizes */
    const char *at = lp == 0 ? s + init : lp > ls - init ? NULL : memmem(s + init, ls - init, p, lp);
    if (!at) { luaL_pushfail(L); return 1; }
    lua_pushinteger(L, (lua_Integer)(at - s) + 1);
    lua_pushinteger(L, (lua_Integer)(at - s + lp));
    return 2;
  }
  Match ms;
  begin(&ms, L, find ? "string.find" : "string.match", s, ls, p, lp);
  int anchored = *p == '^';
  if (anchored) p++;
  const char *at = s + init;
  do {
    reset(&ms);
    const char *e = run(&ms, at, p);
    if (e) {
      settle(&ms);
      if (!find) return push_caps(&ms, at, e);
      lua_pushinteger(L, (lua_Integer)(at - s) + 1);
      lua_pushinteger(L, (lua_Integer)(e - s));
      return push_caps(&ms, NULL, NULL) + 2;
    }
  } while (at++ < ms.se && !anchored);
  settle(&ms);
  luaL_pushfail(L);
  return 1;
}

/* string.find(s, pattern, [init], [plain]) */
static int pm_find(lua_State *L) { return find_or_match(L, 1); }

/* string.match(s, pattern, [init]) */
static int pm_match(lua_State *L) { return find_or_match(L, 0); }

/* the iterator's state: offsets into its subject */
typedef struct Iter { size_t pos; ptrdiff_t last; } Iter;

/* upvalues: meter, subject, pattern, Iter */
static int gmatch_next(lua_State *L) {
  size_t ls, lp;
  const char *s = lua_tolstring(L, lua_upvalueindex(2), &ls);
  const char *p = lua_tolstring(L, lua_upvalueindex(3), &lp);
  Iter *it = lua_touserdata(L, lua_upvalueindex(4));
  Match ms;
  begin(&ms, L, "string.gmatch", s, ls, p, lp);
  for (const char *at = s + it->pos; at <= ms.se; at++) {
    reset(&ms);
    const char *e = run(&ms, at, p);
    if (e && e - s != it->last) {
      it->pos = (size_t)(e - s);
      it->last = e - s;
      settle(&ms);
      return push_caps(&ms, at, e);
    }
  }
  it->pos = ls + 1;
  settle(&ms);
  return 0;
}

/* string.gmatch(s, pattern, [init]) -> iterator */
static int pm_gmatch(lua_State *L) {
  size_t ls;
  luaL_checklstring(L, 1, &ls);
  luaL_checkstring(L, 2);
  size_t init = start_at(luaL_optinteger(L, 3, 1), ls);
  lua_settop(L, 2);
  Iter *it = lua_newuserdatauv(L, sizeof *it, 0);
  it->pos = init > ls ? ls + 1 : init;
  it->last = -1;
  /* stack: s, p, iter */
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_pushcclosure(L, gmatch_next, 4);
  return 1;
}

/* a replacement string: %0-%9 and %% */
static void add_template(Match *ms, luaL_Buffer *b, const char *s, const char *e) {
  size_t n;
  const char *r = lua_tolstring(ms->L, 3, &n);
  const char *end = r + n;
  while (r < end) {
    const char *pc = memchr(r, '%', (size_t)(end - r));
    if (!pc) { luaL_addlstring(b, r, (size_t)(end - r)); break; }
    luaL_addlstring(b, r, (size_t)(pc - r));
    int c = (unsigned char)pc[1];              /* NUL past the end */
    if (c == '%') {
      luaL_addchar(b, '%');
    } else if (c == '0') {
      luaL_addlstring(b, s, (size_t)(e - s));
    } else if (isdigit(c)) {
      push_cap(ms, c - '1', s, e);
      luaL_tolstring(ms->L, -1, NULL);         /* a position becomes digits */
      lua_remove(ms->L, -2);
      luaL_addvalue(b);
    } else {
      luaL_error(ms->L, "invalid use of '%%' in replacement string");
    }
    r = pc + 2;
  }
}

/* append the replacement for the match s..e */
static void add_replacement(Match *ms, luaL_Buffer *b, const char *s, const char *e, int kind) {
  lua_State *L = ms->L;
  if (kind == LUA_TSTRING || kind == LUA_TNUMBER) {
    add_template(ms, b, s, e);
    return;
  }
  if (kind == LUA_TFUNCTION) {
    lua_pushvalue(L, 3);
    int n = push_caps(ms, s, e);
    lua_call(L, n, 1);
  } else {
    push_cap(ms, 0, s, e);
    lua_gettable(L, 3);
  }
  if (!lua_toboolean(L, -1)) {                 /* false or nil: keep the match */
    lua_pop(L, 1);
    luaL_addlstring(b, s, (size_t)(e - s));
  } else if (!lua_isstring(L, -1)) {
    luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
  } else {
    luaL_addvalue(b);
  }
}

/* string.gsub(s, pattern, repl, [n]) -> string, count */
static int pm_gsub(lua_State *L) {
  size_t ls, lp;
  const char *s = luaL_checklstring(L, 1, &ls);
  const char *p = luaL_checklstring(L, 2, &lp);
  int kind = lua_type(L, 3);
  lua_Integer max = luaL_optinteger(L, 4, (lua_Integer)ls + 1);
  luaL_argexpected(L, kind == LUA_TNUMBER || kind == LUA_TSTRING || kind == LUA_TFUNCTION
                   || kind == LUA_TTABLE, 3, "string/function/table");
  Match ms;
  begin(&ms, L, "string.gsub", s, ls, p, lp);
  int anchored = *p == '^';
  if (anchored) p++;
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  const char *at = s, *last = NULL;
  lua_Integer count = 0;
  while (count < max) {
    reset(&ms);
    const char *e = run(&ms, at, p);
    if (e && e != last) {
      count++;
      add_replacement(&ms, &b, at, e, kind);
      at = last = e;
    } else if (at < ms.se) {
      luaL_addchar(&b, *at++);
    } else {
      break;
    }
    if (anchored) break;
  }
  settle(&ms);
  luaL_addlstring(&b, at, (size_t)(ms.se - at));
  luaL_pushresult(&b);
  lua_pushinteger(L, count);
  return 2;
}

void pm_install(lua_State *L, int idx, int midx) {
  static const luaL_Reg fns[] = {
    {"find", pm_find}, {"match", pm_match}, {"gmatch", pm_gmatch}, {"gsub", pm_gsub},
    {NULL, NULL}
  };
  idx = lua_absindex(L, idx);
  midx = lua_absindex(L, midx);
  for (const luaL_Reg *f = fns; f->name; f++) {
    lua_pushvalue(L, midx);
    lua_pushcclosure(L, f->func, 1);
    lua_setfield(L, idx, f->name);
  }
}
