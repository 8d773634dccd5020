/*
** sbx.loop: epoll + timers + signals, and coroutine tasks.
**
** Exactly one function resumes tasks (task_resume). A blocking primitive
** calls sbx_await: inside a task it yields with a continuation; elsewhere
** (plain Lua, a non-yieldable C boundary, a user coroutine) it runs the loop
** itself until its waiter is done, so the same call works everywhere.
*/
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "lauxlib.h"
#include "loop.h"
#include "spawn.h"

enum { T_READY, T_RUNNING, T_WAITING, T_DONE };
enum { C_NONE, C_REQUESTED, C_DELIVERED };

struct sbx_task {
  sbx_loop *lp;
  lua_State *co;
  int coref, selfref;           /* held by the loop until the task ends */
  int resref, tbref;            /* results table (n=...) or error; traceback */
  int state, cancel, ok, started, joined, queued;
  sbx_waiter *waiting;          /* what it is suspended on */
  sbx_waiter *joiners;
  sbx_task *next;               /* ready queue */
};

struct sbx_loop {
  lua_State *L;                 /* main thread */
  lua_State *cbL;               /* thread used for callbacks from the loop */
  int epfd, nwatch, closed;
  sbx_timer **heap;
  int nheap, capheap;
  sbx_task *head, *tail;        /* ready queue */
  sbx_task *uhead, *utail;      /* woken during a turn: run within it */
  int looking;                  /* a look at the fds within a turn */
  sbx_task *current;
  int sigfd, sigref, errref;
  sbx_watch sigw;
};

static const char LOOP_KEY = 'L';

static int step(sbx_loop *lp, int block);

#define TASK_MT "sbx.Task"


/* ---------------------------------------------------------------- errors */

/* Raise an error of `kind` through the facade's factory when it is set. */
static int raise_kind(lua_State *L, const char *kind, const char *msg) {
  sbx_loop *lp = sbx_loop_get(L);
  if (lp->errref != LUA_NOREF) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, lp->errref);
    lua_pushstring(L, kind);
    lua_pushstring(L, msg);
    lua_call(L, 2, 1);
  } else {
    lua_pushfstring(L, "%s: %s", kind, msg);
  }
  return lua_error(L);
}

int sbx_raise_cancelled(lua_State *L) {
  return raise_kind(L, "Cancelled", "the task was cancelled");
}

int sbx_loop_busy(lua_State *L) {
  sbx_loop *lp = sbx_loop_get(L);
  sbx_task *t = lp->current;
  if (!t || t->co != L || !lua_isyieldable(L) || t->cancel == C_REQUESTED) return -1;
  return lp->head != NULL;
}

void sbx_check_cancel(lua_State *L) {
  sbx_loop *lp = sbx_loop_get(L);
  sbx_task *t = lp->current;
  if (t && t->cancel == C_REQUESTED) {
    t->cancel = C_DELIVERED;
    sbx_raise_cancelled(L);
  }
}


/* ----------------------------------------------------------------- clock */

double sbx_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}


/* ---------------------------------------------------------------- timers */

static void heap_swap(sbx_loop *lp, int i, int j) {
  sbx_timer *t = lp->heap[i];
  lp->heap[i] = lp->heap[j];
  lp->heap[j] = t;
  lp->heap[i]->idx = i;
  lp->heap[j]->idx = j;
}

static void heap_up(sbx_loop *lp, int i) {
  while (i > 0 && lp->heap[(i - 1) / 2]->due > lp->heap[i]->due) {
    heap_swap(lp, i, (i - 1) / 2);
    i = (i - 1) / 2;
  }
}

static void heap_down(sbx_loop *lp, int i) {
  for (;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < lp->nheap && lp->heap[l]->due < lp->heap[m]->due) m = l;
    if (r < lp->nheap && lp->heap[r]->due < lp->heap[m]->due) m = r;
    if (m == i) return;
    heap_swap(lp, i, m);
    i = m;
  }
}

