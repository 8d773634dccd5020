/*
** sbx.proc: child processes with exact argv, a from-scratch environment,
** stdin from a string (or /dev/null), stdout/stderr read concurrently with
** caps enforced while reading, optional chunk streaming with backpressure,
** and timeouts that kill the whole process tree.
**
** The tree is contained by a per-command cgroup (CLONE_INTO_CGROUP, killed
** through cgroup.kill) when the caller passes one; otherwise by a process
** group plus a child that is its own subreaper, swept through /proc.
*/
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lauxlib.h"
#include "loop.h"
#include "proctree.h"
#include "spawn.h"
#include "spawner.h"

#define PROC_MT "sbx.Proc"
#define CHUNK 65536
#define QUEUE_MAX (256 * 1024)     /* streamed bytes held before backpressure */
#define FINAL_DRAIN (1024 * 1024)  /* read after exit while grandchildren write */

typedef struct chunk {
  struct chunk *next;
  int which;                       /* 1 stdout, 2 stderr */
  size_t len;
  char data[];
} chunk;

typedef struct stream {
  struct proc *owner;
  int fd;
  sbx_watch w;
  char *buf;
  size_t len, cap, max;
  int truncated, paused;
} stream;

typedef struct proc {
  sbx_loop *lp;
  pid_t pid;
  int pidfd, exited, code, sig, timed_out, closed, streaming;
  sbx_watch pw;
  stream out, err;
  int infd, close_after;           /* stdin pipe, close once drained */
  sbx_watch iw;
  char *in;
  size_t inlen, inoff;
  sbx_timer tm;
  double start, end;
  char *cgroup;                    /* this command's own cgroup, or NULL */
  int cg_killed;                   /* cgroup.kill went through it: never reused */
  chunk *qhead, *qtail;
  size_t qbytes;
  sbx_waiter *waiters;             /* woken on every change of state */
  int selfref;                     /* anchored while the child runs */
  /* A spawn out with a spawner thread, and what starts the child's watches
  ** once it is back. */
  sbx_spawn_job *job;
  sbx_waiter *spawnw;
  int spawn_err, spawn_stage, pump;
  double timeout;
} proc;


/* ------------------------------------------------------------ utilities */

static void notify(proc *p) {
  sbx_waiter *w = p->waiters;
  p->waiters = NULL;
  while (w) {
    sbx_waiter *next = w->next;
    w->next = NULL;
    sbx_wake(p->lp, w);
    w = next;
  }
}

static void forget_waiter(proc *p, sbx_waiter *w) {
  sbx_waiter **q = &p->waiters;
  while (*q && *q != w) q = &(*q)->next;
  if (*q) *q = w->next;
  sbx_unwait(p->lp, w);
}

static int finished(proc *p) {
  return p->exited && p->out.fd < 0 && p->err.fd < 0;
}

static void stream_close(proc *p, stream *s) {
  if (s->fd < 0) return;
  sbx_watch_stop(p->lp, &s->w);
  close(s->fd);
  s->fd = -1;
}

static void stdin_close(proc *p) {
  if (p->infd < 0) return;
  sbx_watch_stop(p->lp, &p->iw);
  close(p->infd);
  p->infd = -1;
  free(p->in);
  p->in = NULL;
  p->inlen = p->inoff = 0;
}

static void unanchor(proc *p) {
  if (p->selfref != LUA_NOREF && finished(p)) {
    luaL_unref(sbx_loop_main(p->lp), LUA_REGISTRYINDEX, p->selfref);
    p->selfref = LUA_NOREF;
  }
}

/* A cgroup that went through cgroup.kill is never handed to another
** command: some kernels kill every child later cloned into it. */
static void kill_tree(proc *p, int sig) {
  if (p->cgroup && sig == SIGKILL && sbx_cgroup_kill(p->cgroup) == 0) {
    p->cg_killed = 1;
    return;
  }
  if (!p->exited) sbx_kill_tree(p->pid, sig);
}


/* ---------------------------------------------------------------- output */

/* Keep what fits under the cap; count the rest as truncated. */
static void capture(stream *s, const char *data, size_t n) {
  size_t room = s->max - s->len;
  if (n > room) {
    s->truncated = 1;
    n = room;
  }
  if (n == 0) return;
  if (s->len + n > s->cap) {
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < s->len + n) cap *= 2;
    if (cap > s->max) cap = s->max;
    char *b = realloc(s->buf, cap);
    if (!b) { s->truncated = 1; return; }
    s->buf = b;
    s->cap = cap;
  }
  memcpy(s->buf + s->len, data, n);
  s->len += n;
}

static void enqueue_chunk(proc *p, int which, const char *data, size_t n) {
  chunk *c = malloc(sizeof *c + n);
  if (!c) return;
  c->next = NULL;
  c->which = which;
  c->len = n;
  memcpy(c->data, data, n);
  if (p->qtail) p->qtail->next = c; else p->qhead = c;
  p->qtail = c;
  p->qbytes += n;
}

