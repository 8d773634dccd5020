/*
** sbx.http: HTTP(S) requests through libcurl's multi interface, driven by
** the shared event loop.
**
** One CURLM per loop lives in the registry. Its sockets become sbx_watch
** entries (one small struct per socket, pooled: the loop may still hold an
** event for a socket curl just dropped), its timeout one sbx_timer. A
** request is an easy handle inside a Response userdata that stays anchored
** while curl owns it. curl's callbacks only fill C buffers and wake
** waiters; Lua values are built in the continuations.
**
** libcurl (and the ~30 libraries it pulls in) is dlopen'ed on first need,
** not linked: loading it costs a process ~5 ms that most runs never use.
*/
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#define CURL_DISABLE_TYPECHECK     /* its macros call the linked symbols */
#include <curl/curl.h>

#include "lauxlib.h"
#include "loop.h"

#define RESP_MT "sbx.HttpResponse"
#define STATE_MT "sbx.HttpState"
#define DEFAULT_MAX_BODY (64 * 1024 * 1024)
#define QUEUE_MAX (1024 * 1024)    /* unread stream bytes before pausing */
#define READ_MAX (256 * 1024)      /* most bytes one read() returns */
#define HEADER_MAX (256 * 1024)    /* response header block */
#define MAX_IDLE_CONNS 32

static const char HTTP_KEY = 'H';

/* The libcurl functions used here: cu.<name> is curl_<name>. */
#define CURL_FUNCS(X) \
  X(global_init) X(version) X(free) X(easy_init) X(easy_cleanup) \
  X(easy_setopt) X(easy_getinfo) X(easy_pause) X(easy_strerror) \
  X(multi_init) X(multi_cleanup) X(multi_setopt) X(multi_add_handle) \
  X(multi_remove_handle) X(multi_assign) X(multi_info_read) \
  X(multi_socket_action) X(multi_strerror) X(slist_append) \
  X(slist_free_all) X(url) X(url_cleanup) X(url_get) X(url_set)

/* Process-wide, like the library itself; filled once by load_curl(). */
static struct {
#define X(f) __typeof__(&curl_##f) f;
  CURL_FUNCS(X)
#undef X
} cu;
static int cu_loaded;            /* 0 not tried, 1 ready, -1 failed */
static char cu_why[256];         /* why it failed */

typedef struct hstate hstate;

typedef struct hsock {             /* a socket curl asked us to watch */
  sbx_watch w;
  hstate *hs;
  struct hsock *next_free, *next_all;
} hsock;

typedef struct xfer {
  sbx_loop *lp;
  hstate *hs;
  CURL *easy;
  struct curl_slist *hdrs;
  char *url;                       /* for messages, without credentials */
  char *sock;                      /* the unix socket, if any */
  int stream, closed, active, done, headers_done, truncated, paused;
  int hdr_overflow, nomem;
  long status, oserr;
  CURLcode result;
  char *hbuf;                      /* header lines of the final response */
  size_t hlen, hcap;
  char *body;                      /* body (stream: unread bytes from boff) */
  size_t blen, bcap, boff, max, total;
  sbx_waiter *waiters;             /* woken on every change of state */
  int selfref;                     /* anchored while curl owns the handle */
  struct xfer *prev, *next;        /* the state's transfers in flight */
  char errbuf[CURL_ERROR_SIZE];
} xfer;

struct hstate {
  sbx_loop *lp;
  CURLM *multi;
  sbx_timer tm;
  hsock *free_socks, *all_socks;
  xfer *live;
  int nlive, closed;
};


/* ------------------------------------------------------- loading curl */

static void *cu_sym(void *lib, const char *name) {
  return sbx_dlsym(lib, name, "libcurl", "libcurl4", cu_why, sizeof cu_why);
}

