/*
** Spawner threads: sbx_spawn off the loop thread. A clone with
** CLONE_VFORK holds the thread that calls it until the child has exec'd;
** on the loop thread that is one spawn at a time for the whole process. A
** job handed to the pool is spawned by one of a few threads (one per core),
** which live as long as the process (PR_SET_PDEATHSIG fires when the thread
** that cloned the child exits), and comes back to the loop thread through
** an eventfd the loop watches while jobs are out.
*/
#ifndef SBX_SPAWNER_H
#define SBX_SPAWNER_H

#include "lua.h"
#include "spawn.h"

/* the fds a job hands its child: its ends (3), extra, join and setns fds */
#define SBX_JOB_MAXFDS (3 + SBX_SPAWN_MAXFDS + 4 + 4)
/* each of them, and a low copy of each (spawner.c's lower_fds) */
#define SBX_JOB_MAXCLOSE (2 * SBX_JOB_MAXFDS)

typedef struct sbx_spawn_job sbx_spawn_job;
struct sbx_spawn_job {
  sbx_spawn_req r;                 /* its strings point into `strings` */
  pid_t pid;                       /* results, set by the spawner thread */
  int pidfd, err;
  int close[SBX_JOB_MAXCLOSE];     /* closed by the spawner after the spawn */
  int nclose;
  /* On the loop thread, once the spawn is over: the owner takes the
  ** results, or (owner gone: NULL) the child is killed and reaped. */
  void (*done)(sbx_spawn_job *j);
  void *owner;
  /* An abandoned job's command cgroup; r.cgroup_fd is its directory's fd
  ** (sbx_cgroup_dirfd), kept by the owner's cgroup until the job is done. */
  char *cgroup;
  sbx_spawn_job *next;
  struct sbx_spawnq *q;
  int fdv[SBX_SPAWN_MAXFDS], joinv[4], nsv[4];
  sbx_rlimit limv[8];
  char *strings;                   /* path, cwd, argv, envp: one block */
};

/* A job whose request (argv, envp, path, cwd, fds, join and setns fds, rlimits) is
** copied from r: the caller's memory may go before the spawn is over. NULL
** when out of memory. */
sbx_spawn_job *sbx_job_new(const sbx_spawn_req *r);
void sbx_job_free(sbx_spawn_job *j);
/* Where j keeps each fd it hands its child (none for a missing stdin):
** how many, in slots. */
int sbx_job_fds(sbx_spawn_job *j, int *slots[SBX_JOB_MAXFDS]);

/* Start the spawner threads (and this loop's queue) if they do not run
** yet: 0, or -1 with errno. Once it succeeds, a submit cannot fail. */
int sbx_spawner_start(lua_State *L);
/* Hand j to a spawner thread; 0, or -1 with errno (no thread could be
** started: spawn on the calling thread instead). */
int sbx_spawner_submit(lua_State *L, sbx_spawn_job *j);
/* Jobs handed out and not yet done on this loop. */
int sbx_spawner_inflight(lua_State *L);
/* Where this loop spawns: AUTO (on a spawner thread when other tasks are
** ready or other spawns are out, else inline), INLINE, THREAD. mode < 0
** only reads it; the first read takes SBX_SPAWNER=auto|inline|thread. */
enum { SBX_SPAWNER_AUTO, SBX_SPAWNER_INLINE, SBX_SPAWNER_THREAD };
int sbx_spawner_mode(lua_State *L, int mode);
/* proc.spawner_stats: threads, jobs done off the loop thread. */
void sbx_spawner_stats(int *threads, long *jobs);

#endif