/* Read what is available, at most `budget` bytes. Returns 1 at EOF. */
static int drain(proc *p, stream *s, size_t budget) {
  char buf[CHUNK];
  int which = (s == &p->out) ? 1 : 2;
  while (budget > 0) {
    ssize_t n = read(s->fd, buf, sizeof buf);
    if (n > 0) {
      capture(s, buf, (size_t)n);
      if (p->streaming) enqueue_chunk(p, which, buf, (size_t)n);
      budget = (size_t)n >= budget ? 0 : budget - (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return 0;
    return 1;                      /* EOF or a read error */
  }
  return 0;
}

static void stream_cb(sbx_watch *w, uint32_t revents) {
  stream *s = (stream *)((char *)w - offsetof(stream, w));
  proc *p = s->owner;
  (void)revents;
  if (drain(p, s, 16 * CHUNK)) stream_close(p, s);
  else if (p->streaming && p->qbytes >= QUEUE_MAX) {
    sbx_watch_stop(p->lp, &s->w);  /* backpressure until read() drains */
    s->paused = 1;
  }
  notify(p);
  unanchor(p);
}

static void resume_streams(proc *p) {
  stream *ss[2] = {&p->out, &p->err};
  for (int i = 0; i < 2; i++)
    if (ss[i]->paused && ss[i]->fd >= 0) {
      ss[i]->paused = 0;
      sbx_watch_set(p->lp, &ss[i]->w, ss[i]->fd, EPOLLIN);
    }
}


/* ----------------------------------------------------------------- stdin */

static void stdin_pump(proc *p) {
  while (p->inoff < p->inlen) {
    ssize_t n = write(p->infd, p->in + p->inoff, p->inlen - p->inoff);
    if (n > 0) { p->inoff += (size_t)n; continue; }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      sbx_watch_set(p->lp, &p->iw, p->infd, EPOLLOUT);
      return;
    }
    stdin_close(p);                /* EPIPE: the reader is gone */
    return;
  }
  p->inoff = p->inlen = 0;
  sbx_watch_stop(p->lp, &p->iw);
  if (p->close_after) stdin_close(p);
}

static void stdin_cb(sbx_watch *w, uint32_t revents) {
  proc *p = (proc *)((char *)w - offsetof(proc, iw));
  (void)revents;
  stdin_pump(p);
  notify(p);
}


/* ------------------------------------------------------------- lifecycle */

static void reap(proc *p, int block) {
  siginfo_t si;
  memset(&si, 0, sizeof si);
  if (p->exited || p->pid <= 0) return;
  if (waitid(P_PIDFD, p->pidfd, &si, WEXITED | (block ? 0 : WNOHANG)) < 0 ||
      si.si_pid == 0)
    return;
  p->exited = 1;
  p->end = sbx_now();
  if (si.si_code == CLD_EXITED) p->code = si.si_status;
  else p->sig = si.si_status;
}

static void after_exit(proc *p) {
  sbx_watch_stop(p->lp, &p->pw);
  sbx_timer_stop(p->lp, &p->tm);
  close(p->pidfd);                 /* reaped: a finished process holds no fd */
  p->pidfd = -1;
  /* Grandchildren may hold the pipes open: take what is there, then stop. */
  stream *ss[2] = {&p->out, &p->err};
  for (int i = 0; i < 2; i++)
    if (ss[i]->fd >= 0) {
      drain(p, ss[i], FINAL_DRAIN);
      stream_close(p, ss[i]);
    }
  stdin_close(p);
  /* Daemons the command left behind keep its cgroup busy: they live on
  ** in the sandbox's cgroup until the sandbox is destroyed. */
  if ((p->timed_out || p->cg_killed) && p->cgroup) {   /* members may still be dying */
    sbx_cgroup_remove(p->cgroup, 1);
    sbx_cgroup_free(p->cgroup);
  } else {
    sbx_cgroup_give(p->cgroup);
  }
  p->cgroup = NULL;
  notify(p);
  unanchor(p);
}

static void exit_cb(sbx_watch *w, uint32_t revents) {
  proc *p = (proc *)((char *)w - offsetof(proc, pw));
  (void)revents;
  reap(p, 0);
  if (p->exited) after_exit(p);
}

static void timeout_cb(sbx_timer *t) {
  proc *p = (proc *)((char *)t - offsetof(proc, tm));
  if (p->exited) return;
  p->timed_out = 1;
  kill_tree(p, SIGKILL);
}

/* Kill what is left and release everything; safe to call twice. */
static void proc_release(proc *p) {
  if (p->closed) return;
  p->closed = 1;
  if (p->job) {                    /* its child is killed when it is back */
    p->job->owner = NULL;
    p->job->cgroup = p->cgroup;
    p->cgroup = NULL;
    p->job = NULL;
  }
  if (p->pid > 0 && !p->exited) {
    kill_tree(p, SIGKILL);
    reap(p, 1);
    if (p->cgroup) sbx_cgroup_remove(p->cgroup, 1);
  }
  sbx_watch_stop(p->lp, &p->pw);
  sbx_timer_stop(p->lp, &p->tm);
  stream_close(p, &p->out);
  stream_close(p, &p->err);
  stdin_close(p);
  if (p->pidfd >= 0) close(p->pidfd);
  p->pidfd = -1;
  sbx_cgroup_free(p->cgroup);
  p->cgroup = NULL;
  free(p->out.buf);
  free(p->err.buf);
  p->out.buf = p->err.buf = NULL;
  while (p->qhead) {
    chunk *c = p->qhead;
    p->qhead = c->next;
    free(c);
  }
  p->qtail = NULL;
  notify(p);                       /* waiters see the close and raise */
  if (p->selfref != LUA_NOREF) {
    luaL_unref(sbx_loop_main(p->lp), LUA_REGISTRYINDEX, p->selfref);
    p->selfref = LUA_NOREF;
  }
}


/* ----------------------------------------------------------------- spawn */

/* The child runs (p->pid, p->pidfd): watch its pipes and its exit. */
static void proc_started(proc *p) {
  p->pidfd = sbx_fd_park(p->pidfd);   /* long-lived: out of the children's way */
  p->out.w.cb = p->err.w.cb = stream_cb;
  sbx_watch_set(p->lp, &p->out.w, p->out.fd, EPOLLIN);
  sbx_watch_set(p->lp, &p->err.w, p->err.fd, EPOLLIN);
  p->pw.cb = exit_cb;
  sbx_watch_set(p->lp, &p->pw, p->pidfd, EPOLLIN);
  p->iw.cb = stdin_cb;
  if (p->timeout > 0) {
    p->tm.cb = timeout_cb;
    sbx_timer_start(p->lp, &p->tm, p->timeout);
  }
  if (p->pump) stdin_pump(p);
}

/* A job back from a spawner thread, on the loop thread. Its owner gone
** (closed, or the spawn's task cancelled) or the loop closing: the child
** is killed and reaped here, as proc_release would have done. */
static void job_done(sbx_spawn_job *j) {
  proc *p = j->owner;
  if (p && j->q) {
    p->job = NULL;
    if (j->pid < 0) {
      p->spawn_err = j->err;
      p->spawn_stage = j->r.stage;
    } else {
      p->pid = j->pid;
      p->pidfd = j->pidfd;
      proc_started(p);
    }
    /* a task cancelled meanwhile is no longer waiting: its continuation
    ** sees the wait undone and releases the started child */
    if (p->spawnw && p->spawnw->task) sbx_wake(p->lp, p->spawnw);
    p->spawnw = NULL;
    sbx_job_free(j);
    return;
  }
  if (p) {
    p->job = NULL;
    p->spawn_err = ECANCELED;
  }
  if (j->pid > 0) {
    siginfo_t si;
    if (!j->cgroup || sbx_cgroup_kill(j->cgroup) != 0) sbx_kill_tree(j->pid, SIGKILL);
    waitid(P_PIDFD, j->pidfd, &si, WEXITED);
    close(j->pidfd);
    if (j->cgroup) sbx_cgroup_remove(j->cgroup, 1);
  }
  sbx_job_free(j);
}

static const char *spawn_what(lua_State *L, int stage, const char *cwd, const char *argv0) {
  return stage == 1 ? lua_pushfstring(L, "cwd %s", cwd) : stage == 2 ? argv0
       : stage == 3 ? "setrlimit" : stage == 4 ? "fds" : stage == 5 ? "cgroup" : stage == 6 ? "setns" : "clone3";
}

/* stack: options, argv, env, cwd, stdin, proc, waiter */
static int spawn_k(lua_State *L, int status, lua_KContext ctx) {
  proc *p = (proc *)ctx;
  sbx_waiter *w = lua_touserdata(L, 7);
  (void)status;
  if (!w->done) {                  /* cancelled while the job was out */
    p->spawnw = NULL;
    sbx_unwait(p->lp, w);
    proc_release(p);
    return sbx_raise_cancelled(L);
  }
  if (p->pid <= 0) {
    int e = p->spawn_err, stage = p->spawn_stage;
    proc_release(p);
    return sbx_fail_errno(L, "spawn", spawn_what(L, stage, lua_tostring(L, 4),
                                                 ((char **)lua_touserdata(L, 2))[0]), e);
  }
  lua_settop(L, 6);
  return 1;
}

/* Whether this spawn goes to a spawner thread (see spawner.h). */
static int use_spawner(lua_State *L) {
  int busy = sbx_loop_busy(L);
  if (busy < 0) return 0;
  switch (sbx_spawner_mode(L, -1)) {
    case SBX_SPAWNER_INLINE: return 0;
    case SBX_SPAWNER_THREAD: return 1;
    default: return busy || sbx_spawner_inflight(L) > 0;
  }
}

/* Hand the prepared spawn to a spawner thread, which takes the child's
** ends of the fds; 0, or -1 when no thread can take it (nothing moved). */
static int spawn_offload(lua_State *L, proc *p, sbx_spawn_req *r, int fds[4][2]) {
  if (sbx_spawner_start(L) < 0) return -1;   /* then the submit cannot fail */
  sbx_spawn_job *j = sbx_job_new(r);  /* r->cgroup_fd: p->cgroup's, which outlives the job */
  if (!j) return -1;
  /* While it waits, the child's ends stay out of the low numbers that
  ** other children copy (see spawn.c's top); the spawner lowers them. */
  int *slots[SBX_JOB_MAXFDS];
  for (int i = 0, n = sbx_job_fds(j, slots); i < n; i++)
    j->close[j->nclose++] = *slots[i] = sbx_fd_keep(*slots[i]);
  j->owner = p;
  j->done = job_done;
  sbx_spawner_submit(L, j);
  p->job = j;
  fds[0][1] = fds[1][1] = fds[2][0] = -1;
  return 0;
}


/* proc.which(name, [PATH]) -> path | nil */
static int proc_which(lua_State *L) {
  char buf[4096];
  const char *name = luaL_checkstring(L, 1);
  const char *envp[2] = {NULL, NULL};
  if (!lua_isnoneornil(L, 2))
    envp[0] = lua_pushfstring(L, "PATH=%s", luaL_checkstring(L, 2));
  if (sbx_find_program(name, sbx_env_path((char *const *)envp), buf, sizeof buf) != 0)
    return 0;
  lua_pushstring(L, buf);
  return 1;
}

static char **string_list(lua_State *L, int t, const char *field, int env) {
  lua_getfield(L, t, field);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lua_newtable(L);
  }
  luaL_argcheck(L, lua_istable(L, -1), 1, lua_pushfstring(L, "'%s' must be a list of strings", field));
  int n = (int)luaL_len(L, -1);
  char **list = lua_newuserdatauv(L, (n + 1) * sizeof *list, 0);
  for (int i = 1; i <= n; i++) {
    size_t len;
    int isstr = lua_rawgeti(L, -2, i) == LUA_TSTRING;
    const char *s = isstr ? lua_tolstring(L, -1, &len) : NULL;
    if (!s || strlen(s) != len)
      luaL_error(L, "%s[%d] must be a string without NUL bytes", field, i);
    if (env && (s[0] == '=' || !strchr(s, '=')))
      luaL_error(L, "env[%d] must look like NAME=VALUE: %s", i, s);
    list[i - 1] = (char *)s;       /* anchored by the options table */
    lua_pop(L, 1);
  }
  list[n] = NULL;
  lua_replace(L, -2);              /* keep the box on the stack */
  return list;
}

