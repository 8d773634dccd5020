/*
** sbx.demux: Docker's multiplexed attach/exec stream (Tty = false).
**
** Each frame is an 8-byte header -- stream id (0 stdin, 1 stdout,
** 2 stderr), three zero bytes, a big-endian uint32 length -- and that many
** payload bytes. Payload is handed out as soon as it arrives, so a frame
** of any size costs no memory here; only a partial header is kept.
*/
#include <stdint.h>
#include <string.h>

#include "lauxlib.h"

#define DEMUX_MT "sbx.Demux"

typedef struct demux {
  unsigned char hdr[8];
  int hlen;                        /* header bytes seen of the next frame */
  int stream;                      /* stream of the frame being read */
  uint32_t left;                   /* payload bytes still to come */
  uint64_t offset;                 /* bytes consumed since the start */
  uint64_t bad_at;                 /* where the bad header began */
  int failed, closed;
} demux;

static demux *check_demux(lua_State *L) {
  demux *d = luaL_checkudata(L, 1, DEMUX_MT);
  if (d->closed) luaL_error(L, "attempt to use a closed demuxer");
  return d;
}

static int bad_header(lua_State *L, demux *d) {
  lua_pushnil(L);
  lua_pushfstring(L, "demux: bad frame header at byte %I",
                  (lua_Integer)d->bad_at);
  lua_pushstring(L, "EPROTO");
  return 3;
}

/* stack: +0; appends {stream = s, data = p[0..n)} to the table on top */
static void emit(lua_State *L, int stream, const char *p, size_t n,
                 lua_Integer *count) {
  lua_createtable(L, 0, 2);
  lua_pushinteger(L, stream);
  lua_setfield(L, -2, "stream");
  lua_pushlstring(L, p, n);
  lua_setfield(L, -2, "data");
  lua_rawseti(L, -2, ++*count);
}

/* d:feed(chunk) -> { {stream = 1|2, data = ...}, ... }
**             | nil, "demux: bad frame header at byte N", "EPROTO" */
static int demux_feed(lua_State *L) {
  demux *d = check_demux(L);
  size_t n;
  const char *p = luaL_checklstring(L, 2, &n);
  lua_Integer count = 0;
  if (d->failed) return bad_header(L, d);
  lua_newtable(L);
  while (n > 0) {
    if (d->left == 0) {            /* in a header */
      size_t take = 8 - (size_t)d->hlen;
      if (take > n) take = n;
      memcpy(d->hdr + d->hlen, p, take);
      d->hlen += (int)take;
      p += take;
      n -= take;
      d->offset += take;
      if (d->hlen < 8) break;
      d->hlen = 0;
      if (d->hdr[0] > 2 || d->hdr[1] || d->hdr[2] || d->hdr[3]) {
        d->failed = 1;
        d->bad_at = d->offset - 8;
        return bad_header(L, d);
      }
      d->stream = d->hdr[0];
      d->left = (uint32_t)d->hdr[4] << 24 | (uint32_t)d->hdr[5] << 16 |
                (uint32_t)d->hdr[6] << 8 | (uint32_t)d->hdr[7];
    } else {                       /* in a payload: hand out what is here */
      size_t take = d->left < n ? d->left : n;
      emit(L, d->stream, p, take, &count);
      d->left -= (uint32_t)take;
      p += take;
      n -= take;
      d->offset += take;
    }
  }
  return 1;
}

/* d:finish() -> true | nil, "demux: truncated frame", "EPROTO" */
static int demux_finish(lua_State *L) {
  demux *d = check_demux(L);
  if (d->failed) return bad_header(L, d);
  if (d->hlen || d->left) {
    lua_pushnil(L);
    lua_pushstring(L, "demux: truncated frame");
    lua_pushstring(L, "EPROTO");
    return 3;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* d:close() (idempotent) */
static int demux_close(lua_State *L) {
  demux *d = luaL_checkudata(L, 1, DEMUX_MT);
  d->closed = 1;
  return 0;
}

static int demux_tostring(lua_State *L) {
  demux *d = luaL_checkudata(L, 1, DEMUX_MT);
  lua_pushfstring(L, "sbx.Demux (%I bytes%s, %p)", (lua_Integer)d->offset,
                  d->closed ? ", closed" : d->failed ? ", failed" : "",
                  (void *)d);
  return 1;
}

/* demux.new() -> Demux */
static int demux_new(lua_State *L) {
  demux *d = lua_newuserdatauv(L, sizeof *d, 0);
  memset(d, 0, sizeof *d);
  luaL_setmetatable(L, DEMUX_MT);
  return 1;
}

static const luaL_Reg demux_methods[] = {
  {"feed", demux_feed},
  {"finish", demux_finish},
  {"close", demux_close},
  {NULL, NULL}
};

static const luaL_Reg demux_funcs[] = {
  {"new", demux_new},
  {NULL, NULL}
};

int luaopen_sbx_demux(lua_State *L) {
  if (luaL_newmetatable(L, DEMUX_MT)) {
    luaL_newlib(L, demux_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, demux_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, demux_close);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, demux_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  luaL_newlib(L, demux_funcs);
  return 1;
}