static int load_curl(void) {
  void *lib;
  if (cu_loaded) return cu_loaded > 0;
  cu_loaded = -1;
  if ((lib = sbx_dlopen("libcurl.so.4", "libcurl", "libcurl4", cu_why, sizeof cu_why)) == NULL)
    return 0;
#define X(f) \
  if (!(cu.f = (__typeof__(cu.f))cu_sym(lib, "curl_" #f))) return 0;
  CURL_FUNCS(X)
#undef X
  if (cu.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    snprintf(cu_why, sizeof cu_why, "curl_global_init failed");
    return 0;
  }
  cu_loaded = 1;
  return 1;
}

/* nil, "http: libcurl not found: ...", "ENOSYS" when it cannot load */
static int cu_missing(lua_State *L) {
  return sbx_fail(L, "http", cu_why, "ENOSYS");
}


/* ------------------------------------------------------------ utilities */

static void notify(xfer *x) {
  sbx_waiter *w = x->waiters;
  x->waiters = NULL;
  while (w) {
    sbx_waiter *next = w->next;
    w->next = NULL;
    sbx_wake(x->lp, w);
    w = next;
  }
}

static void forget_waiter(xfer *x, sbx_waiter *w) {
  sbx_waiter **q = &x->waiters;
  while (*q && *q != w) q = &(*q)->next;
  if (*q) *q = w->next;
  sbx_unwait(x->lp, w);
}

static void unanchor(xfer *x) {
  if (x->selfref == LUA_NOREF) return;
  luaL_unref(sbx_loop_main(x->lp), LUA_REGISTRYINDEX, x->selfref);
  x->selfref = LUA_NOREF;
}

/* Append to a buffer growing up to `limit`; -1 when memory runs out. */
static int append(char **buf, size_t *len, size_t *cap, const char *data,
                  size_t n, size_t limit) {
  if (*len + n > *cap) {
    size_t c = *cap ? *cap : 16384;
    while (c < *len + n) c *= 2;
    if (c > limit && limit >= *len + n) c = limit;
    char *b = realloc(*buf, c);
    if (!b) return -1;
    *buf = b;
    *cap = c;
  }
  memcpy(*buf + *len, data, n);
  *len += n;
  return 0;
}

/* Take the handle out of curl; the connection goes back to the cache when
** the transfer completed, and is closed when it was aborted. */
static void detach(xfer *x) {
  if (x->active) {
    hstate *hs = x->hs;
    cu.multi_remove_handle(hs->multi, x->easy);
    if (x->prev) x->prev->next = x->next; else hs->live = x->next;
    if (x->next) x->next->prev = x->prev;
    x->prev = x->next = NULL;
    hs->nlive--;
    x->active = 0;
  }
  if (x->easy) cu.easy_cleanup(x->easy);
  x->easy = NULL;
  cu.slist_free_all(x->hdrs);
  x->hdrs = NULL;
}

/* Abort what is in flight and free everything; safe to call twice. Tasks
** waiting on it are woken and find it closed. */
static void xfer_release(xfer *x) {
  if (x->closed) return;
  x->closed = 1;
  detach(x);
  free(x->url);
  free(x->sock);
  free(x->hbuf);
  free(x->body);
  x->url = x->sock = x->hbuf = x->body = NULL;
  x->hlen = x->hcap = x->blen = x->bcap = x->boff = 0;
  notify(x);
  unanchor(x);
}


/* ------------------------------------------------------ curl callbacks */

static size_t on_header(char *data, size_t size, size_t n, void *ud) {
  xfer *x = ud;
  size_t len = size * n;
  if (x->headers_done) return len;           /* trailers: ignored */
  if (len >= 5 && memcmp(data, "HTTP/", 5) == 0) x->hlen = 0;
  if (len <= 2 && (data[0] == '\r' || data[0] == '\n')) {
    long code = 0;
    cu.easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &code);
    if (code >= 200) {                       /* not a 1xx interim reply */
      x->status = code;
      x->headers_done = 1;
      notify(x);
    }
    return len;
  }
  if (x->hlen + len > HEADER_MAX) {
    x->hdr_overflow = 1;
    return 0;
  }
  if (append(&x->hbuf, &x->hlen, &x->hcap, data, len, HEADER_MAX) < 0) {
    x->nomem = 1;
    return 0;
  }
  return len;
}

static size_t on_body(char *data, size_t size, size_t n, void *ud) {
  xfer *x = ud;
  size_t len = size * n, take = len;
  if (x->stream) {
    if (x->blen - x->boff >= QUEUE_MAX) {    /* backpressure */
      x->paused = 1;
      return CURL_WRITEFUNC_PAUSE;
    }
    if (x->boff == x->blen) x->boff = x->blen = 0;
    else if (x->boff > 0 && x->blen + len > x->bcap) {
      memmove(x->body, x->body + x->boff, x->blen - x->boff);
      x->blen -= x->boff;
      x->boff = 0;
    }
  }
  if (take > x->max - x->total) {            /* the cap: keep what fits */
    take = x->max - x->total;
    x->truncated = 1;
  }
  if (take > 0 &&
      append(&x->body, &x->blen, &x->bcap, data, take, x->max) < 0) {
    x->nomem = 1;
    return 0;
  }
  x->total += take;
  if (x->stream) notify(x);
  return x->truncated ? 0 : len;             /* 0 ends the transfer */
}

static curl_socket_t open_socket(void *ud, curlsocktype purpose,
                                 struct curl_sockaddr *a) {
  (void)ud;
  (void)purpose;
  return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

static void finish(xfer *x, CURLcode rc) {
  x->result = rc;
  cu.easy_getinfo(x->easy, CURLINFO_OS_ERRNO, &x->oserr);
  if (!x->status)
    cu.easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->status);
  detach(x);
  x->done = 1;
  notify(x);
  unanchor(x);
}

/* Complete the transfers curl reports done. */
static void check_done(hstate *hs) {
  CURLMsg *m;
  int left;
  while ((m = cu.multi_info_read(hs->multi, &left)) != NULL) {
    if (m->msg != CURLMSG_DONE) continue;
    xfer *x = NULL;
    CURLcode rc = m->data.result;            /* m dies with the handle */
    cu.easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
    if (x) finish(x, rc);
  }
}

static void on_ready(sbx_watch *w, uint32_t revents) {
  hsock *k = (hsock *)w;
  hstate *hs = k->hs;
  int flags = 0, running;
  if (revents & (EPOLLIN | EPOLLHUP | EPOLLRDHUP)) flags |= CURL_CSELECT_IN;
  if (revents & EPOLLOUT) flags |= CURL_CSELECT_OUT;
  if (revents & EPOLLERR) flags |= CURL_CSELECT_ERR;
  cu.multi_socket_action(hs->multi, w->fd, flags, &running);
  check_done(hs);                            /* k may be back in the pool */
}

static int on_socket(CURL *e, curl_socket_t s, int what, void *ud, void *sp) {
  hstate *hs = ud;
  hsock *k = sp;
  uint32_t ev = 0;
  (void)e;
  if (what == CURL_POLL_REMOVE) {
    if (k) {
      sbx_watch_stop(hs->lp, &k->w);
      k->next_free = hs->free_socks;
      hs->free_socks = k;
    }
    return 0;
  }
  if (!k) {
    if ((k = hs->free_socks) != NULL) {
      hs->free_socks = k->next_free;
    } else {
      if ((k = calloc(1, sizeof *k)) == NULL) return -1;
      k->hs = hs;
      k->w.cb = on_ready;
      k->next_all = hs->all_socks;
      hs->all_socks = k;
    }
    cu.multi_assign(hs->multi, s, k);
  }
  if (what & CURL_POLL_IN) ev |= EPOLLIN;
  if (what & CURL_POLL_OUT) ev |= EPOLLOUT;
  if (ev) return sbx_watch_set(hs->lp, &k->w, s, ev) < 0 ? -1 : 0;
  sbx_watch_stop(hs->lp, &k->w);
  return 0;
}

static void on_timeout(sbx_timer *t) {
  hstate *hs = (hstate *)((char *)t - offsetof(hstate, tm));
  int running;
  cu.multi_socket_action(hs->multi, CURL_SOCKET_TIMEOUT, 0, &running);
  check_done(hs);
}

static int on_timer(CURLM *m, long ms, void *ud) {
  hstate *hs = ud;
  (void)m;
  if (ms < 0) sbx_timer_stop(hs->lp, &hs->tm);
  else sbx_timer_start(hs->lp, &hs->tm, ms / 1000.0);
  return 0;
}


/* ---------------------------------------------------- the multi handle */

static int state_gc(lua_State *L) {
  hstate *hs = lua_touserdata(L, 1);
  if (hs->closed) return 0;
  hs->closed = 1;
  while (hs->live) detach(hs->live);
  sbx_timer_stop(hs->lp, &hs->tm);
  cu.multi_cleanup(hs->multi);
  hs->multi = NULL;
  while (hs->all_socks) {
    hsock *k = hs->all_socks;
    hs->all_socks = k->next_all;
    sbx_watch_stop(hs->lp, &k->w);
    free(k);
  }
  hs->free_socks = NULL;
  return 0;
}

/* fds lacking FD_CLOEXEC, as a list ending in -1 (NULL when unknown) */
static int *plain_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *de;
  int *fds = NULL, n = 0, cap = 0;
  if (!d) return NULL;
  while ((de = readdir(d)) != NULL) {
    int fd = atoi(de->d_name), fl;
    if (de->d_name[0] == '.' || fd == dirfd(d)) continue;
    if ((fl = fcntl(fd, F_GETFD)) < 0 || (fl & FD_CLOEXEC)) continue;
    if (n + 2 > cap) {
      int *f = realloc(fds, (cap = cap ? cap * 2 : 16) * sizeof *f);
      if (!f) break;
      fds = f;
    }
    fds[n++] = fd;
  }
  closedir(d);
  if (!fds && (fds = malloc(sizeof *fds)) == NULL) return NULL;
  fds[n] = -1;
  return fds;
}

/* curl_multi_init opens a socketpair without O_CLOEXEC (curl 7.88): mark
** the fds that appeared during the call. */
static CURLM *multi_init_cloexec(void) {
  int *before = plain_fds();
  CURLM *m = cu.multi_init();
  int *after = plain_fds();
  for (int i = 0; after && before && after[i] >= 0; i++) {
    int j = 0;
    while (before[j] >= 0 && before[j] != after[i]) j++;
    if (before[j] < 0) fcntl(after[i], F_SETFD, FD_CLOEXEC);
  }
  free(before);
  free(after);
  return m;
}

static hstate *get_state(lua_State *L) {
  hstate *hs;
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &HTTP_KEY) == LUA_TUSERDATA) {
    hs = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return hs;
  }
  lua_pop(L, 1);
  sbx_loop *lp = sbx_loop_get(L);
  hs = lua_newuserdatauv(L, sizeof *hs, 0);  /* closed until ready */
  memset(hs, 0, sizeof *hs);
  hs->closed = 1;
  luaL_setmetatable(L, STATE_MT);
  hs->lp = lp;
  hs->tm.idx = -1;
  hs->tm.cb = on_timeout;
  if ((hs->multi = multi_init_cloexec()) == NULL)
    luaL_error(L, "http: curl_multi_init failed");
  cu.multi_setopt(hs->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
  cu.multi_setopt(hs->multi, CURLMOPT_SOCKETDATA, hs);
  cu.multi_setopt(hs->multi, CURLMOPT_TIMERFUNCTION, on_timer);
  cu.multi_setopt(hs->multi, CURLMOPT_TIMERDATA, hs);
  cu.multi_setopt(hs->multi, CURLMOPT_MAXCONNECTS, (long)MAX_IDLE_CONNS);
  hs->closed = 0;
  lua_rawsetp(L, LUA_REGISTRYINDEX, &HTTP_KEY);
  return hs;
}