static int open_pipe(int fds[2], int nonblock_end) {
  /* out of fds: the ones kept with empty cgroups are ours to give back */
  if (pipe2(fds, O_CLOEXEC) < 0 && (errno != EMFILE || sbx_cgroup_trim() == 0 ||
                                    pipe2(fds, O_CLOEXEC) < 0))
    return -1;
  fcntl(fds[nonblock_end], F_SETFL, O_NONBLOCK);
  return 0;
}

static void close_pair(int fds[2]) {
  if (fds[0] >= 0) close(fds[0]);
  if (fds[1] >= 0) close(fds[1]);
  fds[0] = fds[1] = -1;
}

static int spawn_failed(lua_State *L, proc *p, int fds[4][2], int err,
                        const char *what) {
  for (int i = 0; i < 4; i++) close_pair(fds[i]);
  proc_release(p);
  return sbx_fail_errno(L, "spawn", what, err);
}

/* resource names for proc.spawn's rlimits = { name = value } */
static const struct { const char *name; int resource; } rlimit_names[] = {
  {"as", RLIMIT_AS}, {"core", RLIMIT_CORE}, {"cpu", RLIMIT_CPU},
  {"data", RLIMIT_DATA}, {"fsize", RLIMIT_FSIZE}, {"nofile", RLIMIT_NOFILE},
  {"nproc", RLIMIT_NPROC}, {"stack", RLIMIT_STACK}};
