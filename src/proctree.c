/*
** How process trees die, without Lua (the host and sbx-run share it).
**
** A cgroup contains a tree for good: setsid, double forks and reparenting
** cannot leave it, and cgroup.kill takes everything at once. Where no
** cgroup v2 directory is writable, sbx_kill_tree sweeps /proc instead
** (the child is its own subreaper, so orphans stay below it).
*/
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "proctree.h"
#include "spawn.h"

#define MAXPATH 4096

static int write_file(const char *dir, const char *name, const char *val) {
  char path[MAXPATH];
  if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
    return -1;
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = write(fd, val, strlen(val));
  close(fd);
  return n == (ssize_t)strlen(val) ? 0 : -1;
}

/* Call fn(dir/child) for every child cgroup of dir. */
static void each_child(const char *dir, void (*fn)(const char *, void *),
                       void *ud) {
  char path[MAXPATH];
  DIR *d = opendir(dir);
  struct dirent *e;
  if (!d) return;
  while ((e = readdir(d)) != NULL) {
    if (e->d_type != DT_DIR || e->d_name[0] == '.') continue;
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path)
      fn(path, ud);
  }
  closedir(d);
}

/* Visit the pids of a cgroup and, recursively, of its children. */
void sbx_cgroup_each_pid(const char *dir, void (*fn)(pid_t, void *), void *ud);

typedef struct pid_visit { void (*fn)(pid_t, void *); void *ud; } pid_visit;

static void each_pid_child(const char *dir, void *ud) {
  pid_visit *v = ud;
  sbx_cgroup_each_pid(dir, v->fn, v->ud);
}

void sbx_cgroup_each_pid(const char *dir, void (*fn)(pid_t, void *), void *ud) {
  char path[MAXPATH];
  pid_visit v = {fn, ud};
  if (snprintf(path, sizeof path, "%s/cgroup.procs", dir) < (int)sizeof path) {
    FILE *f = fopen(path, "re");
    long pid;
    if (f) {
      while (fscanf(f, "%ld", &pid) == 1) fn((pid_t)pid, ud);
      fclose(f);
    }
  }
  each_child(dir, each_pid_child, &v);
}

static void kill_pid(pid_t pid, void *ud) {
  (void)ud;
  kill(pid, SIGKILL);
}

int sbx_cgroup_kill(const char *dir) {
  if (write_file(dir, "cgroup.kill", "1") == 0) return 0;
  /* Kernels before 5.14: freeze, kill each member, thaw. */
  struct stat st;
  if (stat(dir, &st) < 0) return -1;
  write_file(dir, "cgroup.freeze", "1");
  sbx_cgroup_each_pid(dir, kill_pid, NULL);
  write_file(dir, "cgroup.freeze", "0");
  return 0;
}

static void remove_child(const char *dir, void *ud) {
  sbx_cgroup_remove(dir, *(int *)ud);
}

static void cg_forget(const char *dir);

int sbx_cgroup_remove(const char *dir, int wait) {
  cg_forget(dir);
  /* Most often its only children were kept ones, now gone: no listing */
  if (rmdir(dir) == 0 || errno == ENOENT) return 0;
  each_child(dir, remove_child, &wait);
  for (int i = 0; rmdir(dir) < 0; i++) {
    if (errno == ENOENT) return 0;
    if (errno != EBUSY || !wait || i >= 400) return -1;
    struct timespec ts = {0, 5 * 1000 * 1000};  /* dying members: 2 s max */
    nanosleep(&ts, NULL);
  }
  return 0;
}


/* Empty command cgroups are reused: mkdir and rmdir of a cgroup take a
** global kernel lock and cost more than starting the command itself.
** Each keeps its cgroup.events and its directory open (parked high, see
** sbx_fd_park): "is it empty" is asked twice per command, every spawn into
** it needs the directory, and a pread or a kept fd costs a tenth of the
** open's path walk through cgroupfs. The path handed out sits in the same
** allocation, after the fds. */
#define CG_CACHE 64
typedef struct cg { int events, dir; char path[]; } cg;
static char *cg_cache[CG_CACHE];
static int cg_ncache;

static cg *cg_of(char *path) { return (cg *)(path - offsetof(cg, path)); }

static char *cg_new(const char *path) {
  size_t n = strlen(path) + 1;
  cg *c = malloc(sizeof *c + n);
  if (!c) return NULL;
  c->events = c->dir = -1;
  memcpy(c->path, path, n);
  return c->path;
}

void sbx_cgroup_free(char *path) {
  if (!path) return;
  cg *c = cg_of(path);
  if (c->events >= 0) close(c->events);
  if (c->dir >= 0) close(c->dir);
  free(c);
}

/* open(2), giving back the kept cgroups' fds once when we are out of fds */
static int open_fd(const char *path, int flags) {
  int fd = open(path, flags | O_CLOEXEC);
  if (fd < 0 && errno == EMFILE && sbx_cgroup_trim() > 0) fd = open(path, flags | O_CLOEXEC);
  return fd;
}

