/*
** Process-tree containment: cgroup v2 directories (killed through
** cgroup.kill) and, where no cgroup is writable, a /proc sweep. No Lua here:
** sbx-run links this too.
*/
#ifndef SBX_PROCTREE_H
#define SBX_PROCTREE_H

#include <sys/types.h>

/* Kill every process in the cgroup `dir` and its children; 0 on success. */
int sbx_cgroup_kill(const char *dir);
/* rmdir `dir` and its children, waiting (bounded) for them to empty. */
int sbx_cgroup_remove(const char *dir, int wait);
/* Visit the pids of a cgroup and, recursively, of its children. */
void sbx_cgroup_each_pid(const char *dir, void (*fn)(pid_t, void *), void *ud);
/* A cgroup for one command under `parent`: an empty one kept from an
** earlier command, or a new one. 0 and a malloc'd path, or an errno. */
int sbx_cgroup_take(const char *parent, char **out);
/* A command's cgroup is done with (path is consumed): kept for reuse when
** empty, left alone when a daemon the command started still lives in it. */
void sbx_cgroup_give(char *path);
/* The directory of a cgroup sbx_cgroup_take returned, as an fd for
** CLONE_INTO_CGROUP: opened on first use and kept with the path (closed by
** sbx_cgroup_give or sbx_cgroup_free, not by the caller); -1 and errno. */
int sbx_cgroup_dirfd(char *path);
/* Out of fds: remove the kept empty cgroups, closing their fds; how many. */
int sbx_cgroup_trim(void);
/* Free a path sbx_cgroup_take returned without giving it back (the
** cgroup itself is left as it is). */
void sbx_cgroup_free(char *path);

/* SIGKILL: every descendant of `pid` (found through /proc), then `pid`;
** another signal goes to its process group. */
void sbx_kill_tree(pid_t pid, int sig);
/* SIGKILL every descendant of `pid`, leaving `pid` itself; returns how
** many rounds found someone. */
int sbx_kill_descendants(pid_t pid);

#endif
