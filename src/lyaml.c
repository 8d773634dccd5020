/*
** sbx.yaml: libyaml -> Lua values, strict and bounded, for sbx.yaml and
** other untrusted YAML.
**
**   yaml.decode(text, [{max_bytes=, max_depth=, max_aliases=, max_nodes=}])
**     -> value, positions | nil, "line:col: message", code
**
** One document (an empty stream is nil). Mapping keys are strings (the
** key's text); duplicate keys, non-scalar keys, unknown tags, more than one
** document, input over max_bytes, nesting over max_depth, more than
** max_aliases aliases or max_nodes nodes (aliases count what they expand
** to) are errors. Plain scalars resolve like YAML 1.2's core schema (null,
** true/false, integers, floats); quoted scalars are strings. A null is
** yaml.null (a light userdata). `positions` maps each table to
** { line=, col=, keys = { [key] = { line, col } } } (1-based) so callers
** can name where a bad value is.
*/
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "lauxlib.h"

typedef struct Frame {
  int is_map;          /* mapping or sequence */
  int anchor;          /* registry ref of the anchor name or LUA_NOREF */
  lua_Integer n;       /* next sequence index */
  int have_key;        /* a key is waiting for its value */
  size_t nodes_at;     /* node count when the collection started */
  yaml_mark_t start;   /* where the collection started */
} Frame;

typedef struct Doc {
  yaml_parser_t p;
  yaml_event_t ev;
  int have_ev;
  Frame *stack;
  int depth, max_depth;
  long aliases, max_aliases;
  size_t nodes, max_nodes;
} Doc;

static const char *const NULLKEY = "sbx.yaml.null";

/* The userdata box holding Doc: __gc frees libyaml state even on errors. */
static int doc_gc(lua_State *L) {
  Doc *d = lua_touserdata(L, 1);
  if (d->have_ev) yaml_event_delete(&d->ev);
  d->have_ev = 0;
  if (d->stack) yaml_parser_delete(&d->p);
  free(d->stack);
  d->stack = NULL;
  return 0;
}

static int fail_at(lua_State *L, yaml_mark_t m, const char *code, const char *fmt,
                   const char *detail) {
  lua_pushnil(L);
  lua_pushfstring(L, "%d:%d: ", (int)m.line + 1, (int)m.column + 1);
  lua_pushfstring(L, fmt, detail);
  lua_concat(L, 2);
  lua_pushstring(L, code);
  return 3;
}

/* Resolve a plain scalar like YAML 1.2's core schema; pushes the value. */
static int push_plain(lua_State *L, const char *s, size_t n) {
  if (n == 0 || (n == 1 && s[0] == '~') || !strcmp(s, "null") || !strcmp(s, "Null")
      || !strcmp(s, "NULL")) {
    lua_pushlightuserdata(L, (void *)NULLKEY);
    return 1;
  }
  if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE")) {
    lua_pushboolean(L, 1);
    return 1;
  }
  if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE")) {
    lua_pushboolean(L, 0);
    return 1;
  }
  const char *t = s + (s[0] == '-' || s[0] == '+');
  if (!strcmp(t, ".inf") || !strcmp(t, ".Inf") || !strcmp(t, ".INF")) {
    lua_pushnumber(L, s[0] == '-' ? -HUGE_VAL : HUGE_VAL);
    return 1;
  }
  if (!strcmp(s, ".nan") || !strcmp(s, ".NaN") || !strcmp(s, ".NAN")) {
    lua_pushnumber(L, NAN);
    return 1;
  }
  /* integers: [-+]?[0-9]+ | 0o[0-7]+ | 0x[0-9a-fA-F]+ */
  char *end;
  errno = 0;
  if (t[0] == '0' && (t[1] == 'x' || t[1] == 'o') && t == s && t[2]) {
    long long v = strtoll(t + 2, &end, t[1] == 'x' ? 16 : 8);
    if (*end == '\0' && errno == 0 && strspn(t + 2, "0123456789abcdefABCDEF") == n - 2) {
      lua_pushinteger(L, (lua_Integer)v);
      return 1;
    }
  } else if (*t && strspn(t, "0123456789") == strlen(t)) {
    long long v = strtoll(s, &end, 10);
    if (*end == '\0' && errno == 0) {
      lua_pushinteger(L, (lua_Integer)v);
      return 1;
    }
  }
  /* floats: [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)? */
  {
    const char *q = t;
    size_t digits = strspn(q, "0123456789");
    q += digits;
    size_t frac = 0;
    int dot = *q == '.';
    if (dot) { q++; frac = strspn(q, "0123456789"); q += frac; }
    int ok = (digits || frac) && (dot || *q == 'e' || *q == 'E');
    if (ok && (*q == 'e' || *q == 'E')) {
      q++;
      if (*q == '-' || *q == '+') q++;
      size_t ed = strspn(q, "0123456789");
      ok = ed > 0;
      q += ed;
    }
    if (ok && *q == '\0') {
      lua_pushnumber(L, strtod(s, NULL));
      return 1;
    }
  }
  lua_pushlstring(L, s, n);
  return 1;
}

