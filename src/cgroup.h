/*
** Process-tree containment: cgroup v2 directories (killed through
** cgroup.kill) and, where no cgroup is writable, a /proc sweep.
*/
#ifndef SBX_CGROUP_H
#define SBX_CGROUP_H

#include <sys/types.h>
#include "lua.h"

/* Kill every process in the cgroup `dir` and its children; 0 on success. */
int sbx_cgroup_kill(const char *dir);
/* rmdir `dir` and its children, waiting (bounded) for them to empty. */
int sbx_cgroup_remove(const char *dir, int wait);
/* SIGKILL: every descendant of `pid` (found through /proc), then `pid`;
** another signal goes to its process group. */
void sbx_kill_tree(pid_t pid, int sig);

int luaopen_sbx_cgroup(lua_State *L);

#endif