/* ------------------------------------------------------------- results */

static const char *fail_code(const xfer *x) {
  int e = (int)x->oserr;
  if (x->hdr_overflow) return "EPROTO";
  if (x->nomem) return "ENOMEM";
  switch (x->result) {
    case CURLE_OPERATION_TIMEDOUT: return "ETIMEDOUT";
    case CURLE_COULDNT_CONNECT:
      switch (e) {
        case ENOENT: case ENOTDIR: return "ENOENT";
        case EACCES: case EPERM: return "EACCES";
        case ETIMEDOUT: return "ETIMEDOUT";
        case ECONNRESET: return "ECONNRESET";
        case ENETUNREACH: case EHOSTUNREACH: return "EHOSTUNREACH";
        default: return "ECONNREFUSED";
      }
    case CURLE_COULDNT_RESOLVE_HOST: case CURLE_COULDNT_RESOLVE_PROXY:
      return "EHOSTUNREACH";
    case CURLE_GOT_NOTHING: return "ECONNRESET";
    case CURLE_SEND_ERROR: case CURLE_RECV_ERROR: case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
      if (e == ECONNRESET || e == EPIPE) return "ECONNRESET";
      return x->result == CURLE_SSL_CONNECT_ERROR ? "EPROTO" : "EIO";
    case CURLE_WEIRD_SERVER_REPLY: case CURLE_HTTP2: case CURLE_HTTP2_STREAM:
    case CURLE_BAD_CONTENT_ENCODING: case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_PEER_FAILED_VERIFICATION: case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER: case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR: case CURLE_USE_SSL_FAILED:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
      return "EPROTO";
    case CURLE_OUT_OF_MEMORY: return "ENOMEM";
    case CURLE_WRITE_ERROR: case CURLE_ABORTED_BY_CALLBACK: return "EIO";
    default: return "EUNKNOWN";
  }
}

