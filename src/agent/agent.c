/*
** sbx-agent: a small static program that sbxlua places inside a sandbox
** (a container has none of sbxlua's own machinery).
**
**   sbx-agent run [--timeout SECS] [--stdin FILE|-] [--cwd DIR] [--pidfile F]
**                 -- PROG [ARGS]
**     Supervises one command where the backend's own exec API cannot:
**     it is a subreaper, so every descendant (setsid ones included) stays
**     below it; a timeout or a TERM/INT/HUP kills the whole tree; output is
**     relayed through pipes it owns, so grandchildren that keep them open
**     cannot hold the exec stream; the command's fate is reported as the
**     last bytes on stderr: "\0SBXAGENT1 <kind> <n>\n", kind one of exit,
**     signal, timeout, noexec (n = errno), nocwd (n = errno), killed.
**     Nothing else ever writes to the agent's own stderr after the command,
**     so the last such record is the agent's.
**
**   sbx-agent ls DIR
**     NUL-separated records "type\0size\0mtime\0name\0" for every entry of
**     DIR (not following symlinks); exit 1 with a message on error.
**
**   sbx-agent sleep
**     Waits until TERM/INT (a container's first process: no `sleep` needed
**     in the image).
**
**   sbx-agent kill PIDFILE
**     Sends TERM to the `run` that wrote PIDFILE (--pidfile): it kills its
**     whole tree and reports "killed".
**
**   sbx-agent rm [-r] PATH
**     Removes a file, a symlink (never its target) or, with -r, a tree
**     without following symlinks. Exit 3 when PATH does not exist.
**
**   sbx-agent mkdir PATH
**     Like mkdir -p (mode 0755). Exit 4 when a component is not a directory.
**
**   sbx-agent version
*/
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../proctree.h"

#define AGENT_VERSION "1"
#define FINAL_DRAIN (1024 * 1024)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;            /* the reader is gone: drop output */
    p += w;
    n -= (size_t)w;
  }
}

static void trailer(const char *kind, int n) {
  char buf[64];
  int len = snprintf(buf, sizeof buf, "%cSBXAGENT1 %s %d\n", 0, kind, n);
  write_all(2, buf, (size_t)len);
}

