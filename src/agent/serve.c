/*
** `sbx-agent serve`: docs/agent-protocol.md over stdin/stdout. One poll
** loop that never waits on the host or a command: stdin and stdout are
** non-blocking, answers wait in a queue, and every command's pipes are
** read here directly. (File requests are plain system calls.)
**
** Each command gets a supervisor, a forked child of the agent that is a
** subreaper: it starts the command with sbx_spawn, waits for it, enforces
** the timeout, and on SIGTERM (K 9, or the agent's end) kills the whole
** tree. It tells the agent how things went through a status pipe of small
** fixed records; the agent never waits for a command itself.
**
** Latency: a supervisor is forked ahead of its command (the spare) and
** gets the request through its stdin pipe, so that an R costs a pipe write
** and not a fork; X goes out as soon as the supervisor's last record is
** in, before it exits.
*/
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../proctree.h"
#include "../spawn.h"
#include "agent.h"
#include "serve.h"
#include "supervise.h"

#define CHUNK 65536                /* one read of a command's output */
#define FINAL_DRAIN (1024 * 1024)  /* per stream, once the command is gone */
#define SHUTDOWN_FLUSH_MS 1000     /* last answers to a host that stopped sending */
#define TEXT_MAX (4096 + 256)      /* an E or Z message: a whole path and why */
#define NOFILE_MAX 65536           /* the agent's fds: 4 per command */
#define REAP_MS 10                 /* the next look at supervisors that sent X */
#define ORPHAN_MS 1000             /* as a container's init: the next look for orphans */
/* Commands' oom_score_adj: under the sandbox's memory limit the kernel
** kills a command rather than the agent (or bwrap's init) holding the
** sandbox together. A command may lower it back to ours, and hurt only
** its own sandbox. */
#define SBX_COMMAND_OOM_ADJ "500"

struct msg {
  msg *next;
  size_t len, off;
  unsigned char b[];
};

/* The supervisor's records: P (a = pid), then X (a = kind, b = n; kind
** noexec or nocwd when the command never started). Each is one write, well
** under PIPE_BUF: never torn. */
typedef struct sup_msg { int32_t what, a, b; } sup_msg;

/* What the agent writes first on a supervisor's stdin pipe: this, then an
** R frame of len bytes whose stdin field is empty (the command's stdin, if
** need_in, follows in the same pipe). A supervisor is forked before its
** command is known, so its request cannot come through fork. */
typedef struct sup_req { uint32_t len, need_in; } sup_req;

struct run {
  run *next;
  uint32_t id;
  pid_t sup, pid;                  /* pid: the command, once P came */
  int status_fd, fd[2], in_fd;     /* fd: stdout, stderr read ends */
  int keep_stdin, close_in;        /* close_in: after the pending bytes */
  unsigned char *pend;             /* stdin not yet taken by the pipe */
  size_t plen, poff;
  uint64_t max, got[2];
  int truncated;
  int done;                        /* the supervisor's last word is in */
  int sent;                        /* X is queued: only the reaping is left */
  int reaped;                      /* the supervisor is gone */
  int kind, n, pending_sig;
  int stopped;                     /* S: the host's reader of it is behind */
  unsigned char sbuf[4 * sizeof(sup_msg)];
  size_t slen;
};

static void fatal(const char *what) {
  fprintf(stderr, "sbx-agent serve: %s: %s\n", what, strerror(errno));
  exit(1);
}

/* ---------------------------------------------------------------- output */

void serve_send(server *s, char type, uint32_t id, const void *a, size_t an,
                const void *b, size_t bn) {
  if (!s->out_ok) return;
  msg *m = malloc(sizeof *m + AGENT_HDR + an + bn);
  /* a lost frame would leave the host waiting forever: better gone */
  if (!m) fatal("out of memory");
  m->next = NULL;
  m->off = 0;
  m->len = AGENT_HDR + an + bn;
  agent_put_header(m->b, type, id, an + bn);
  if (an) memcpy(m->b + AGENT_HDR, a, an);
  if (bn) memcpy(m->b + AGENT_HDR + an, b, bn);
  if (s->tail) s->tail->next = m; else s->head = m;
  s->tail = m;
  s->queued += m->len;
}

