/*
** sbx.cgroup: where sbxlua may create cgroups, and how process trees die.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lauxlib.h"
#include "cgroup.h"
#include "loop.h"

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
static void each_pid(const char *dir, void (*fn)(pid_t, void *), void *ud);

typedef struct pid_visit { void (*fn)(pid_t, void *); void *ud; } pid_visit;

static void each_pid_child(const char *dir, void *ud) {
  pid_visit *v = ud;
  each_pid(dir, v->fn, v->ud);
}

static void each_pid(const char *dir, void (*fn)(pid_t, void *), void *ud) {
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
  each_pid(dir, kill_pid, NULL);
  write_file(dir, "cgroup.freeze", "0");
  return 0;
}

static void remove_child(const char *dir, void *ud) {
  sbx_cgroup_remove(dir, *(int *)ud);
}

int sbx_cgroup_remove(const char *dir, int wait) {
  each_child(dir, remove_child, &wait);
  for (int i = 0; rmdir(dir) < 0; i++) {
    if (errno == ENOENT) return 0;
    if (errno != EBUSY || !wait || i >= 400) return -1;
    struct timespec ts = {0, 5 * 1000 * 1000};  /* dying members: 2 s max */
    nanosleep(&ts, NULL);
  }
  return 0;
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

void sbx_kill_tree(pid_t pid, int sig) {
  if (pid <= 0) return;
  if (sig != SIGKILL) {
    if (kill(-pid, sig) < 0) kill(pid, sig);
    return;
  }
  ptab t = {0};
  kill(-pid, SIGSTOP);             /* the group stops forking while we look */
  for (int round = 0; round < 50; round++) {
    ptab_scan(&t);
    if (kill_descendants(&t, pid) == 0) break;
  }
  kill(-pid, SIGKILL);
  kill(pid, SIGKILL);
  free(t.pid);
  free(t.ppid);
}


/* ------------------------------------------------------------ Lua facing */

/* cgroup.base() -> dir | nil, msg, code: a writable cgroup v2 dir for us */
static int cg_base(lua_State *L) {
  char line[MAXPATH], mnt[MAXPATH] = "", own[MAXPATH] = "";
  FILE *f = fopen("/proc/self/mountinfo", "re");
  while (f && fgets(line, sizeof line, f)) {
    char *sep = strstr(line, " - cgroup2 ");
    char mp[MAXPATH];
    if (sep && sscanf(line, "%*s %*s %*s %*s %4095s", mp) == 1) {
      strcpy(mnt, mp);
      break;
    }
  }
  if (f) fclose(f);
  if (!*mnt) return sbx_fail(L, "cgroup", "no cgroup v2 mount", "ENOENT");
  f = fopen("/proc/self/cgroup", "re");
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "0::", 3) == 0) {
      line[strcspn(line, "\n")] = '\0';
      snprintf(own, sizeof own, "%s", line + 3);
    }
  if (f) fclose(f);
  if (strcmp(own, "/") == 0) own[0] = '\0';
  lua_pushfstring(L, "%s%s/sbxlua", mnt, own);
  const char *dir = lua_tostring(L, -1);
  if (mkdir(dir, 0755) < 0 && errno != EEXIST)
    return sbx_fail_errno(L, "cgroup", dir, errno);
  if (access(dir, W_OK) < 0) return sbx_fail_errno(L, "cgroup", dir, errno);
  char probe[MAXPATH];
  snprintf(probe, sizeof probe, "%s/cgroup.procs", dir);
  if (access(probe, W_OK) < 0) return sbx_fail_errno(L, "cgroup", probe, errno);
  return 1;
}

/* cgroup.create(dir) -> true | nil, msg, code (an existing dir is fine) */
static int cg_create(lua_State *L) {
  const char *dir = luaL_checkstring(L, 1);
  if (mkdir(dir, 0755) < 0 && errno != EEXIST)
    return sbx_fail_errno(L, "cgroup", dir, errno);
  lua_pushboolean(L, 1);
  return 1;
}

/* cgroup.kill(dir) -> true | nil, msg, code */
static int cg_kill(lua_State *L) {
  const char *dir = luaL_checkstring(L, 1);
  if (sbx_cgroup_kill(dir) < 0) return sbx_fail_errno(L, "cgroup kill", dir, errno);
  lua_pushboolean(L, 1);
  return 1;
}

/* cgroup.remove(dir) -> true | nil, msg, code: kill, wait, rmdir (tree) */
static int cg_remove(lua_State *L) {
  const char *dir = luaL_checkstring(L, 1);
  struct stat st;
  if (stat(dir, &st) < 0 && errno == ENOENT) {
    lua_pushboolean(L, 1);
    return 1;
  }
  sbx_cgroup_kill(dir);
  if (sbx_cgroup_remove(dir, 1) < 0)
    return sbx_fail_errno(L, "cgroup remove", dir, errno);
  lua_pushboolean(L, 1);
  return 1;
}

static void push_pid(pid_t pid, void *ud) {
  lua_State *L = ud;
  lua_pushinteger(L, pid);
  lua_rawseti(L, -2, (lua_Integer)luaL_len(L, -1) + 1);
}

/* cgroup.pids(dir) -> { pid, ... } of the cgroup and its children */
static int cg_pids(lua_State *L) {
  const char *dir = luaL_checkstring(L, 1);
  lua_newtable(L);
  each_pid(dir, push_pid, L);
  return 1;
}

/* cgroup.kill_tree(pid): SIGKILL pid and all its descendants */
static int cg_kill_tree(lua_State *L) {
  sbx_kill_tree((pid_t)luaL_checkinteger(L, 1), SIGKILL);
  return 0;
}

/* cgroup.pids_in_dir(prefix) -> { pid, ... } whose cwd is under prefix */
static int cg_pids_in_dir(lua_State *L) {
  size_t plen;
  const char *prefix = luaL_checklstring(L, 1, &plen);
  char path[64], cwd[MAXPATH];
  DIR *d = opendir("/proc");
  struct dirent *e;
  lua_newtable(L);
  while (d && (e = readdir(d)) != NULL) {
    int pid = atoi(e->d_name);
    if (pid <= 0 || pid == getpid()) continue;
    snprintf(path, sizeof path, "/proc/%d/cwd", pid);
    ssize_t n = readlink(path, cwd, sizeof cwd - 1);
    if (n < (ssize_t)plen) continue;
    cwd[n] = '\0';
    if (strncmp(cwd, prefix, plen) == 0 && (cwd[plen] == '/' || !cwd[plen])) {
      lua_pushinteger(L, pid);
      lua_rawseti(L, -2, (lua_Integer)luaL_len(L, -1) + 1);
    }
  }
  if (d) closedir(d);
  return 1;
}

static const luaL_Reg cg_funcs[] = {
  {"base", cg_base},
  {"create", cg_create},
  {"kill", cg_kill},
  {"remove", cg_remove},
  {"pids", cg_pids},
  {"kill_tree", cg_kill_tree},
  {"pids_in_dir", cg_pids_in_dir},
  {NULL, NULL}
};

int luaopen_sbx_cgroup(lua_State *L) {
  luaL_newlib(L, cg_funcs);
  return 1;
}