void sbx_timer_stop(sbx_loop *lp, sbx_timer *t) {
  int i = t->idx;
  if (i < 0 || i >= lp->nheap || lp->heap[i] != t) return;
  lp->nheap--;
  if (i != lp->nheap) {
    lp->heap[i] = lp->heap[lp->nheap];
    lp->heap[i]->idx = i;
    heap_down(lp, i);
    heap_up(lp, i);
  }
  t->idx = -1;
}

void sbx_timer_start(sbx_loop *lp, sbx_timer *t, double secs) {
  sbx_timer_stop(lp, t);
  if (lp->nheap == lp->capheap) {
    int cap = lp->capheap ? lp->capheap * 2 : 16;
    sbx_timer **h = realloc(lp->heap, cap * sizeof *h);
    if (!h) abort();  /* out of memory for a pointer array: nothing sane left */
    lp->heap = h;
    lp->capheap = cap;
  }
  t->due = sbx_now() + (secs > 0 ? secs : 0);
  t->idx = lp->nheap;
  lp->heap[lp->nheap++] = t;
  heap_up(lp, t->idx);
}


/* ------------------------------------------------------------------- fds */

int sbx_watch_set(sbx_loop *lp, sbx_watch *w, int fd, uint32_t events) {
  struct epoll_event ev = { .events = events, .data.ptr = w };
  int op = w->events ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
  if (events == 0) {
    sbx_watch_stop(lp, w);
    return 0;
  }
  w->fd = fd;
  if (epoll_ctl(lp->epfd, op, fd, &ev) < 0) return -1;
  if (op == EPOLL_CTL_ADD) lp->nwatch++;
  w->events = events;
  return 0;
}

void sbx_watch_stop(sbx_loop *lp, sbx_watch *w) {
  if (!w->events) return;
  if (!lp->closed) epoll_ctl(lp->epfd, EPOLL_CTL_DEL, w->fd, NULL);
  w->events = 0;
  lp->nwatch--;
}


/* ----------------------------------------------------------------- tasks */

static void enqueue(sbx_loop *lp, sbx_task *t) {
  if (t->queued) return;
  t->queued = 1;
  t->state = T_READY;
  t->next = NULL;
  sbx_task **head = lp->looking ? &lp->uhead : &lp->head;
  sbx_task **tail = lp->looking ? &lp->utail : &lp->tail;
  if (*tail) (*tail)->next = t; else *head = t;
  *tail = t;
}

static sbx_task *take(sbx_task **head, sbx_task **tail) {
  sbx_task *t = *head;
  if (!t) return NULL;
  *head = t->next;
  if (!*head) *tail = NULL;
  t->queued = 0;
  return t;
}

static sbx_task *dequeue(sbx_loop *lp) { return take(&lp->head, &lp->tail); }

void sbx_wake(sbx_loop *lp, sbx_waiter *w) {
  sbx_task *t = w->task;
  w->task = NULL;
  if (w->cancelled) return;     /* the continuation must raise Cancelled */
  w->done = 1;
  if (t && t->state == T_WAITING && t->waiting == w) {
    t->waiting = NULL;
    enqueue(lp, t);
  }
}

void sbx_unwait(sbx_loop *lp, sbx_waiter *w) {
  (void)lp;
  if (w->task && w->task->waiting == w) w->task->waiting = NULL;
  w->task = NULL;
}

static void wake_joiners(sbx_loop *lp, sbx_task *t) {
  sbx_waiter *w = t->joiners;
  t->joiners = NULL;
  while (w) {
    sbx_waiter *next = w->next;
    w->next = NULL;
    sbx_wake(lp, w);
    w = next;
  }
}