#define NRLIMITS (int)(sizeof rlimit_names / sizeof *rlimit_names)

/* rlimits = { name = integer } at the top of the stack -> lims; count */
static int rlimit_list(lua_State *L, sbx_rlimit *lims) {
  int n = 0;
  if (lua_isnil(L, -1)) return 0;
  luaL_argcheck(L, lua_istable(L, -1), 1, "'rlimits' must be a table");
  for (int i = 0; i < NRLIMITS; i++) {
    lua_getfield(L, -1, rlimit_names[i].name);
    if (!lua_isnil(L, -1)) {
      int isint;
      lua_Integer v = lua_tointegerx(L, -1, &isint);
      if (!isint || v < 0)
        luaL_error(L, "rlimits.%s must be an integer >= 0", rlimit_names[i].name);
      lims[n].resource = rlimit_names[i].resource;
      lims[n++].value = (unsigned long long)v;
    }
    lua_pop(L, 1);
  }
  lua_pushnil(L);                  /* no unknown names */
  while (lua_next(L, -2)) {
    int known = 0;
    for (int i = 0; i < NRLIMITS && lua_type(L, -2) == LUA_TSTRING; i++)
      known |= strcmp(lua_tostring(L, -2), rlimit_names[i].name) == 0;
    if (!known) luaL_error(L, "rlimits: unknown limit %s", luaL_tolstring(L, -2, NULL));
    lua_pop(L, 1);
  }
  return n;
}

/* fds = { data, ... } at the top of the stack: each string (<= 64 KiB)
** will be readable to its end on fd 3, 4, ... of the child. */
static int data_list(lua_State *L, const char **data, size_t *len) {
  if (lua_isnil(L, -1)) return 0;
  luaL_argcheck(L, lua_istable(L, -1), 1, "'fds' must be a list of strings");
  int n = (int)luaL_len(L, -1);
  luaL_argcheck(L, n <= SBX_SPAWN_MAXFDS, 1, "at most 8 'fds'");
  for (int i = 0; i < n; i++) {
    if (lua_rawgeti(L, -1, i + 1) != LUA_TSTRING)
      luaL_error(L, "fds[%d] must be a string", i + 1);
    data[i] = lua_tolstring(L, -1, &len[i]);  /* anchored by the options */
    if (len[i] > 65536) luaL_error(L, "fds[%d] is longer than 64 KiB", i + 1);
    lua_pop(L, 1);
  }
  return n;
}

