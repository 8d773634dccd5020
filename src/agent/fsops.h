/*
** File operations of sbx-agent, shared by its CLI subcommands (ls, rm,
** mkdir) and by `serve` (l, d, m, s). Each returns 0 or an errno; paths
** are used as given.
*/
#ifndef SBX_AGENT_FSOPS_H
#define SBX_AGENT_FSOPS_H

#include <stddef.h>
#include <sys/stat.h>

/* "file", "dir", "link", ... for a st_mode */
const char *fsop_type(mode_t m);

/* One "type\0size\0mtime\0name\0" record per entry of dir (not following
** symlinks, without . and ..) to emit(ud, record, size), which returns 0
** to go on. */
int fsop_list(const char *dir, int (*emit)(void *ud, const char *rec, size_t n),
              void *ud);

/* The stat record "type\0size\0mtime\0mode\0" (mode: the permission bits
** in octal) of path, following a final symlink; *n its size. */
int fsop_stat(const char *path, char *buf, size_t size, size_t *n);

/* A file or a symlink (never its target); a directory when empty, or with
** recursive a whole tree, never following symlinks. */
int fsop_remove(const char *path, int recursive);

/* mkdir -p (mode 0755). A component that exists and is not a directory,
** the last one included, is ENOTDIR. path is modified while it runs. */
int fsop_mkdir_p(char *path);

#endif