/* The task ended: keep results (or the error and traceback), let go of the
** thread, close its pending to-be-closed variables on error. */
static void task_finish(sbx_loop *lp, sbx_task *t, int status, int nres) {
  lua_State *co = t->co;
  t->ok = (status == LUA_OK);
  if (t->ok) {
    lua_createtable(co, nres, 1);               /* stack: res..., tbl */
    lua_insert(co, -(nres + 1));
    for (int i = nres; i >= 1; i--) lua_rawseti(co, -(i + 1), i);
    lua_pushinteger(co, nres);
    lua_setfield(co, -2, "n");
    t->resref = luaL_ref(co, LUA_REGISTRYINDEX);
  } else {
    /* A cancelled task's traceback would only show its wait point, and
    ** luaL_traceback names each frame's function by a walk through
    ** package.loaded: a tenth of a ms, paid by every sandbox's TTL task. */
    if (t->cancel != C_DELIVERED) {
      luaL_traceback(co, co, lua_tostring(co, -1), 0);
      t->tbref = luaL_ref(co, LUA_REGISTRYINDEX);
    }
    lua_pushvalue(co, -1);
    t->resref = luaL_ref(co, LUA_REGISTRYINDEX);
    /* Run the __close handlers of the failed task (sandboxes get
    ** destroyed); they may wait, which then runs the loop inline. */
    sbx_task *prev = lp->current;
    lp->current = t;
    lua_resetthread(co);
    lp->current = prev;
  }
  t->state = T_DONE;
  luaL_unref(lp->L, LUA_REGISTRYINDEX, t->coref);
  t->coref = LUA_NOREF;
  t->co = NULL;
  wake_joiners(lp, t);
  luaL_unref(lp->L, LUA_REGISTRYINDEX, t->selfref);
  t->selfref = LUA_NOREF;
}

static void task_resume(sbx_loop *lp, sbx_task *t) {
  lua_State *co = t->co;
  int nargs = 0, nres = 0, status;
  sbx_task *prev = lp->current;
  if (!t->started) {
    t->started = 1;
    if (t->cancel) {  /* cancelled before it ever ran */
      lua_settop(co, 0);
      t->cancel = C_DELIVERED;
      lua_pushcfunction(co, sbx_raise_cancelled);
      status = lua_pcall(co, 0, 0, 0);
      task_finish(lp, t, status, 0);
      return;
    }
    nargs = lua_gettop(co) - 1;
  }
  t->state = T_RUNNING;
  lp->current = t;
  status = lua_resume(co, NULL, nargs, &nres);
  lp->current = prev;
  if (status == LUA_YIELD) {
    if (t->waiting) {
      t->state = T_WAITING;
    } else {            /* a plain coroutine.yield(): run again later */
      lua_pop(co, nres);
      enqueue(lp, t);
    }
  } else {
    task_finish(lp, t, status, nres);
  }
}

int sbx_await(lua_State *L, sbx_waiter *w, lua_KContext ctx,
              lua_KFunction k) {
  sbx_loop *lp = sbx_loop_get(L);
  sbx_task *t = lp->current;
  if (!w->done) {
    if (t && t->co == L && lua_isyieldable(L) && t->cancel != C_REQUESTED) {
      w->task = t;
      t->waiting = w;
      return lua_yieldk(L, 0, ctx, k);
    }
    while (!w->done && !(t && t->cancel == C_REQUESTED)) {
      if (!step(lp, 1))
        return luaL_error(L, "deadlock: waiting for an event that nothing "
                             "can produce (no timers, fds or tasks left)");
    }
    if (!w->done) t->cancel = C_DELIVERED;
  }
  return k(L, LUA_OK, ctx);
}

/* Wait up to timeout ms for the watched fds; run their callbacks. */
static void dispatch(sbx_loop *lp, int timeout) {
  struct epoll_event evs[64];
  int n = epoll_wait(lp->epfd, evs, 64, timeout);
  for (int i = 0; i < n; i++) {
    sbx_watch *w = evs[i].data.ptr;
    if (w->events) w->cb(w, evs[i].events);
  }
}

