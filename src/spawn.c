/*
** vfork-style clone3. A full fork copies the page tables of sbxlua for
** every command; with CLONE_VM | CLONE_VFORK the child runs on a small
** stack of its own in the parent's memory until execve, as posix_spawn
** does, and CLONE_INTO_CGROUP places it in its cgroup without a migration.
** Where clone3 is refused (Docker's seccomp profile and the bwrap backend's
** own filter answer ENOSYS: sbx-agent's supervisors meet it on every
** command) the old clone syscall takes the same flags, so the child still
** borrows our memory. Returning from a clone onto a new stack needs a few
** instructions of assembly; other architectures use fork-style clones
** (same semantics, slower).
**
** The fd table: a plain clone copies all of it (a reference taken on every
** open file) and execve then closes every copy again, so with a thousand
** sandboxes open each command paid for a thousand fds twice. Instead the
** child shares our table (CLONE_FILES) and, as its first act, takes a copy
** of only the fds below the highest one it needs (close_range with
** CLOSE_RANGE_UNSHARE). sbx_fd_park keeps the many long-lived fds above
** that low range, so the copy stays a few dozen fds whatever runs, and
** sbx_fd_keep even those few that would fit below 16 (the process's, a
** sandbox's, a kept cgroup's: each child would copy them all). A
** command waiting for a spawner thread parks its child's ends too: two
** hundred queued commands held six hundred low fds, so the commands
** spawned meanwhile copied (and execve closed) over a thousand each. The
** spawner thread gives them low numbers again just before the clone.
*/
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <linux/sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spawn.h"

/* AddressSanitizer cannot follow a child running on a borrowed stack in the
** parent's memory (its shadow bytes would go stale): sanitizer builds take
** the fork-style path, the normal build tests the trampoline. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
/* fork-style clones (ThreadSanitizer cannot follow it either) */
#elif defined(__x86_64__)
#define SBX_CLONE_TRAMPOLINE 1
/* long sbx_clone_raw(long nr, long a1, long a2, long a3, int (*fn)(void *),
** void *arg): the syscall nr (clone3 or clone) with its first three
** arguments and no child_tid. fn and arg ride in r8 and r9, which clone3
** does not read and clone reads only as the TLS of CLONE_SETTLS. */
__asm__(".text\n"
        ".globl sbx_clone_raw\n"
        ".hidden sbx_clone_raw\n"
        ".type sbx_clone_raw,@function\n"
        "sbx_clone_raw:\n"
        "  mov %rdi, %rax\n"
        "  mov %rsi, %rdi\n"
        "  mov %rdx, %rsi\n"
        "  mov %rcx, %rdx\n"
        "  xor %r10d, %r10d\n"
        "  syscall\n"
        "  test %rax, %rax\n"
        "  jnz 1f\n"
        "  xor %ebp, %ebp\n"           /* child, on its own stack */
        "  mov %r9, %rdi\n"
        "  call *%r8\n"
        "  mov %eax, %edi\n"
        "  mov $60, %eax\n"            /* SYS_exit */
        "  syscall\n"
        "  hlt\n"
        "1: ret\n"
        ".size sbx_clone_raw, .-sbx_clone_raw\n");
#elif defined(__aarch64__)
#define SBX_CLONE_TRAMPOLINE 1
/* The same; clone's tls and child_tid (x3, x4) are zero. */
__asm__(".text\n"
        ".globl sbx_clone_raw\n"
        ".hidden sbx_clone_raw\n"
        ".type sbx_clone_raw,%function\n"
        "sbx_clone_raw:\n"
        "  mov x10, x4\n"
        "  mov x11, x5\n"
        "  mov x8, x0\n"
        "  mov x0, x1\n"
        "  mov x1, x2\n"
        "  mov x2, x3\n"
        "  mov x3, xzr\n"
        "  mov x4, xzr\n"
        "  svc #0\n"
        "  cbnz x0, 1f\n"
        "  mov x0, x11\n"
        "  blr x10\n"
        "  mov x8, #93\n"              /* SYS_exit */
        "  svc #0\n"
        "1: ret\n"
        ".size sbx_clone_raw, .-sbx_clone_raw\n");
#endif

#ifdef SBX_CLONE_TRAMPOLINE
long sbx_clone_raw(long nr, long a1, long a2, long a3, int (*fn)(void *), void *arg);
#endif

static void move_fd(int from, int to) {
  if (from == to) fcntl(to, F_SETFD, 0);  /* dup2 would keep O_CLOEXEC */
  else dup2(from, to);
}

/* Signals a parent may have set to SIG_IGN, which execve would keep. */
static const int reset_signals[] = {SIGPIPE, SIGHUP, SIGINT, SIGQUIT, SIGTERM,
  SIGUSR1, SIGUSR2, SIGALRM, SIGCHLD, SIGTTIN, SIGTTOU, SIGTSTP, SIGXFSZ};