static int failed(const xfer *x) {
  if (x->result == CURLE_OK) return 0;
  return !(x->result == CURLE_WRITE_ERROR && x->truncated && !x->nomem &&
           !x->hdr_overflow);
}

/* nil, "http: <url>: <why>", code */
static int push_failure(lua_State *L, const xfer *x) {
  const char *why = x->errbuf[0] ? x->errbuf : cu.easy_strerror(x->result);
  if (x->result == CURLE_OK) {     /* finished without a final response */
    lua_pushnil(L);
    lua_pushfstring(L, "http: %s: no response", x->url ? x->url : "?");
    lua_pushstring(L, "EPROTO");
    return 3;
  }
  if (x->hdr_overflow) why = "response headers larger than 256 KiB";
  else if (x->nomem) why = "out of memory buffering the response";
  lua_pushnil(L);
  if (x->sock && x->result == CURLE_COULDNT_CONNECT && x->oserr)
    lua_pushfstring(L, "http: %s: cannot connect to unix socket %s: %s",
                    x->url ? x->url : "?", x->sock, strerror((int)x->oserr));
  else
    lua_pushfstring(L, "http: %s: %s", x->url ? x->url : "?", why);
  lua_pushstring(L, fail_code(x));
  return 3;
}

static int is_ows(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* stack: +1 table of lower-cased names; repeats joined with ", " */
static void push_headers(lua_State *L, const char *p, size_t len) {
  const char *end = p + len, *lname = NULL;
  size_t lnamelen = 0;
  lua_newtable(L);
  while (p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    const char *e = eol ? eol : end, *name = p, *v, *colon;
    size_t nlen;
    int fold = (*name == ' ' || *name == '\t');
    p = eol ? eol + 1 : end;
    while (e > name && is_ows(e[-1])) e--;
    if (e - name >= 5 && memcmp(name, "HTTP/", 5) == 0) continue;
    if (fold) {                    /* obs-fold: continues the last value */
      if (!lname) continue;
      v = name;
      name = lname;
      nlen = lnamelen;
    } else {
      if ((colon = memchr(name, ':', (size_t)(e - name))) == NULL) continue;
      nlen = (size_t)(colon - name);
      v = colon + 1;
    }
    while (v < e && is_ows(*v)) v++;
    luaL_Buffer b;
    char *lower = luaL_buffinitsize(L, &b, nlen);
    for (size_t i = 0; i < nlen; i++)
      lower[i] = (name[i] >= 'A' && name[i] <= 'Z') ? name[i] + 32 : name[i];
    luaL_pushresultsize(&b, nlen);            /* stack: t, name */
    lua_pushvalue(L, -1);
    if (lua_rawget(L, -3) == LUA_TSTRING) {   /* stack: t, name, old */
      lua_pushstring(L, fold ? " " : ", ");
      lua_pushlstring(L, v, (size_t)(e - v));
      lua_concat(L, 3);
    } else {
      lua_pop(L, 1);
      lua_pushlstring(L, v, (size_t)(e - v));
    }
    lua_rawset(L, -3);
    lname = name;
    lnamelen = nlen;
  }
}

static int push_result(lua_State *L, xfer *x) {
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, x->status);
  lua_setfield(L, -2, "status");
  push_headers(L, x->hbuf ? x->hbuf : "", x->hlen);
  lua_setfield(L, -2, "headers");
  lua_pushlstring(L, x->body ? x->body : "", x->blen);
  lua_setfield(L, -2, "body");
  lua_pushboolean(L, x->truncated);
  lua_setfield(L, -2, "truncated");
  return 1;
}


