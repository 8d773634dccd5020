/*
** sbx-agent's file operations, one implementation for the CLI subcommands
** and for `serve`. Errors come back as errno values: the CLI turns them
** into exit codes, serve into Z frames.
*/
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fsops.h"

const char *fsop_type(mode_t m) {
  return S_ISREG(m) ? "file" : S_ISDIR(m) ? "dir" : S_ISLNK(m) ? "link"
       : S_ISFIFO(m) ? "fifo" : S_ISSOCK(m) ? "socket" : S_ISCHR(m) ? "char"
       : S_ISBLK(m) ? "block" : "other";
}

int fsop_list(const char *dir, int (*emit)(void *ud, const char *rec, size_t n),
              void *ud) {
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  if (!d) {
    int e = errno;
    if (dfd >= 0) close(dfd);
    return e;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    struct stat st;
    char rec[512];
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    /* an entry removed since readdir saw it is simply not listed */
    if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
    int n = snprintf(rec, sizeof rec, "%s%c%lld%c%lld%c%s%c", fsop_type(st.st_mode),
                     0, (long long)st.st_size, 0, (long long)st.st_mtime, 0,
                     e->d_name, 0);
    if (n < 0 || (size_t)n >= sizeof rec) continue;
    if (emit(ud, rec, (size_t)n) != 0) break;
  }
  closedir(d);
  return 0;
}

int fsop_stat(const char *path, char *buf, size_t size, size_t *n) {
  struct stat st;
  if (stat(path, &st) < 0) return errno;
  int len = snprintf(buf, size, "%s%c%lld%c%lld%c%o%c", fsop_type(st.st_mode), 0,
                     (long long)st.st_size, 0, (long long)st.st_mtime, 0,
                     (unsigned)(st.st_mode & 07777), 0);
  if (len < 0 || (size_t)len >= size) return ENAMETOOLONG;
  *n = (size_t)len;
  return 0;
}

/* nftw's callback has no user data: the first failure is kept here. */
static int rm_errno;

static int rm_entry(const char *path, const struct stat *st, int flag,
                    struct FTW *ftw) {
  (void)st; (void)ftw;
  int r = flag == FTW_DP ? rmdir(path) : unlink(path);
  if (r < 0 && errno != ENOENT) {
    rm_errno = errno;
    return -1;
  }
  return 0;
}

int fsop_remove(const char *path, int recursive) {
  struct stat st;
  if (lstat(path, &st) < 0) return errno;
  if (!S_ISDIR(st.st_mode)) return unlink(path) < 0 ? errno : 0;
  if (!recursive) return rmdir(path) < 0 ? errno : 0;
  rm_errno = 0;
  /* FTW_PHYS: a symlink inside is removed, never followed */
  if (nftw(path, rm_entry, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0)
    return rm_errno ? rm_errno : errno;
  return 0;
}

int fsop_mkdir_p(char *path) {
  struct stat st;
  if (!*path) return ENOENT;
  for (char *p = path + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    char saved = *p;
    *p = '\0';
    int e = mkdir(path, 0755) < 0 && errno != EEXIST ? errno : 0;
    if (!e && stat(path, &st) == 0 && !S_ISDIR(st.st_mode)) e = ENOTDIR;
    *p = saved;
    if (e) return e;
    if (!saved) return 0;
  }
}