/* s4 message (and nothing else): E, or the end of Z after the errno name. */
static void send_text(server *s, char type, uint32_t id, const unsigned char *pre,
                      size_t npre, const char *text) {
  unsigned char buf[4 + 32 + 4 + TEXT_MAX];   /* pre: at most an s4 errno name */
  size_t n = strlen(text);
  if (n > TEXT_MAX) n = TEXT_MAX;
  unsigned char *p = buf;
  if (npre) memcpy(p, pre, npre);
  p = agent_put_str(p + npre, text, n);
  serve_send(s, type, id, buf, (size_t)(p - buf), NULL, 0);
}

void serve_done(server *s, uint32_t id, int err, const char *path,
                const char *why) {
  unsigned char e[4 + 32];
  char text[TEXT_MAX + 1];
  const char *name = serve_errno_name(err);
  size_t n = (size_t)(agent_put_str(e, name, strlen(name)) - e);
  if (err) snprintf(text, sizeof text, "%s: %s", path, why ? why : strerror(err));
  else text[0] = '\0';
  send_text(s, 'Z', id, e, n, text);
}

static void send_error(server *s, uint32_t id, const char *text) {
  send_text(s, 'E', id, NULL, 0, text);
}

static void drop_queue(server *s) {
  while (s->head) {
    msg *m = s->head;
    s->head = m->next;
    free(m);
  }
  s->tail = NULL;
  s->queued = 0;
}

/* Write what stdout takes now, up to 64 frames per call. */
static void flush(server *s) {
  while (s->head && s->out_ok) {
    struct iovec iov[64];
    int n = 0;
    for (msg *m = s->head; m && n < 64; m = m->next, n++)
      iov[n] = (struct iovec){m->b + m->off, m->len - m->off};
    ssize_t w = writev(1, iov, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) return;
    if (w <= 0) {                  /* EPIPE: the host is gone */
      s->out_ok = 0;
      drop_queue(s);
      return;
    }
    s->queued -= (size_t)w;
    while (w > 0) {
      msg *m = s->head;
      size_t left = m->len - m->off;
      if ((size_t)w < left) {
        m->off += (size_t)w;
        break;
      }
      w -= (ssize_t)left;
      s->head = m->next;
      if (!s->head) s->tail = NULL;
      free(m);
    }
  }
}

/* ------------------------------------------------------------------ runs */

/* A command whose X is not queued yet: after X its id is free again. */
static run *find_run(server *s, uint32_t id) {
  for (run *r = s->runs; r; r = r->next)
    if (r->id == id && !r->sent) return r;
  return NULL;
}

static void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

/* The name of an errno value ("ENOENT"): names mean the same on every
** architecture, numbers do not. "" for 0, "EUNKNOWN" for one glibc does not name. */
const char *serve_errno_name(int err) {
  if (!err) return "";
  const char *name = strerrorname_np(err);
  return name ? name : "EUNKNOWN";
}

/* X: kind, n, truncated, errno. A command that never started (noexec,
** nocwd) carries its errno by name and n = 0; the others have errno "". */
static void send_exit(server *s, uint32_t id, int kind, int n, int truncated) {
  unsigned char buf[96], *p;
  const char *name = sup_kind_name(kind);
  const char *err = "";
  if (kind == SUP_NOEXEC || kind == SUP_NOCWD) {
    err = serve_errno_name(n);
    n = 0;
  }
  p = agent_put_str(buf, name, strlen(name));
  p = agent_put_u32(p, (uint32_t)n);
  *p++ = (unsigned char)(truncated ? 1 : 0);
  p = agent_put_str(p, err, strlen(err));
  serve_send(s, 'X', id, buf, (size_t)(p - buf), NULL, 0);
}

/* Output of the command: O frames up to max per stream, the rest dropped. */
static void emit_output(server *s, run *r, int i, const char *buf, size_t n) {
  uint64_t room = r->max - r->got[i];
  size_t keep = n < room ? n : (size_t)room;
  unsigned char which = (unsigned char)(i + 1);
  if (keep < n) r->truncated = 1;
  r->got[i] += keep;
  if (keep) serve_send(s, 'O', r->id, &which, 1, buf, keep);
}

