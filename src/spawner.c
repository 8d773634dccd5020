/*
** Spawner threads (see spawner.h). The pool is the process's: a few
** threads, started on the first job, that never exit, so that a child's
** PR_SET_PDEATHSIG (which follows the thread that cloned it) fires only
** when sbxlua itself dies. They start with every signal blocked, so no
** handler of sbxlua's ever runs in a child still borrowing our memory, and
** the child unblocks what it needs after resetting the handlers. Each loop
** has its own queue of finished jobs (a userdata in the registry) and an
** eventfd it watches only while jobs are out, so an idle loop still sees
** that nothing is left to wait for.
*/
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "lauxlib.h"
#include "loop.h"
#include "proctree.h"
#include "spawner.h"

#define SPAWNQ_MT "sbx.SpawnQueue"
#define MAX_THREADS 8

typedef struct sbx_spawnq {
  pthread_mutex_t mu;
  pthread_cond_t idle;             /* signalled when `out` drops to 0 */
  sbx_spawn_job *done;             /* finished jobs, newest first (mu) */
  int out;                         /* jobs with the threads (mu) */
  int inflight;                    /* loop thread only: handed out, not done */
  int efd;                         /* opened with the first job */
  int mode;                        /* SBX_SPAWNER_AUTO, _INLINE, _THREAD */
  sbx_watch w;
  sbx_loop *lp;
} sbx_spawnq;

static int spawnq_key;

/* The pool: jobs to spawn, the threads that take them. */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_cv = PTHREAD_COND_INITIALIZER;
static sbx_spawn_job *pool_head, *pool_tail;
static int pool_threads;
static long pool_jobs;


/* ------------------------------------------------------------------ jobs */

static size_t list_size(char *const *v, int *n) {
  size_t s = 0;
  *n = 0;
  for (; v && v[*n]; (*n)++) s += strlen(v[*n]) + 1;
  return s;
}

static char *put(char **at, const char *s) {
  size_t n = strlen(s) + 1;
  char *d = memcpy(*at, s, n);
  *at += n;
  return d;
}

sbx_spawn_job *sbx_job_new(const sbx_spawn_req *r) {
  int na, ne;
  size_t bytes = list_size(r->argv, &na) + list_size(r->envp, &ne) +
                 strlen(r->path) + 1 + (r->cwd ? strlen(r->cwd) + 1 : 0) +
                 (r->oom_score_adj ? strlen(r->oom_score_adj) + 1 : 0);
  size_t ptrs = (size_t)(na + ne + 2) * sizeof(char *);
  sbx_spawn_job *j = calloc(1, sizeof *j + (r->ignored ? sizeof(sigset_t) : 0));
  char *block = malloc(ptrs + bytes);
  if (!j || !block || r->nfds > SBX_SPAWN_MAXFDS || r->njoin > 4 || r->nns > 4 || r->nrlimits > 8) {
    free(j);
    free(block);
    errno = ENOMEM;
    return NULL;
  }
  char **argv = (char **)block, **envp = argv + na + 1;
  char *at = block + ptrs;
  j->r = *r;
  for (int i = 0; i < na; i++) argv[i] = put(&at, r->argv[i]);
  argv[na] = NULL;
  for (int i = 0; i < ne; i++) envp[i] = put(&at, r->envp[i]);
  envp[ne] = NULL;
  j->r.argv = argv;
  j->r.envp = envp;
  j->r.path = put(&at, r->path);
  j->r.cwd = r->cwd ? put(&at, r->cwd) : NULL;
  j->r.oom_score_adj = r->oom_score_adj ? put(&at, r->oom_score_adj) : NULL;
  memcpy(j->fdv, r->fds, (size_t)r->nfds * sizeof *r->fds);
  memcpy(j->joinv, r->join_fds, (size_t)r->njoin * sizeof *r->join_fds);
  if (r->nns) memcpy(j->nsv, r->ns_fds, (size_t)r->nns * sizeof *r->ns_fds);
  memcpy(j->limv, r->rlimits, (size_t)r->nrlimits * sizeof *r->rlimits);
  j->r.fds = j->fdv;
  j->r.join_fds = j->joinv;
  j->r.ns_fds = j->nsv;
  j->r.rlimits = j->limv;
  if (r->ignored) {
    sigset_t *ign = (sigset_t *)(j + 1);
    *ign = *r->ignored;
    j->r.ignored = ign;
  }
  j->strings = block;
  j->pid = -1;
  j->pidfd = -1;
  return j;
}