/* Ready tasks run this many at a time between looks at the fds, and the
** tasks a look wakes run before the rest of the turn: a turn of 200 tasks
** that each make a sandbox (~0.4 ms) would otherwise leave the commands
** that finished meanwhile unseen for 80 ms, and the spawner threads idle
** while those sandboxes' next commands wait for the turn's end. Every task
** ready at a turn's start still runs in that turn. */
#define TASKS_PER_LOOK 16

static void look(sbx_loop *lp) {
  lp->looking = 1;
  dispatch(lp, 0);
  lp->looking = 0;
  sbx_task *t;
  while ((t = take(&lp->uhead, &lp->utail)) != NULL) task_resume(lp, t);
}

/* One turn of the loop. Returns 0 when nothing could ever happen again. */
static int step(sbx_loop *lp, int block) {
  int timeout = -1;
  int nready = 0, resumed = 0;
  for (sbx_task *t = lp->head; t; t = t->next) nready++;
  while (nready-- > 0) {
    sbx_task *t = dequeue(lp);
    if (!t) break;
    task_resume(lp, t);
    if (++resumed % TASKS_PER_LOOK == 0 && nready > 0) look(lp);
  }
  int live = lp->nwatch - (lp->sigfd >= 0 ? 1 : 0);
  if (lp->head || !block || resumed) timeout = 0;
  else if (lp->nheap) {
    double ms = (lp->heap[0]->due - sbx_now()) * 1000.0;
    timeout = ms <= 0 ? 0 : (int)ceil(ms);
  } else if (live <= 0) return 0;
  dispatch(lp, timeout);
  double now = sbx_now();
  while (lp->nheap && lp->heap[0]->due <= now) {
    sbx_timer *tm = lp->heap[0];
    sbx_timer_stop(lp, tm);
    tm->cb(tm);
  }
  return 1;
}

static sbx_task *check_task(lua_State *L, int idx) {
  return luaL_checkudata(L, idx, TASK_MT);
}

/* loop.spawn(fn, ...) -> Task */
static int loop_spawn(lua_State *L) {
  sbx_loop *lp = sbx_loop_get(L);
  int n = lua_gettop(L);
  luaL_checktype(L, 1, LUA_TFUNCTION);
  sbx_task *t = lua_newuserdatauv(L, sizeof *t, 0);
  memset(t, 0, sizeof *t);
  t->lp = lp;
  t->coref = t->selfref = t->resref = t->tbref = LUA_NOREF;
  t->state = T_DONE;                  /* closed until fully set up */
  luaL_setmetatable(L, TASK_MT);
  lua_State *co = lua_newthread(L);
  t->coref = luaL_ref(L, LUA_REGISTRYINDEX);
  t->co = co;
  for (int i = 1; i <= n; i++) lua_pushvalue(L, i);
  lua_xmove(L, co, n);                 /* stack of co: fn, args... */
  lua_pushvalue(L, -1);
  t->selfref = luaL_ref(L, LUA_REGISTRYINDEX);
  enqueue(lp, t);
  return 1;
}

static int join_results(lua_State *L, sbx_task *t) {
  t->joined = 1;
  lua_pushboolean(L, t->ok);
  lua_rawgeti(L, LUA_REGISTRYINDEX, t->resref);
  if (!t->ok) return 2;
  lua_getfield(L, -1, "n");
  int n = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  luaL_checkstack(L, n, "too many results");
  for (int i = 1; i <= n; i++) lua_rawgeti(L, -i, i);
  lua_remove(L, -(n + 1));
  return n + 1;
}

static int join_k(lua_State *L, int status, lua_KContext ctx) {
  sbx_task *t = (sbx_task *)ctx;
  sbx_waiter *w = lua_touserdata(L, 2);
  (void)status;
  if (!w->done) {                      /* cancelled: leave the joiner list */
    sbx_waiter **p = &t->joiners;
    while (*p && *p != w) p = &(*p)->next;
    if (*p) *p = w->next;
    sbx_unwait(t->lp, w);
    return sbx_raise_cancelled(L);
  }
  return join_results(L, t);
}

