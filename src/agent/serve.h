/*
** Inside `sbx-agent serve`: the state serve.c (the loop, commands) and
** servefs.c (file requests) share.
*/
#ifndef SBX_AGENT_SERVE_H
#define SBX_AGENT_SERVE_H

#include <stddef.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "frame.h"

#define OUT_LIMIT (4u * 1024 * 1024)  /* unsent bytes that pause the producers */
#define DATA_CHUNK (256 * 1024)       /* the most one D frame carries */

typedef struct msg msg;               /* a queued frame (serve.c) */
typedef struct run run;               /* a command (serve.c) */
typedef struct rjob rjob;             /* a file being read (servefs.c) */

typedef struct server {
  msg *head, *tail;                   /* frames not yet written to stdout */
  size_t queued;                      /* their unsent bytes */
  int out_ok;                         /* 0 once stdout failed: the host is gone */
  unsigned char *in;                  /* stdin bytes not yet parsed */
  size_t inlen, incap, want;          /* want: the size of the partial frame */
  int in_open;                        /* 0 at stdin's EOF */
  int broken;                         /* a frame length was out of range */
  run *runs;
  run *spare;                         /* a supervisor waiting for its command */
  int spare_failed;                   /* its fork failed: wait for the next R */
  rjob *reads;
  pid_t self;
  struct rlimit nofile;               /* as the agent found it: for commands */
  sigset_t ignored;                   /* SIG_IGN signals a command gets reset */
  char scratch[DATA_CHUNK];           /* file data on its way into D frames */
  size_t nscratch;
} server;

/* Queue a frame whose payload is a then b. */
void serve_send(server *s, char type, uint32_t id, const void *a, size_t an,
                const void *b, size_t bn);
/* Queue Z: success ("", "") when err is 0, else the errno's name and
** "<path>: <why>" (why NULL: strerror). */
void serve_done(server *s, uint32_t id, int err, const char *path,
                const char *why);
/* "ENOENT" for ENOENT, "" for 0, "EUNKNOWN" for a value with no name. */
const char *serve_errno_name(int err);

/* servefs.c: r w l d m s. r starts a read that fs_step advances one D
** frame at a time, so that a big file respects OUT_LIMIT. */
void fs_request(server *s, const agent_req *q);
int fs_busy(const server *s, uint32_t id);
void fs_step(server *s);
void fs_stop(server *s);

#endif