void sbx_job_free(sbx_spawn_job *j) {
  if (!j) return;
  free(j->strings);
  sbx_cgroup_free(j->cgroup);
  free(j);
}


/* --------------------------------------------------------------- threads */

int sbx_job_fds(sbx_spawn_job *j, int *slots[SBX_JOB_MAXFDS]) {
  int n = 0;
  int *ends[] = {&j->r.in, &j->r.out, &j->r.err};
  for (int i = 0; i < 3; i++)
    if (*ends[i] >= 0) slots[n++] = ends[i];
  int *lists[] = {j->fdv, j->joinv, j->nsv};
  const int counts[] = {j->r.nfds, j->r.njoin, j->r.nns};
  for (int l = 0; l < 3; l++)
    for (int i = 0; i < counts[l]; i++) slots[n++] = &lists[l][i];
  return n;
}

/* The child's ends come parked (spawn_offload): low copies for the clone,
** closed with the rest after it (see spawn.c's top). */
static void lower_fds(sbx_spawn_job *j) {
  int *slots[SBX_JOB_MAXFDS];
  for (int i = 0, n = sbx_job_fds(j, slots); i < n; i++) {
    int low = sbx_fd_lowered(*slots[i]);
    if (low >= 0) *slots[i] = j->close[j->nclose++] = low;
  }
}

static void *spawner_main(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&pool_mu);
    while (!pool_head) pthread_cond_wait(&pool_cv, &pool_mu);
    sbx_spawn_job *j = pool_head;
    pool_head = j->next;
    if (!pool_head) pool_tail = NULL;
    pool_jobs++;
    pthread_mutex_unlock(&pool_mu);

    lower_fds(j);
    j->pid = sbx_spawn(&j->r, &j->pidfd);
    j->err = j->pid < 0 ? errno : 0;
    /* finished jobs can wait a while for a busy loop: their pidfds too */
    if (j->pid > 0) j->pidfd = sbx_fd_keep(j->pidfd);
    for (int i = 0; i < j->nclose; i++) close(j->close[i]);
    j->nclose = 0;

    sbx_spawnq *q = j->q;          /* q outlives its jobs: see spawnq_gc */
    pthread_mutex_lock(&q->mu);
    int first = q->done == NULL;
    j->next = q->done;
    q->done = j;
    if (first) {
      uint64_t one = 1;
      if (write(q->efd, &one, sizeof one) < 0) { /* the counter is full: already readable */ }
    }
    if (--q->out == 0) pthread_cond_broadcast(&q->idle);
    pthread_mutex_unlock(&q->mu);
  }
  return NULL;
}

/* Start the pool's threads if none run yet: 0, or -1 with errno. */
static int pool_start(void) {
  int err = 0;
  pthread_mutex_lock(&pool_mu);
  if (pool_threads == 0) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int want = cores < 1 ? 1 : cores > MAX_THREADS ? MAX_THREADS : (int)cores;
    sigset_t all, old;
    pthread_attr_t at;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);   /* inherited by the threads */
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&at, 256 * 1024);  /* sbx_spawn keeps 32 KiB of child stack */
    for (int i = 0; i < want; i++) {
      pthread_t t;
      if ((err = pthread_create(&t, &at, spawner_main, NULL)) != 0) break;
      pool_threads++;
    }
    pthread_attr_destroy(&at);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (pool_threads > 0) err = 0;
  }
  pthread_mutex_unlock(&pool_mu);
  if (err) errno = err;
  return err ? -1 : 0;
}

void sbx_spawner_stats(int *threads, long *jobs) {
  pthread_mutex_lock(&pool_mu);
  *threads = pool_threads;
  *jobs = pool_jobs;
  pthread_mutex_unlock(&pool_mu);
}


/* ---------------------------------------------------------- loop's queue */