/* Pipes holding data (the write ends closed): 0, or -1 with errno. */
static int data_pipes(const char **data, const size_t *len, int n, int *out) {
  int pp[2] = {-1, -1};
  for (int i = 0; i < n; i++) out[i] = -1;
  for (int i = 0; i < n; i++) {
    if (pipe2(pp, O_CLOEXEC) < 0) goto fail;
    out[i] = pp[0];
    fcntl(pp[1], F_SETFL, O_NONBLOCK);   /* a full pipe fails, never hangs */
    for (size_t off = 0; off < len[i];) {
      ssize_t w = write(pp[1], data[i] + off, len[i] - off);
      if (w < 0 && errno != EINTR) goto fail;
      if (w > 0) off += (size_t)w;
    }
    close(pp[1]);
    pp[1] = -1;
  }
  return 0;
fail:;
  int e = errno;
  if (pp[1] >= 0) close(pp[1]);
  for (int i = 0; i < n; i++)
    if (out[i] >= 0) close(out[i]);
  errno = e;
  return -1;
}

/* join = { path, ... } (cgroup.procs files), or setns = { path, ... }
** (namespace files), at the top of the stack: checked and popped; the count. */
#define MAXJOIN 4
static int join_check(lua_State *L) {
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return 0;
  }
  luaL_argcheck(L, lua_istable(L, -1), 1, "'join' and 'setns' must be lists of paths");
  int n = (int)luaL_len(L, -1);
  luaL_argcheck(L, n <= MAXJOIN, 1, "at most 4 'join' or 'setns' paths");
  for (int i = 0; i < n; i++) {
    if (lua_rawgeti(L, -1, i + 1) != LUA_TSTRING) luaL_error(L, "join and setns paths must be strings");
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return n;
}

/* Open the n checked paths of field `f` of options table 1 with `flags`:
** 0, or -1 with errno. */
static int join_open(lua_State *L, const char *f, int flags, int n, int *out) {
  lua_getfield(L, 1, f);
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, -1, i + 1);
    out[i] = open(lua_tostring(L, -1), flags | O_CLOEXEC);
    lua_pop(L, 1);
    if (out[i] < 0) {
      int e = errno;
      while (i > 0) close(out[--i]);
      lua_pop(L, 1);
      errno = e;
      return -1;
    }
  }
  lua_pop(L, 1);
  return 0;
}

