/*
** Starting a child: vfork-style clone3 (the child borrows the parent's
** memory until it execs, so nothing is copied), straight into a cgroup when
** one is given, with a pidfd; the old clone with the same flags where a
** seccomp filter refuses clone3. No Lua here: sbx-agent links it too.
*/
#ifndef SBX_SPAWN_H
#define SBX_SPAWN_H

#include <signal.h>
#include <stddef.h>
#include <sys/types.h>

#define SBX_SPAWN_MAXFDS 8

typedef struct sbx_rlimit { int resource; unsigned long long value; } sbx_rlimit;

typedef struct sbx_spawn_req {
  const char *path;          /* program to execve (already looked up) */
  const char *cwd;           /* NULL: inherit */
  char *const *argv, *const *envp;
  int in, out, err;          /* fds for 0, 1, 2; in < 0 means /dev/null */
  int cgroup_fd;             /* -1: none, and the child is its own subreaper */
  const int *fds;            /* nfds more fds: they become 3, 4, ... */
  int nfds;                  /* at most SBX_SPAWN_MAXFDS */
  const sbx_rlimit *rlimits; /* set in the child before execve */
  int nrlimits;
  /* cgroup.procs files of cgroup v1 hierarchies (a hybrid host's pids,
  ** memory, cpu controllers), open for writing: the child writes itself
  ** into each before anything else, so no descendant starts outside. */
  const int *join_fds;
  int njoin;
  /* Written to /proc/self/oom_score_adj in the child, best effort (NULL:
  ** inherited). sbx-agent raises its commands' so that under a sandbox's
  ** memory limit the kernel kills a command, not the agent. */
  const char *oom_score_adj;
  /* Namespace files (open, O_RDONLY) the child enters in order, after the
  ** cgroups and before anything else; entering a user namespace makes it
  ** that namespace's root (uid and gid 0 there, no extra groups). */
  const int *ns_fds;
  int nns;
  /* The signals the caller ignores (execve keeps SIG_IGN), from
  ** sbx_ignored_signals: the child resets only those. NULL: every signal
  ** that might be. Only for callers without signal handlers, as the child
  ** runs in their memory until execve. */
  const sigset_t *ignored;
  /* set by the child when it fails before execve */
  volatile int stage;        /* 1 chdir, 2 execve, 3 setrlimit, 4 fds, 5 cgroup, 6 setns, 7 unshare */
  volatile int err_no;
  int report;                /* internal: pipe for fork-style clones */
  int legacy;                /* internal: the old clone (clone3 refused) */
  int keep_below;            /* internal: > 0, the child shares our fd table
                                and copies only the fds below this one */
  pid_t parent;              /* internal: the child's parent, to notice its death */
} sbx_spawn_req;

/* Returns the pid (and *pidfd) or -1: errno for clone3 failures, or
** r->stage/r->err_no when the child could not chdir or exec (it has been
** reaped). */
pid_t sbx_spawn(sbx_spawn_req *r, int *pidfd);

/* Move a long-lived fd (a sandbox's root, a running command's pipes) out
** of the low numbers a child's fd table copies: `fd` itself when it is low
** enough already or cannot move (fd limit), else the moved copy (fd is
** closed). See spawn.c. */
int sbx_fd_park(int fd);
/* The same for a fd that lives as long as a sandbox, a kept cgroup or the
** process (the loop's, the session's): moved even from below 16, where
** sbx_fd_park leaves a command's own fds. */
int sbx_fd_keep(int fd);
/* The most fd slots a child's copy of our table has held so far, their
** mean over the children, and whether clones copy the whole table instead
** (close_range refused). */
void sbx_spawn_copy_stats(int *max, double *mean, int *whole);
/* A copy of a parked fd at the lowest free number, or -1 when fd is low
** already or nothing lower is free: a spawner thread gives a queued
** command's child ends low numbers again just before its clone. */
int sbx_fd_lowered(int fd);
/* Whether the fd limit is under 1024 (no parking then): keep fewer fds. */
int sbx_fds_scarce(void);

/* The nice value children start with, when the thread that spawns them
** runs at another one (INT_MIN, the default: theirs is inherited). The
** sbxlua binary raises its own threads' priority: see main.c. */
extern int sbx_child_nice;

/* The signals the child of sbx_spawn resets that are SIG_IGN now. */
void sbx_ignored_signals(sigset_t *set);

/* Find `name` on `path` (a PATH value) like execvp, without using the
** caller's own environment. 0 and the result in buf, or an errno. */
int sbx_find_program(const char *name, const char *path, char *buf, size_t size);
/* The PATH= entry of envp, or the documented default. */
const char *sbx_env_path(char *const *envp);

#define SBX_DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#endif
