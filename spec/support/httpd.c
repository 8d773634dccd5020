/*
** A stand-in HTTP/1.1 server for spec/core/http_spec.lua: one thread,
** poll(), many connections, on 127.0.0.1 (random port) and a unix socket.
**
**   httpd UNIX_SOCKET_PATH    prints "port P closed C\n" (C: a closed port)
**
** /ok  /status/N  /echo  /headers  /big?n=  /slow?n=&chunk=&delay=(ms)
** /hang  /reset  /short  /drop  /bad  /chunked  /redirect  /retry-after
** /interim
** /bighead  /ka (keep-alive, X-Conn: id)  /conns (open connections)
** Everything but /ka closes the connection after the response.
*/
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

enum { READING, WRITING, HANGING };

typedef struct conn {
  int fd, state, id, keep, rst;
  char *in;
  size_t inlen, incap;
  char *out;
  size_t outlen, outoff;
  long long gen_left, gen_off;     /* generated body bytes still to send */
  long long slow_left, slow_chunk; /* paced body */
  double slow_delay, next;
  double rst_at;                   /* /reset: RST once this time passes */
} conn;

static conn **conns;
static int nconns, capconns, next_id;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

static void put(conn *c, const char *data, size_t n) {
  c->out = realloc(c->out, c->outlen + n);
  if (!c->out) die("realloc");
  memcpy(c->out + c->outlen, data, n);
  c->outlen += n;
}

static void putf(conn *c, const char *fmt, ...) {
  char buf[8192];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  put(c, buf, (size_t)n);
}

static void head(conn *c, int code, long long len, const char *extra) {
  putf(c, "HTTP/1.1 %d X\r\n%s", code, extra ? extra : "");
  if (len >= 0) putf(c, "Content-Length: %lld\r\n", len);
  putf(c, "%s\r\n", c->keep ? "" : "Connection: close\r\n");
}

static void reply(conn *c, int code, const char *type, const char *body,
                  size_t n, const char *extra, int is_head) {
  char more[4096];
  snprintf(more, sizeof more, "Content-Type: %s\r\n%s", type,
           extra ? extra : "");
  head(c, code, (long long)n, more);
  if (!is_head) put(c, body, n);
}

static long long qparam(const char *target, const char *name, long long dflt) {
  const char *q = strchr(target, '?');
  size_t n = strlen(name);
  while (q) {
    q++;
    if (strncmp(q, name, n) == 0 && q[n] == '=') return atoll(q + n + 1);
    q = strchr(q, '&');
  }
  return dflt;
}

static int path_is(const char *target, const char *p) {
  size_t n = strlen(p);
  return strncmp(target, p, n) == 0 && (target[n] == 0 || target[n] == '?');
}

