/* floor_parallel: the throughput floor for "run N commands on P cores":
 * P worker processes, each doing its share of N posix_spawn + waitpid one
 * after another (as floor_spawn does: stdio on /dev/null, a minimal PATH).
 *   floor_parallel P N PROG [ARGS...]      e.g. floor_parallel 2 2000 /bin/true
 * 20 warm-up spawns first, then prints:
 *   wall_ms X per_s X workers P n N
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static char *envp[] = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", NULL};

static int spawn_n(int n, char **argv, posix_spawn_file_actions_t *fa) {
  for (int i = 0; i < n; i++) {
    pid_t pid;
    int st, rc = posix_spawn(&pid, argv[0], fa, NULL, argv, envp);
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
  printf("wall_ms %.2f per_s %.1f workers %d n %d\n", wall, n / wall * 1e3, p, n);
  return 0;
}