/* Read stream i of r, at most `budget` bytes; it closes at EOF. */
static void read_output(server *s, run *r, int i, size_t budget) {
  char buf[CHUNK];
  while (r->fd[i] >= 0 && budget > 0) {
    ssize_t n = read(r->fd[i], buf, budget < sizeof buf ? budget : sizeof buf);
    if (n > 0) {
      emit_output(s, r, i, buf, (size_t)n);
      budget -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    close_fd(&r->fd[i]);           /* EOF, or an error that will not pass */
  }
}

static void stdin_close(run *r) {
  close_fd(&r->in_fd);
  free(r->pend);
  r->pend = NULL;
  r->plen = r->poff = 0;
}

/* Give the command's stdin what it takes now. */
static void pump_stdin(run *r) {
  while (r->in_fd >= 0 && r->poff < r->plen) {
    ssize_t n = write(r->in_fd, r->pend + r->poff, r->plen - r->poff);
    if (n > 0) { r->poff += (size_t)n; continue; }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    stdin_close(r);                /* EPIPE: nobody reads it any more */
    return;
  }
  free(r->pend);                   /* a big stdin is not kept for nothing */
  r->pend = NULL;
  r->poff = r->plen = 0;
  if (r->close_in) stdin_close(r);
}

static int add_stdin(run *r, const unsigned char *data, size_t n) {
  if (n == 0) return 0;
  if (r->poff > 0) {               /* keep the buffer from creeping */
    memmove(r->pend, r->pend + r->poff, r->plen - r->poff);
    r->plen -= r->poff;
    r->poff = 0;
  }
  unsigned char *p = realloc(r->pend, r->plen + n);
  if (!p) return -1;
  memcpy(p + r->plen, data, n);
  r->pend = p;
  r->plen += n;
  return 0;
}

/* The supervisor's records; at EOF it has exited and is reaped here. */
static void on_status(server *s, run *r) {
  ssize_t n = read(r->status_fd, r->sbuf + r->slen, sizeof r->sbuf - r->slen);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n > 0) {
    r->slen += (size_t)n;
    size_t off = 0;
    for (; r->slen - off >= sizeof(sup_msg); off += sizeof(sup_msg)) {
      sup_msg m;
      memcpy(&m, r->sbuf + off, sizeof m);
      if (m.what == 'P') {
        r->pid = m.a;
        unsigned char pid[4];
        agent_put_u32(pid, (uint32_t)m.a);
        serve_send(s, 'P', r->id, pid, 4, NULL, 0);
        if (r->pending_sig) sbx_kill_tree(r->pid, r->pending_sig);
      } else if (!r->done) {
        r->done = 1;
        r->kind = m.a;
        r->n = m.b;
      }
    }
    memmove(r->sbuf, r->sbuf + off, r->slen - off);
    r->slen -= off;
    return;
  }
  close_fd(&r->status_fd);
  waitpid(r->sup, NULL, 0);        /* it closed the pipe by exiting */
  r->reaped = 1;
  if (!r->done) {                  /* killed before it could say */
    r->done = 1;
    r->kind = SUP_KILLED;
    r->n = SIGKILL;
  }
}

/* The command is gone: what its pipes already hold goes out, then X. */
static void finish(server *s, run *r) {
  for (int i = 0; i < 2; i++) {
    read_output(s, r, i, FINAL_DRAIN);
    close_fd(&r->fd[i]);
  }
  stdin_close(r);
  send_exit(s, r->id, r->kind, r->n, r->truncated);
}

static void free_run(run *r) {
  close_fd(&r->status_fd);
  close_fd(&r->fd[0]);
  close_fd(&r->fd[1]);
  stdin_close(r);
  free(r);
}

/* Send X for every run whose supervisor has had its last word, while the
** queue has room: the command is reaped by then, so X does not wait for the
** supervisor's exit. That exit is not watched either (its wakeup would
** take the CPU from the host reading X): reap_sent collects the supervisor
** later, a zombie until then. Runs that are sent and reaped are freed. */
static void finish_runs(server *s) {
  run **p = &s->runs;
  while (*p) {
    run *r = *p;
    if (r->done && !r->sent && s->queued < OUT_LIMIT) {
      finish(s, r);
      close_fd(&r->status_fd);
      r->sent = 1;
    }
    if (r->sent && r->reaped) {
      *p = r->next;
      free_run(r);
    } else {
      p = &r->next;
    }
  }
}

/* Supervisors that sent X and are still to be reaped. */
static int unreaped(const server *s) {
  for (const run *r = s->runs; r; r = r->next)
    if (r->sent && !r->reaped) return 1;
  return 0;
}

/* Reap the supervisors that sent X and have exited since. */
static void reap_sent(server *s) {
  for (run *r = s->runs; r; r = r->next)
    if (r->sent && !r->reaped && waitpid(r->sup, NULL, WNOHANG) == r->sup)
      r->reaped = 1;
}

