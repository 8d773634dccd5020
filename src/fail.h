/*
** How the C modules fail: `nil, "<op>: <detail>", "<CODE>"` (STYLE.md 5),
** errno names as codes, and loading a library on first use with dlopen.
*/
#ifndef SBX_FAIL_H
#define SBX_FAIL_H

#include <stddef.h>

#include "lua.h"

/* A runtime failure: pushes nil, "<op>: <detail>", code; returns 3. */
int sbx_fail(lua_State *L, const char *op, const char *detail, const char *code);
/* Same, from errno. */
int sbx_fail_errno(lua_State *L, const char *op, const char *what, int err);
/* The name of an errno value ("ENOENT"), "EUNKNOWN" for one not listed. */
const char *sbx_errno_name(int err);

/* dlopen(soname), or NULL with why = "<lib> not found: apt-get install
** <pkg> (<dlerror>)". */
void *sbx_dlopen(const char *soname, const char *lib, const char *pkg, char *why, size_t n);
/* dlsym(h, sym), or NULL with why = "<lib> too old or not the real one (no
** <sym>): apt-get install <pkg>". */
void *sbx_dlsym(void *h, const char *sym, const char *lib, const char *pkg, char *why, size_t n);

#endif