/* proc.spawn{argv=, env=, cwd=, stdin=, keep_stdin=, max_output=,
**            stream=, timeout=, cgroup=, join=, fds=, rlimits=, setns=}
** setns: namespace files (/proc/<pid>/ns/...) the child enters first
**   -> Proc | nil, msg, code */
static int proc_spawn(lua_State *L) {
  char path[4096];
  int fds[4][2] = {{-1, -1}, {-1, -1}, {-1, -1}, {-1, -1}};
  sbx_spawn_req r;
  memset(&r, 0, sizeof r);
  size_t inlen = 0;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  char **argv = string_list(L, 1, "argv", 0);     /* 2 */
  char **envp = string_list(L, 1, "env", 1);      /* 3 */
  r.argv = argv;
  r.envp = envp;
  luaL_argcheck(L, r.argv[0] != NULL, 1, "argv must not be empty");
  lua_getfield(L, 1, "cwd");                      /* 4 */
  const char *cwd = luaL_optstring(L, -1, NULL);
  lua_getfield(L, 1, "stdin");                    /* 5 */
  const char *in = luaL_optlstring(L, -1, NULL, &inlen);
  lua_getfield(L, 1, "keep_stdin");
  int keep = lua_toboolean(L, -1);
  lua_getfield(L, 1, "stream");
  int streaming = lua_toboolean(L, -1);
  lua_getfield(L, 1, "max_output");
  lua_Integer max = luaL_optinteger(L, -1, 1 << 20);
  luaL_argcheck(L, max >= 0, 1, "max_output must be >= 0");
  lua_getfield(L, 1, "timeout");
  double timeout = luaL_optnumber(L, -1, 0);
  luaL_argcheck(L, timeout >= 0 && timeout == timeout, 1, "timeout must be >= 0");
  lua_getfield(L, 1, "cgroup");
  const char *cgparent = luaL_optstring(L, -1, NULL);
  const char *xdata[SBX_SPAWN_MAXFDS];
  size_t xlen[SBX_SPAWN_MAXFDS];
  int xfd[SBX_SPAWN_MAXFDS];
  lua_getfield(L, 1, "join");
  int njoin = join_check(L);
  lua_getfield(L, 1, "setns");
  int nns = join_check(L);
  lua_getfield(L, 1, "fds");
  int nx = data_list(L, xdata, xlen);
  sbx_rlimit lims[NRLIMITS];
  lua_getfield(L, 1, "rlimits");
  r.nrlimits = rlimit_list(L, lims);
  r.rlimits = lims;
  lua_settop(L, 5);

  proc *p = lua_newuserdatauv(L, sizeof *p, 0);   /* 6, closed until ready */
  memset(p, 0, sizeof *p);
  p->closed = 1;
  p->lp = sbx_loop_get(L);
  p->pidfd = p->infd = p->out.fd = p->err.fd = -1;
  p->selfref = LUA_NOREF;
  p->tm.idx = -1;
  p->out.owner = p->err.owner = p;
  luaL_setmetatable(L, PROC_MT);
  p->closed = 0;

  int e = sbx_find_program(argv[0], sbx_env_path(envp), path, sizeof path);
  if (e) return spawn_failed(L, p, fds, e, argv[0]);
  if (cgparent && (e = sbx_cgroup_take(cgparent, &p->cgroup)) != 0)
    return spawn_failed(L, p, fds, e, cgparent);
  if (open_pipe(fds[0], 0) < 0 || open_pipe(fds[1], 0) < 0 ||
      ((in || keep) && open_pipe(fds[2], 1) < 0))
    return spawn_failed(L, p, fds, errno, "pipe");
  /* the command's cgroup directory: kept open with the cgroup (proctree.c) */
  int offload = use_spawner(L), cgfd = -1;
  if (p->cgroup && (cgfd = sbx_cgroup_dirfd(p->cgroup)) < 0)
    return spawn_failed(L, p, fds, errno, p->cgroup);

  r.path = path;
  r.cwd = cwd;
  r.in = fds[2][0];
  r.out = fds[0][1];
  r.err = fds[1][1];
  r.cgroup_fd = cgfd;
  if (data_pipes(xdata, xlen, nx, xfd) < 0) {
    e = errno;
    return spawn_failed(L, p, fds, e, "fds");
  }
  r.fds = xfd;
  r.nfds = nx;
  int jfd[MAXJOIN];
  int nsfd[MAXJOIN];
  const char *what = "cgroup (join)";
  if (join_open(L, "join", O_WRONLY, njoin, jfd) < 0 ||
      (what = "setns (open)", join_open(L, "setns", O_RDONLY, nns, nsfd) < 0)) {
    e = errno;
    if (what[0] == 's') for (int i = 0; i < njoin; i++) close(jfd[i]);
    for (int i = 0; i < nx; i++) close(xfd[i]);
    return spawn_failed(L, p, fds, e, what);
  }
  r.join_fds = jfd;
  r.njoin = njoin;
  r.ns_fds = nsfd;
  r.nns = nns;
  p->out.max = p->err.max = (size_t)max;
  p->streaming = streaming;
  p->timeout = timeout;
  p->start = sbx_now();
  int offloaded = offload && spawn_offload(L, p, &r, fds) == 0;
  pid_t pid = 0;
  if (!offloaded) {
    pid = sbx_spawn(&r, &p->pidfd);
    e = errno;
    for (int i = 0; i < nx; i++) close(xfd[i]);
    for (int i = 0; i < r.njoin; i++) close(jfd[i]);
    for (int i = 0; i < r.nns; i++) close(nsfd[i]);
    if (pid < 0) return spawn_failed(L, p, fds, e, spawn_what(L, r.stage, cwd, argv[0]));
    p->pid = pid;
    close(fds[0][1]); fds[0][1] = -1;
    close(fds[1][1]); fds[1][1] = -1;
    if (fds[2][0] >= 0) { close(fds[2][0]); fds[2][0] = -1; }
  }

  int (*park)(int) = offloaded ? sbx_fd_keep : sbx_fd_park;
  p->out.fd = park(fds[0][0]);
  p->err.fd = park(fds[1][0]);
  p->infd = park(fds[2][1]);  /* (-1, no stdin pipe, stays -1) */
  fds[0][0] = fds[1][0] = fds[2][1] = -1;
  lua_pushvalue(L, 6);
  p->selfref = luaL_ref(L, LUA_REGISTRYINDEX);
  if (in) {
    p->close_after = !keep;
    if (inlen > 0 && (p->in = malloc(inlen)) != NULL) {
      memcpy(p->in, in, inlen);
      p->inlen = inlen;
    }
    p->pump = 1;
  }
  lua_settop(L, 6);
  if (!offloaded) {
    proc_started(p);
    return 1;
  }
  sbx_waiter *w = lua_newuserdatauv(L, sizeof *w, 0);   /* 7 */
  memset(w, 0, sizeof *w);
  p->spawnw = w;
  return sbx_await(L, w, (lua_KContext)p, spawn_k);
}


/* -------------------------------------------------------------- methods */

static proc *check_proc(lua_State *L) {
  proc *p = luaL_checkudata(L, 1, PROC_MT);
  if (p->closed) luaL_error(L, "attempt to use a closed process");
  return p;
}

/* Suspend until the process changes state, then call k again. */
static int wait_change(lua_State *L, proc *p, lua_KFunction k) {
  sbx_waiter *w = lua_newuserdatauv(L, sizeof *w, 0);
  memset(w, 0, sizeof *w);
  w->next = p->waiters;
  p->waiters = w;
  lua_replace(L, 2);               /* stack: proc, waiter */
  return sbx_await(L, w, (lua_KContext)p, k);
}

static int cancelled(lua_State *L, proc *p) {
  sbx_waiter *w = lua_touserdata(L, 2);
  if (w && !w->done) {
    forget_waiter(p, w);
    return 1;
  }
  return 0;
}

static const char *signame(int sig) {
  static char buf[32];
  const char *abbrev = sigabbrev_np(sig);
  if (!abbrev) return "SIGUNKNOWN";
  snprintf(buf, sizeof buf, "SIG%s", abbrev);
  return buf;
}