/* On the loop thread: hand finished jobs to their owners, oldest first. */
static void spawnq_cb(sbx_watch *w, uint32_t revents) {
  sbx_spawnq *q = (sbx_spawnq *)((char *)w - offsetof(sbx_spawnq, w));
  uint64_t n;
  (void)revents;
  if (read(q->efd, &n, sizeof n) < 0) { /* EAGAIN: nothing new was signalled */ }
  pthread_mutex_lock(&q->mu);
  sbx_spawn_job *list = q->done, *fifo = NULL;
  q->done = NULL;
  pthread_mutex_unlock(&q->mu);
  while (list) {
    sbx_spawn_job *next = list->next;
    list->next = fifo;
    fifo = list;
    list = next;
  }
  while (fifo) {
    sbx_spawn_job *next = fifo->next;
    q->inflight--;
    fifo->next = NULL;
    fifo->done(fifo);
    fifo = next;
  }
  if (q->inflight == 0) sbx_watch_stop(q->lp, &q->w);
}

/* At lua_close: wait for the threads to finish this loop's jobs, then let
** each owner (or the abandoned-job path) deal with its child. */
static int spawnq_gc(lua_State *L) {
  sbx_spawnq *q = luaL_checkudata(L, 1, SPAWNQ_MT);
  if (q->lp == NULL) return 0;
  q->lp = NULL;
  pthread_mutex_lock(&q->mu);
  while (q->out > 0) pthread_cond_wait(&q->idle, &q->mu);
  sbx_spawn_job *list = q->done;
  q->done = NULL;
  pthread_mutex_unlock(&q->mu);
  while (list) {
    sbx_spawn_job *next = list->next;
    list->next = NULL;
    list->q = NULL;                /* tells the owner: the loop is closing */
    list->done(list);
    list = next;
  }
  if (q->efd >= 0) close(q->efd);
  q->efd = -1;
  pthread_mutex_destroy(&q->mu);
  pthread_cond_destroy(&q->idle);
  return 0;
}

static sbx_spawnq *spawnq_get(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &spawnq_key);
  sbx_spawnq *q = lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (q) return q;
  q = lua_newuserdatauv(L, sizeof *q, 0);
  memset(q, 0, sizeof *q);
  q->efd = -1;
  if (luaL_newmetatable(L, SPAWNQ_MT)) {
    lua_pushcfunction(L, spawnq_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->idle, NULL);
  q->lp = sbx_loop_get(L);
  const char *m = getenv("SBX_SPAWNER");
  q->mode = !m ? SBX_SPAWNER_AUTO : strcmp(m, "thread") == 0 ? SBX_SPAWNER_THREAD
          : strcmp(m, "inline") == 0 ? SBX_SPAWNER_INLINE : SBX_SPAWNER_AUTO;
  q->w.cb = spawnq_cb;
  lua_rawsetp(L, LUA_REGISTRYINDEX, &spawnq_key);
  return q;
}

int sbx_spawner_start(lua_State *L) {
  sbx_spawnq *q = spawnq_get(L);
  if (q->efd < 0) {
    if ((q->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) return -1;
    q->efd = sbx_fd_keep(q->efd);
  }
  return pool_start();
}

int sbx_spawner_submit(lua_State *L, sbx_spawn_job *j) {
  sbx_spawnq *q = spawnq_get(L);
  if (sbx_spawner_start(L) < 0) return -1;
  j->q = q;
  j->next = NULL;
  if (q->inflight++ == 0) sbx_watch_set(q->lp, &q->w, q->efd, EPOLLIN);
  pthread_mutex_lock(&q->mu);
  q->out++;
  pthread_mutex_unlock(&q->mu);
  pthread_mutex_lock(&pool_mu);
  if (pool_tail) pool_tail->next = j; else pool_head = j;
  pool_tail = j;
  pthread_cond_signal(&pool_cv);
  pthread_mutex_unlock(&pool_mu);
  return 0;
}

int sbx_spawner_inflight(lua_State *L) { return spawnq_get(L)->inflight; }

int sbx_spawner_mode(lua_State *L, int mode) {
  sbx_spawnq *q = spawnq_get(L);
  if (mode >= 0) q->mode = mode;
  return q->mode;
}
