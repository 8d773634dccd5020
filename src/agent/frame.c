/*
** Frames of the agent protocol (docs/agent-protocol.md): splitting,
** request parsing, answer encoding. Everything here trusts nothing about
** its input and does no I/O; fuzz/agent_fuzz.c runs it on arbitrary bytes.
*/
#include <stdlib.h>
#include <string.h>

#include "frame.h"

static uint32_t load_u32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int agent_frame_split(const unsigned char *buf, size_t n, agent_frame *f) {
  memset(f, 0, sizeof *f);
  if (n < 4) return AGENT_FRAME_MORE;
  f->len = load_u32(buf);
  /* Checked before waiting for the rest: a broken length must not make
  ** the caller buffer up to 4 GiB first. */
  if (f->len < 5 || f->len > AGENT_MAX_FRAME) return AGENT_FRAME_BROKEN;
  if (n - 4 < f->len) return AGENT_FRAME_MORE;
  f->type = (char)buf[4];
  f->id = load_u32(buf + 5);
  f->payload = buf + AGENT_HDR;
  f->plen = f->len - 5;
  return AGENT_FRAME_OK;
}

/* ---------------------------------------------------------------- cursor */

/* A read position in a payload; `bad` sticks once a field runs short. */
typedef struct cur { const unsigned char *p, *end; int bad; } cur;

static uint32_t get_u32(cur *c) {
  if (c->bad || c->end - c->p < 4) { c->bad = 1; return 0; }
  uint32_t v = load_u32(c->p);
  c->p += 4;
  return v;
}

static uint64_t get_u64(cur *c) {
  uint64_t hi = get_u32(c);
  return hi << 32 | get_u32(c);
}

/* An s4 field: its bytes and length. */
static const unsigned char *get_bytes(cur *c, size_t *n) {
  uint32_t len = get_u32(c);
  *n = 0;
  if (c->bad || (size_t)(c->end - c->p) < len) { c->bad = 1; return NULL; }
  const unsigned char *s = c->p;
  c->p += len;
  *n = len;
  return s;
}

/* An s4 field that becomes a C string (a path, an argument, "K=V"): an
** embedded NUL would silently cut it, so such a payload does not parse. */
static const unsigned char *get_text(cur *c, size_t *n) {
  const unsigned char *s = get_bytes(c, n);
  if (s && memchr(s, 0, *n)) c->bad = 1;
  return c->bad ? NULL : s;
}

/* Text copies go to one allocation: a first pass (out == NULL) measures,
** the second fills. */
typedef struct arena { char *out; size_t used; } arena;

static char *keep(arena *a, const unsigned char *s, size_t n) {
  char *d = a->out ? a->out + a->used : NULL;
  if (d) {
    if (n) memcpy(d, s, n);
    d[n] = '\0';
  }
  a->used += n + 1;
  return d;
}

/* ------------------------------------------------------------- requests */

/* R's payload; ptrs (argc + 1 + envc + 1 slots) is NULL when measuring. */
static void parse_run(cur *c, agent_req *q, arena *a, char **ptrs,
                      uint32_t *argc, uint32_t *envc) {
  size_t n;
  const unsigned char *s;
  q->flags = get_u32(c);
  q->timeout_ms = get_u32(c);
  q->max = get_u64(c);
  s = get_text(c, &n);
  q->path = keep(a, s, n);
  *argc = get_u32(c);
  for (uint32_t i = 0; i < *argc && !c->bad; i++) {
    s = get_text(c, &n);
    char *arg = keep(a, s, n);
    if (ptrs) ptrs[i] = arg;
  }
  *envc = get_u32(c);
  for (uint32_t i = 0; i < *envc && !c->bad; i++) {
    s = get_text(c, &n);
    char *kv = keep(a, s, n);
    if (ptrs) ptrs[*argc + 1 + i] = kv;
  }
  q->data = get_bytes(c, &q->dlen);
  if (*argc == 0) c->bad = 1;
}