/* Relay what is readable from `from` to `to`; 1 at EOF. */
static int relay(int from, int to, size_t budget) {
  char buf[65536];
  while (budget > 0) {
    ssize_t n = read(from, buf, sizeof buf);
    if (n > 0) {
      write_all(to, buf, (size_t)n);
      budget = (size_t)n >= budget ? 0 : budget - (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return 0;
    return 1;
  }
  return 0;
}

typedef struct options {
  double timeout;
  const char *stdin_file, *cwd, *pidfile;
  char **argv;
} options;

static int parse(int argc, char **argv, options *o) {
  int i = 2;
  memset(o, 0, sizeof *o);
  for (; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) { i++; break; }
    if (i + 1 >= argc) return -1;
    if (strcmp(argv[i], "--timeout") == 0) o->timeout = atof(argv[++i]);
    else if (strcmp(argv[i], "--stdin") == 0) o->stdin_file = argv[++i];
    else if (strcmp(argv[i], "--cwd") == 0) o->cwd = argv[++i];
    else if (strcmp(argv[i], "--pidfile") == 0) o->pidfile = argv[++i];
    else return -1;
  }
  if (i >= argc) return -1;
  o->argv = argv + i;
  return 0;
}

/* In the child: everything here is a system call until execvp. */
static void child(const options *o, int out, int err, int report) {
  sigset_t none;
  int rep[2] = {0, 0};
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  signal(SIGPIPE, SIG_DFL);
  setpgid(0, 0);
  /* "--stdin -": the command reads the agent's own stdin (an attached
  ** exec stream); otherwise a file, or /dev/null when none is given. */
  if (!o->stdin_file || strcmp(o->stdin_file, "-") != 0) {
    int in = open(o->stdin_file ? o->stdin_file : "/dev/null", O_RDONLY | O_CLOEXEC);
    if (in >= 0) dup2(in, 0);
  }
  dup2(out, 1);
  dup2(err, 2);
  if (o->cwd && chdir(o->cwd) < 0) {
    rep[0] = 1;
    goto fail;
  }
  execvp(o->argv[0], o->argv);
  rep[0] = 2;
fail:
  rep[1] = errno;
  if (write(report, rep, sizeof rep) < 0) _exit(126);
  _exit(127);
}

static int cmd_run(int argc, char **argv) {
  options o;
  int out[2], err[2], rep[2];
  if (parse(argc, argv, &o) < 0) {
    fprintf(stderr, "usage: sbx-agent run [--timeout S] [--stdin FILE] [--cwd DIR] -- PROG [ARGS]\n");
    return 2;
  }
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  sigprocmask(SIG_BLOCK, &set, NULL);
  int sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  signal(SIGPIPE, SIG_IGN);
  if (sfd < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 ||
      pipe2(rep, O_CLOEXEC) < 0) {
    perror("sbx-agent");
    return 2;
  }
  if (o.pidfile) {
    FILE *f = fopen(o.pidfile, "we");
    if (f) {
      fprintf(f, "%d\n", (int)getpid());
      fclose(f);
    }
  }
  pid_t pid = fork();
  if (pid < 0) {
    trailer("noexec", errno);
    return 2;
  }
  if (pid == 0) child(&o, out[1], err[1], rep[1]);
  close(out[1]);
  close(err[1]);
  close(rep[1]);
  int why[2];
  ssize_t n;
  while ((n = read(rep[0], why, sizeof why)) < 0 && errno == EINTR) {}
  close(rep[0]);
  if (o.stdin_file && strcmp(o.stdin_file, "-") != 0)
    unlink(o.stdin_file);          /* one use, and it is opened */
  if (n == (ssize_t)sizeof why) {
    waitpid(pid, NULL, 0);
    trailer(why[0] == 1 ? "nocwd" : "noexec", why[1]);
    return 127;
  }
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);

  double deadline = o.timeout > 0 ? now() + o.timeout : 0;
  int status = 0, done = 0, timed_out = 0, killed = 0;
  int open_out = 1, open_err = 1;
  while (!done) {
    struct pollfd p[3] = {{sfd, POLLIN, 0}, {open_out ? out[0] : -1, POLLIN, 0},
                          {open_err ? err[0] : -1, POLLIN, 0}};
    int wait_ms = -1;
    if (deadline > 0 && !timed_out) {
      double left = deadline - now();
      wait_ms = left <= 0 ? 0 : (int)(left * 1000) + 1;
    }
    poll(p, 3, wait_ms);
    if (p[1].revents && relay(out[0], 1, 16 * 65536)) open_out = 0;
    if (p[2].revents && relay(err[0], 2, 16 * 65536)) open_err = 0;
    if (deadline > 0 && !timed_out && now() >= deadline) {
      timed_out = 1;
      sbx_kill_descendants(getpid());
    }
    struct signalfd_siginfo si;
    while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
      if (si.ssi_signo != SIGCHLD && !killed) {
        killed = (int)si.ssi_signo;
        sbx_kill_descendants(getpid());
      }
    }
    int st;
    pid_t r;
    while ((r = waitpid(-1, &st, WNOHANG)) > 0)   /* orphans are ours to reap */
      if (r == pid) { status = st; done = 1; }
  }
  /* Output already in the pipes belongs to the command; then stop. */
  if (open_out) relay(out[0], 1, FINAL_DRAIN);
  if (open_err) relay(err[0], 2, FINAL_DRAIN);
  close(out[0]);
  close(err[0]);
  if (o.pidfile) unlink(o.pidfile);
  if (timed_out) trailer("timeout", 0);
  else if (killed) trailer("killed", killed);
  else if (WIFSIGNALED(status)) trailer("signal", WTERMSIG(status));
  else trailer("exit", WEXITSTATUS(status));
  return 0;
}

