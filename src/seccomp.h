/*
** The seccomp filter of bwrap sandboxes, as a classic BPF program for
** bwrap's --seccomp FD. No Lua here.
*/
#ifndef SBX_SECCOMP_H
#define SBX_SECCOMP_H

#include <linux/filter.h>
#include <stddef.h>

#define SBX_SECCOMP_MAX 256  /* instructions, more than the filter needs */

/* Fill prog (room for max instructions); the instruction count, or 0 when
** this architecture has no filter (then bwrap must not run). */
size_t sbx_seccomp_program(struct sock_filter *prog, size_t max);

/* The name of the i-th call the filter denies (for doctor and the specs),
** NULL past the last. */
const char *sbx_seccomp_denied(size_t i);

#endif
