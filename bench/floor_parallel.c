/* floor_parallel: the throughput floor for "run N commands on P cores":
 * P worker processes, each doing its share of N posix_spawn + waitpid one
 * after another (as floor_spawn does: stdio on /dev/null, a minimal PATH).
 *   floor_parallel P N PROG [ARGS...]      e.g. floor_parallel 2 2000 /bin/true
 * 20 warm-up spawns first, then prints:
 *   wall_ms X per_s X workers P n N boost B
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

static int spawn_n(int n, char **argv, posix_spawn_file_actions_t *fa) {
  for (int i = 0; i < n; i++) {
    int st, rc = 0;
    pid_t pid = spawn_one(argv, fa);
    if (pid < 0) rc = errno;
    if (rc != 0) {
      fprintf(stderr, "posix_spawn %s: error %d\n", argv[0], rc);
      return 1;
    }
    while (waitpid(pid, &st, 0) < 0) {}
  }
  return 0;
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
  if (spawn_n(20, argv + 3, &fa)) return 1;
  double t0 = now_ms();
  for (int w = 0; w < p; w++) {
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 1; }
    if (pid == 0) _exit(spawn_n(n / p + (w < n % p), argv + 3, &fa));
  }
  int st, bad = 0;
  while (wait(&st) > 0) bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  double wall = now_ms() - t0;
  if (bad) return 1;
  printf("wall_ms %.2f per_s %.1f workers %d n %d boost %d\n", wall, n / wall * 1e3, p, n, boost);
  return 0;
}