/* task:join() -> true, results... | false, err */
static int task_join(lua_State *L) {
  sbx_task *t = check_task(L, 1);
  lua_settop(L, 1);
  if (t->state == T_DONE) return join_results(L, t);
  if (t->lp->current == t)
    return luaL_error(L, "a task cannot join itself");
  sbx_check_cancel(L);
  sbx_waiter *w = lua_newuserdatauv(L, sizeof *w, 0);  /* index 2 */
  memset(w, 0, sizeof *w);
  w->next = t->joiners;
  t->joiners = w;
  return sbx_await(L, w, (lua_KContext)t, join_k);
}

/* task:cancel(): the task gets a Cancelled error at its wait point. */
static int task_cancel(lua_State *L) {
  sbx_task *t = check_task(L, 1);
  if (t->state == T_DONE || t->cancel) return 0;
  t->cancel = C_REQUESTED;
  if (t->state == T_WAITING) {
    t->cancel = C_DELIVERED;    /* its continuation raises on resume */
    t->waiting->cancelled = 1;  /* even if the event comes before it runs */
    sbx_unwait(t->lp, t->waiting);
    t->waiting = NULL;
    enqueue(t->lp, t);
  }
  return 0;
}

/* task:status() -> "ready" | "running" | "waiting" | "done" */
static int task_status(lua_State *L) {
  static const char *const names[] = {"ready", "running", "waiting", "done"};
  sbx_task *t = check_task(L, 1);
  lua_pushstring(L, names[t->state]);
  return 1;
}

/* task:traceback() -> string | nil */
static int task_traceback(lua_State *L) {
  sbx_task *t = check_task(L, 1);
  if (t->tbref == LUA_NOREF) return 0;
  lua_rawgeti(L, LUA_REGISTRYINDEX, t->tbref);
  return 1;
}

static int task_gc(lua_State *L) {
  sbx_task *t = check_task(L, 1);
  /* A failure nobody looked at should not vanish silently. */
  if (t->state == T_DONE && !t->ok && !t->joined && t->tbref != LUA_NOREF &&
      t->cancel != C_DELIVERED && !t->lp->closed) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->tbref);
    fprintf(stderr, "sbxlua: a task failed and was never joined: %s\n",
            lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  luaL_unref(L, LUA_REGISTRYINDEX, t->resref);
  luaL_unref(L, LUA_REGISTRYINDEX, t->tbref);
  t->resref = t->tbref = LUA_NOREF;
  return 0;
}

static int task_tostring(lua_State *L) {
  sbx_task *t = check_task(L, 1);
  static const char *const names[] = {"ready", "running", "waiting", "done"};
  lua_pushfstring(L, "sbx.Task (%s, %p)", names[t->state], (void *)t);
  return 1;
}


/* ----------------------------------------------------------------- sleep */

typedef struct sleeper { sbx_timer tm; sbx_waiter w; sbx_loop *lp; } sleeper;

static void sleeper_cb(sbx_timer *tm) {
  sleeper *s = (sleeper *)tm;
  sbx_wake(s->lp, &s->w);
}

static int sleep_k(lua_State *L, int status, lua_KContext ctx) {
  sleeper *s = (sleeper *)ctx;
  (void)status;
  if (!s->w.done) {
    sbx_timer_stop(s->lp, &s->tm);
    sbx_unwait(s->lp, &s->w);
    return sbx_raise_cancelled(L);
  }
  return 0;
}

