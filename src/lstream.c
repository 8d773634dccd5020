/*
** sbx.stream: a raw byte stream over a unix or TCP socket, on the loop.
** For what HTTP libraries do not do: a connection hijacked after an HTTP
** upgrade (Docker's attach/exec with stdin), and later the framed protocol
** of sbx-agent.
*/
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <netinet/tcp.h>
#include <sys/un.h>
#include <unistd.h>

#include "lauxlib.h"
#include "loop.h"

#define STREAM_MT "sbx.Stream"
#define READ_MAX 65536

typedef struct stream {
  sbx_loop *lp;
  int fd, closed, connecting, eof, err;
  sbx_watch w;
  sbx_timer tm;
  int expired;
  sbx_waiter *rw, *ww;             /* one reader and one writer at a time */
  int selfref;
} stream;

static stream *check_stream(lua_State *L) {
  stream *s = luaL_checkudata(L, 1, STREAM_MT);
  if (s->closed) luaL_error(L, "attempt to use a closed stream");
  return s;
}

static void rearm(stream *s) {
  uint32_t ev = (s->rw ? EPOLLIN | EPOLLRDHUP : 0) | (s->ww ? EPOLLOUT : 0);
  if (ev) sbx_watch_set(s->lp, &s->w, s->fd, ev);
  else sbx_watch_stop(s->lp, &s->w);
}

static void wake(stream *s, sbx_waiter **slot) {
  sbx_waiter *w = *slot;
  *slot = NULL;
  if (w) sbx_wake(s->lp, w);
}

static void io_cb(sbx_watch *w, uint32_t revents) {
  stream *s = (stream *)((char *)w - offsetof(stream, w));
  if (revents & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) wake(s, &s->rw);
  if (revents & (EPOLLOUT | EPOLLHUP | EPOLLERR)) wake(s, &s->ww);
  rearm(s);
}

static void timer_cb(sbx_timer *t) {
  stream *s = (stream *)((char *)t - offsetof(stream, tm));
  s->expired = 1;
  wake(s, &s->rw);
  wake(s, &s->ww);
  rearm(s);
}

static void stream_release(stream *s) {
  if (s->closed) return;
  s->closed = 1;
  sbx_watch_stop(s->lp, &s->w);
  sbx_timer_stop(s->lp, &s->tm);
  wake(s, &s->rw);                 /* waiters see the close and fail */
  wake(s, &s->ww);
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
}

/* Wait until fd is readable (or writable) or `timeout` passes; then k. */
static int arm(lua_State *L, stream *s, int writing, double timeout,
               lua_KFunction k) {
  sbx_waiter **slot = writing ? &s->ww : &s->rw;
  if (*slot) return luaL_error(L, "another task is %s this stream",
                               writing ? "writing to" : "reading from");
  sbx_waiter *w = lua_newuserdatauv(L, sizeof *w, 0);
  memset(w, 0, sizeof *w);
  lua_replace(L, 3);               /* stack: stream, arg, waiter */
  *slot = w;
  s->expired = 0;
  rearm(s);
  if (timeout > 0) sbx_timer_start(s->lp, &s->tm, timeout);
  return sbx_await(L, w, (lua_KContext)s, k);
}

/* Common continuation prologue: 1 to go on, 0 when results were pushed. */
static int resumed(lua_State *L, stream *s, int writing, int *nres) {
  sbx_waiter *w = lua_touserdata(L, 3);
  sbx_waiter **slot = writing ? &s->ww : &s->rw;
  if (!writing) sbx_timer_stop(s->lp, &s->tm);
  if (w && !w->done) {             /* cancelled */
    if (*slot == w) *slot = NULL;
    sbx_unwait(s->lp, w);
    if (!s->closed) rearm(s);
    *nres = sbx_raise_cancelled(L);
    return 0;
  }
  if (s->closed) {
    *nres = sbx_fail(L, "stream", "closed while waiting", "EPIPE");
    return 0;
  }
  if (s->expired && !writing) {
    *nres = sbx_fail(L, "stream", "timed out", "ETIMEDOUT");
    return 0;
  }
  return 1;
}

static double opt_timeout(lua_State *L, int idx) {
  double t = luaL_optnumber(L, idx, 0);
  luaL_argcheck(L, t >= 0 && t == t, idx, "timeout must be >= 0");
  return t;
}


/* ---------------------------------------------------------------- read */

static int read_k(lua_State *L, int status, lua_KContext ctx) {
  stream *s = (stream *)ctx;
  int nres;
  char buf[READ_MAX];
  (void)status;
  if (lua_touserdata(L, 3) && !resumed(L, s, 0, &nres)) return nres;
  for (;;) {
    ssize_t n = recv(s->fd, buf, sizeof buf, 0);
    if (n > 0) {
      lua_pushlstring(L, buf, (size_t)n);
      return 1;
    }
    if (n == 0) {
      s->eof = 1;
      return 0;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN) break;
    return sbx_fail_errno(L, "read", NULL, errno);
  }
  return arm(L, s, 0, lua_tonumber(L, 2), read_k);
}

