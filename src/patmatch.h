/*
** Lua patterns with a step meter: string.find/match/gmatch/gsub with the
** stock semantics, for code that must not run unbounded inside one call
** (scripts). Every step of the matcher is counted; each PM_CHUNK steps,
** and at the end of a call, the meter's charge() is called with the count
** and may raise to stop the match. Plain find is linear (memmem).
*/
#ifndef SBX_PATMATCH_H
#define SBX_PATMATCH_H

#include "lua.h"

#define PM_CHUNK 1024

typedef struct pm_meter pm_meter;
struct pm_meter {
  /* steps done by `fname` ("string.find", ...); raises to stop it */
  void (*charge)(lua_State *L, pm_meter *m, long steps, const char *fname);
};

/* stack: [-0, +0]. Sets find, match, gmatch, gsub in the table at idx to
** bounded versions metered by the userdata (full or light) at midx, whose
** block starts with a pm_meter; a light one must outlive the functions. */
void pm_install(lua_State *L, int idx, int midx);

#endif
