/* floor_contained: the floor of a job of S sandboxes x K commands with
 * what sbxlua keeps of each, in C and without Lua: each sandbox gets a
 * directory and a cgroup with one command cgroup in it, made before its
 * first command and removed after its last; each command its stdout and
 * stderr pipes, drained through epoll, a pidfd watched for its exit and
 * reaped with waitid, and is spawned by sbxlua's own src/spawn.c (vfork
 * clone3 into the command cgroup, cwd the sandbox's directory; its
 * long-lived fds parked above the few a child copies, as sbxlua's). As
 * sbxlua's on a warmed state directory, a sandbox's directory is a spare
 * one renamed into its name and back (made before the clock starts, not
 * timed: an ext4 mkdir and rmdir cost more). P threads
 * share the sandboxes, each an epoll loop spawning inline, as sbxlua's P
 * spawner threads do (a clone holds its thread until the child execs).
 * What sbxlua adds over this row is its Lua layer and its loop's
 * bookkeeping; what this row adds over floor_parallel is the design's.
 *
 *   floor_contained P S K DIR CGROUP PROG [ARGS...]
 *     DIR     a directory for the sandboxes' directories (made, emptied)
 *     CGROUP  a cgroup v2 directory to make the sandboxes' cgroups in,
 *             or - for none (then no command cgroups either)
 *   FLOOR_BOOST=S  as floor_parallel: threads S nice steps up, children not
 * 20 warm-up commands first (in a sandbox of their own), then prints:
 *   wall_ms X per_s X threads P sandboxes S cmds N
 * Build: gcc -O2 -std=c11 -D_GNU_SOURCE -Isrc bench/floor_contained.c src/spawn.c -lpthread
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "spawn.h"

static int S, K, P;
static const char *DIR_, *CG;
static char **ARGV;
static char *ENVP[] = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", NULL};
static sigset_t NONE;

typedef struct box {
  char dir[PATH_MAX], cg[PATH_MAX], cmdcg[PATH_MAX];
  int cgfd, left;                  /* the command cgroup's fd; commands to go */
  int out, err, pidfd;             /* the running command's, -1 when closed */
} box;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void die(const char *what, const char *where) {
  fprintf(stderr, "floor_contained: %s %s: %s\n", what, where ? where : "", strerror(errno));
  exit(1);
}

static void spare_name(char *buf, size_t n, int i) { snprintf(buf, n, "%s/.spare-%d", DIR_, i); }

static void box_open(box *b, int i) {
  char spare[PATH_MAX];
  spare_name(spare, sizeof spare, i);
  snprintf(b->dir, sizeof b->dir, "%s/sbx-%d", DIR_, i);
  if (rename(spare, b->dir) < 0) die("rename", spare);
  b->cgfd = -1;
  if (CG) {
    snprintf(b->cg, sizeof b->cg, "%s/sbx-%d", CG, i);
    snprintf(b->cmdcg, sizeof b->cmdcg, "%s/c", b->cg);
    if (mkdir(b->cg, 0755) < 0 || mkdir(b->cmdcg, 0755) < 0) die("mkdir", b->cmdcg);
    b->cgfd = open(b->cmdcg, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (b->cgfd < 0) die("open", b->cmdcg);
    b->cgfd = sbx_fd_keep(b->cgfd);  /* as sbxlua: out of the children's copies */
  }
}

static void box_close(box *b, int i) {
  char spare[PATH_MAX];
  if (CG) {
    close(b->cgfd);
    if (rmdir(b->cmdcg) < 0 || rmdir(b->cg) < 0) die("rmdir", b->cg);
  }
  spare_name(spare, sizeof spare, i);
  if (rename(b->dir, spare) < 0) die("rename", b->dir);
}

/* The spare directories of sandboxes 0..n-1: made (make) or removed. */
static void spares(int n, int make) {
  char spare[PATH_MAX];
  for (int i = 0; i < n; i++) {
    spare_name(spare, sizeof spare, i);
    if (make ? mkdir(spare, 0700) < 0 && errno != EEXIST : rmdir(spare) < 0) die("spare", spare);
  }
}

static void watch(int ep, int fd, box *b) {
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = b};
  if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl", NULL);
}

static void start(int ep, box *b) {
  int o[2], e[2], pidfd;
  if (pipe2(o, O_CLOEXEC) < 0 || pipe2(e, O_CLOEXEC) < 0) die("pipe2", NULL);
  fcntl(o[0], F_SETFL, O_NONBLOCK);
  fcntl(e[0], F_SETFL, O_NONBLOCK);
  sbx_spawn_req r;
  memset(&r, 0, sizeof r);
  r.path = ARGV[0];
  r.cwd = b->dir;
  r.argv = ARGV;
  r.envp = ENVP;
  r.in = -1;
  r.out = o[1];
  r.err = e[1];
  r.cgroup_fd = b->cgfd;
  r.ignored = &NONE;
  if (sbx_spawn(&r, &pidfd) < 0) die("spawn", ARGV[0]);
  close(o[1]);
  close(e[1]);
  b->out = sbx_fd_keep(o[0]), b->err = sbx_fd_keep(e[0]), b->pidfd = sbx_fd_keep(pidfd);
  watch(ep, b->out, b);
  watch(ep, b->err, b);
  watch(ep, b->pidfd, b);
  b->left--;
}