/* stream:read([timeout]) -> chunk | nil (end) | nil, msg, code */
static int stream_read(lua_State *L) {
  stream *s = check_stream(L);
  double t = opt_timeout(L, 2);
  sbx_check_cancel(L);
  lua_settop(L, 1);
  lua_pushnumber(L, t);
  lua_pushnil(L);
  if (s->eof) return 0;
  return read_k(L, LUA_OK, (lua_KContext)s);
}


/* --------------------------------------------------------------- write */

static int write_k(lua_State *L, int status, lua_KContext ctx) {
  stream *s = (stream *)ctx;
  int nres;
  size_t len;
  (void)status;
  if (lua_touserdata(L, 3) && !resumed(L, s, 1, &nres)) return nres;
  const char *data = lua_tolstring(L, 2, &len);
  size_t off = (size_t)lua_tointeger(L, 4);
  while (off < len) {
    ssize_t n = send(s->fd, data + off, len - off, MSG_NOSIGNAL);
    if (n > 0) { off += (size_t)n; continue; }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      lua_pushinteger(L, (lua_Integer)off);
      lua_replace(L, 4);
      return arm(L, s, 1, 0, write_k);
    }
    return sbx_fail_errno(L, "write", NULL, errno);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* stream:write(data) -> true | nil, msg, code (waits until all is sent) */
static int stream_write(lua_State *L) {
  stream *s = check_stream(L);
  luaL_checkstring(L, 2);
  sbx_check_cancel(L);
  lua_settop(L, 2);
  lua_pushnil(L);                  /* 3: waiter */
  lua_pushinteger(L, 0);           /* 4: bytes sent */
  return write_k(L, LUA_OK, (lua_KContext)s);
}

/* stream:shutdown(): no more writes (the peer reads end of file) */
static int stream_shutdown(lua_State *L) {
  stream *s = check_stream(L);
  if (shutdown(s->fd, SHUT_WR) < 0 && errno != ENOTCONN)
    return sbx_fail_errno(L, "shutdown", NULL, errno);
  lua_pushboolean(L, 1);
  return 1;
}

/* stream:close() (also __gc, __close; idempotent) */
static int stream_close(lua_State *L) {
  stream *s = luaL_checkudata(L, 1, STREAM_MT);
  stream_release(s);
  return 0;
}

static int stream_tostring(lua_State *L) {
  stream *s = luaL_checkudata(L, 1, STREAM_MT);
  lua_pushfstring(L, "sbx.Stream (%s)", s->closed ? "closed" : s->eof ? "eof" : "open");
  return 1;
}


/* ------------------------------------------------------------- connect */

static int connect_k(lua_State *L, int status, lua_KContext ctx) {
  stream *s = (stream *)ctx;
  int nres, err = 0;
  socklen_t len = sizeof err;
  (void)status;
  sbx_timer_stop(s->lp, &s->tm);
  if (!resumed(L, s, 1, &nres)) {
    stream_release(s);
    return nres;
  }
  if (s->expired) {
    stream_release(s);
    return sbx_fail(L, "connect", "timed out", "ETIMEDOUT");
  }
  getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err) {
    stream_release(s);
    return sbx_fail_errno(L, "connect", lua_tostring(L, 4), err);
  }
  lua_pushvalue(L, 1);
  return 1;
}

/* stream.connect{unix=PATH | host=, port=, timeout=} -> Stream | nil, msg, code */
static int stream_connect(lua_State *L) {
  struct sockaddr_un un;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "unix");
  const char *path = luaL_optstring(L, -1, NULL);
  lua_getfield(L, 1, "host");
  const char *host = luaL_optstring(L, -1, NULL);
  lua_getfield(L, 1, "port");
  const char *port = luaL_optstring(L, -1, NULL);
  lua_getfield(L, 1, "timeout");
  double timeout = luaL_optnumber(L, -1, 10);
  luaL_argcheck(L, path || (host && port), 1, "needs unix= or host= and port=");
  luaL_argcheck(L, !path || strlen(path) < sizeof un.sun_path, 1, "unix path too long");
  sbx_check_cancel(L);

  stream *s = lua_newuserdatauv(L, sizeof *s, 0);
  memset(s, 0, sizeof *s);
  s->closed = 1;
  s->fd = -1;
  s->lp = sbx_loop_get(L);
  s->tm.idx = -1;
  s->w.cb = io_cb;
  s->tm.cb = timer_cb;
  s->selfref = LUA_NOREF;
  luaL_setmetatable(L, STREAM_MT);
  s->closed = 0;
  int r;
  if (path) {
    s->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->fd < 0) return sbx_fail_errno(L, "connect", path, errno);
    memset(&un, 0, sizeof un);
    un.sun_family = AF_UNIX;
    strcpy(un.sun_path, path);
    r = connect(s->fd, (struct sockaddr *)&un, sizeof un);
  } else {
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    int e = getaddrinfo(host, port, &hints, &ai);
    if (e) return sbx_fail(L, "connect", gai_strerror(e), "EHOSTUNREACH");
    s->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    r = s->fd < 0 ? -1 : connect(s->fd, ai->ai_addr, ai->ai_addrlen);
    e = errno;
    freeaddrinfo(ai);
    errno = e;
  }
  int e = errno;
  lua_replace(L, 1);               /* stack: stream, ... */
  lua_settop(L, 1);
  lua_pushnumber(L, timeout);      /* 2 */
  lua_pushnil(L);                  /* 3 */
  lua_pushstring(L, path ? path : host);  /* 4 */
  if (r == 0) {
    lua_settop(L, 1);
    return 1;
  }
  if (e != EINPROGRESS && e != EAGAIN) {
    stream_release(s);
    return sbx_fail_errno(L, "connect", lua_tostring(L, 4), e);
  }
  return arm(L, s, 1, timeout, connect_k);
}

