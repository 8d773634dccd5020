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
**   sbx-agent sleep [--serve]
**     Waits until TERM/INT (a container's first process: no `sleep` needed
**     in the image). With --serve it first serves the protocol (as `serve`)
**     on the container's own stdin/stdout, which sbxlua attaches to before
**     the start: the first link costs the engine no exec. When that stream
**     ends, its commands are stopped as `serve` stops them, and it sleeps
**     (the container lives on; later links are `serve` over an exec).
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
**   sbx-agent serve
**     The multiplexed protocol of docs/agent-protocol.md on stdin/stdout:
**     many commands and file operations at once (serve.c).
**
**   sbx-agent version
*/
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"
#include "fsops.h"
#include "supervise.h"

#define FINAL_DRAIN (1024 * 1024)

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

/* cmd_run's relay between the command's pipes and its own stdout/stderr */
typedef struct relays { struct pollfd fds[2]; } relays;

static void relay_ready(void *ud) {
  relays *r = ud;
  for (int i = 0; i < 2; i++)
    if (r->fds[i].fd >= 0 && r->fds[i].revents &&
        relay(r->fds[i].fd, i + 1, 16 * 65536))
      r->fds[i].fd = -1;
}

/* Why the child failed before exec, from its report pipe: 0 when it ran. */
static int start_failure(int rep, sup_end *end) {
  int why[2];
  ssize_t n;
  while ((n = read(rep, why, sizeof why)) < 0 && errno == EINTR) {}
  close(rep);
  if (n != (ssize_t)sizeof why) return 0;
  *end = (sup_end){why[0] == 1 ? SUP_NOCWD : SUP_NOEXEC, why[1]};
  return 1;
}

/* `run` keeps its fork + execvp start: its command inherits the agent's
** environment and PATH search, as the engine-exec fallback expects (serve
** builds both from the request and starts commands with sbx_spawn). */
static int cmd_run(int argc, char **argv) {
  options o;
  int out[2], err[2], rep[2];
  sigset_t set;
  if (parse(argc, argv, &o) < 0) {
    fprintf(stderr, "usage: sbx-agent run [--timeout S] [--stdin FILE] [--cwd DIR] -- PROG [ARGS]\n");
    return 2;
  }
  sup_signals(&set);
  sigprocmask(SIG_BLOCK, &set, NULL);
  int sfd = sup_start();
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
  sup_end end;
  int failed = start_failure(rep[0], &end);
  if (o.stdin_file && strcmp(o.stdin_file, "-") != 0)
    unlink(o.stdin_file);          /* one use, and it is opened */
  if (failed) {
    waitpid(pid, NULL, 0);
    trailer(sup_kind_name(end.kind), end.n);
    return 127;
  }
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  relays r = {{{out[0], POLLIN, 0}, {err[0], POLLIN, 0}}};
  sup_io io = {r.fds, 2, relay_ready, &r};
  end = sup_wait(pid, sfd, o.timeout, &io);
  /* Output already in the pipes belongs to the command; then stop. */
  if (r.fds[0].fd >= 0) relay(out[0], 1, FINAL_DRAIN);
  if (r.fds[1].fd >= 0) relay(err[0], 2, FINAL_DRAIN);
  close(out[0]);
  close(err[0]);
  if (o.pidfile) unlink(o.pidfile);
  trailer(sup_kind_name(end.kind), end.n);
  return 0;
}

static int emit_stdout(void *ud, const char *rec, size_t n) {
  (void)ud;
  return fwrite(rec, 1, n, stdout) == n ? 0 : -1;
}

/* The CLI's exit codes: 3 no such path (ls, rm), 4 not a directory (or,
** for rm, not empty), 1 anything else. */
static int fail(const char *path, int e, int code3, int code4) {
  fprintf(stderr, "sbx-agent: %s: %s\n", path, strerror(e));
  return e == code3 ? 3 : e == code4 ? 4 : 1;
}

static int cmd_ls(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: sbx-agent ls DIR\n");
    return 2;
  }
  int e = fsop_list(argv[2], emit_stdout, NULL);
  if (e) return fail(argv[2], e, ENOENT, ENOTDIR);
  return fflush(stdout) == 0 ? 0 : 1;
}

static int cmd_sleep(void) {
  sigset_t set;
  int sig;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGCHLD);
  sigprocmask(SIG_BLOCK, &set, NULL);
  if (agent_terminated) return 128 + agent_terminated;   /* it ended serve, or came as serve ended */
  do {                             /* as a container's init: orphans are reaped */
    sigwait(&set, &sig);
    while (waitpid(-1, NULL, WNOHANG) > 0) {}
  } while (sig == SIGCHLD);
  return 0;
}

/* sleep --serve: the container's first process serves its stdio, then
** sleeps. As the namespace's init it cannot be killed from inside (the
** kernel drops SIGKILL from the container to its init), and when it did
** die the engine would end the attached stream (it holds the stdio open
** only while its first process lives), so the host always hears of it. */
static int cmd_sleep_serve(void) {
  agent_serve();                   /* the link's end is the host's, not the container's */
  return cmd_sleep();              /* (at once when serve ended on docker stop's TERM) */
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

static int cmd_rm(int argc, char **argv) {
  int recursive = argc == 4 && strcmp(argv[2], "-r") == 0;
  const char *path = argv[argc - 1];
  if (argc != (recursive ? 4 : 3)) return 2;
  int e = fsop_remove(path, recursive);
  return e ? fail(path, e, ENOENT, ENOTEMPTY) : 0;
}

static int cmd_mkdir(int argc, char **argv) {
  if (argc != 3) return 2;
  int e = fsop_mkdir_p(argv[2]);
  return e ? fail(argv[2], e, 0, ENOTDIR) : 0;
}

int main(int argc, char **argv) {
  const char *cmd = argc >= 2 ? argv[1] : "";
  if (strcmp(cmd, "run") == 0) return cmd_run(argc, argv);
  if (strcmp(cmd, "serve") == 0) return argc == 2 ? agent_serve() : 2;
  if (strcmp(cmd, "ls") == 0) return cmd_ls(argc, argv);
  if (strcmp(cmd, "sleep") == 0 && argc == 3 && strcmp(argv[2], "--serve") == 0)
    return cmd_sleep_serve();
  if (strcmp(cmd, "sleep") == 0) return cmd_sleep();
  if (strcmp(cmd, "kill") == 0) return cmd_kill(argc, argv);
  if (strcmp(cmd, "rm") == 0) return cmd_rm(argc, argv);
  if (strcmp(cmd, "mkdir") == 0) return cmd_mkdir(argc, argv);
  if (strcmp(cmd, "version") == 0) {
    printf("sbx-agent %s\n", AGENT_VERSION);
    return 0;
  }
  fprintf(stderr, "usage: sbx-agent run|serve|ls|rm|mkdir|kill|sleep|version ...\n");
  return 2;
}
