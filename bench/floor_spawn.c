/* floor_spawn: the floor for "run one command": N x posix_spawn + waitpid.
 *   floor_spawn N PROG [ARGS...]      e.g. floor_spawn 500 /bin/sh -c true
 * stdin/stdout/stderr are /dev/null, environment is a minimal PATH/HOME (as a
 * sandbox gets). 20 warm-up runs, then prints (ms):
 *   p50 X p90 X mean X min X n N
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

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(const double *v, int n, double p) {  /* nearest-rank */
  int i = (int)(p * n + 0.5) - 1;
  if (i < 0) i = 0;
  if (i >= n) i = n - 1;
  return v[i];
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s N PROG [ARGS...]\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[1]);
  if (n < 1) n = 1;
  char *envp[] = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", NULL};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  double *t = malloc(sizeof(double) * n), sum = 0;
  for (int i = -20; i < n; i++) {
    double t0 = now_ms();
    pid_t pid;
    int rc = posix_spawn(&pid, argv[2], &fa, NULL, argv + 2, envp);
    if (rc != 0) {
      fprintf(stderr, "posix_spawn %s: error %d\n", argv[2], rc);
      return 1;
    }
    int st;
    while (waitpid(pid, &st, 0) < 0) {}
    double dt = now_ms() - t0;
    if (i >= 0) { t[i] = dt; sum += dt; }
  }
  qsort(t, n, sizeof(double), cmp);
  printf("p50 %.4f p90 %.4f mean %.4f min %.4f n %d\n", pct(t, n, .5), pct(t, n, .9),
         sum / n, t[0], n);
  return 0;
}