static int finish_run(const agent_frame *f, agent_req *q, const char **why) {
  cur c = {f->payload, f->payload + f->plen, 0};
  arena a = {NULL, 0};
  uint32_t argc, envc;
  parse_run(&c, q, &a, NULL, &argc, &envc);
  if (c.bad || c.p != c.end) {
    *why = "payload does not parse";
    return -1;
  }
  /* both counts are bounded by plen / 4 here: every string took 4 bytes */
  size_t nptr = (size_t)argc + 1 + envc + 1;
  char **ptrs = malloc(nptr * sizeof *ptrs + a.used);
  if (!ptrs) {
    *why = "out of memory";
    return -1;
  }
  c = (cur){f->payload, f->payload + f->plen, 0};
  a = (arena){(char *)(ptrs + nptr), 0};
  parse_run(&c, q, &a, ptrs, &argc, &envc);
  ptrs[argc] = NULL;
  ptrs[argc + 1 + envc] = NULL;
  q->argv = ptrs;
  q->envp = ptrs + argc + 1;
  q->mem = ptrs;
  return 0;
}

/* The requests with fixed fields and one path; w's data runs to the end. */
static void parse_fixed(cur *c, agent_req *q, const unsigned char **path,
                        size_t *plen) {
  switch (q->type) {
    case 'r': q->max = get_u64(c); break;
    case 'w': q->mode = get_u32(c); q->flags = get_u32(c); break;
    case 'd': q->recursive = get_u32(c); break;
    default: break;
  }
  *path = get_text(c, plen);
  if (q->type == 'w' && !c->bad) {
    q->data = c->p;
    q->dlen = (size_t)(c->end - c->p);
    c->p = c->end;
  }
}

static int finish_path(const agent_frame *f, agent_req *q, const char **why) {
  cur c = {f->payload, f->payload + f->plen, 0};
  const unsigned char *path;
  size_t n;
  parse_fixed(&c, q, &path, &n);
  if (c.bad || c.p != c.end) {
    *why = "payload does not parse";
    return -1;
  }
  arena a = {malloc(n + 1), 0};
  if (!a.out) {
    *why = "out of memory";
    return -1;
  }
  q->path = keep(&a, path, n);
  q->mem = a.out;
  return 0;
}

int agent_req_parse(const agent_frame *f, agent_req *q, const char **why) {
  memset(q, 0, sizeof *q);
  q->type = f->type;
  q->id = f->id;
  switch (f->type) {
    case 'R':
      return finish_run(f, q, why);
    case 'I':
      q->data = f->payload;
      q->dlen = f->plen;
      return 0;
    case 'K':
      if (f->plen != 4) break;
      q->signo = load_u32(f->payload);
      return 0;
    case 'S': case 'G':
      if (f->plen != 0) break;
      return 0;
    case 'r': case 'w': case 'l': case 'd': case 'm': case 's':
      return finish_path(f, q, why);
    default:
      *why = "unknown frame type";
      return -1;
  }
  *why = "payload does not parse";
  return -1;
}

void agent_req_free(agent_req *q) {
  free(q->mem);
  q->mem = NULL;
  q->path = NULL;
  q->argv = q->envp = NULL;
}

/* ------------------------------------------------------------- encoding */

unsigned char *agent_put_u32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24);
  p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8);
  p[3] = (unsigned char)v;
  return p + 4;
}

unsigned char *agent_put_header(unsigned char *p, char type, uint32_t id,
                                size_t plen) {
  p = agent_put_u32(p, (uint32_t)(plen + 5));
  *p++ = (unsigned char)type;
  return agent_put_u32(p, id);
}

unsigned char *agent_put_str(unsigned char *p, const char *s, size_t n) {
  p = agent_put_u32(p, (uint32_t)n);
  if (n) memcpy(p, s, n);
  return p + n;
}
