/*
** sbx.httpreq: the request head of HTTP/1.x, parsed from untrusted bytes
** for the dashboard's small server (lua/sbx/cli/dashboard/init.lua). Bounded: the
** head may not exceed a size limit, the target 2048 bytes, 64 header
** lines. No bodies, no chunked encoding, no obsolete line folding: the
** caller answers what does not parse with 400.
*/
#include <string.h>

#include "lauxlib.h"
#include "loop.h"

#define HEAD_MAX 8192
#define TARGET_MAX 2048
#define HEADERS_MAX 64

static int is_tchar(unsigned char c) {          /* RFC 9110 token */
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         (c && strchr("!#$%&'*+-.^_`|~", c));
}

static int hexval(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Push s[0..n) percent-decoded ('+' as a space when `plus`); 0 on a bad
** escape or an encoded NUL (nothing pushed). */
static int push_decoded(lua_State *L, const char *s, size_t n, int plus) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '%') {
      int hi = i + 2 < n ? hexval((unsigned char)s[i + 1]) : -1;
      int lo = i + 2 < n ? hexval((unsigned char)s[i + 2]) : -1;
      if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
        luaL_pushresult(&b);
        lua_pop(L, 1);
        return 0;
      }
      luaL_addchar(&b, (char)(hi * 16 + lo));
      i += 2;
    } else {
      luaL_addchar(&b, plus && c == '+' ? ' ' : (char)c);
    }
  }
  luaL_pushresult(&b);
  return 1;
}

/* Parse "a=1&b=x%20y" into the table at the top of the stack. */
static int parse_query(lua_State *L, const char *q, size_t n) {
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    while (j < n && q[j] != '&') j++;
    size_t eq = i;
    while (eq < j && q[eq] != '=') eq++;
    if (eq > i) {
      if (!push_decoded(L, q + i, eq - i, 1)) return 0;
      if (eq < j) {
        if (!push_decoded(L, q + eq + 1, j - eq - 1, 1)) { lua_pop(L, 1); return 0; }
      } else {
        lua_pushliteral(L, "");
      }
      lua_rawset(L, -3);
    }
    i = j + 1;
  }
  return 1;
}

static int bad(lua_State *L, const char *what) {
  return sbx_fail(L, "http", what, "EINVAL");
}

/* httpreq.parse(data [, max]) -> request, head_length
**                              | nil (the head is not complete yet)
**                              | nil, msg, code ("E2BIG": larger than max)
** request = { method=, target=, path= (decoded), query = {k = v},
**             version = "HTTP/1.1", headers = {lower-case name = value} } */
static int httpreq_parse(lua_State *L) {
  size_t len;
  const char *d = luaL_checklstring(L, 1, &len);
  lua_Integer max = luaL_optinteger(L, 2, HEAD_MAX);
  luaL_argcheck(L, max > 0 && max <= 1024 * 1024, 2, "max must be 1..1048576");
  const char *end = NULL;
  size_t scan = len < (size_t)max ? len : (size_t)max;
  for (size_t i = 0; i + 4 <= scan; i++) {
    if (memcmp(d + i, "\r\n\r\n", 4) == 0) {
      end = d + i;
      break;
    }
  }
  if (!end) {
    if (len >= (size_t)max)
      return sbx_fail(L, "http", lua_pushfstring(L, "request head larger than %I bytes", max), "E2BIG");
    lua_pushnil(L);
    return 1;
  }
  size_t head = (size_t)(end - d) + 4;
  /* request line: METHOD SP TARGET SP HTTP/1.x CRLF */
  const char *p = d, *line_end = memchr(d, '\r', (size_t)(end - d) + 1);
  const char *m = p;
  while (p < line_end && *p >= 'A' && *p <= 'Z') p++;
  if (p == m || p - m > 16 || p >= line_end || *p != ' ') return bad(L, "bad method in the request line");
  const char *t = ++p;
  while (p < line_end && (unsigned char)*p > ' ' && (unsigned char)*p < 0x7f) p++;
  if (p == t || p - t > TARGET_MAX || p >= line_end || *p != ' ')
    return bad(L, "bad target in the request line");
  if (*t != '/') return bad(L, "the target must be a path (origin form)");
  const char *v = ++p;
  if (line_end - v != 8 || memcmp(v, "HTTP/1.", 7) != 0 || (v[7] != '0' && v[7] != '1'))
    return bad(L, "not HTTP/1.0 or HTTP/1.1");

  lua_createtable(L, 0, 6);
  lua_pushlstring(L, m, (size_t)(t - 1 - m));
  lua_setfield(L, -2, "method");
  lua_pushlstring(L, t, (size_t)(v - 1 - t));
  lua_setfield(L, -2, "target");
  lua_pushlstring(L, v, 8);
  lua_setfield(L, -2, "version");
  const char *qm = memchr(t, '?', (size_t)(v - 1 - t));
  const char *path_end = qm ? qm : v - 1;
  if (!push_decoded(L, t, (size_t)(path_end - t), 0)) return bad(L, "bad percent-escape in the path");
  lua_setfield(L, -2, "path");
  lua_newtable(L);
  if (qm && !parse_query(L, qm + 1, (size_t)(v - 1 - qm - 1)))
    return bad(L, "bad percent-escape in the query");
  lua_setfield(L, -2, "query");

  /* header lines: NAME ":" OWS VALUE OWS CRLF */
  lua_newtable(L);
  int count = 0;
  p = line_end + 2;
  while (p < end + 2) {
    const char *le = memchr(p, '\r', (size_t)(end + 2 - p));
    if (!le || le[1] != '\n') return bad(L, "a header line does not end in CRLF");
    if (++count > HEADERS_MAX) return bad(L, "more than 64 header lines");
    const char *n = p;
    while (p < le && is_tchar((unsigned char)*p)) p++;
    if (p == n || p >= le || *p != ':') return bad(L, "bad header name");
    size_t nlen = (size_t)(p - n);
    p++;
    while (p < le && (*p == ' ' || *p == '\t')) p++;
    const char *val = p, *ve = le;
    while (ve > val && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
    for (const char *c = val; c < ve; c++)
      if (((unsigned char)*c < ' ' && *c != '\t') || *c == 0x7f) return bad(L, "bad byte in a header value");
    luaL_Buffer b;                                  /* the name, lower-cased */
    luaL_buffinit(L, &b);
    for (size_t i = 0; i < nlen; i++) {
      char c = n[i];
      luaL_addchar(&b, (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c);
    }
    luaL_pushresult(&b);
    lua_pushvalue(L, -1);
    if (lua_rawget(L, -3) != LUA_TNIL) {           /* repeated: joined by ", " */
      lua_pushliteral(L, ", ");
      lua_pushlstring(L, val, (size_t)(ve - val));
      lua_concat(L, 3);
    } else {
      lua_pop(L, 1);
      lua_pushlstring(L, val, (size_t)(ve - val));
    }
    lua_rawset(L, -3);
    p = le + 2;
  }
  lua_setfield(L, -2, "headers");
  lua_pushinteger(L, (lua_Integer)head);
  return 2;
}

static const luaL_Reg httpreq_funcs[] = {
  {"parse", httpreq_parse},
  {NULL, NULL}
};

int luaopen_sbx_httpreq(lua_State *L) {
  luaL_newlib(L, httpreq_funcs);
  lua_pushinteger(L, HEAD_MAX);
  lua_setfield(L, -2, "HEAD_MAX");
  return 1;
}