/* As a container's first process (sbx-agent sleep --serve) the agent is
** its init: orphans from outside its own supervisors (an engine exec's, a
** killed supervisor's) come to it. Those are reaped here; a supervisor's
** exit is left to its own waitpid (the others behind it wait a turn). */
static int own_supervisor(const server *s, pid_t pid) {
  if (s->spare && s->spare->sup == pid) return 1;
  for (const run *r = s->runs; r; r = r->next)
    if (r->sup == pid) return 1;
  return 0;
}

static void reap_orphans(server *s) {
  if (s->self != 1) return;
  for (int i = 0; i < 64; i++) {
    siginfo_t si;
    memset(&si, 0, sizeof si);
    if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) < 0 || si.si_pid == 0) return;
    if (own_supervisor(s, si.si_pid)) return;
    waitpid(si.si_pid, NULL, WNOHANG);
  }
}

/* A command between its R and its P: its supervisor (or the command) is
** about to want a CPU, which may well be ours. */
static int starting(const server *s) {
  for (const run *r = s->runs; r; r = r->next)
    if (!r->pid && !r->done) return 1;
  return 0;
}

/* ------------------------------------------------------------ supervisor */

/* Move fds[i] to 3 + i (close-on-exec) and close every other fd above 2:
** a supervisor must not hold the pipes of other commands (a stdin would
** never reach EOF) nor the agent's own. */
static void keep_fds(int *fds, int n) {
  int parked[8];
  for (int i = 0; i < n; i++)
    parked[i] = fds[i] < 0 ? -1 : fcntl(fds[i], F_DUPFD_CLOEXEC, 3 + n);
  for (int i = 0; i < n; i++) {
    if (parked[i] >= 0) dup3(parked[i], 3 + i, O_CLOEXEC);
    fds[i] = parked[i] >= 0 ? 3 + i : -1;
  }
  if (syscall(SYS_close_range, 3 + n, ~0U, 0) < 0)
    for (int fd = 3 + n; fd < NOFILE_MAX; fd++) close(fd);
  int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null >= 0) {                 /* the host's EOF must not wait for us */
    dup2(null, 0);
    dup2(null, 1);
    close(null);
  }
}

/* A failed write means the agent is gone: its PDEATHSIG is on the way. */
static void report(int fd, int what, int a, int b) {
  sup_msg m = {what, a, b};
  ssize_t n = write(fd, &m, sizeof m);
  (void)n;
}