/* -------------------------------------------------------------- waiting */

/* Suspend until the transfer changes state; the waiter goes to slot idx. */
static int wait_change(lua_State *L, xfer *x, int idx, lua_KFunction k) {
  sbx_waiter *w = lua_newuserdatauv(L, sizeof *w, 0);
  memset(w, 0, sizeof *w);
  w->next = x->waiters;
  x->waiters = w;
  lua_replace(L, idx);
  return sbx_await(L, w, (lua_KContext)x, k);
}

static int cancelled(lua_State *L, xfer *x, int idx) {
  sbx_waiter *w = lua_touserdata(L, idx);
  if (w && !w->done) {
    forget_waiter(x, w);
    return 1;
  }
  return 0;
}

/* stack: opts, response, waiter */
static int request_k(lua_State *L, int status, lua_KContext ctx) {
  xfer *x = (xfer *)ctx;
  (void)status;
  if (cancelled(L, x, 3)) {
    xfer_release(x);
    return sbx_raise_cancelled(L);
  }
  if (x->closed) return luaL_error(L, "http: the request was closed");
  if (!x->done && !(x->stream && x->headers_done))
    return wait_change(L, x, 3, request_k);
  if (x->done && (failed(x) || !x->headers_done)) {
    int n = push_failure(L, x);
    xfer_release(x);
    return n;
  }
  if (x->stream) {
    push_headers(L, x->hbuf ? x->hbuf : "", x->hlen);
    lua_setiuservalue(L, 2, 2);
    lua_settop(L, 2);
    return 1;
  }
  push_result(L, x);
  xfer_release(x);                 /* the body is in Lua now */
  return 1;
}


/* ------------------------------------------------------------- request */

static int valid_token(const char *s) {
  if (!*s) return 0;
  for (; *s; s++)
    if (!(('a' <= *s && *s <= 'z') || ('A' <= *s && *s <= 'Z') ||
          ('0' <= *s && *s <= '9') || strchr("!#$%&'*+-.^_`|~", *s)))
      return 0;
  return 1;
}

static int valid_value(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] == '\r' || s[i] == '\n' || s[i] == '\0') return 0;
  return 1;
}