static int cmd_ls(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: sbx-agent ls DIR\n");
    return 2;
  }
  int dfd = open(argv[2], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  if (!d) {
    fprintf(stderr, "sbx-agent: %s: %s\n", argv[2], strerror(errno));
    return errno == ENOENT ? 3 : errno == ENOTDIR ? 4 : 1;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    struct stat st;
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
    const char *type = S_ISREG(st.st_mode) ? "file" : S_ISDIR(st.st_mode) ? "dir"
                     : S_ISLNK(st.st_mode) ? "link" : S_ISFIFO(st.st_mode) ? "fifo"
                     : S_ISSOCK(st.st_mode) ? "socket" : S_ISCHR(st.st_mode) ? "char"
                     : S_ISBLK(st.st_mode) ? "block" : "other";
    printf("%s%c%lld%c%lld%c%s%c", type, 0, (long long)st.st_size, 0,
           (long long)st.st_mtime, 0, e->d_name, 0);
  }
  closedir(d);
  return fflush(stdout) == 0 ? 0 : 1;
}

static int cmd_sleep(void) {
  sigset_t set;
  int sig;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigprocmask(SIG_BLOCK, &set, NULL);
  sigwait(&set, &sig);
  return 0;
}

static int cmd_kill(int argc, char **argv) {
  if (argc != 3) return 2;
  FILE *f = fopen(argv[2], "re");
  int pid = 0;
  if (!f) return 3;                /* already finished */
  if (fscanf(f, "%d", &pid) != 1) pid = 0;
  fclose(f);
  if (pid <= 1 || kill(pid, SIGTERM) < 0) return 3;
  return 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag,
                    struct FTW *ftw) {
  (void)st; (void)ftw;
  int r = flag == FTW_DP ? rmdir(path) : unlink(path);
  return r < 0 && errno != ENOENT ? -1 : 0;
}

static int cmd_rm(int argc, char **argv) {
  int recursive = argc == 4 && strcmp(argv[2], "-r") == 0;
  const char *path = argv[argc - 1];
  struct stat st;
  if (argc != (recursive ? 4 : 3)) return 2;
  if (lstat(path, &st) < 0) {
    fprintf(stderr, "sbx-agent: %s: %s\n", path, strerror(errno));
    return errno == ENOENT ? 3 : 1;
  }
  int r;
  if (S_ISDIR(st.st_mode))
    r = recursive ? nftw(path, rm_entry, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT)
                  : rmdir(path);
  else
    r = unlink(path);
  if (r < 0) {
    fprintf(stderr, "sbx-agent: %s: %s\n", path, strerror(errno));
    return errno == ENOTEMPTY ? 4 : 1;
  }
  return 0;
}

static int cmd_mkdir(int argc, char **argv) {
  if (argc != 3) return 2;
  char *path = argv[2];
  struct stat st;
  for (char *p = path + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    char saved = *p;
    *p = '\0';
    if (mkdir(path, 0755) < 0 && errno != EEXIST) {
      fprintf(stderr, "sbx-agent: %s: %s\n", path, strerror(errno));
      return errno == ENOTDIR ? 4 : 1;
    }
    if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode)) {
      fprintf(stderr, "sbx-agent: %s: not a directory\n", path);
      return 4;
    }
    *p = saved;
    if (!saved) return 0;
  }
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "run") == 0) return cmd_run(argc, argv);
  if (argc >= 2 && strcmp(argv[1], "ls") == 0) return cmd_ls(argc, argv);
  if (argc >= 2 && strcmp(argv[1], "sleep") == 0) return cmd_sleep();
  if (argc >= 2 && strcmp(argv[1], "kill") == 0) return cmd_kill(argc, argv);
  if (argc >= 2 && strcmp(argv[1], "rm") == 0) return cmd_rm(argc, argv);
  if (argc >= 2 && strcmp(argv[1], "mkdir") == 0) return cmd_mkdir(argc, argv);
  if (argc >= 2 && strcmp(argv[1], "version") == 0) {
    printf("sbx-agent %s\n", AGENT_VERSION);
    return 0;
  }
  fprintf(stderr, "usage: sbx-agent run|ls|rm|mkdir|kill|sleep|version ...\n");
  return 2;
}