static void drop(int ep, int *fd) {
  epoll_ctl(ep, EPOLL_CTL_DEL, *fd, NULL);
  close(*fd);
  *fd = -1;
}

/* Something of b is ready: drain its pipes, reap its command; 1 when the
** command is over. */
static int step(int ep, box *b) {
  char buf[65536];
  int *ends[] = {&b->out, &b->err};
  for (int i = 0; i < 2; i++) {
    ssize_t n = 1;
    while (*ends[i] >= 0 && (n = read(*ends[i], buf, sizeof buf)) != 0) {
      if (n < 0 && errno == EAGAIN) break;
      if (n < 0 && errno != EINTR) die("read", NULL);
    }
    if (*ends[i] >= 0 && n == 0) drop(ep, ends[i]);
  }
  if (b->pidfd >= 0) {
    siginfo_t si;
    si.si_pid = 0;
    if (waitid(P_PIDFD, b->pidfd, &si, WEXITED | WNOHANG) == 0 && si.si_pid != 0) {
      if (si.si_code != CLD_EXITED || si.si_status != 0) {
        fprintf(stderr, "floor_contained: a command failed\n");
        exit(1);
      }
      drop(ep, &b->pidfd);
    }
  }
  return b->out < 0 && b->err < 0 && b->pidfd < 0;
}

typedef struct worker { pthread_t t; int first, n; } worker;

static void *run(void *arg) {
  worker *w = arg;
  int ep = sbx_fd_keep(epoll_create1(EPOLL_CLOEXEC)), live = w->n;
  box *boxes = calloc((size_t)w->n, sizeof *boxes);
  if (ep < 0 || !boxes) die("epoll_create1", NULL);
  for (int i = 0; i < w->n; i++) {
    box_open(&boxes[i], w->first + i);
    boxes[i].left = K;
    start(ep, &boxes[i]);
  }
  struct epoll_event ev[64];
  while (live > 0) {
    int n = epoll_wait(ep, ev, 64, -1);
    for (int i = 0; i < n; i++) {
      box *b = ev[i].data.ptr;
      if (b->out < 0 && b->err < 0 && b->pidfd < 0) continue;   /* done this turn */
      if (!step(ep, b)) continue;
      if (b->left > 0) start(ep, b);
      else {
        box_close(b, w->first + (int)(b - boxes));
        live--;
      }
    }
  }
  close(ep);
  free(boxes);
  return NULL;
}

static double job(int first, int s, int p) {
  worker *ws = calloc((size_t)p, sizeof *ws);
  double t0 = now_ms();
  for (int i = 0, at = first; i < p; i++) {
    ws[i].first = at;
    ws[i].n = s / p + (i < s % p);
    at += ws[i].n;
    if (pthread_create(&ws[i].t, NULL, run, &ws[i]) != 0) die("pthread_create", NULL);
  }
  for (int i = 0; i < p; i++) pthread_join(ws[i].t, NULL);
  free(ws);
  return now_ms() - t0;
}

int main(int argc, char **argv) {
  if (argc < 7) {
    fprintf(stderr, "usage: %s P S K DIR CGROUP|- PROG [ARGS...]\n", argv[0]);
    return 2;
  }
  P = atoi(argv[1]), S = atoi(argv[2]), K = atoi(argv[3]);
  DIR_ = argv[4];
  CG = strcmp(argv[5], "-") == 0 ? NULL : argv[5];
  ARGV = argv + 6;
  if (P < 1 || S < 1 || K < 1) return 2;
  if (P > S) P = S;
  sigemptyset(&NONE);
  sigset_t all;                    /* children borrow our memory: no handler */
  sigfillset(&all);                /* of ours may run in them (spawn.h) */
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  const char *b = getenv("FLOOR_BOOST");
  int boost = 0;
  if (b && atoi(b) > 0) {
    errno = 0;
    int nice0 = getpriority(PRIO_PROCESS, 0);
    if (errno == 0 && setpriority(PRIO_PROCESS, 0, nice0 - atoi(b)) == 0) {
      sbx_child_nice = nice0;
      boost = 1;
    }
  }
  int k = K;
  spares(S + 1, 1);
  K = 20;
  job(S, 1, 1);                    /* warm-up: 20 commands, one sandbox */
  K = k;
  double wall = job(0, S, P);
  spares(S + 1, 0);
  printf("wall_ms %.2f per_s %.1f threads %d sandboxes %d cmds %d boost %d\n", wall,
         S * K / wall * 1e3, P, S, S * K, boost);
  return 0;
}