/* Check the url; push a copy without credentials, for messages. */
static void check_url(lua_State *L, const char *url) {
  CURLU *u = cu.url();
  char *scheme = NULL, *out = NULL;
  const char *err = NULL;
  if (!u) luaL_error(L, "http: out of memory");
  if (cu.url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK)
    err = "malformed url";
  else if (cu.url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
           (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0))
    err = "url scheme must be http or https";
  else {
    cu.url_set(u, CURLUPART_USER, NULL, 0);
    cu.url_set(u, CURLUPART_PASSWORD, NULL, 0);
    if (cu.url_get(u, CURLUPART_URL, &out, 0) != CURLUE_OK) out = NULL;
  }
  cu.free(scheme);
  cu.url_cleanup(u);
  if (err) luaL_argerror(L, 1, err);
  lua_pushstring(L, out ? out : url);  /* (a memory error leaks `out`) */
  cu.free(out);
}

static const char *opt_string(lua_State *L, const char *field, size_t *len) {
  size_t n;
  lua_getfield(L, 1, field);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return NULL;
  }
  if (lua_type(L, -1) != LUA_TSTRING)
    luaL_error(L, "bad option '%s' (string expected, got %s)", field,
               luaL_typename(L, -1));
  const char *s = lua_tolstring(L, -1, &n);
  if (!len && strlen(s) != n)
    luaL_error(L, "bad option '%s' (contains a NUL byte)", field);
  if (len) *len = n;
  lua_pop(L, 1);                   /* still anchored by the options table */
  return s;
}

static double opt_seconds(lua_State *L, const char *field, double dflt) {
  lua_getfield(L, 1, field);
  double v = lua_isnil(L, -1) ? dflt : lua_tonumber(L, -1);
  if (!lua_isnil(L, -1) && (!lua_isnumber(L, -1) || !(v > 0)))
    luaL_error(L, "bad option '%s' (seconds > 0 expected)", field);
  lua_pop(L, 1);
  return v;
}

static long millis(double secs) {
  double ms = secs * 1000.0;
  return ms >= (double)LONG_MAX ? LONG_MAX : ms < 1 ? 1 : (long)ms;
}

/* Validate headers = {name = value}; build the list when x is given. */
static void do_headers(lua_State *L, xfer *x, int *has_expect) {
  lua_getfield(L, 1, "headers");
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return;
  }
  luaL_argcheck(L, lua_istable(L, -1), 1, "'headers' must be a table");
  lua_pushnil(L);
  while (lua_next(L, -2)) {        /* stack: headers, name, value */
    size_t vlen;
    if (lua_type(L, -2) != LUA_TSTRING || !valid_token(lua_tostring(L, -2)))
      luaL_error(L, "bad header name (a token expected)");
    const char *name = lua_tostring(L, -2);
    int t = lua_type(L, -1);
    if (t != LUA_TSTRING && t != LUA_TNUMBER)
      luaL_error(L, "bad value for header '%s' (string expected)", name);
    lua_pushvalue(L, -1);
    const char *v = lua_tolstring(L, -1, &vlen);
    if (!valid_value(v, vlen))
      luaL_error(L, "bad value for header '%s' (CR, LF or NUL)", name);
    if (strcasecmp(name, "expect") == 0) *has_expect = 1;
    if (x) {
      /* "Name;" sends an empty value; "Name:" would remove the header. */
      const char *line = vlen ? lua_pushfstring(L, "%s: %s", name, v)
                              : lua_pushfstring(L, "%s;", name);
      struct curl_slist *l = cu.slist_append(x->hdrs, line);
      if (!l) luaL_error(L, "http: out of memory");
      x->hdrs = l;
      lua_pop(L, 1);
    }
    lua_pop(L, 2);
  }
  lua_pop(L, 1);
}

