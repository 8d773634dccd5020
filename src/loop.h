/*
** The event loop shared by every C module: epoll for fds (pipes, pidfds,
** and later curl's sockets), a min-heap of monotonic timers, and the
** coroutine tasks that wait on them.
*/
#ifndef SBX_LOOP_H
#define SBX_LOOP_H

#include <stdint.h>
#include "lua.h"
#include "fail.h"

typedef struct sbx_loop sbx_loop;
typedef struct sbx_task sbx_task;

/* An fd watched by the loop; embed it in the owning object. */
typedef struct sbx_watch {
  int fd;
  uint32_t events;              /* EPOLL* mask currently registered */
  void (*cb)(struct sbx_watch *w, uint32_t revents);
} sbx_watch;

/* A one-shot timer; embed it in the owning object. */
typedef struct sbx_timer {
  double due;                   /* CLOCK_MONOTONIC seconds */
  int idx;                      /* heap slot, -1 when stopped */
  void (*cb)(struct sbx_timer *t);
} sbx_timer;

/* Something a task (or an inline caller) is waiting for. */
typedef struct sbx_waiter {
  int done;
  int cancelled;                /* its task was cancelled: a wake is ignored */
  sbx_task *task;               /* set while a task is suspended on it */
  struct sbx_waiter *next;      /* for lists of joiners */
} sbx_waiter;

sbx_loop *sbx_loop_get(lua_State *L);
/* The main thread, for registry refs taken outside any call. */
lua_State *sbx_loop_main(sbx_loop *lp);
double sbx_now(void);

int sbx_watch_set(sbx_loop *lp, sbx_watch *w, int fd, uint32_t events);
void sbx_watch_stop(sbx_loop *lp, sbx_watch *w);

void sbx_timer_start(sbx_loop *lp, sbx_timer *t, double secs);
void sbx_timer_stop(sbx_loop *lp, sbx_timer *t);

/*
** Wait for `w`: inside a task, yield with continuation `k`; elsewhere run
** the loop until `w` is done. Either way `k(L, status, ctx)` produces the
** results. When `k` runs with `w->done == 0` the wait was cancelled: the
** primitive cleans up and calls sbx_raise_cancelled.
*/
int sbx_await(lua_State *L, sbx_waiter *w, lua_KContext ctx, lua_KFunction k);
void sbx_wake(sbx_loop *lp, sbx_waiter *w);
/* Forget a waiter that will never be woken (its object is closing). */
void sbx_unwait(sbx_loop *lp, sbx_waiter *w);
int sbx_raise_cancelled(lua_State *L);
/* -1: L is not a task that can yield here (sbx_await would run the loop
** inside this call); else whether other tasks are ready to run now. */
int sbx_loop_busy(lua_State *L);
/* Raise if the current task was cancelled (call at a primitive's entry). */
void sbx_check_cancel(lua_State *L);

/* sbx_fail, sbx_fail_errno, sbx_errno_name: fail.h */

int luaopen_sbx_loop(lua_State *L);

#endif