/* loop.sleep(secs) */
static int loop_sleep(lua_State *L) {
  double secs = luaL_checknumber(L, 1);
  luaL_argcheck(L, secs >= 0 && secs == secs, 1, "expected seconds >= 0");
  sbx_check_cancel(L);
  sleeper *s = lua_newuserdatauv(L, sizeof *s, 0);
  memset(s, 0, sizeof *s);
  s->lp = sbx_loop_get(L);
  s->tm.idx = -1;
  s->tm.cb = sleeper_cb;
  sbx_timer_start(s->lp, &s->tm, secs);
  return sbx_await(L, &s->w, (lua_KContext)s, sleep_k);
}


/* ----------------------------------------------------------------- events */

/* loop.event(): tasks wait on it until another task notifies it; several
** readers of one shared stream (the agent's) take turns this way. */
#define EVENT_MT "sbx.Event"

typedef struct ev_node {
  sbx_timer tm;                 /* first: the timer callback casts back */
  sbx_waiter w;
  sbx_loop *lp;
  struct ev_node *next, **pprev;
  int notified;
} ev_node;

typedef struct event { ev_node *head; } event;

static void ev_unlink(ev_node *n) {
  if (!n->pprev) return;
  *n->pprev = n->next;
  if (n->next) n->next->pprev = n->pprev;
  n->next = NULL;
  n->pprev = NULL;
}

static void ev_timeout(sbx_timer *tm) {
  ev_node *n = (ev_node *)tm;
  ev_unlink(n);
  sbx_wake(n->lp, &n->w);
}

static int ev_wait_k(lua_State *L, int status, lua_KContext ctx) {
  ev_node *n = (ev_node *)ctx;
  (void)status;
  sbx_timer_stop(n->lp, &n->tm);
  if (!n->w.done) {
    ev_unlink(n);
    sbx_unwait(n->lp, &n->w);
    return sbx_raise_cancelled(L);
  }
  lua_pushboolean(L, n->notified);
  return 1;
}

/* ev:wait([secs]) -> true when notified, false when secs passed first */
static int ev_wait(lua_State *L) {
  event *e = luaL_checkudata(L, 1, EVENT_MT);
  double secs = luaL_optnumber(L, 2, -1);
  sbx_check_cancel(L);
  ev_node *n = lua_newuserdatauv(L, sizeof *n, 1);
  memset(n, 0, sizeof *n);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);              /* the event outlives its waiters */
  n->lp = sbx_loop_get(L);
  n->tm.idx = -1;
  n->tm.cb = ev_timeout;
  n->next = e->head;
  if (e->head) e->head->pprev = &n->next;
  e->head = n;
  n->pprev = &e->head;
  if (secs >= 0) sbx_timer_start(n->lp, &n->tm, secs);
  return sbx_await(L, &n->w, (lua_KContext)n, ev_wait_k);
}

/* ev:notify(): wake every task waiting now (later waiters wait for the
** next notify). */
static int ev_notify(lua_State *L) {
  event *e = luaL_checkudata(L, 1, EVENT_MT);
  ev_node *n;
  while ((n = e->head) != NULL) {
    ev_unlink(n);
    n->notified = 1;
    sbx_wake(n->lp, &n->w);
  }
  return 0;
}

static int loop_event(lua_State *L) {
  event *e = lua_newuserdatauv(L, sizeof *e, 0);
  e->head = NULL;
  if (luaL_newmetatable(L, EVENT_MT)) {
    lua_createtable(L, 0, 2);
    lua_pushcfunction(L, ev_wait);
    lua_setfield(L, -2, "wait");
    lua_pushcfunction(L, ev_notify);
    lua_setfield(L, -2, "notify");
    lua_setfield(L, -2, "__index");
  }
  lua_setmetatable(L, -2);
  return 1;
}


/* --------------------------------------------------------------- signals */