static int push_result(lua_State *L, proc *p) {
  lua_createtable(L, 0, 7);
  lua_pushlstring(L, p->out.buf ? p->out.buf : "", p->out.len);
  lua_setfield(L, -2, "stdout");
  lua_pushlstring(L, p->err.buf ? p->err.buf : "", p->err.len);
  lua_setfield(L, -2, "stderr");
  if (p->sig) {
    lua_pushstring(L, signame(p->sig));
    lua_setfield(L, -2, "signal");
  } else {
    lua_pushinteger(L, p->code);
    lua_setfield(L, -2, "exit_code");
  }
  lua_pushboolean(L, p->timed_out);
  lua_setfield(L, -2, "timed_out");
  lua_pushboolean(L, p->out.truncated || p->err.truncated);
  lua_setfield(L, -2, "truncated");
  lua_pushinteger(L, (lua_Integer)((p->end - p->start) * 1000.0 + 0.5));
  lua_setfield(L, -2, "duration_ms");
  return 1;
}

static int wait_k(lua_State *L, int status, lua_KContext ctx) {
  proc *p = (proc *)ctx;
  (void)status;
  if (cancelled(L, p)) {
    kill_tree(p, SIGKILL);
    return sbx_raise_cancelled(L);
  }
  if (p->closed) return luaL_error(L, "the process was closed while waiting");
  if (!finished(p)) return wait_change(L, p, wait_k);
  return push_result(L, p);
}

/* proc:wait() -> result; chunks not yet read() are dropped from the queue */
static int proc_wait(lua_State *L) {
  proc *p = check_proc(L);
  lua_settop(L, 1);
  lua_pushnil(L);
  sbx_check_cancel(L);
  if (p->streaming) {              /* nobody reads chunks any more */
    p->streaming = 0;
    while (p->qhead) {
      chunk *c = p->qhead;
      p->qhead = c->next;
      free(c);
    }
    p->qtail = NULL;
    p->qbytes = 0;
    resume_streams(p);
  }
  return wait_k(L, LUA_OK, (lua_KContext)p);
}

static int read_k(lua_State *L, int status, lua_KContext ctx) {
  proc *p = (proc *)ctx;
  (void)status;
  if (cancelled(L, p)) return sbx_raise_cancelled(L);
  if (p->closed) return 0;
  if (p->qhead) {
    chunk *c = p->qhead;
    p->qhead = c->next;
    if (!p->qhead) p->qtail = NULL;
    p->qbytes -= c->len;
    lua_pushstring(L, c->which == 1 ? "stdout" : "stderr");
    lua_pushlstring(L, c->data, c->len);
    free(c);
    if (p->qbytes < QUEUE_MAX / 2) resume_streams(p);
    return 2;
  }
  if (finished(p) || !p->streaming) return 0;
  return wait_change(L, p, read_k);
}

/* proc:read() -> "stdout"|"stderr", chunk | nil at the end (stream mode) */
static int proc_read(lua_State *L) {
  proc *p = check_proc(L);
  lua_settop(L, 1);
  lua_pushnil(L);
  sbx_check_cancel(L);
  return read_k(L, LUA_OK, (lua_KContext)p);
}

static int write_k(lua_State *L, int status, lua_KContext ctx) {
  proc *p = (proc *)ctx;
  (void)status;
  if (cancelled(L, p)) return sbx_raise_cancelled(L);
  if (p->infd < 0)
    return sbx_fail(L, "write", "stdin is closed (the process may have "
                                 "exited)", "EPIPE");
  if (p->inoff < p->inlen) return wait_change(L, p, write_k);
  lua_pushboolean(L, 1);
  return 1;
}

/* proc:write(data) -> true | nil, msg, code; waits until the pipe took it */
static int proc_write(lua_State *L) {
  proc *p = check_proc(L);
  size_t n;
  const char *data = luaL_checklstring(L, 2, &n);
  sbx_check_cancel(L);
  if (p->infd < 0 || p->close_after)
    return sbx_fail(L, "write", "stdin is closed", "EPIPE");
  char *buf = realloc(p->in, p->inlen + n);
  if (!buf) return sbx_fail_errno(L, "write", NULL, ENOMEM);
  memcpy(buf + p->inlen, data, n);
  p->in = buf;
  p->inlen += n;
  stdin_pump(p);
  lua_settop(L, 1);
  lua_pushnil(L);
  return write_k(L, LUA_OK, (lua_KContext)p);
}

/* proc:close_stdin() */
static int proc_close_stdin(lua_State *L) {
  proc *p = check_proc(L);
  p->close_after = 1;
  if (p->infd >= 0 && p->inoff >= p->inlen) stdin_close(p);
  return 0;
}

/* proc:kill([signal]) -- SIGKILL (default) takes the whole tree */
static int proc_kill(lua_State *L) {
  proc *p = check_proc(L);
  int sig = (int)luaL_optinteger(L, 2, SIGKILL);
  luaL_argcheck(L, sig > 0 && sig < NSIG, 2, "invalid signal number");
  if (!p->exited) kill_tree(p, sig);
  return 0;
}

/* proc:expire(): the caller's deadline passed: kill the tree, timed_out */
static int proc_expire(lua_State *L) {
  proc *p = check_proc(L);
  if (!p->exited) {
    p->timed_out = 1;
    kill_tree(p, SIGKILL);
  }
  return 0;
}

/* proc:running() -> boolean */
static int proc_running(lua_State *L) {
  proc *p = check_proc(L);
  lua_pushboolean(L, !p->exited);
  return 1;
}

/* proc:close(): kill whatever is left and free everything (idempotent) */
static int proc_close(lua_State *L) {
  proc *p = luaL_checkudata(L, 1, PROC_MT);
  proc_release(p);
  return 0;
}

