/*
** The seccomp filter of bwrap sandboxes: the calls that untrusted code has
** no business making and that kernel exploits and sandbox escapes lean on.
** Each fails with EPERM (clone3 with ENOSYS, so that libc falls back to
** clone, whose flags a filter can see). Everything else is allowed: this
** is a deny list on top of the namespaces, --cap-drop ALL and
** no_new_privs, not a replacement for them.
**
**   new user namespaces   clone/unshare with CLONE_NEWUSER, clone3
**   the terminal          ioctl TIOCSTI (typing into the caller's tty), TIOCLINUX
**   mounts                mount, umount2, pivot_root, chroot, the new mount API
**   kernel attack surface keyctl, add_key, request_key, bpf, perf_event_open,
**                         userfaultfd, io_uring_*
**   other processes       ptrace, process_vm_readv/writev, setns
**   the machine           syslog, acct, quotactl, swapon/off, reboot, kexec,
**                         modules, iopl/ioperm
** Foreign ABIs (i386 and x32 calls from a 64-bit process) are refused.
*/
#include <errno.h>
#include <linux/audit.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <sys/syscall.h>

#include "seccomp.h"

#if defined(__x86_64__)
#define SBX_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define SBX_AUDIT_ARCH AUDIT_ARCH_AARCH64
#endif

#define TIOCSTI_NR 0x5412
#define TIOCLINUX_NR 0x541C

/* little-endian: the low 32 bits of argument i */
#define ARG_LO(i) (offsetof(struct seccomp_data, args) + 8 * (i))

/* Plain denials: the number, and a name for the specs and doctor. */
static const struct { long nr; const char *name; } denied[] = {
#ifdef SBX_AUDIT_ARCH
  {SYS_mount, "mount"}, {SYS_umount2, "umount2"}, {SYS_pivot_root, "pivot_root"},
  {SYS_chroot, "chroot"}, {SYS_setns, "setns"}, {SYS_keyctl, "keyctl"},
  {SYS_add_key, "add_key"}, {SYS_request_key, "request_key"}, {SYS_bpf, "bpf"},
  {SYS_ptrace, "ptrace"}, {SYS_perf_event_open, "perf_event_open"},
  {SYS_userfaultfd, "userfaultfd"}, {SYS_process_vm_readv, "process_vm_readv"},
  {SYS_process_vm_writev, "process_vm_writev"}, {SYS_syslog, "syslog"},
  {SYS_acct, "acct"}, {SYS_quotactl, "quotactl"}, {SYS_swapon, "swapon"},
  {SYS_swapoff, "swapoff"}, {SYS_reboot, "reboot"}, {SYS_kexec_load, "kexec_load"},
  {SYS_init_module, "init_module"}, {SYS_finit_module, "finit_module"},
  {SYS_delete_module, "delete_module"},
  {SYS_open_by_handle_at, "open_by_handle_at"},
#ifdef SYS_kexec_file_load
  {SYS_kexec_file_load, "kexec_file_load"},
#endif
#ifdef SYS_open_tree
  {SYS_open_tree, "open_tree"}, {SYS_move_mount, "move_mount"},
  {SYS_fsopen, "fsopen"}, {SYS_fsconfig, "fsconfig"}, {SYS_fsmount, "fsmount"},
  {SYS_fspick, "fspick"},
#endif
#ifdef SYS_mount_setattr
  {SYS_mount_setattr, "mount_setattr"},
#endif
#ifdef SYS_io_uring_setup
  {SYS_io_uring_setup, "io_uring_setup"}, {SYS_io_uring_enter, "io_uring_enter"},
  {SYS_io_uring_register, "io_uring_register"},
#endif
#ifdef SYS_iopl
  {SYS_iopl, "iopl"}, {SYS_ioperm, "ioperm"},
#endif
#endif
  {-1, NULL}
};

static const char *const special[] = {
  "clone3 (ENOSYS)", "clone(CLONE_NEWUSER)", "unshare(CLONE_NEWUSER)",
  "ioctl(TIOCSTI)", "ioctl(TIOCLINUX)", NULL
};

const char *sbx_seccomp_denied(size_t i) {
  size_t n = sizeof denied / sizeof *denied - 1;
  if (i < n) return denied[i].name;
  return i - n < sizeof special / sizeof *special ? special[i - n] : NULL;
}

typedef struct builder { struct sock_filter *p; size_t n, max; } builder;

static void emit(builder *b, unsigned short code, unsigned char jt,
                 unsigned char jf, unsigned int k) {
  if (b->n < b->max) b->p[b->n] = (struct sock_filter)BPF_JUMP(code, k, jt, jf);
  b->n++;
}

#define RET(b, v) emit(b, BPF_RET | BPF_K, 0, 0, (v))
#define LOAD(b, off) emit(b, BPF_LD | BPF_W | BPF_ABS, 0, 0, (unsigned int)(off))
#define EPERM_RET (SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA))

/* nr with `flag` set in argument `arg`: EPERM; nr otherwise: allowed. */
static void deny_flag(builder *b, long nr, unsigned int arg, unsigned int flag) {
  emit(b, BPF_JMP | BPF_JEQ | BPF_K, 0, 4, (unsigned int)nr);
  LOAD(b, ARG_LO(arg));
  emit(b, BPF_JMP | BPF_JSET | BPF_K, 0, 1, flag);
  RET(b, EPERM_RET);
  RET(b, SECCOMP_RET_ALLOW);
  LOAD(b, offsetof(struct seccomp_data, nr));   /* for the rules after */
}

size_t sbx_seccomp_program(struct sock_filter *prog, size_t max) {
#ifndef SBX_AUDIT_ARCH
  (void)prog; (void)max;
  return 0;
#else
  builder b = {prog, 0, max};
  LOAD(&b, offsetof(struct seccomp_data, arch));
  emit(&b, BPF_JMP | BPF_JEQ | BPF_K, 1, 0, SBX_AUDIT_ARCH);
  RET(&b, EPERM_RET);                          /* a foreign ABI */
  LOAD(&b, offsetof(struct seccomp_data, nr));
#ifdef __x86_64__
  emit(&b, BPF_JMP | BPF_JGE | BPF_K, 0, 1, 0x40000000);   /* x32 */
  RET(&b, EPERM_RET);
#endif
  for (int i = 0; denied[i].name; i++) {
    emit(&b, BPF_JMP | BPF_JEQ | BPF_K, 0, 1, (unsigned int)denied[i].nr);
    RET(&b, EPERM_RET);
  }
  emit(&b, BPF_JMP | BPF_JEQ | BPF_K, 0, 1, (unsigned int)SYS_clone3);
  RET(&b, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA));
  /* clone's flags are its first argument on x86_64 and arm64 alike */
  deny_flag(&b, SYS_clone, 0, CLONE_NEWUSER);
  deny_flag(&b, SYS_unshare, 0, CLONE_NEWUSER);
  /* ioctl(fd, TIOCSTI | TIOCLINUX, ...): the command is 32 bits */
  emit(&b, BPF_JMP | BPF_JEQ | BPF_K, 0, 5, (unsigned int)SYS_ioctl);
  LOAD(&b, ARG_LO(1));
  emit(&b, BPF_JMP | BPF_JEQ | BPF_K, 2, 0, TIOCSTI_NR);
  emit(&b, BPF_JMP | BPF_JEQ | BPF_K, 1, 0, TIOCLINUX_NR);
  RET(&b, SECCOMP_RET_ALLOW);
  RET(&b, EPERM_RET);
  RET(&b, SECCOMP_RET_ALLOW);
  return b.n <= max ? b.n : 0;
#endif
}