/* A whole request is in c->in: answer it. */
static void handle(conn *c, char *reqhead, const char *body, size_t blen) {
  char method[32] = "", target[4096] = "";
  char *line = strstr(reqhead, "\r\n");
  *line = 0;
  sscanf(reqhead, "%31s %4095s", method, target);
  char *hdrs = line + 2;
  int is_head = strcmp(method, "HEAD") == 0;
  c->state = WRITING;
  if (path_is(target, "/ok")) {
    reply(c, 200, "application/json", "{\"ok\":true}", 11, NULL, is_head);
  } else if (strncmp(target, "/status/", 8) == 0) {
    char b[64];
    int code = atoi(target + 8);
    int n = snprintf(b, sizeof b, "status %d\n", code);
    reply(c, code, "text/plain", b, (size_t)n, NULL, is_head);
  } else if (path_is(target, "/echo")) {
    char extra[65536];
    size_t off = (size_t)snprintf(extra, sizeof extra,
                                  "X-Method: %s\r\nX-Path: %s\r\n"
                                  "X-Body-Length: %zu\r\n", method, target, blen);
    for (char *h = hdrs; *h;) {    /* request headers as X-Req-<name> */
      char *eol = strstr(h, "\r\n");
      if (!eol) break;
      *eol = 0;
      if (*h && off < sizeof extra - 1)
        off += (size_t)snprintf(extra + off, sizeof extra - off,
                                "X-Req-%s\r\n", h);
      h = eol + 2;
    }
    reply(c, 200, "application/octet-stream", body, blen, extra, is_head);
  } else if (path_is(target, "/headers")) {
    reply(c, 200, "text/plain", "h", 1,
          "Set-Cookie: a=1\r\nSet-Cookie: b=2\r\nX-Multi: one\r\n"
          "x-multi: two\r\nX-Empty:\r\nX-Folded: first\r\n  second\r\n"
          "X-Spaces:   padded value  \r\n", 0);
  } else if (path_is(target, "/big")) {
    long long n = qparam(target, "n", 1000);
    head(c, 200, n, "Content-Type: application/octet-stream\r\n");
    c->gen_left = is_head ? 0 : n;
  } else if (path_is(target, "/slow")) {
    long long n = qparam(target, "n", 10);
    head(c, 200, n, "Content-Type: text/plain\r\n");
    c->slow_left = n;
    c->slow_chunk = qparam(target, "chunk", 1);
    c->slow_delay = qparam(target, "delay", 100) / 1000.0;
    c->next = now() + c->slow_delay;
  } else if (path_is(target, "/hang")) {
    c->state = HANGING;
  } else if (path_is(target, "/reset") || path_is(target, "/short")) {
    char b[1000];
    memset(b, 'r', sizeof b);
    head(c, 200, 100000, "Content-Type: text/plain\r\n");
    put(c, b, sizeof b);
    c->rst = path_is(target, "/reset") ? 2 : 0;
  } else if (path_is(target, "/drop")) {
    c->rst = 1;                    /* nothing to write: closes at once */
  } else if (path_is(target, "/bad")) {
    putf(c, "HTTP/1.1 abc Broken\r\nweird\r\n\r\n");
  } else if (path_is(target, "/chunked")) {
    putf(c, "HTTP/1.1 200 X\r\nTransfer-Encoding: chunked\r\n"
            "Connection: close\r\n\r\n6\r\nhello \r\n8\r\nchunked \r\n"
            "5\r\nworld\r\n0\r\n\r\n");
  } else if (path_is(target, "/redirect")) {
    reply(c, 302, "text/plain", "moved", 5, "Location: /ok\r\n", is_head);
  } else if (path_is(target, "/retry-after")) {
    reply(c, 429, "text/plain", "slow down", 9, "Retry-After: 2\r\n", is_head);
  } else if (path_is(target, "/interim")) {
    putf(c, "HTTP/1.1 100 Continue\r\nX-Interim: yes\r\n\r\n");
    reply(c, 200, "text/plain", "final", 5, NULL, is_head);
  } else if (path_is(target, "/bighead")) {
    char v[8001];
    memset(v, 'v', 8000);
    v[8000] = 0;
    head(c, 200, 0, NULL);
    c->outlen -= 2;                /* reopen the header block */
    for (int i = 0; i < 40; i++) putf(c, "X-Big-%d: %s\r\n", i, v);
    putf(c, "\r\n");
  } else if (path_is(target, "/ka")) {
    char b[64];
    c->keep = 1;
    snprintf(b, sizeof b, "X-Conn: %d\r\n", c->id);
    reply(c, 200, "text/plain", "ka", 2, b, is_head);
  } else if (path_is(target, "/conns")) {
    char b[32];
    int n = snprintf(b, sizeof b, "%d", nconns - 1);
    reply(c, 200, "text/plain", b, (size_t)n, NULL, is_head);
  } else {
    reply(c, 404, "text/plain", "not found\n", 10, NULL, is_head);
  }
}

/* Parse what came in; returns 1 when a request was handled. */
static int parse(conn *c) {
  char *end = c->inlen ? memmem(c->in, c->inlen, "\r\n\r\n", 4) : NULL;
  if (!end) return 0;
  size_t hlen = (size_t)(end - c->in) + 4;
  long long clen = 0;
  for (char *p = c->in; p < end; p++)
    if ((p == c->in || p[-1] == '\n') && strncasecmp(p, "content-length:", 15) == 0)
      clen = atoll(p + 15);
  if (c->inlen < hlen + (size_t)clen) return 0;
  char *reqhead = malloc(hlen + 1);
  memcpy(reqhead, c->in, hlen);
  reqhead[hlen - 2] = 0;           /* keep the last header's CRLF */
  handle(c, reqhead, c->in + hlen, (size_t)clen);
  free(reqhead);
  memmove(c->in, c->in + hlen + clen, c->inlen - hlen - (size_t)clen);
  c->inlen -= hlen + (size_t)clen;
  return 1;
}

static void drop(int i, int rst) {
  conn *c = conns[i];
  if (rst) {
    struct linger lg = {1, 0};
    setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  }
  close(c->fd);
  free(c->in);
  free(c->out);
  free(c);
  conns[i] = conns[--nconns];
}

static int all_sent(conn *c) {
  return c->outoff == c->outlen && c->gen_left == 0 && c->slow_left == 0;
}

