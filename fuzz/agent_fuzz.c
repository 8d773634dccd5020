/*
** libFuzzer target for sbx-agent's frame decoder (src/agent/frame.c): the
** bytes a host, or anything that reaches the agent's stdin, may send. The
** input is split into frames exactly as `sbx-agent serve` does; every
** frame goes through the same request parser. A request that parses must
** encode back to its own payload, byte for byte (so no field was misread,
** cut or invented). Built and run by fuzz/run.sh.
*/
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agent/frame.h"

/* Encoding of what agent_req_parse read, in the request's own layout. */
typedef struct out { unsigned char *p, *end; } out;

static void put_u32(out *o, uint32_t v) {
  if (o->end - o->p < 4) __builtin_trap();
  o->p = agent_put_u32(o->p, v);
}

static void put_u64(out *o, uint64_t v) {
  put_u32(o, (uint32_t)(v >> 32));
  put_u32(o, (uint32_t)v);
}

static void put_bytes(out *o, const void *s, size_t n) {
  if ((size_t)(o->end - o->p) < n) __builtin_trap();
  if (n) memcpy(o->p, s, n);
  o->p += n;
}

static void put_str(out *o, const char *s) {
  size_t n = strlen(s);
  put_u32(o, (uint32_t)n);
  put_bytes(o, s, n);
}

static void put_list(out *o, char **list) {
  uint32_t n = 0;
  while (list[n]) n++;
  put_u32(o, n);
  for (uint32_t i = 0; i < n; i++) put_str(o, list[i]);
}

static void encode(const agent_req *q, out *o) {
  switch (q->type) {
    case 'R':
      if (!q->argv || !q->argv[0] || !q->envp || !q->path) __builtin_trap();
      put_u32(o, q->flags);
      put_u32(o, q->timeout_ms);
      put_u64(o, q->max);
      put_str(o, q->path);
      put_list(o, q->argv);
      put_list(o, q->envp);
      put_u32(o, (uint32_t)q->dlen);
      put_bytes(o, q->data, q->dlen);
      return;
    case 'I': put_bytes(o, q->data, q->dlen); return;
    case 'K': put_u32(o, q->signo); return;
    case 'S': case 'G': return;      /* no payload */
    case 'r': put_u64(o, q->max); break;
    case 'w': put_u32(o, q->mode); put_u32(o, q->flags); break;
    case 'd': put_u32(o, q->recursive); break;
    case 'l': case 'm': case 's': break;
    default: __builtin_trap();       /* the parser accepted an unknown type */
  }
  put_str(o, q->path);
  if (q->type == 'w') put_bytes(o, q->data, q->dlen);
}

static void check(const agent_frame *f) {
  agent_req q;
  const char *why = NULL;
  if (agent_req_parse(f, &q, &why) != 0) {
    if (!why) __builtin_trap();
    return;
  }
  if (q.type != f->type || q.id != f->id) __builtin_trap();
  unsigned char *buf = malloc(f->plen + 1);
  if (!buf) abort();
  out o = {buf, buf + f->plen};
  encode(&q, &o);
  if ((size_t)(o.p - buf) != f->plen || (f->plen && memcmp(buf, f->payload, f->plen) != 0))
    __builtin_trap();
  free(buf);
  agent_req_free(&q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t off = 0;
  for (;;) {
    agent_frame f;
    int r = agent_frame_split(data + off, size - off, &f);
    if (r != AGENT_FRAME_OK) break;
    if (f.len < 5 || f.len > AGENT_MAX_FRAME || 4 + (size_t)f.len > size - off ||
        f.plen != f.len - 5 || f.payload != data + off + AGENT_HDR)
      __builtin_trap();
    check(&f);
    off += 4 + (size_t)f.len;
  }
  return 0;
}