int sbx_cgroup_dirfd(char *path) {
  cg *c = cg_of(path);
  if (c->dir < 0) {
    int fd = open_fd(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -1;
    c->dir = sbx_fd_keep(fd);
  }
  return c->dir;
}

/* 0 empty, 1 populated, -1 gone or unreadable (removed: ENODEV). */
static int populated(char *path) {
  cg *c = cg_of(path);
  char buf[256];
  if (c->events < 0) {
    char file[MAXPATH];
    if (snprintf(file, sizeof file, "%s/cgroup.events", path) >= (int)sizeof file)
      return -1;
    if ((c->events = open_fd(file, O_RDONLY)) < 0) return -1;
    c->events = sbx_fd_keep(c->events);
  }
  ssize_t n = pread(c->events, buf, sizeof buf - 1, 0);
  if (n <= 0) return -1;
  buf[n] = '\0';
  return strstr(buf, "populated 0") ? 0 : 1;
}

int sbx_cgroup_trim(void) {
  int n = cg_ncache;
  while (cg_ncache > 0) {
    char *c = cg_cache[--cg_ncache];
    rmdir(c);                      /* empty when it was kept */
    sbx_cgroup_free(c);
  }
  return n;
}

/* Kept groups at or below dir, which is being removed: removed (a
** sandbox's own would otherwise fill the cache once it is destroyed). They
** were empty when kept, and nothing spawns into a kept one. */
static void cg_forget(const char *dir) {
  size_t n = strlen(dir);
  for (int i = cg_ncache - 1; i >= 0; i--) {
    char *c = cg_cache[i];
    if (strncmp(c, dir, n) == 0 && (c[n] == '/' || c[n] == '\0')) {
      cg_cache[i] = cg_cache[--cg_ncache];
      rmdir(c);
      sbx_cgroup_free(c);
    }
  }
}

int sbx_cgroup_take(const char *parent, char **out) {
  static unsigned long counter;
  size_t plen = strlen(parent);
  for (int i = cg_ncache - 1; i >= 0; i--) {
    char *c = cg_cache[i];
    if (strncmp(c, parent, plen) != 0 || c[plen] != '/' || strchr(c + plen + 1, '/'))
      continue;
    cg_cache[i] = cg_cache[--cg_ncache];
    if (populated(c) == 0) {       /* still there, still empty */
      *out = c;
      return 0;
    }
    sbx_cgroup_free(c);
  }
  char buf[MAXPATH];
  int n = snprintf(buf, sizeof buf, "%s/c%d.%lu", parent, (int)getpid(), ++counter);
  if (n < 0 || n >= (int)sizeof buf) return ENAMETOOLONG;
  if (mkdir(buf, 0755) < 0) return errno;
  *out = cg_new(buf);
  if (*out) return 0;
  rmdir(buf);
  return ENOMEM;
}

void sbx_cgroup_give(char *path) {
  if (!path) return;
  int state = populated(path);
  if (state == 0 && cg_ncache < CG_CACHE) {
    cg *c = cg_of(path);
    if (c->dir >= 0 && sbx_fds_scarce()) {   /* under a low fd limit a kept */
      close(c->dir);                          /* cgroup holds one fd, not two */
      c->dir = -1;
    }
    cg_cache[cg_ncache++] = path;
    return;
  }
  if (state == 0) rmdir(path);
  sbx_cgroup_free(path);
}

/* ------------------------------------------------------- the /proc sweep */

typedef struct ptab { pid_t *pid, *ppid; size_t n, cap; } ptab;

static int read_ppid(pid_t pid, pid_t *ppid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  char *p = strrchr(buf, ')');     /* the command name may hold anything */
  int pp;
  if (!p || sscanf(p + 1, " %*c %d", &pp) != 1) return -1;
  *ppid = (pid_t)pp;
  return 0;
}

static void ptab_scan(ptab *t) {
  DIR *d = opendir("/proc");
  struct dirent *e;
  t->n = 0;
  if (!d) return;
  while ((e = readdir(d)) != NULL) {
    pid_t pid = (pid_t)atoi(e->d_name), ppid;
    if (pid <= 0 || read_ppid(pid, &ppid) < 0) continue;
    if (t->n == t->cap) {
      size_t cap = t->cap ? t->cap * 2 : 256;
      pid_t *a = realloc(t->pid, cap * sizeof *a);
      if (!a) break;
      t->pid = a;
      pid_t *b = realloc(t->ppid, cap * sizeof *b);
      if (!b) break;
      t->ppid = b;
      t->cap = cap;
    }
    t->pid[t->n] = pid;
    t->ppid[t->n++] = ppid;
  }
  closedir(d);
}

/* Kill every descendant of root once; returns how many were found. */
static int kill_descendants(ptab *t, pid_t root) {
  int found = 0, grew = 1;
  char *mark = calloc(t->n ? t->n : 1, 1);
  if (!mark) return 0;
  while (grew) {                   /* fixpoint over parent links */
    grew = 0;
    for (size_t i = 0; i < t->n; i++) {
      if (mark[i]) continue;
      int under = t->ppid[i] == root;
      for (size_t j = 0; !under && j < t->n; j++)
        under = mark[j] && t->pid[j] == t->ppid[i];
      if (under) { mark[i] = 1; grew = 1; found++; kill(t->pid[i], SIGKILL); }
    }
  }
  free(mark);
  return found;
}

int sbx_kill_descendants(pid_t pid) {
  ptab t = {0};
  int rounds = 0;
  for (; rounds < 50; rounds++) {
    ptab_scan(&t);
    if (kill_descendants(&t, pid) == 0) break;
  }
  free(t.pid);
  free(t.ppid);
  return rounds;
}

void sbx_kill_tree(pid_t pid, int sig) {
  if (pid <= 0) return;
  if (sig != SIGKILL) {
    if (kill(-pid, sig) < 0) kill(pid, sig);
    return;
  }
  kill(-pid, SIGSTOP);             /* the group stops forking while we look */
  sbx_kill_descendants(pid);
  kill(-pid, SIGKILL);
  kill(pid, SIGKILL);
}