/* Write what we can; returns -1 when the connection should go. */
static int pump(conn *c) {
  for (;;) {
    if (c->outoff == c->outlen) {
      c->outoff = c->outlen = 0;
      if (c->gen_left > 0) {       /* byte i of a body is 'a' + i % 26 */
        char b[65536];
        size_t n = c->gen_left < (long long)sizeof b ? (size_t)c->gen_left : sizeof b;
        for (size_t i = 0; i < n; i++) b[i] = (char)('a' + (c->gen_off + i) % 26);
        put(c, b, n);
        c->gen_left -= (long long)n;
        c->gen_off += (long long)n;
      } else if (c->slow_left > 0 && now() >= c->next) {
        long long n = c->slow_chunk < c->slow_left ? c->slow_chunk : c->slow_left;
        for (long long i = 0; i < n; i++) put(c, "s", 1);
        c->slow_left -= n;
        c->next = now() + c->slow_delay;
      } else {
        break;
      }
    }
    ssize_t n = send(c->fd, c->out + c->outoff, c->outlen - c->outoff, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (n <= 0) return -1;
    c->outoff += (size_t)n;
  }
  if (!all_sent(c)) return 0;
  if (c->rst == 2) {               /* let the client read what was sent */
    if (!c->rst_at) c->rst_at = now() + 0.1;
    return now() >= c->rst_at ? -1 : 0;
  }
  if (c->rst) return -1;
  if (!c->keep) {
    shutdown(c->fd, SHUT_WR);
    return -1;
  }
  c->state = READING;
  return parse(c) ? pump(c) : 0;
}

static void accept_on(int lfd) {
  for (;;) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    conn *c = calloc(1, sizeof *c);
    c->fd = fd;
    c->id = ++next_id;
    if (nconns == capconns) {
      capconns = capconns ? capconns * 2 : 64;
      conns = realloc(conns, capconns * sizeof *conns);
    }
    conns[nconns++] = c;
  }
}

static int listen_tcp(int *port) {
  struct sockaddr_in a = {.sin_family = AF_INET};
  socklen_t len = sizeof a;
  int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) < 0)
    die("tcp");
  *port = ntohs(a.sin_port);
  return fd;
}

int main(int argc, char **argv) {
  int port, closed, fds[2];
  struct sockaddr_un u = {.sun_family = AF_UNIX};
  if (argc != 2 || strlen(argv[1]) >= sizeof u.sun_path) {
    fprintf(stderr, "usage: httpd UNIX_SOCKET_PATH\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  fds[0] = listen_tcp(&port);
  if (listen(fds[0], 1024) < 0) die("listen");
  close(listen_tcp(&closed));      /* a port nobody listens on */
  strcpy(u.sun_path, argv[1]);
  unlink(argv[1]);
  fds[1] = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fds[1] < 0 || bind(fds[1], (struct sockaddr *)&u, sizeof u) < 0 ||
      listen(fds[1], 1024) < 0)
    die("unix");
  printf("port %d closed %d\n", port, closed);
  fflush(stdout);
  for (;;) {
    struct pollfd *p = calloc((size_t)nconns + 2, sizeof *p);
    int timeout = -1;
    double t = now();
    p[0].fd = fds[0];
    p[1].fd = fds[1];
    p[0].events = p[1].events = POLLIN;
    for (int i = 0; i < nconns; i++) {
      conn *c = conns[i];
      p[i + 2].fd = c->fd;
      p[i + 2].events = POLLIN;
      if (c->state == WRITING && c->outoff < c->outlen) p[i + 2].events |= POLLOUT;
      else if (c->state == WRITING && c->gen_left > 0) p[i + 2].events |= POLLOUT;
      if (c->state == WRITING && ((c->slow_left > 0 && c->outoff == c->outlen) ||
                                  (c->rst_at > 0))) {
        int ms = (int)(((c->rst_at > 0 ? c->rst_at : c->next) - t) * 1000) + 1;
        if (ms < 0) ms = 0;
        if (timeout < 0 || ms < timeout) timeout = ms;
      }
    }
    int n = nconns;
    if (poll(p, (nfds_t)n + 2, timeout) < 0 && errno != EINTR) die("poll");
    /* Walk backwards: drop() moves the last connection into slot i. */
    for (int i = n - 1; i >= 0; i--) {
      conn *c = conns[i];
      short re = p[i + 2].revents;
      if (re & POLLIN) {
        char buf[65536];
        ssize_t got = recv(c->fd, buf, sizeof buf, 0);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
          drop(i, 0);
          continue;
        }
        if (got > 0 && c->state != HANGING) {
          if (c->inlen + (size_t)got > c->incap) {
            c->incap = (c->inlen + (size_t)got) * 2;
            c->in = realloc(c->in, c->incap);
          }
          memcpy(c->in + c->inlen, buf, (size_t)got);
          c->inlen += (size_t)got;
          if (c->state == READING) parse(c);
        }
      }
      if (c->state == WRITING && pump(c) < 0) drop(i, c->rst);
    }
    if (p[0].revents & POLLIN) accept_on(fds[0]);
    if (p[1].revents & POLLIN) accept_on(fds[1]);
    free(p);
  }
}