/* Push a scalar event's value, honouring the few core tags. */
static int push_scalar(lua_State *L, Doc *d, int *bad) {
  yaml_event_t *e = &d->ev;
  const char *s = (const char *)e->data.scalar.value;
  size_t n = e->data.scalar.length;
  const char *tag = (const char *)e->data.scalar.tag;
  *bad = 0;
  if (tag && strcmp(tag, "!") != 0) {
    if (!strcmp(tag, YAML_STR_TAG)) { lua_pushlstring(L, s, n); return 1; }
    if (strcmp(tag, YAML_INT_TAG) && strcmp(tag, YAML_FLOAT_TAG) && strcmp(tag, YAML_BOOL_TAG)
        && strcmp(tag, YAML_NULL_TAG)) { *bad = 1; return 0; }
    if (strlen(s) != n) { *bad = 1; return 0; }
    push_plain(L, s, n);
    int t = lua_type(L, -1);
    int want = !strcmp(tag, YAML_BOOL_TAG) ? LUA_TBOOLEAN
             : !strcmp(tag, YAML_NULL_TAG) ? LUA_TLIGHTUSERDATA : LUA_TNUMBER;
    if (t != want || (!strcmp(tag, YAML_INT_TAG) && !lua_isinteger(L, -1))) {
      lua_pop(L, 1);
      *bad = 1;
      return 0;
    }
    return 1;
  }
  if (e->data.scalar.style != YAML_PLAIN_SCALAR_STYLE || (tag && !strcmp(tag, "!"))) {
    lua_pushlstring(L, s, n);
    return 1;
  }
  if (strlen(s) != n) { lua_pushlstring(L, s, n); return 1; }
  return push_plain(L, s, n);
}

/* positions[tbl] = { line=, col=, keys = {} }; stack: ... tbl -> ... tbl */
static void mark_table(lua_State *L, int pos, yaml_mark_t m) {
  lua_pushvalue(L, -1);
  lua_createtable(L, 0, 3);
  lua_pushinteger(L, (lua_Integer)m.line + 1);
  lua_setfield(L, -2, "line");
  lua_pushinteger(L, (lua_Integer)m.column + 1);
  lua_setfield(L, -2, "col");
  lua_newtable(L);
  lua_setfield(L, -2, "keys");
  lua_rawset(L, pos);
}

/* positions[parent].keys[key] = { line, col }; stack: ... parent key */
static void mark_key(lua_State *L, int pos, yaml_mark_t m) {
  lua_pushvalue(L, -2);
  lua_rawget(L, pos);
  lua_getfield(L, -1, "keys");
  lua_pushvalue(L, -3);
  lua_createtable(L, 2, 0);
  lua_pushinteger(L, (lua_Integer)m.line + 1);
  lua_rawseti(L, -2, 1);
  lua_pushinteger(L, (lua_Integer)m.column + 1);
  lua_rawseti(L, -2, 2);
  lua_rawset(L, -3);
  lua_pop(L, 2);
}