static int proc_tostring(lua_State *L) {
  proc *p = luaL_checkudata(L, 1, PROC_MT);
  lua_pushfstring(L, "sbx.Proc (pid %d%s)", (int)p->pid,
                  p->closed ? ", closed" : p->exited ? ", exited" : "");
  return 1;
}

static int proc_index(lua_State *L) {
  proc *p = luaL_checkudata(L, 1, PROC_MT);
  const char *k = luaL_checkstring(L, 2);
  if (strcmp(k, "pid") == 0) {
    lua_pushinteger(L, p->pid);
    return 1;
  }
  lua_getmetatable(L, 1);
  lua_getfield(L, -1, "methods");
  lua_getfield(L, -1, k);
  return 1;
}

static const luaL_Reg proc_methods[] = {
  {"wait", proc_wait},
  {"read", proc_read},
  {"write", proc_write},
  {"close_stdin", proc_close_stdin},
  {"kill", proc_kill},
  {"running", proc_running},
  {"expire", proc_expire},
  {"close", proc_close},
  {NULL, NULL}
};

/* proc.random_hex(n) -> n hex digits from the kernel's random pool (ids
** must not repeat across processes started in the same instant) */
static int proc_random_hex(lua_State *L) {
  static const char digits[] = "0123456789abcdef";
  unsigned char raw[64];
  char out[128];
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n > 0 && n <= 128, 1, "between 1 and 128 digits");
  size_t bytes = (size_t)(n + 1) / 2, got = 0;
  while (got < bytes) {
    ssize_t r = getrandom(raw + got, bytes - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return luaL_error(L, "getrandom: %s", strerror(errno));
    got += (size_t)r;
  }
  for (lua_Integer i = 0; i < n; i++)
    out[i] = digits[(raw[i / 2] >> (i % 2 ? 0 : 4)) & 15];
  lua_pushlstring(L, out, (size_t)n);
  return 1;
}

/* proc.spawner([mode]) -> {mode=, threads=, jobs=, inflight=,
** fds_copied_max=, fds_copied_mean=, whole_table=}: where this loop spawns
** ("auto", "inline", "thread"; see spawner.h), the pool's threads and the
** jobs they have taken so far, and what children's fd tables cost
** (spawn.c): the most fd slots one child has copied, their mean over the
** children, and whether children copy the whole table instead. */
static int proc_spawner(lua_State *L) {
  static const char *const modes[] = {"auto", "inline", "thread", NULL};
  int set = lua_isnoneornil(L, 1) ? -1 : luaL_checkoption(L, 1, NULL, modes);
  int mode = sbx_spawner_mode(L, set), threads;
  long jobs;
  sbx_spawner_stats(&threads, &jobs);
  lua_createtable(L, 0, 7);
  lua_pushstring(L, modes[mode]);
  lua_setfield(L, -2, "mode");
  lua_pushinteger(L, threads);
  lua_setfield(L, -2, "threads");
  lua_pushinteger(L, jobs);
  lua_setfield(L, -2, "jobs");
  lua_pushinteger(L, sbx_spawner_inflight(L));
  lua_setfield(L, -2, "inflight");
  int copied, whole;
  double mean;
  sbx_spawn_copy_stats(&copied, &mean, &whole);
  lua_pushinteger(L, copied);
  lua_setfield(L, -2, "fds_copied_max");
  lua_pushnumber(L, mean);
  lua_setfield(L, -2, "fds_copied_mean");
  lua_pushboolean(L, whole);
  lua_setfield(L, -2, "whole_table");
  return 1;
}

/* proc.getpid() -> sbxlua's own pid */
static int proc_getpid(lua_State *L) {
  lua_pushinteger(L, getpid());
  return 1;
}

/* proc.uname() -> the host's kernel name ("Linux", "Darwin"), its machine
** ("x86_64") and its host name (nodename) */
static int proc_uname(lua_State *L) {
  struct utsname u;
  if (uname(&u) != 0) return sbx_fail_errno(L, "uname", NULL, errno);
  lua_pushstring(L, u.sysname);
  lua_pushstring(L, u.machine);
  lua_pushstring(L, u.nodename);
  return 3;
}

/* proc.setenv(name, value | nil) -> true | nil, msg: this process's own
** environment (children get the env their spawn names, never this one).
** For setup before any thread that reads the environment runs: a spec
** pointing a provider at its stand-in, as a user's shell would. */
static int proc_setenv(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  const char *value = luaL_optstring(L, 2, NULL);
  if (!*name || strchr(name, '=')) return luaL_argerror(L, 1, "not a variable name");
  int rc = value ? setenv(name, value, 1) : unsetenv(name);
  if (rc != 0) return sbx_fail_errno(L, "setenv", NULL, errno);
  lua_pushboolean(L, 1);
  return 1;
}

static const luaL_Reg proc_funcs[] = {
  {"getpid", proc_getpid},
  {"uname", proc_uname},
  {"setenv", proc_setenv},
  {"random_hex", proc_random_hex},
  {"spawn", proc_spawn},
  {"spawner", proc_spawner},
  {"which", proc_which},
  {NULL, NULL}
};

int luaopen_sbx_proc(lua_State *L) {
  if (luaL_newmetatable(L, PROC_MT)) {
    luaL_newlib(L, proc_methods);
    lua_setfield(L, -2, "methods");
    lua_pushcfunction(L, proc_index);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, proc_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, proc_close);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, proc_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  luaL_newlib(L, proc_funcs);
  return 1;
}
