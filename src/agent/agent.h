/*
** What agent.c's main needs from the other files of sbx-agent.
*/
#ifndef SBX_AGENT_H
#define SBX_AGENT_H

#include <signal.h>

/* The build, in `sbx-agent version` and serve's hello. */
#define AGENT_VERSION "2"

/* `sbx-agent serve`: the protocol of docs/agent-protocol.md on stdin and
** stdout until stdin's EOF; the exit status. */
int agent_serve(void);

/* The signal that ended serve as a container's init (SIGTERM, SIGINT), or 0. */
extern volatile sig_atomic_t agent_terminated;

#endif