/* yaml.decode(text, [limits]) -> value, positions | nil, msg, code */
static int yaml_decode(lua_State *L) {
  size_t len;
  const char *text = luaL_checklstring(L, 1, &len);
  lua_Integer max_bytes = 1 << 20, max_depth = 64, max_aliases = 100, max_nodes = 100000;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_getfield(L, 2, "max_bytes");
    max_bytes = luaL_optinteger(L, -1, max_bytes);
    lua_getfield(L, 2, "max_depth");
    max_depth = luaL_optinteger(L, -1, max_depth);
    lua_getfield(L, 2, "max_aliases");
    max_aliases = luaL_optinteger(L, -1, max_aliases);
    lua_getfield(L, 2, "max_nodes");
    max_nodes = luaL_optinteger(L, -1, max_nodes);
    lua_pop(L, 4);
  }
  luaL_argcheck(L, max_depth >= 1 && max_depth <= 10000, 2, "max_depth must be 1..10000");
  luaL_argcheck(L, max_bytes >= 0 && max_nodes >= 1 && max_aliases >= 0, 2, "limits must be >= 0");
  if ((lua_Integer)len > max_bytes) {
    lua_pushnil(L);
    lua_pushfstring(L, "1:1: the document is %I bytes, over the limit of %I",
                    (lua_Integer)len, max_bytes);
    lua_pushstring(L, "ETOOBIG");
    return 3;
  }
  lua_settop(L, 1);
  Doc *d = lua_newuserdatauv(L, sizeof *d, 0);           /* 2: the box */
  memset(d, 0, sizeof *d);
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, doc_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  d->stack = calloc((size_t)max_depth + 1, sizeof *d->stack);
  if (!d->stack) return luaL_error(L, "yaml: out of memory");
  if (!yaml_parser_initialize(&d->p)) {
    free(d->stack);
    d->stack = NULL;
    return luaL_error(L, "yaml: cannot initialise the parser");
  }
  yaml_parser_set_input_string(&d->p, (const unsigned char *)text, len);
  d->max_depth = (int)max_depth;
  d->max_aliases = (long)max_aliases;
  d->max_nodes = (size_t)max_nodes;
  lua_newtable(L);                                         /* 3: anchors name -> {value, nodes} */
  lua_newtable(L);                                         /* 4: positions */
  const int ANCHORS = 3, POS = 4;
  /* stack above 4: the open collections, each followed by its pending key */
  int docs = 0, have_root = 0;
  for (;;) {
    if (!yaml_parser_parse(&d->p, &d->ev)) {
      yaml_mark_t m = d->p.problem_mark;
      const char *prob = d->p.problem ? d->p.problem : "syntax error";
      const char *ctx = d->p.context;
      if (ctx) {
        lua_pushfstring(L, "%s %s", prob, ctx);
        prob = lua_tostring(L, -1);
      }
      if (m.index < len && text[m.index] == '\t') return fail_at(L, m, "EINVAL", "%s (tabs cannot indent YAML)", prob);
      return fail_at(L, m, "EINVAL", "%s", prob);
    }
    d->have_ev = 1;
    yaml_event_t *e = &d->ev;
    yaml_mark_t m = e->start_mark;
    int value = 0;            /* a complete value was pushed */
    const char *anchor = NULL;
    switch (e->type) {
      case YAML_STREAM_START_EVENT: case YAML_DOCUMENT_END_EVENT:
        break;
      case YAML_STREAM_END_EVENT:
        yaml_event_delete(e);
        d->have_ev = 0;
        if (!have_root) lua_pushnil(L);
        lua_pushvalue(L, POS);
        return 2;
      case YAML_DOCUMENT_START_EVENT:
        if (++docs > 1) return fail_at(L, m, "EINVAL", "%s", "more than one document");
        break;
      case YAML_ALIAS_EVENT: {
        Frame *f = d->depth ? &d->stack[d->depth] : NULL;
        if (f && f->is_map && !f->have_key)
          return fail_at(L, m, "EINVAL", "%s", "aliases cannot be mapping keys");
        if (++d->aliases > d->max_aliases)
          return fail_at(L, m, "ELIMIT", "more than %s aliases", lua_pushfstring(L, "%I", (lua_Integer)d->max_aliases));
        lua_getfield(L, ANCHORS, (const char *)e->data.alias.anchor);
        if (lua_isnil(L, -1))
          return fail_at(L, m, "EINVAL", "unknown alias '%s'", (const char *)e->data.alias.anchor);
        lua_rawgeti(L, -1, 2);
        size_t n = (size_t)lua_tointeger(L, -1);
        lua_pop(L, 1);
        d->nodes += n;
        if (d->nodes > d->max_nodes)
          return fail_at(L, m, "ELIMIT", "more than %s nodes (aliases count what they expand to)",
                         lua_pushfstring(L, "%I", (lua_Integer)d->max_nodes));
        lua_rawgeti(L, -1, 1);
        lua_remove(L, -2);
        value = 1;
        break;
      }
      case YAML_SCALAR_EVENT: {
        Frame *f = d->depth ? &d->stack[d->depth] : NULL;
        if (++d->nodes > d->max_nodes)
          return fail_at(L, m, "ELIMIT", "more than %s nodes", lua_pushfstring(L, "%I", (lua_Integer)d->max_nodes));
        if (f && f->is_map && !f->have_key) {   /* a key */
          if (e->data.scalar.anchor)
            return fail_at(L, m, "EINVAL", "%s", "anchors on mapping keys are not supported");
          lua_pushlstring(L, (const char *)e->data.scalar.value, e->data.scalar.length);
          lua_pushvalue(L, -1);
          if (lua_rawget(L, -3) != LUA_TNIL)
            return fail_at(L, m, "EDUP", "duplicate key '%s'", lua_tostring(L, -2));
          lua_pop(L, 1);
          mark_key(L, POS, m);
          f->have_key = 1;
          break;
        }
        int bad;
        if (!push_scalar(L, d, &bad) || bad)
          return fail_at(L, m, "EINVAL", "unsupported tag '%s'",
                         e->data.scalar.tag ? (const char *)e->data.scalar.tag : "?");
        anchor = (const char *)e->data.scalar.anchor;
        value = 1;
        break;
      }
      case YAML_SEQUENCE_START_EVENT: case YAML_MAPPING_START_EVENT: {
        Frame *f = d->depth ? &d->stack[d->depth] : NULL;
        if (f && f->is_map && !f->have_key)
          return fail_at(L, m, "EINVAL", "%s", "mapping keys must be scalars");
        const char *tag = (const char *)(e->type == YAML_MAPPING_START_EVENT
                          ? e->data.mapping_start.tag : e->data.sequence_start.tag);
        if (tag && strcmp(tag, "!") && strcmp(tag, YAML_MAP_TAG) && strcmp(tag, YAML_SEQ_TAG))
          return fail_at(L, m, "EINVAL", "unsupported tag '%s'", tag);
        if (d->depth >= d->max_depth)
          return fail_at(L, m, "ELIMIT", "nesting deeper than %s levels",
                         lua_pushfstring(L, "%d", d->max_depth));
        if (++d->nodes > d->max_nodes)
          return fail_at(L, m, "ELIMIT", "more than %s nodes", lua_pushfstring(L, "%I", (lua_Integer)d->max_nodes));
        if (!lua_checkstack(L, 8)) return luaL_error(L, "yaml: stack overflow");
        Frame *nf = &d->stack[++d->depth];
        memset(nf, 0, sizeof *nf);
        nf->is_map = e->type == YAML_MAPPING_START_EVENT;
        nf->n = 1;
        nf->nodes_at = d->nodes;
        nf->start = m;
        nf->anchor = LUA_NOREF;
        const char *a = (const char *)(nf->is_map ? e->data.mapping_start.anchor
                                                  : e->data.sequence_start.anchor);
        if (a) {
          lua_pushstring(L, a);
          nf->anchor = luaL_ref(L, LUA_REGISTRYINDEX);
        }
        lua_newtable(L);
        mark_table(L, POS, m);
        break;
      }
      case YAML_SEQUENCE_END_EVENT: case YAML_MAPPING_END_EVENT: {
        Frame *f = &d->stack[d->depth--];
        m = f->start;
        if (f->anchor != LUA_NOREF) {
          lua_rawgeti(L, LUA_REGISTRYINDEX, f->anchor);
          luaL_unref(L, LUA_REGISTRYINDEX, f->anchor);
          lua_createtable(L, 2, 0);
          lua_pushvalue(L, -3);
          lua_rawseti(L, -2, 1);
          lua_pushinteger(L, (lua_Integer)(d->nodes - f->nodes_at + 1));
          lua_rawseti(L, -2, 2);
          lua_rawset(L, ANCHORS);
        }
        value = 1;
        break;
      }
      default:
        break;
    }
    if (anchor) {
      lua_pushstring(L, anchor);
      lua_createtable(L, 2, 0);
      lua_pushvalue(L, -3);
      lua_rawseti(L, -2, 1);
      lua_pushinteger(L, 1);
      lua_rawseti(L, -2, 2);
      lua_rawset(L, ANCHORS);
    }
    yaml_event_delete(e);
    d->have_ev = 0;
    if (value) {           /* stack: ... [parent [key]] value */
      if (d->depth == 0) {
        have_root = 1;     /* the document's root: stays on the stack */
      } else {
        Frame *f = &d->stack[d->depth];
        if (f->is_map) {
          lua_rawset(L, -3);
          f->have_key = 0;
        } else {
          lua_rawseti(L, -2, f->n);  /* stack: ... seq */
          lua_pushinteger(L, f->n);
          mark_key(L, POS, m);       /* positions[seq].keys[n] */
          lua_pop(L, 1);
          f->n++;
        }
      }
    }
  }
}

static const luaL_Reg funcs[] = {
  {"decode", yaml_decode},
  {NULL, NULL}
};

int luaopen_sbx_yaml(lua_State *L) {
  luaL_newlib(L, funcs);
  lua_pushlightuserdata(L, (void *)NULLKEY);
  lua_setfield(L, -2, "null");
  return 1;
}