/* http.request{url=, method=, headers=, body=, unix_socket=, proxy=,
**   timeout=, connect_timeout=, max_body=, stream=, ca_file=, cert_file=,
**   key_file=} -> {status, headers, body, truncated} | Response (stream)
**   | nil, msg, code */
static int http_request(lua_State *L) {
  size_t bodylen = 0;
  int has_expect = 0;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  const char *url = opt_string(L, "url", NULL);
  luaL_argcheck(L, url != NULL, 1, "'url' is required");
  const char *method = opt_string(L, "method", NULL);
  luaL_argcheck(L, !method || valid_token(method), 1, "bad 'method'");
  const char *body = opt_string(L, "body", &bodylen);
  const char *sock = opt_string(L, "unix_socket", NULL);
  const char *proxy = opt_string(L, "proxy", NULL);
  const char *cafile = opt_string(L, "ca_file", NULL);
  const char *certfile = opt_string(L, "cert_file", NULL);
  const char *keyfile = opt_string(L, "key_file", NULL);
  double timeout = opt_seconds(L, "timeout", 60);
  double ctimeout = opt_seconds(L, "connect_timeout", 10);
  lua_getfield(L, 1, "stream");
  int stream = lua_toboolean(L, -1);
  lua_getfield(L, 1, "max_body");
  int isint;
  lua_Integer max = lua_tointegerx(L, -1, &isint);
  if (lua_isnil(L, -1)) max = stream ? -1 : DEFAULT_MAX_BODY;
  else luaL_argcheck(L, isint && max >= 0, 1, "'max_body' must be >= 0");
  lua_pop(L, 2);
  do_headers(L, NULL, &has_expect);
  sbx_check_cancel(L);
  if (!load_curl()) return cu_missing(L);
  check_url(L, url);               /* 2 */

  hstate *hs = get_state(L);
  xfer *x = lua_newuserdatauv(L, sizeof *x, 2);  /* 3, closed until ready */
  memset(x, 0, sizeof *x);
  x->closed = 1;
  x->selfref = LUA_NOREF;
  luaL_setmetatable(L, RESP_MT);
  x->lp = hs->lp;
  x->hs = hs;
  x->closed = 0;
  x->url = strdup(lua_tostring(L, 2));
  lua_replace(L, 2);               /* stack: opts, response */
  x->stream = stream;
  x->max = max < 0 ? SIZE_MAX : (size_t)max;
  if (!x->url || (x->easy = cu.easy_init()) == NULL) {
    xfer_release(x);
    return sbx_fail(L, "http", "curl_easy_init failed", "ENOMEM");
  }
  do_headers(L, x, &has_expect);
  if (!has_expect) {               /* no 1 s stall on "100-continue" */
    struct curl_slist *l = cu.slist_append(x->hdrs, "Expect:");
    if (!l) return luaL_error(L, "http: out of memory");
    x->hdrs = l;
  }

  CURL *e = x->easy;
  cu.easy_setopt(e, CURLOPT_URL, url);
  cu.easy_setopt(e, CURLOPT_PRIVATE, (char *)x);
  cu.easy_setopt(e, CURLOPT_ERRORBUFFER, x->errbuf);
  cu.easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  cu.easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  cu.easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
  cu.easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
  cu.easy_setopt(e, CURLOPT_SUPPRESS_CONNECT_HEADERS, 1L);
  cu.easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, open_socket);
  cu.easy_setopt(e, CURLOPT_TIMEOUT_MS, millis(timeout));
  cu.easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, millis(ctimeout));
  cu.easy_setopt(e, CURLOPT_BUFFERSIZE, 128L * 1024);
  cu.easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
  cu.easy_setopt(e, CURLOPT_HEADERDATA, x);
  cu.easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  cu.easy_setopt(e, CURLOPT_WRITEDATA, x);
  cu.easy_setopt(e, CURLOPT_HTTPHEADER, x->hdrs);
  if (proxy) {
    cu.easy_setopt(e, CURLOPT_PROXY, proxy);
    cu.easy_setopt(e, CURLOPT_NOPROXY, "");
  } else {
    cu.easy_setopt(e, CURLOPT_NOPROXY, "*");
  }
  if (sock) {
    if ((x->sock = strdup(sock)) == NULL) {
      xfer_release(x);
      return sbx_fail(L, "http", "out of memory", "ENOMEM");
    }
    cu.easy_setopt(e, CURLOPT_UNIX_SOCKET_PATH, sock);
  }
  if (cafile) cu.easy_setopt(e, CURLOPT_CAINFO, cafile);
  if (certfile) cu.easy_setopt(e, CURLOPT_SSLCERT, certfile);
  if (keyfile) cu.easy_setopt(e, CURLOPT_SSLKEY, keyfile);
  if (!body && method && (!strcmp(method, "POST") || !strcmp(method, "PUT") ||
                          !strcmp(method, "PATCH")))
    body = "";                     /* Content-Length: 0 */
  if (body) {
    lua_getfield(L, 1, "body");    /* keep it alive with the response */
    lua_setiuservalue(L, 2, 1);
    cu.easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)bodylen);
    cu.easy_setopt(e, CURLOPT_POSTFIELDS, body);
  }
  if (method && strcmp(method, "HEAD") == 0) {
    cu.easy_setopt(e, CURLOPT_NOBODY, 1L);
  } else if (method && strcmp(method, body ? "POST" : "GET") != 0) {
    cu.easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
  }

  CURLMcode mc = cu.multi_add_handle(hs->multi, e);
  if (mc != CURLM_OK) {
    int n = sbx_fail(L, "http", cu.multi_strerror(mc), "EUNKNOWN");
    xfer_release(x);
    return n;
  }
  x->active = 1;
  x->next = hs->live;
  if (hs->live) hs->live->prev = x;
  hs->live = x;
  hs->nlive++;
  lua_pushvalue(L, 2);
  x->selfref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_settop(L, 2);
  lua_pushnil(L);                  /* 3: the waiter */
  return request_k(L, LUA_OK, (lua_KContext)x);
}


/* ------------------------------------------------------------- response */