void sbx_ignored_signals(sigset_t *set) {
  struct sigaction sa;
  sigemptyset(set);
  for (size_t i = 0; i < sizeof reset_signals / sizeof *reset_signals; i++)
    if (sigaction(reset_signals[i], NULL, &sa) == 0 && sa.sa_handler == SIG_IGN)
      sigaddset(set, reset_signals[i]);
}

/* The legacy clone has no CLONE_INTO_CGROUP: the child moves itself. */
static int join_cgroup(int cgroup_fd) {
  int fd = openat(cgroup_fd, "cgroup.procs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = write(fd, "0", 1);
  close(fd);
  return n == 1 ? 0 : -1;
}

int sbx_child_nice = INT_MIN;

/* Every fd from `lowest` up close-on-exec. Where close_range cannot
** (before Linux 5.11, or a seccomp filter) the fds /proc lists are marked
** one by one: a Lua io.open's fd is not close-on-exec, and must not reach
** the command either. getdents64 into a buffer on this stack: no malloc. */
static void cloexec_from(int lowest) {
  if (syscall(SYS_close_range, (unsigned)lowest, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
  int d = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d < 0) return;
  char buf[2048];
  long n;
  while ((n = syscall(SYS_getdents64, d, buf, sizeof buf)) > 0)
    for (long off = 0; off < n;) {
      struct { uint64_t ino; int64_t off; unsigned short reclen; unsigned char type; char name[]; } *e =
        (void *)(buf + off);
      int fd = 0, digits = 0;
      for (const char *c = e->name; *c >= '0' && *c <= '9' && fd < (1 << 24); c++, digits++)
        fd = fd * 10 + (*c - '0');
      if (digits && e->name[digits] == '\0' && fd >= lowest && fd != d) fcntl(fd, F_SETFD, FD_CLOEXEC);
      off += e->reclen;
    }
  close(d);
}

/* In the child: system calls only, until execve. */
static int child(void *arg) {
  sbx_spawn_req *r = arg;
  sigset_t none;
  /* a lower priority is always allowed: the boost ends here */
  if (sbx_child_nice != INT_MIN) setpriority(PRIO_PROCESS, 0, sbx_child_nice);
  /* first of all, before any fd changes: our own table (see the top) */
  if (r->keep_below > 0 &&
      syscall(SYS_close_range, (unsigned)r->keep_below, ~0U, CLOSE_RANGE_UNSHARE) < 0) {
    r->stage = 7;
    goto fail;
  }
  /* (here, before a setns may take /proc away; every fd the child makes
  ** from now on is O_CLOEXEC, and dup2 clears it on 0-2 and 3, 4, ...) */
  cloexec_from(3 + r->nfds);
  for (size_t i = 0; i < sizeof reset_signals / sizeof *reset_signals; i++)
    if (!r->ignored || sigismember(r->ignored, reset_signals[i]) == 1)
      signal(reset_signals[i], SIG_DFL);
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  setpgid(0, 0);
  if (r->legacy && r->cgroup_fd >= 0 && join_cgroup(r->cgroup_fd) < 0) {
    r->stage = 5;
    goto fail;
  }
  for (int i = 0; i < r->njoin; i++)
    if (write(r->join_fds[i], "0", 1) != 1) {
      r->stage = 5;
      goto fail;
    }
  if (r->oom_score_adj) {
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
      if (write(fd, r->oom_score_adj, strlen(r->oom_score_adj)) < 0) { /* best effort */ }
      close(fd);
    }
  }
  /* (before PR_SET_PDEATHSIG: a change of uid clears it) */
  /* (a caller without root keeps its own groups: a namespace it made has
  ** setgroups denied) */
  int root = geteuid() == 0;
  for (int i = 0; i < r->nns; i++) {
    int user = ioctl(r->ns_fds[i], NS_GET_NSTYPE) == CLONE_NEWUSER;
    if (setns(r->ns_fds[i], 0) < 0 ||
        (user && ((setgroups(0, NULL) < 0 && root) || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0))) {
      r->stage = 6;
      goto fail;
    }
  }
  if (r->cgroup_fd < 0) prctl(PR_SET_CHILD_SUBREAPER, 1);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  /* A parent killed before that prctl sends no signal: start nothing for
  ** it. (Until execve we also hold a copy of its fds, its session lock
  ** among them: the sooner we go, the sooner gc sees it dead.) */
  if (getppid() != r->parent) _exit(127);
  /* Extra fds go above their targets first, so that placing 0-2 and then
  ** 3, 4, ... never overwrites one that is still to be moved. */
  int parked[SBX_SPAWN_MAXFDS];
  for (int i = 0; i < r->nfds; i++)
    if ((parked[i] = fcntl(r->fds[i], F_DUPFD_CLOEXEC, 3 + r->nfds)) < 0) {
      r->stage = 4;
      goto fail;
    }
  int in = r->in >= 0 ? r->in : open("/dev/null", O_RDONLY | O_CLOEXEC);
  move_fd(in, 0);
  move_fd(r->out, 1);
  move_fd(r->err, 2);
  for (int i = 0; i < r->nfds; i++) dup2(parked[i], 3 + i);
  if (r->cwd && chdir(r->cwd) < 0) {
    r->stage = 1;
    goto fail;
  }
  for (int i = 0; i < r->nrlimits; i++) {
    struct rlimit rl = {(rlim_t)r->rlimits[i].value, (rlim_t)r->rlimits[i].value};
    if (setrlimit(r->rlimits[i].resource, &rl) < 0) {
      r->stage = 3;
      goto fail;
    }
  }
  execve(r->path, r->argv, r->envp);
  r->stage = 2;
fail:
  r->err_no = errno;
  if (r->report >= 0) {            /* fork-style: our memory is a copy */
    int rep[2] = {r->stage, r->err_no};
    if (write(r->report, rep, sizeof rep) < 0) _exit(126);
  }
  _exit(127);
}

#ifndef SBX_CLONE_TRAMPOLINE
/* Fork-style: the child runs on a copy of our memory and reports a failure
** before execve through a pipe. `legacy`: the old clone syscall, for
** seccomp profiles that refuse clone3. */
static pid_t spawn_forked(sbx_spawn_req *r, struct clone_args *ca, int *pidfd, int legacy) {
  int rep[2] = {0, 0}, fds[2];
  if (pipe2(fds, O_CLOEXEC) < 0) return -1;
  r->report = fds[1];
  r->legacy = legacy;
  pid_t pid = legacy ? (pid_t)syscall(SYS_clone, SIGCHLD | CLONE_PIDFD, 0, pidfd, 0, 0)
                     : (pid_t)syscall(SYS_clone3, ca, sizeof *ca);
  if (pid == 0) child(r);
  int saved = errno;
  close(fds[1]);
  if (pid > 0 && read(fds[0], rep, sizeof rep) == (ssize_t)sizeof rep) {
    r->stage = rep[0];
    r->err_no = rep[1];
  }
  close(fds[0]);
  r->report = -1;
  errno = saved;
  return pid;
}
#endif

static int refused(int err) { return err == ENOSYS || err == EPERM; }

#ifdef SBX_CLONE_TRAMPOLINE
/* 1 + the highest fd the child needs, at least 3 (its stdio). The cgroup's
** fd only where the child joins it itself (legacy clone): clone3 reads it
** from our table, and a kept one sits high (sbx_cgroup_dirfd). */
static int fds_needed(const sbx_spawn_req *r) {
  int k = 2;
  const int *lists[] = {r->fds, r->join_fds, r->ns_fds};
  const int counts[] = {r->nfds, r->njoin, r->nns};
  int one[] = {r->in, r->out, r->err, r->legacy ? r->cgroup_fd : -1};
  for (size_t i = 0; i < sizeof one / sizeof *one; i++)
    if (one[i] > k) k = one[i];
  for (int l = 0; l < 3; l++)
    for (int i = 0; i < counts[l]; i++)
      if (lists[l][i] > k) k = lists[l][i];
  return k + 1;
}
#endif

/* Whether children may share the fd table until they copy their part:
** 1 yes, 0 no (close_range's CLOSE_RANGE_UNSHARE, Linux 5.9, refused by
** the kernel or a seccomp filter: the first child that meets it says so,
** and we clone the whole table from then on). */
static volatile int share_files = 1;

/* Above this the parked fds go; the low numbers below stay for what a
** child needs. 0: not yet computed, -1: parking is off (fd limit too low). */
#define PARK_LOW 16
static int park_base;

static void park_init(void) {
  if (park_base == 0) {
    struct rlimit rl;
    park_base = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur >= 1024 ? 256 : -1;
  }
}

int sbx_fds_scarce(void) {
  park_init();
  return park_base < 0;
}

/* A fd at or above `low` moves up to park_base. */
static int park_from(int fd, int low) {
  if (fd < low) return fd;
  park_init();
  if (park_base < 0 || fd >= park_base) return fd;
  int moved = fcntl(fd, F_DUPFD_CLOEXEC, park_base);
  if (moved < 0) return fd;        /* EMFILE: it works where it is */
  close(fd);
  return moved;
}

int sbx_fd_park(int fd) { return park_from(fd, PARK_LOW); }

/* Below 16 every child copies what sits there, whatever it runs: a fd
** that stays for a whole sandbox or job pays one move instead of a copy
** and a close-on-exec in each of its commands' children. */
int sbx_fd_keep(int fd) { return park_from(fd, 3); }

/* The most fd slots one child has copied (its close_range's K): what
** parking is for, reported by proc.spawner(). */
static atomic_int copied_max;
static atomic_long copied_sum, copies;

static void note_copied(int k) {
  int seen = atomic_load(&copied_max);
  while (k > seen && !atomic_compare_exchange_weak(&copied_max, &seen, k)) {}
  atomic_fetch_add(&copied_sum, k);
  atomic_fetch_add(&copies, 1);
}

void sbx_spawn_copy_stats(int *max, double *mean, int *whole) {
  long n = atomic_load(&copies);
  *max = atomic_load(&copied_max);
  *mean = n ? (double)atomic_load(&copied_sum) / (double)n : 0;
#ifdef SBX_CLONE_TRAMPOLINE
  *whole = !share_files;
#else
  *whole = 1;                      /* fork-style: a copy of everything */
#endif
}

int sbx_fd_lowered(int fd) {
  if (fd < PARK_LOW) return -1;
  int low = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (low >= 0 && low > fd) {
    close(low);
    low = -1;
  }
  return low;
}

pid_t sbx_spawn(sbx_spawn_req *r, int *pidfd) {
  struct clone_args ca;
  memset(&ca, 0, sizeof ca);
  r->stage = r->err_no = 0;
  r->report = -1;
  r->legacy = 0;
  r->keep_below = 0;
  r->parent = getpid();
  *pidfd = -1;
  ca.flags = CLONE_PIDFD | (r->cgroup_fd >= 0 ? CLONE_INTO_CGROUP : 0);
  ca.pidfd = (uint64_t)(uintptr_t)pidfd;
  ca.exit_signal = SIGCHLD;
  ca.cgroup = r->cgroup_fd >= 0 ? (uint64_t)r->cgroup_fd : 0;
  pid_t pid;
#ifdef SBX_CLONE_TRAMPOLINE
  _Alignas(16) char stack[32768];
again:;
  struct clone_args va = ca;
  r->keep_below = share_files ? fds_needed(r) : 0;
  note_copied(r->keep_below);
  va.flags |= CLONE_VM | CLONE_VFORK | (r->keep_below ? CLONE_FILES : 0);
  va.stack = (uint64_t)(uintptr_t)stack;
  va.stack_size = sizeof stack;
  pid = (pid_t)sbx_clone_raw(SYS_clone3, (long)&va, (long)sizeof va, 0, child, r);
  if (pid < 0 && refused(-pid)) {
    r->legacy = 1;                 /* the child joins its cgroup itself */
    r->keep_below = share_files ? fds_needed(r) : 0;
    pid = (pid_t)sbx_clone_raw(SYS_clone, CLONE_VM | CLONE_VFORK | CLONE_PIDFD | SIGCHLD |
                               (r->keep_below ? CLONE_FILES : 0),
                               (long)(stack + sizeof stack), (long)pidfd, child, r);
  }
  if (pid < 0) {
    errno = -pid;
    return -1;
  }
#else
  pid = spawn_forked(r, &ca, pidfd, 0);
  if (pid < 0 && refused(errno)) pid = spawn_forked(r, &ca, pidfd, 1);
#endif
  if (pid < 0) return -1;
  /* With CLONE_VFORK the child has exec'd or failed by now; fork-style, the
  ** pipe told us. (A later failure shows up as an exit: lproc.c's reap.) */
  if (r->stage) {
    siginfo_t si;
    int stage = r->stage;
    waitid(P_PIDFD, *pidfd, &si, WEXITED);
    close(*pidfd);
    *pidfd = -1;
#ifdef SBX_CLONE_TRAMPOLINE
    if (stage == 7) {              /* no close_range unsharing here: copy it all */
      share_files = 0;
      r->stage = r->err_no = 0;
      r->legacy = 0;
      goto again;
    }
#endif
    (void)stage;
    errno = r->err_no;
    return -1;
  }
  return pid;
}

const char *sbx_env_path(char *const *envp) {
  for (; *envp; envp++)
    if (strncmp(*envp, "PATH=", 5) == 0) return *envp + 5;
  return SBX_DEFAULT_PATH;
}

int sbx_find_program(const char *name, const char *path, char *buf,
                     size_t size) {
  struct stat st;
  if (strchr(name, '/')) {
    if (strlen(name) >= size) return ENAMETOOLONG;
    strcpy(buf, name);
    return 0;
  }
  if (!*name) return ENOENT;
  while (path && *path) {
    const char *end = strchrnul(path, ':');
    int len = (int)(end - path);
    if (len > 0 && path[0] == '/' &&
        snprintf(buf, size, "%.*s/%s", len, path, name) < (int)size &&
        stat(buf, &st) == 0 && S_ISREG(st.st_mode) && access(buf, X_OK) == 0)
      return 0;
    path = *end ? end + 1 : end;
  }
  return ENOENT;
}