/* The handler only writes to a pipe the loop watches; a second signal
** cannot wait for the loop (the job may be busy): it kills the session's
** cgroup tree, if one was named, and exits at once. So does a first signal
** the loop has not taken within SIG_GRACE seconds (the job is stuck inside
** one C call, such as a string.find that backtracks for hours): SIGALRM.
** A second signal within SIG_TWIN seconds of the first is the same one
** delivered twice (timeout(1) signals its child and then the child's process
** group): the clean shutdown the first started goes on. */
#define SIG_GRACE 5
#define SIG_TWIN 0.3
static volatile sig_atomic_t sig_count, sig_first;
static int sig_pipe = -1;
static char sig_kill_dir[1024];
static struct timespec sig_first_at;

static void sig_die(int sig) {
  if (sig_kill_dir[0]) {
    char path[1100];
    int n = snprintf(path, sizeof path, "%s/cgroup.kill", sig_kill_dir);
    int fd = n > 0 ? open(path, O_WRONLY | O_CLOEXEC) : -1;
    if (fd >= 0) {
      if (write(fd, "1", 1) < 0) {}
      close(fd);
    }
  }
  _exit(128 + sig);
}

static void sig_handler(int sig) {
  int saved = errno;
  unsigned char b = (unsigned char)sig;
  if (sig == SIGALRM) {                 /* the grace of a first signal ran out */
    static const char msg[] = "sbxlua: the signal was not handled in time (the job is busy "
                              "inside one call); exiting now, `sbxlua gc` cleans up\n";
    if (!sig_first) return;
    if (write(2, msg, sizeof msg - 1) < 0) {}
    sig_die(sig_first);
  }
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);   /* async-signal-safe */
  if (sig_count == 0) sig_first_at = now;
  double since = (double)(now.tv_sec - sig_first_at.tv_sec)
               + (double)(now.tv_nsec - sig_first_at.tv_nsec) / 1e9;
  if (sig_count++ >= 1 && since >= SIG_TWIN) sig_die(sig);
  sig_first = sig;
  alarm(SIG_GRACE);
  if (write(sig_pipe, &b, 1) < 0) {}
  errno = saved;
}

static void sig_cb(sbx_watch *w, uint32_t revents) {
  sbx_loop *lp = (sbx_loop *)((char *)w - offsetof(sbx_loop, sigw));
  unsigned char b;
  (void)revents;
  while (read(lp->sigfd, &b, 1) == 1) {
    sig_first = 0;              /* taken: the grace timer is void */
    alarm(0);
    lua_State *L = lp->cbL;   /* never a suspended coroutine */
    lua_rawgeti(L, LUA_REGISTRYINDEX, lp->sigref);
    lua_pushstring(L, b == SIGINT ? "SIGINT" : "SIGTERM");
    if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
      fprintf(stderr, "sbxlua: signal handler failed: %s\n",
              lua_tostring(L, -1));
      lua_pop(L, 1);
    }
  }
}

/* loop.on_signal(fn, [kill_dir]): SIGINT/SIGTERM call fn("SIGINT"|...);
** a second signal, or a first one the loop does not take within SIG_GRACE
** seconds, kills the cgroup tree kill_dir and exits 128+signal. */
static int loop_on_signal(lua_State *L) {
  sbx_loop *lp = sbx_loop_get(L);
  luaL_checktype(L, 1, LUA_TFUNCTION);
  const char *dir = luaL_optstring(L, 2, "");
  luaL_argcheck(L, strlen(dir) < sizeof sig_kill_dir, 2, "path too long");
  lua_pushvalue(L, 1);
  luaL_unref(L, LUA_REGISTRYINDEX, lp->sigref);
  lp->sigref = luaL_ref(L, LUA_REGISTRYINDEX);
  strcpy(sig_kill_dir, dir);
  if (lp->sigfd < 0) {
    int fds[2];
    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) < 0)
      return sbx_fail_errno(L, "on_signal", NULL, errno);
    lp->sigfd = sbx_fd_keep(fds[0]);
    sig_pipe = sbx_fd_keep(fds[1]);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = sig_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGALRM, &sa, NULL);
    lp->sigw.cb = sig_cb;
    sbx_watch_set(lp, &lp->sigw, lp->sigfd, EPOLLIN);
  }
  lua_pushboolean(L, 1);
  return 1;
}