static xfer *check_resp(lua_State *L) {
  xfer *x = luaL_checkudata(L, 1, RESP_MT);
  if (x->closed) luaL_error(L, "attempt to use a closed http response");
  return x;
}

static void maybe_unpause(xfer *x) {
  if (!x->paused || !x->active || x->blen - x->boff >= QUEUE_MAX / 2) return;
  x->paused = 0;
  cu.easy_pause(x->easy, CURLPAUSE_CONT);  /* may deliver data at once */
  check_done(x->hs);
}

/* stack: response, waiter */
static int read_k(lua_State *L, int status, lua_KContext ctx) {
  xfer *x = (xfer *)ctx;
  (void)status;
  if (cancelled(L, x, 2)) {
    xfer_release(x);
    return sbx_raise_cancelled(L);
  }
  if (x->closed)
    return sbx_fail(L, "http", "the response was closed while reading",
                    "ECANCELED");
  if (x->blen > x->boff) {
    size_t n = x->blen - x->boff;
    if (n > READ_MAX) n = READ_MAX;
    lua_pushlstring(L, x->body + x->boff, n);
    x->boff += n;
    if (x->boff == x->blen) x->boff = x->blen = 0;
    maybe_unpause(x);
    return 1;
  }
  if (x->done) return failed(x) ? push_failure(L, x) : 0;
  return wait_change(L, x, 2, read_k);
}

/* resp:read() -> chunk | nil (end) | nil, msg, code */
static int resp_read(lua_State *L) {
  xfer *x = check_resp(L);
  lua_settop(L, 1);
  lua_pushnil(L);
  sbx_check_cancel(L);
  return read_k(L, LUA_OK, (lua_KContext)x);
}

/* resp:close(): abort the transfer and free it (idempotent) */
static int resp_close(lua_State *L) {
  xfer *x = luaL_checkudata(L, 1, RESP_MT);
  xfer_release(x);
  return 0;
}

static int resp_tostring(lua_State *L) {
  xfer *x = luaL_checkudata(L, 1, RESP_MT);
  lua_pushfstring(L, "sbx.HttpResponse (%d%s, %p)", (int)x->status,
                  x->closed ? ", closed" : x->done ? ", done" : "", (void *)x);
  return 1;
}

static int resp_index(lua_State *L) {
  xfer *x = luaL_checkudata(L, 1, RESP_MT);
  const char *k = luaL_checkstring(L, 2);
  if (strcmp(k, "status") == 0) {
    lua_pushinteger(L, x->status);
  } else if (strcmp(k, "headers") == 0) {
    lua_getiuservalue(L, 1, 2);
  } else if (strcmp(k, "truncated") == 0) {
    lua_pushboolean(L, x->truncated);
  } else {
    lua_getmetatable(L, 1);
    lua_getfield(L, -1, "methods");
    lua_getfield(L, -1, k);
  }
  return 1;
}


/* --------------------------------------------------------- the module */

/* http.escape(s) -> s with every byte but A-Z a-z 0-9 - . _ ~ as %XX */
static int http_escape(lua_State *L) {
  static const char hex[] = "0123456789ABCDEF";
  size_t n;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &n);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = s[i];
    if (('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') ||
        ('0' <= c && c <= '9') || (c && strchr("-._~", c))) {
      luaL_addchar(&b, (char)c);
    } else {
      luaL_addchar(&b, '%');
      luaL_addchar(&b, hex[c >> 4]);
      luaL_addchar(&b, hex[c & 15]);
    }
  }
  luaL_pushresult(&b);
  return 1;
}

/* http.version() -> "libcurl/x.y.z ..." | nil, msg, code */
static int http_version(lua_State *L) {
  if (!load_curl()) return cu_missing(L);
  lua_pushstring(L, cu.version());
  return 1;
}

/* http.in_flight() -> number of transfers curl is working on */
static int http_in_flight(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &HTTP_KEY);
  hstate *hs = lua_touserdata(L, -1);
  lua_pushinteger(L, hs ? hs->nlive : 0);
  return 1;
}

static const luaL_Reg resp_methods[] = {
  {"read", resp_read},
  {"close", resp_close},
  {NULL, NULL}
};

static const luaL_Reg http_funcs[] = {
  {"request", http_request},
  {"escape", http_escape},
  {"version", http_version},
  {"in_flight", http_in_flight},
  {NULL, NULL}
};

int luaopen_sbx_http(lua_State *L) {
  if (luaL_newmetatable(L, RESP_MT)) {
    luaL_newlib(L, resp_methods);
    lua_setfield(L, -2, "methods");
    lua_pushcfunction(L, resp_index);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, resp_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, resp_close);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, resp_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, STATE_MT)) {
    lua_pushcfunction(L, state_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  luaL_newlib(L, http_funcs);
  return 1;
}
