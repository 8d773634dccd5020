/*
** File requests of `sbx-agent serve` (r w l d m s). Every answer ends
** with Z; its message names the path. Paths are used as given: the host
** resolves them.
*/
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsops.h"
#include "serve.h"

struct rjob {
  rjob *next;
  uint32_t id;
  int fd;
  uint64_t left;                   /* bytes still allowed */
  uint64_t max;
  char path[];
};

/* ------------------------------------------------------------------ read */

static void read_start(server *s, const agent_req *q) {
  struct stat st;
  /* O_NONBLOCK: a FIFO must not hang the agent in open() */
  int fd = open(q->path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  int e = fd < 0 ? errno : fstat(fd, &st) < 0 ? errno
        : S_ISDIR(st.st_mode) ? EISDIR : 0;
  if (!e && !S_ISREG(st.st_mode)) {
    close(fd);
    serve_done(s, q->id, EINVAL, q->path, "not a regular file");
    return;
  }
  size_t n = strlen(q->path);
  rjob *j = e ? NULL : malloc(sizeof *j + n + 1);
  if (!e && !j) e = ENOMEM;
  if (e) {
    if (fd >= 0) close(fd);
    serve_done(s, q->id, e, q->path, NULL);
    return;
  }
  j->id = q->id;
  j->fd = fd;
  j->left = j->max = q->max;
  memcpy(j->path, q->path, n + 1);
  j->next = s->reads;
  s->reads = j;
}

/* One step of j: a D frame, or the end (Z). 1 when j is done. */
static int read_step(server *s, rjob *j) {
  char probe;
  ssize_t n;
  if (j->left == 0) {              /* at max: is there more? */
    while ((n = read(j->fd, &probe, 1)) < 0 && errno == EINTR) {}
    if (n > 0) {
      char why[64];
      snprintf(why, sizeof why, "longer than %llu bytes", (unsigned long long)j->max);
      serve_done(s, j->id, EFBIG, j->path, why);
    } else {
      serve_done(s, j->id, n < 0 ? errno : 0, j->path, NULL);
    }
    return 1;
  }
  size_t want = j->left < sizeof s->scratch ? (size_t)j->left : sizeof s->scratch;
  while ((n = read(j->fd, s->scratch, want)) < 0 && errno == EINTR) {}
  if (n <= 0) {
    serve_done(s, j->id, n < 0 ? errno : 0, j->path, NULL);
    return 1;
  }
  serve_send(s, 'D', j->id, s->scratch, (size_t)n, NULL, 0);
  j->left -= (uint64_t)n;
  return 0;
}

void fs_step(server *s) {
  rjob **p = &s->reads;
  while (*p && s->queued < OUT_LIMIT) {
    rjob *j = *p;
    if (read_step(s, j)) {
      *p = j->next;
      close(j->fd);
      free(j);
    } else {
      p = &j->next;
    }
  }
}

int fs_busy(const server *s, uint32_t id) {
  for (const rjob *j = s->reads; j; j = j->next)
    if (j->id == id) return 1;
  return 0;
}

void fs_stop(server *s) {
  while (s->reads) {
    rjob *j = s->reads;
    s->reads = j->next;
    close(j->fd);
    free(j);
  }
}

/* ----------------------------------------------------------------- write */

static int write_all(int fd, const unsigned char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Regular files only, created with `mode` or truncated and given it; an
** append leaves the mode alone. The parent must exist. */
static int write_file(const agent_req *q) {
  int append = q->flags & 1;
  mode_t mode = (mode_t)(q->mode & 07777);
  struct stat st;
  int fd = open(q->path, O_WRONLY | O_CREAT | O_NONBLOCK | O_NOCTTY | O_CLOEXEC |
                (append ? O_APPEND : 0), mode);
  if (fd < 0) return errno;
  int e = fstat(fd, &st) < 0 ? errno : !S_ISREG(st.st_mode) ? EINVAL : 0;
  if (!e && !append && ftruncate(fd, 0) < 0) e = errno;
  if (!e && !append && fchmod(fd, mode) < 0) e = errno;
  if (!e) e = write_all(fd, q->data, q->dlen);
  if (close(fd) < 0 && !e) e = errno;
  return e;
}

/* ------------------------------------------------------------ list, stat */

/* Records gather in s->scratch and leave as D frames when it is full. */
typedef struct lister { server *s; uint32_t id; } lister;

static int emit_record(void *ud, const char *rec, size_t n) {
  lister *l = ud;
  server *s = l->s;
  if (s->nscratch + n > sizeof s->scratch) {
    serve_send(s, 'D', l->id, s->scratch, s->nscratch, NULL, 0);
    s->nscratch = 0;
  }
  memcpy(s->scratch + s->nscratch, rec, n);
  s->nscratch += n;
  return 0;
}

static void list(server *s, const agent_req *q) {
  lister l = {s, q->id};
  s->nscratch = 0;
  int e = fsop_list(q->path, emit_record, &l);
  if (s->nscratch) serve_send(s, 'D', q->id, s->scratch, s->nscratch, NULL, 0);
  s->nscratch = 0;
  serve_done(s, q->id, e, q->path, NULL);
}

void fs_request(server *s, const agent_req *q) {
  char rec[128];
  size_t n;
  int e = 0;
  switch (q->type) {
    case 'r': read_start(s, q); return;
    case 'l': list(s, q); return;
    case 'w': e = write_file(q); break;
    case 'd': e = fsop_remove(q->path, (int)q->recursive); break;
    case 'm': e = fsop_mkdir_p(q->path); break;
    case 's':
      e = fsop_stat(q->path, rec, sizeof rec, &n);
      if (!e) serve_send(s, 'D', q->id, rec, n, NULL, 0);
      break;
    default: return;
  }
  serve_done(s, q->id, e, q->path, NULL);
}
