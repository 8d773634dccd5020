/*
** The supervision loop shared by `sbx-agent run` and each command of
** `sbx-agent serve`: the supervisor is a subreaper, so every descendant of
** the command (setsid ones included) stays below it; a timeout or a
** TERM/INT/HUP kills the whole tree.
*/
#ifndef SBX_AGENT_SUPERVISE_H
#define SBX_AGENT_SUPERVISE_H

#include <poll.h>
#include <signal.h>
#include <sys/types.h>

/* How a command ended; sup_kind_name gives the word both protocols use. */
enum { SUP_EXIT, SUP_SIGNAL, SUP_TIMEOUT, SUP_KILLED, SUP_NOEXEC, SUP_NOCWD };
const char *sup_kind_name(int kind);

typedef struct sup_end { int kind, n; } sup_end;

/* The signals a supervisor takes through its signalfd. Block them before
** fork() so that none is lost before the signalfd exists. */
void sup_signals(sigset_t *set);

/* Become a subreaper and open the signalfd (the signals must be blocked
** already): the fd, or -1. */
int sup_start(void);

/* More fds for sup_wait to poll; ready(ud) runs after every poll, with
** fds[i].revents set (set fds[i].fd to -1 to stop watching one). */
typedef struct sup_io {
  struct pollfd *fds;
  int nfds;
  void (*ready)(void *ud);
  void *ud;
} sup_io;

/* Wait for the command `pid` (a child of ours) to end, reaping every
** orphan that ends below us. A timeout (secs > 0; kind timeout) or a
** signal on sfd (kind killed, n = the signal) kills every descendant. */
sup_end sup_wait(pid_t pid, int sfd, double timeout, const sup_io *io);

#endif
