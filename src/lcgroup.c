/*
** sbx.cgroup: where sbxlua may create cgroups, and how process trees die
** (the mechanisms are in proctree.c, shared with sbx-run).
*/
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lauxlib.h"
#include "cgroup.h"
#include "loop.h"
#include "proctree.h"

#define MAXPATH 4096

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
  sbx_cgroup_each_pid(dir, push_pid, L);
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
