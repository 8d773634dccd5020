/*
** The frames of docs/agent-protocol.md, as the agent sees them: splitting
** a byte stream into frames, parsing the host's request payloads, and
** encoding the fields of the agent's answers. Pure functions (no I/O), so
** that fuzz/agent_fuzz.c drives exactly what `sbx-agent serve` runs.
*/
#ifndef SBX_AGENT_FRAME_H
#define SBX_AGENT_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define AGENT_PROTOCOL 3
#define AGENT_HDR 9                              /* u32 len, u8 type, u32 id */
#define AGENT_MAX_FRAME (16u * 1024 * 1024 + 5)  /* the largest len */

/* agent_frame_split's answers */
#define AGENT_FRAME_MORE 0     /* not a whole frame yet */
#define AGENT_FRAME_OK 1
#define AGENT_FRAME_BROKEN (-1)  /* len out of range: the stream is lost */

typedef struct agent_frame {
  char type;
  uint32_t id;
  uint32_t len;                  /* the len field: bytes after it */
  const unsigned char *payload;  /* len - 5 bytes, inside the caller's buffer */
  size_t plen;
} agent_frame;

/* The first frame of buf[0..n). On AGENT_FRAME_OK the frame takes
** 4 + f->len bytes; on BROKEN f->len holds the offending value. */
int agent_frame_split(const unsigned char *buf, size_t n, agent_frame *f);

/* A parsed request. Text fields (path, cwd, argv, env) are NUL-terminated
** copies in one allocation (mem); `data` points into the frame's payload
** and is valid only as long as that is. */
typedef struct agent_req {
  char type;
  uint32_t id;
  uint32_t flags;          /* R: bit 0 keep_stdin; w: bit 0 append */
  uint32_t timeout_ms;     /* R */
  uint64_t max;            /* R: max_output; r: max */
  uint32_t signo;          /* K */
  uint32_t mode;           /* w */
  uint32_t recursive;      /* d */
  char *path;              /* r w l d m s; R: the cwd ("" = the agent's) */
  char **argv, **envp;     /* R: NULL-terminated; argv has at least one */
  const unsigned char *data;  /* R: stdin; I: the bytes; w: the file data */
  size_t dlen;
  void *mem;
} agent_req;

/* Parse f's payload by its type. 0, or -1 with *why a static message
** (unknown type, payload that does not parse, out of memory); nothing is
** allocated on failure. */
int agent_req_parse(const agent_frame *f, agent_req *q, const char **why);
void agent_req_free(agent_req *q);

/* Encoding: each writes big-endian at p and returns the byte after. */
unsigned char *agent_put_header(unsigned char *p, char type, uint32_t id,
                                size_t plen);
unsigned char *agent_put_u32(unsigned char *p, uint32_t v);
unsigned char *agent_put_str(unsigned char *p, const char *s, size_t n);

#endif