/* ------------------------------------------------------------ the module */

/* loop.run([task]): run until `task` is done, or until no work is left. */
static int loop_run(lua_State *L) {
  sbx_loop *lp = sbx_loop_get(L);
  sbx_task *t = lua_isnoneornil(L, 1) ? NULL : check_task(L, 1);
  while (!t || t->state != T_DONE) {
    if (!step(lp, 1)) {
      if (!t) break;
      return luaL_error(L, "deadlock: the task waits for an event that "
                           "nothing can produce");
    }
  }
  return 0;
}

/* loop.now() -> monotonic seconds */
static int loop_now(lua_State *L) {
  lua_pushnumber(L, sbx_now());
  return 1;
}

/* loop.current() -> Task | nil */
static int loop_current(lua_State *L) {
  sbx_loop *lp = sbx_loop_get(L);
  if (!lp->current || lp->current->selfref == LUA_NOREF) return 0;
  lua_rawgeti(L, LUA_REGISTRYINDEX, lp->current->selfref);
  return 1;
}

/* loop.set_error_factory(fn): fn(kind, message) builds raised errors. */
static int loop_set_error_factory(lua_State *L) {
  sbx_loop *lp = sbx_loop_get(L);
  luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_pushvalue(L, 1);
  luaL_unref(L, LUA_REGISTRYINDEX, lp->errref);
  lp->errref = luaL_ref(L, LUA_REGISTRYINDEX);
  return 0;
}

static int loop_gc(lua_State *L) {
  sbx_loop *lp = lua_touserdata(L, 1);
  if (lp->closed) return 0;
  lp->closed = 1;
  if (lp->sigfd >= 0) close(lp->sigfd);
  close(lp->epfd);
  free(lp->heap);
  lp->heap = NULL;
  lp->nheap = lp->capheap = 0;
  return 0;
}

sbx_loop *sbx_loop_get(lua_State *L) {
  sbx_loop *lp;
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &LOOP_KEY) == LUA_TUSERDATA) {
    lp = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return lp;
  }
  lua_pop(L, 1);
  lp = lua_newuserdatauv(L, sizeof *lp, 0);
  memset(lp, 0, sizeof *lp);
  lp->closed = 1;
  lp->sigfd = -1;
  lp->sigref = lp->errref = LUA_NOREF;
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, loop_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lp->epfd = epoll_create1(EPOLL_CLOEXEC);
  if (lp->epfd < 0) luaL_error(L, "epoll_create1: %s", strerror(errno));
  lp->epfd = sbx_fd_keep(lp->epfd);
  lp->closed = 0;
  lua_rawsetp(L, LUA_REGISTRYINDEX, &LOOP_KEY);
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  lp->L = lua_tothread(L, -1);
  lua_pop(L, 1);
  lp->cbL = lua_newthread(L);
  luaL_ref(L, LUA_REGISTRYINDEX);
  return lp;
}

static const luaL_Reg task_methods[] = {
  {"join", task_join},
  {"cancel", task_cancel},
  {"status", task_status},
  {"traceback", task_traceback},
  {NULL, NULL}
};

static const luaL_Reg loop_funcs[] = {
  {"spawn", loop_spawn},
  {"sleep", loop_sleep},
  {"event", loop_event},
  {"run", loop_run},
  {"now", loop_now},
  {"current", loop_current},
  {"on_signal", loop_on_signal},
  {"set_error_factory", loop_set_error_factory},
  {NULL, NULL}
};

int luaopen_sbx_loop(lua_State *L) {
  sbx_loop_get(L);
  if (luaL_newmetatable(L, TASK_MT)) {
    luaL_newlib(L, task_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, task_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, task_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  luaL_newlib(L, loop_funcs);
  return 1;
}

lua_State *sbx_loop_main(sbx_loop *lp) {
  return lp->L;
}