/* n bytes from a blocking fd; -1 if it ends first. */
static int read_full(int fd, void *buf, size_t n) {
  unsigned char *p = buf;
  while (n > 0) {
    ssize_t k = read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* The request on the supervisor's stdin pipe (see sup_req): 0, -1 when the
** pipe closed first (the agent stopped), or an errno. */
static int read_request(int fd, agent_req *q, int *need_in) {
  sup_req h;
  agent_frame f;
  const char *why;
  if (read_full(fd, &h, sizeof h) < 0) return -1;
  unsigned char *buf = malloc(h.len ? h.len : 1);
  if (!buf) return ENOMEM;
  if (read_full(fd, buf, h.len) < 0) return -1;
  *need_in = (int)h.need_in;
  /* the agent parsed this frame already: only memory can fail here */
  if (agent_frame_split(buf, h.len, &f) != AGENT_FRAME_OK ||
      agent_req_parse(&f, q, &why) < 0)
    return ENOMEM;
  return 0;
}

/* The forked supervisor of one command; never returns. fds: stdin read
** end, stdout and stderr write ends, the status pipe. Everything that does
** not depend on the command is done before its request is read: a spare
** supervisor waits there, ready. */
static void supervise(const server *s, int fds[4]) {
  char path[4096];
  agent_req q;
  int pidfd, need_in = 0;
  keep_fds(fds, 4);
  if (s->nofile.rlim_cur > 0)      /* the command gets the usual limit */
    setrlimit(RLIMIT_NOFILE, &s->nofile);
  /* the agent's death (a crash, SIGKILL) is a SIGTERM: the tree dies */
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != s->self) _exit(0);
  int sfd = sup_start();
  int e = sfd < 0 ? errno : 0;
  int got = read_request(fds[0], &q, &need_in);
  if (got < 0) _exit(0);           /* no command: the agent is stopping */
  if (!need_in) {                  /* the command's stdin is /dev/null */
    close(fds[0]);
    fds[0] = -1;
  }
  if (!e) e = got;
  if (!e) e = sbx_find_program(q.argv[0], sbx_env_path(q.envp), path, sizeof path);
  if (e) {
    report(fds[3], 'X', SUP_NOEXEC, e);
    _exit(0);
  }
  sbx_spawn_req r;
  memset(&r, 0, sizeof r);
  r.path = path;
  r.cwd = q.path[0] ? q.path : NULL;
  r.argv = q.argv;
  r.envp = q.envp;
  r.in = fds[0];
  r.out = fds[1];
  r.err = fds[2];
  r.cgroup_fd = -1;
  r.ignored = &s->ignored;         /* we have no handlers: see spawn.h */
  r.oom_score_adj = SBX_COMMAND_OOM_ADJ;
  pid_t pid = sbx_spawn(&r, &pidfd);
  if (pid < 0) {
    report(fds[3], 'X', r.stage == 1 ? SUP_NOCWD : SUP_NOEXEC, errno);
    _exit(0);
  }
  close(pidfd);
  /* The write ends of stdout and stderr stay open here until we exit: the
  ** command's exit then wakes the agent only through our X (which drains
  ** the pipes anyway), not twice more with their EOF while it exits. */
  if (fds[0] >= 0) close(fds[0]);
  report(fds[3], 'P', pid, 0);
  sup_end end = sup_wait(pid, sfd, q.timeout_ms / 1000.0, NULL);
  /* whatever signal told us to stop, the tree got SIGKILL */
  if (end.kind == SUP_KILLED) end.n = SIGKILL;
  report(fds[3], 'X', end.kind, end.n);
  _exit(0);
}

static void close_all(int *fds, int n) {
  for (int i = 0; i < n; i++)
    if (fds[i] >= 0) close(fds[i]);
}

/* A supervisor with its pipes, waiting for a request (id not set yet);
** NULL and *err when it cannot be made. */
static run *new_supervisor(server *s, int *err) {
  /* out r/w, err r/w, status r/w, in r/w */
  int fds[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
  run *r = calloc(1, sizeof *r);
  *err = ENOMEM;
  if (!r) return NULL;
  for (int i = 0; i < 8; i += 2)
    if (pipe2(fds + i, O_CLOEXEC) < 0) {
      *err = errno;
      close_all(fds, 8);
      free(r);
      return NULL;
    }
  sigset_t set, old;
  sup_signals(&set);
  sigprocmask(SIG_BLOCK, &set, &old);   /* the supervisor's, from its start */
  pid_t pid = fork();
  if (pid == 0) {
    int child[4] = {fds[6], fds[1], fds[3], fds[5]};
    supervise(s, child);
  }
  *err = errno;
  sigprocmask(SIG_SETMASK, &old, NULL);
  if (pid < 0) {
    close_all(fds, 8);
    free(r);
    return NULL;
  }
  close(fds[1]);
  close(fds[3]);
  close(fds[5]);
  close(fds[6]);
  r->sup = pid;
  r->fd[0] = fds[0];
  r->fd[1] = fds[2];
  r->status_fd = fds[4];
  r->in_fd = fds[7];
  fcntl(r->fd[0], F_SETFL, O_NONBLOCK);
  fcntl(r->fd[1], F_SETFL, O_NONBLOCK);
  fcntl(r->status_fd, F_SETFL, O_NONBLOCK);
  fcntl(r->in_fd, F_SETFL, O_NONBLOCK);
  return r;
}

/* A supervisor that never got (or never took) its command. */
static void drop_supervisor(run *r) {
  kill(r->sup, SIGKILL);
  waitpid(r->sup, NULL, 0);
  free_run(r);
}

/* The next command's supervisor, forked ahead of time so that a command
** starts without waiting for a fork. After a failed fork the next R tries
** again (on its own). */
static void make_spare(server *s) {
  int e;
  if (s->spare || s->spare_failed) return;
  s->spare = new_supervisor(s, &e);
  if (!s->spare) s->spare_failed = 1;
}

/* What the supervisor reads first: the header, then f with its stdin field
** emptied; the command's own stdin follows in the same pipe. */
static int queue_request(run *r, const agent_frame *f, const agent_req *q) {
  size_t keep = f->plen - q->dlen - 4;   /* the payload before stdin's s4 */
  size_t len = AGENT_HDR + keep + 4;
  sup_req h = {(uint32_t)len, (q->flags & 1) || q->dlen > 0};
  unsigned char *p = malloc(sizeof h + len + q->dlen);
  if (!p) return -1;
  memcpy(p, &h, sizeof h);
  unsigned char *w = agent_put_header(p + sizeof h, 'R', q->id, keep + 4);
  memcpy(w, f->payload, keep);
  w = agent_put_u32(w + keep, 0);
  if (q->dlen) memcpy(w, q->data, q->dlen);
  r->pend = p;
  r->plen = sizeof h + len + q->dlen;
  r->poff = 0;
  return 0;
}

static void start_run(server *s, const agent_frame *f, const agent_req *q) {
  int e = 0;
  run *r = s->spare;
  s->spare = NULL;
  s->spare_failed = 0;
  if (!r) r = new_supervisor(s, &e);
  if (r && queue_request(r, f, q) < 0) {
    drop_supervisor(r);
    r = NULL;
    e = ENOMEM;
  }
  if (!r) {                        /* no supervisor: the run ends at once */
    send_exit(s, q->id, SUP_NOEXEC, e, 0);
    return;
  }
  r->id = q->id;
  r->keep_stdin = q->flags & 1;
  r->close_in = !r->keep_stdin;
  r->max = q->max;
  r->next = s->runs;
  s->runs = r;
  pump_stdin(r);
}

/* I: more stdin, or (empty) its end. Late bytes for a command that has
** ended or closed its stdin are dropped: the host could not know. */
static void on_stdin(server *s, const agent_req *q) {
  run *r = find_run(s, q->id);
  if (!r || !r->keep_stdin) {
    char text[80];
    snprintf(text, sizeof text, "id %u is not a running command with keep_stdin", q->id);
    send_error(s, q->id, text);
    return;
  }
  if (r->done || r->in_fd < 0 || r->close_in) return;
  if (q->dlen == 0) r->close_in = 1;
  else if (add_stdin(r, q->data, q->dlen) < 0) stdin_close(r);
  pump_stdin(r);
}

/* K: 9 is the supervisor's tree kill; others go to the process group. */
static void on_signal(server *s, const agent_req *q) {
  run *r = find_run(s, q->id);
  char text[80];
  if (!r) {
    snprintf(text, sizeof text, "id %u is not a running command", q->id);
    send_error(s, q->id, text);
    return;
  }
  if (q->signo == 0 || q->signo >= (uint32_t)NSIG) {
    snprintf(text, sizeof text, "no signal %u", q->signo);
    send_error(s, q->id, text);
    return;
  }
  if (r->done) return;
  if (q->signo == SIGKILL) kill(r->sup, SIGTERM);
  else if (r->pid > 0) sbx_kill_tree(r->pid, (int)q->signo);
  else r->pending_sig = (int)q->signo;   /* sent once P is known */
}

/* S and G: one command's output waits in its pipes while the host's
** reader of it catches up. They race with the command's end, so an id that
** is not running is no error. */
static void on_flow(server *s, const agent_req *q) {
  run *r = find_run(s, q->id);
  if (r) r->stopped = q->type == 'S';
}

/* ------------------------------------------------------------- requests */

static void dispatch(server *s, const agent_frame *f) {
  agent_req q;
  const char *why;
  char text[120];
  if (agent_req_parse(f, &q, &why) < 0) {
    unsigned char t = (unsigned char)f->type;
    snprintf(text, sizeof text, t > 32 && t < 127 ? "%s (a '%c' frame)"
             : "%s (a frame of type %u)", why, t);
    send_error(s, f->id, text);
    return;
  }
  if (q.type == 'I') {
    on_stdin(s, &q);
  } else if (q.type == 'K') {
    on_signal(s, &q);
  } else if (q.type == 'S' || q.type == 'G') {
    on_flow(s, &q);
  } else if (q.id == 0) {
    send_error(s, 0, "id 0 is the connection, not a request");
  } else if (find_run(s, q.id) || fs_busy(s, q.id)) {
    snprintf(text, sizeof text, "id %u is already in use", q.id);
    send_error(s, q.id, text);
  } else if (q.type == 'R') {
    start_run(s, f, &q);
  } else {
    fs_request(s, &q);
  }
  agent_req_free(&q);
}

/* Room for the frame in progress (s->want bytes) or one more read. */
static void grow_input(server *s) {
  size_t need = s->inlen + CHUNK;
  if (s->want > need) need = s->want;
  if (need <= s->incap) return;
  size_t cap = s->incap ? s->incap : 4 * CHUNK;
  while (cap < need) cap *= 2;
  unsigned char *p = realloc(s->in, cap);
  if (!p) fatal("out of memory");
  s->in = p;
  s->incap = cap;
}

/* Every whole frame in the input; what is left waits for more. */
static void parse_input(server *s) {
  size_t off = 0;
  char text[80];
  s->want = 0;
  while (!s->broken) {
    agent_frame f;
    int r = agent_frame_split(s->in + off, s->inlen - off, &f);
    if (r == AGENT_FRAME_BROKEN) {
      /* no way to find the next frame: say why, then stop as at EOF */
      snprintf(text, sizeof text, "broken stream: a frame of %u bytes", f.len);
      send_error(s, 0, text);
      s->broken = 1;
    } else if (r == AGENT_FRAME_MORE) {
      if (f.len) s->want = 4 + (size_t)f.len;
      break;
    } else {
      dispatch(s, &f);
      off += 4 + (size_t)f.len;
    }
  }
  memmove(s->in, s->in + off, s->inlen - off);
  s->inlen -= off;
  if (s->incap > 16 * CHUNK && s->inlen < CHUNK && s->want < CHUNK) {
    unsigned char *p = realloc(s->in, 4 * CHUNK);   /* a big frame is done */
    if (p) {
      s->in = p;
      s->incap = 4 * CHUNK;
    }
  }
}

static void read_input(server *s) {
  grow_input(s);
  ssize_t n = read(0, s->in + s->inlen, s->incap - s->inlen);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {                    /* EOF: the host is gone */
    s->in_open = 0;
    return;
  }
  s->inlen += (size_t)n;
  parse_input(s);
}

/* ------------------------------------------------------------------ loop */

enum { W_STDIN, W_STDOUT, W_STATUS, W_OUT, W_ERR, W_IN, W_SPARE };

typedef struct slot { run *r; int what; } slot;
typedef struct pollset { struct pollfd *fds; slot *slots; size_t n, cap; } pollset;

static void watch(pollset *ps, int fd, short events, run *r, int what) {
  if (fd < 0) return;
  if (ps->n == ps->cap) {
    size_t cap = ps->cap ? ps->cap * 2 : 64;
    struct pollfd *f = realloc(ps->fds, cap * sizeof *f);
    if (f) ps->fds = f;
    slot *sl = realloc(ps->slots, cap * sizeof *sl);
    if (!f || !sl) fatal("out of memory");
    ps->slots = sl;
    ps->cap = cap;
  }
  ps->fds[ps->n] = (struct pollfd){fd, events, 0};
  ps->slots[ps->n++] = (slot){r, what};
}

static void build(server *s, pollset *ps) {
  /* past OUT_LIMIT the commands wait in their pipes for a slow host */
  int paused = s->queued >= OUT_LIMIT;
  ps->n = 0;
  if (s->in_open && !s->broken) watch(ps, 0, POLLIN, NULL, W_STDIN);
  if (s->head) watch(ps, 1, POLLOUT, NULL, W_STDOUT);
  /* a spare says nothing before its request: any event is its end */
  if (s->spare) watch(ps, s->spare->status_fd, POLLIN, s->spare, W_SPARE);
  for (run *r = s->runs; r; r = r->next) {
    watch(ps, r->status_fd, POLLIN, r, W_STATUS);
    /* output only after P went out: the command may write before its
    ** supervisor has said it started */
    if (!paused && !r->stopped && (r->pid > 0 || r->done)) {
      watch(ps, r->fd[0], POLLIN, r, W_OUT);
      watch(ps, r->fd[1], POLLIN, r, W_ERR);
    }
    if (r->poff < r->plen) watch(ps, r->in_fd, POLLOUT, r, W_IN);
  }
}

/* Handlers look at the run's current fds, never at a stale number; stdin
** goes last, as its requests may close or open fds. */
static void handle(server *s, const pollset *ps) {
  int input = 0;
  for (size_t i = 0; i < ps->n; i++) {
    run *r = ps->slots[i].r;
    if (!ps->fds[i].revents) continue;
    switch (ps->slots[i].what) {
      case W_STDIN: input = 1; break;
      case W_STDOUT: flush(s); break;
      case W_STATUS: on_status(s, r); break;
      case W_OUT: read_output(s, r, 0, CHUNK); break;
      case W_ERR: read_output(s, r, 1, CHUNK); break;
      case W_IN: pump_stdin(r); break;
      case W_SPARE: drop_supervisor(r); s->spare = NULL; break;
    }
  }
  if (input) read_input(s);
}

/* The host is gone (or the stream broke): every tree dies, the
** supervisors are reaped, and what is queued gets a short last chance. */
static void stop_all(server *s) {
  if (s->spare) drop_supervisor(s->spare);
  s->spare = NULL;
  for (run *r = s->runs; r; r = r->next)
    if (!r->reaped) kill(r->sup, SIGTERM);
  while (s->runs) {
    run *r = s->runs;
    s->runs = r->next;
    if (!r->reaped) waitpid(r->sup, NULL, 0);
    free_run(r);
  }
  fs_stop(s);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (flush(s); s->head && s->out_ok; flush(s)) {
    clock_gettime(CLOCK_MONOTONIC, &t);
    long ms = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
    struct pollfd p = {1, POLLOUT, 0};
    if (ms >= SHUTDOWN_FLUSH_MS || poll(&p, 1, (int)(SHUTDOWN_FLUSH_MS - ms)) == 0)
      break;
  }
  drop_queue(s);
}

static void hello(server *s) {
  static const char name[] = "sbx-agent " AGENT_VERSION;
  unsigned char buf[64], *p = agent_put_str(buf, name, sizeof name - 1);
  p = agent_put_u32(p, AGENT_PROTOCOL);
  serve_send(s, 'H', 0, buf, (size_t)(p - buf), NULL, 0);
}

/* Room for many commands at once; each supervisor puts the limit back
** before its command starts. */
static void raise_nofile(server *s) {
  struct rlimit up;
  if (getrlimit(RLIMIT_NOFILE, &s->nofile) < 0) return;
  up = s->nofile;
  up.rlim_cur = up.rlim_max < NOFILE_MAX ? up.rlim_max : NOFILE_MAX;
  if (up.rlim_cur > s->nofile.rlim_cur) setrlimit(RLIMIT_NOFILE, &up);
}

volatile sig_atomic_t agent_terminated;

static void on_term(int sig) { agent_terminated = sig; }

/* As a container's init the kernel drops a signal it has no handler for,
** so `docker stop`'s SIGTERM would wait out the grace period and end in a
** SIGKILL. With one, the commands are stopped and the agent exits. (No
** SA_RESTART: poll returns at once; a signal just before it waits at
** most ORPHAN_MS.) */
static void term_as_init(server *s) {
  if (s->self != 1) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_term;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
}

int agent_serve(void) {
  static server srv;               /* its scratch buffer is too big for a stack */
  server *s = &srv;
  pollset ps = {NULL, NULL, 0, 0};
  s->out_ok = s->in_open = 1;
  s->self = getpid();
  term_as_init(s);
  raise_nofile(s);
  signal(SIGPIPE, SIG_IGN);        /* a gone host or command is EPIPE */
  sbx_ignored_signals(&s->ignored);  /* what each command's child resets */
  fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK);
  fcntl(1, F_SETFL, fcntl(1, F_GETFL) | O_NONBLOCK);
  hello(s);
  while (s->in_open && !s->broken && s->out_ok && !agent_terminated) {
    flush(s);
    /* Housekeeping waits while a command starts: the supervisor just woken
    ** by its request would wait for this CPU (a pipe's wakeup puts the
    ** reader on the writer's CPU). It runs once the command has its P. */
    if (!starting(s)) {
      make_spare(s);
      reap_sent(s);
      reap_orphans(s);
    }
    build(s, &ps);
    /* file reads go on by themselves while the queue has room, and
    ** supervisors that sent X are looked at again after a while */
    int timeout = s->reads && s->queued < OUT_LIMIT ? 0 : unreaped(s) ? REAP_MS
                : s->self == 1 ? ORPHAN_MS : -1;
    int n = poll(ps.fds, (nfds_t)ps.n, timeout);
    if (n < 0 && errno != EINTR) fatal("poll");
    if (n > 0) handle(s, &ps);
    fs_step(s);
    finish_runs(s);
  }
  stop_all(s);
  free(ps.fds);
  free(ps.slots);
  free(s->in);
  return s->broken ? 1 : 0;
}
