/*
** One supervision loop for `run` and `serve`. The supervisor never
** kills by process group alone: setsid escapes a group, not the subreaper,
** so the tree is found through /proc (sbx_kill_descendants).
*/
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../proctree.h"
#include "supervise.h"

const char *sup_kind_name(int kind) {
  static const char *const names[] = {"exit", "signal", "timeout", "killed",
                                      "noexec", "nocwd"};
  return kind >= 0 && kind <= SUP_NOCWD ? names[kind] : "killed";
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

void sup_signals(sigset_t *set) {
  sigemptyset(set);
  sigaddset(set, SIGCHLD);
  sigaddset(set, SIGTERM);
  sigaddset(set, SIGINT);
  sigaddset(set, SIGHUP);
}

int sup_start(void) {
  sigset_t set;
  sup_signals(&set);
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  return signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
}

/* The poll timeout until `deadline` (0: none), in ms. */
static int wait_ms(double deadline) {
  if (deadline <= 0) return -1;
  double left = deadline - now();
  return left <= 0 ? 0 : (int)(left * 1000) + 1;
}

sup_end sup_wait(pid_t pid, int sfd, double timeout, const sup_io *io) {
  struct pollfd p[8];
  int n = 1 + (io ? io->nfds : 0);
  double deadline = timeout > 0 ? now() + timeout : 0;
  int status = 0, done = 0, timed_out = 0, killed = 0;
  if (n > 8) abort();              /* callers pass at most a few */
  while (!done) {
    p[0] = (struct pollfd){sfd, POLLIN, 0};
    if (io) memcpy(p + 1, io->fds, (size_t)io->nfds * sizeof *p);
    if (poll(p, (nfds_t)n, timed_out ? -1 : wait_ms(deadline)) > 0 && io) {
      memcpy(io->fds, p + 1, (size_t)io->nfds * sizeof *p);
      io->ready(io->ud);
    }
    if (deadline > 0 && !timed_out && now() >= deadline) {
      timed_out = 1;
      sbx_kill_descendants(getpid());
    }
    struct signalfd_siginfo si;
    while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si)
      if (si.ssi_signo != SIGCHLD && !killed) {
        killed = (int)si.ssi_signo;
        sbx_kill_descendants(getpid());
      }
    int st;
    pid_t r;
    while ((r = waitpid(-1, &st, WNOHANG)) > 0)   /* orphans are ours to reap */
      if (r == pid) { status = st; done = 1; }
  }
  if (timed_out) return (sup_end){SUP_TIMEOUT, 0};
  if (killed) return (sup_end){SUP_KILLED, killed};
  if (WIFSIGNALED(status)) return (sup_end){SUP_SIGNAL, WTERMSIG(status)};
  return (sup_end){SUP_EXIT, WEXITSTATUS(status)};
}