/* ------------------------------------------------------------ listen */

static stream *new_stream(lua_State *L, int fd) {
  stream *s = lua_newuserdatauv(L, sizeof *s, 0);
  memset(s, 0, sizeof *s);
  s->fd = fd;
  s->lp = sbx_loop_get(L);
  s->tm.idx = -1;
  s->w.cb = io_cb;
  s->tm.cb = timer_cb;
  s->selfref = LUA_NOREF;
  luaL_setmetatable(L, STREAM_MT);
  return s;
}

static int accept_k(lua_State *L, int status, lua_KContext ctx) {
  stream *s = (stream *)ctx;
  int nres;
  (void)status;
  if (lua_touserdata(L, 3) && !resumed(L, s, 0, &nres)) return nres;
  int fd = accept4(s->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0) {
    /* a server's answers go out as written (as Go's net/http does): no
    ** Nagle wait for the peer's delayed ACK between small writes. Fails
    ** harmlessly on a unix socket. */
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    new_stream(L, fd);
    return 1;
  }
  if (errno != EAGAIN && errno != EINTR) return sbx_fail_errno(L, "accept", NULL, errno);
  return arm(L, s, 0, lua_tonumber(L, 2), accept_k);
}

/* listener:accept([timeout]) -> Stream | nil, msg, code */
static int stream_accept(lua_State *L) {
  stream *s = check_stream(L);
  double t = opt_timeout(L, 2);
  sbx_check_cancel(L);
  lua_settop(L, 1);
  lua_pushnumber(L, t);
  lua_pushnil(L);
  return accept_k(L, LUA_OK, (lua_KContext)s);
}

/* Listen on TCP host:port (port 0: any free one); pushes the port. */
static int listen_tcp(lua_State *L, const char *host, int port) {
  struct sockaddr_in in;
  memset(&in, 0, sizeof in);
  in.sin_family = AF_INET;
  in.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, host, &in.sin_addr) != 1)
    return sbx_fail(L, "listen", "host must be an IPv4 address", "EINVAL");
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return sbx_fail_errno(L, "listen", host, errno);
  stream *s = new_stream(L, fd);
  int one = 1;
  socklen_t len = sizeof in;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&in, sizeof in) < 0 || listen(fd, 128) < 0 ||
      getsockname(fd, (struct sockaddr *)&in, &len) < 0) {
    int e = errno;
    stream_release(s);
    return sbx_fail_errno(L, "listen", host, e);
  }
  lua_pushinteger(L, ntohs(in.sin_port));
  return 2;
}

/* stream.listen{unix=PATH} -> listening Stream | nil, msg, code
** stream.listen{host=IPV4, port=N} -> listening Stream, port | nil, msg, code */
static int stream_listen(lua_State *L) {
  struct sockaddr_un un;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "host");
  const char *host = luaL_optstring(L, -1, NULL);
  lua_getfield(L, 1, "port");
  lua_Integer port = luaL_optinteger(L, -1, 0);
  if (host) {
    luaL_argcheck(L, port >= 0 && port <= 65535, 1, "port must be 0..65535");
    return listen_tcp(L, host, (int)port);
  }
  lua_getfield(L, 1, "unix");
  const char *path = luaL_checkstring(L, -1);
  luaL_argcheck(L, strlen(path) < sizeof un.sun_path, 1, "unix path too long");
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return sbx_fail_errno(L, "listen", path, errno);
  stream *s = new_stream(L, fd);
  memset(&un, 0, sizeof un);
  un.sun_family = AF_UNIX;
  strcpy(un.sun_path, path);
  if (bind(fd, (struct sockaddr *)&un, sizeof un) < 0 || listen(fd, 128) < 0) {
    int e = errno;
    stream_release(s);
    return sbx_fail_errno(L, "listen", path, e);
  }
  return 1;
}

static const luaL_Reg stream_methods[] = {
  {"accept", stream_accept},
  {"read", stream_read},
  {"write", stream_write},
  {"shutdown", stream_shutdown},
  {"close", stream_close},
  {NULL, NULL}
};

static const luaL_Reg stream_funcs[] = {
  {"connect", stream_connect},
  {"listen", stream_listen},
  {NULL, NULL}
};

int luaopen_sbx_stream(lua_State *L) {
  if (luaL_newmetatable(L, STREAM_MT)) {
    luaL_newlib(L, stream_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, stream_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, stream_close);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, stream_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  luaL_newlib(L, stream_funcs);
  return 1;
}
