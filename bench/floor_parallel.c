/* floor_parallel: the throughput floor for "run N commands on P cores":
 * P worker processes, each doing its share of N posix_spawn + wait (as
 * floor_spawn does: stdio on /dev/null, a minimal PATH), with up to
 * FLOOR_DEPTH children alive at once per worker (default 1: one after
 * another). A job of S sandboxes has up to S commands alive at once, so
 * its floor has depth S / P: on a VM whose idle vCPUs halt, a chain of one
 * child at a time waits on wake-ups and leaves the cores idle (2,000 `true`
 * on 2 vCPUs here: depth 1 ran 2.5-4.6 s, depth 8-100 0.7-0.9 s).
 *   floor_parallel P N PROG [ARGS...]      e.g. floor_parallel 2 2000 /bin/true
 * 20 warm-up spawns first, then prints:
 *   wall_ms X per_s X workers P n N boost B depth D
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static char *envp[] = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", NULL};

/* FLOOR_BOOST=S: the workers run S nice steps up and each child starts
** back at the original nice, as sbxlua's loop and its commands do where it
** may raise its priority (src/main.c), so that load from other processes
** favours neither side. posix_spawn cannot set a child's nice: vfork,
** setpriority, the same three opens, execve. */
static int boost = 0, orig_nice;

static pid_t spawn_one(char **argv, posix_spawn_file_actions_t *fa) {
  pid_t pid;
  if (!boost) {
    int rc = posix_spawn(&pid, argv[0], fa, NULL, argv, envp);
    errno = rc;
    return rc == 0 ? pid : -1;
  }
  pid = vfork();
  if (pid == 0) {
    setpriority(PRIO_PROCESS, 0, orig_nice);
    for (int fd = 0; fd < 3; fd++) {
      int d = open("/dev/null", fd ? O_WRONLY : O_RDONLY);
      if (d != fd) { dup2(d, fd); close(d); }
    }
    execve(argv[0], argv, envp);
    _exit(127);
  }
  return pid;
}

/* n spawns with up to `depth` children alive at once: a child is reaped
** (any of this process's) before the next one starts once `depth` run. */
static int spawn_n(int n, int depth, char **argv, posix_spawn_file_actions_t *fa) {
  int alive = 0, st, bad = 0;
  for (int i = 0; i < n || alive > 0; ) {
    if (i < n && alive < depth) {
      pid_t pid = spawn_one(argv, fa);
      if (pid < 0) {
        fprintf(stderr, "posix_spawn %s: error %d\n", argv[0], errno);
        return 1;
      }
      i++, alive++;
      continue;
    }
    if (wait(&st) < 0) continue;
    alive--;
    bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  return bad;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s P N PROG [ARGS...]\n", argv[0]);
    return 2;
  }
  int p = atoi(argv[1]), n = atoi(argv[2]);
  if (p < 1) p = 1;
  if (n < p) n = p;
  const char *b = getenv("FLOOR_BOOST");
  if (b && atoi(b) > 0) {
    errno = 0;
    orig_nice = getpriority(PRIO_PROCESS, 0);
    if (errno == 0 && setpriority(PRIO_PROCESS, 0, orig_nice - atoi(b)) == 0) boost = 1;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  const char *d = getenv("FLOOR_DEPTH");
  int depth = d && atoi(d) > 0 ? atoi(d) : 1;
  if (spawn_n(20, 1, argv + 3, &fa)) return 1;
  double t0 = now_ms();
  for (int w = 0; w < p; w++) {
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 1; }
    if (pid == 0) _exit(spawn_n(n / p + (w < n % p), depth, argv + 3, &fa));
  }
  int st, bad = 0;
  while (wait(&st) > 0) bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  double wall = now_ms() - t0;
  if (bad) return 1;
  printf("wall_ms %.2f per_s %.1f workers %d n %d boost %d depth %d\n", wall, n / wall * 1e3, p, n, boost, depth);
  return 0;
}
