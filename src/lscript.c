/*
** sbx.script: a capped Lua state for user scripts that must not hurt the
** host (routing policies). Each Script is its own lua_State with:
**   - an allow-listed library: base (no load/loadfile/dofile/
**     collectgarbage/print), string (no dump; pattern functions and rep
**     bounded), table (move/insert/remove bounded),
**     math, utf8, os.time/clock/date/difftime; no io, debug,
**     package, require, coroutine; reading an undefined global raises;
**   - a memory cap enforced by its allocator;
**   - an instruction budget and a wall-clock budget per call, enforced by a
**     count hook.
** Values cross between the states by copy: plain data only (nil, booleans,
** numbers, strings, tables); a cyclic or over-deep result is refused.
**
**   script.new{ memory=, instructions=, millis= } -> Script
**   s:load(source, chunkname) -> true, types, scalars | nil, msg, code
**   s:call(field, ...) -> true, result | nil, msg, code
**       code: "syntax" | "error" | "budget" | "memory" | "value"
**   s:memory() -> bytes;  s:close()
**   script.builtin(name) -> source | nil;  script.has_builtin(name) -> bool
**   script.builtins(prefix) -> {names}
**   script.stat(path) -> signature string | nil, msg
**   script.patterns(steps) -> { find, match, gmatch, gsub } as scripts get them
** Pattern matching in a script (src/patmatch.c) counts its steps against the
** instruction budget and the clock, so one string.find cannot run past them.
*/
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "lauxlib.h"
#include "lualib.h"
#include "patmatch.h"

#define SCRIPT_MT "sbx.Script"
#define HOOK_EVERY 1000
#define COPY_DEPTH 32
#define OUT_NODES 20000

typedef struct embedded { const char *name; const char *src; size_t len; } embedded;
extern const embedded sbx_embedded[];

typedef struct Script {
  pm_meter meter;          /* first: the matcher's charge() casts back */
  lua_State *P;
  size_t used, limit;
  int refused;             /* the allocator said no */
  int over;                /* the hook stopped the call: 1 budget, 2 time */
  long long budget, spent; /* instructions */
  double millis, deadline;
  char where[160];         /* last known position in the script */
  char name[128];          /* the chunk's name, for errors with no position */
} Script;

/* The calling thread's CPU time: a script runs without yielding, so this
** is what the script itself spent, and other processes keeping the CPUs
** busy cannot use up its budget (wall time did, on a loaded machine). */
static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void *capped_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  Script *s = ud;
  size_t old = ptr ? osize : 0;
  if (nsize == 0) {
    free(ptr);
    s->used -= old;
    return NULL;
  }
  if (nsize > old && s->used + (nsize - old) > s->limit) {
    s->refused = 1;
    return NULL;
  }
  void *p = realloc(ptr, nsize);
  if (p) s->used = s->used - old + nsize;
  return p;
}

static void hook(lua_State *P, lua_Debug *ar) {
  void *ud;
  lua_getallocf(P, &ud);
  Script *s = ud;
  s->spent += HOOK_EVERY;
  if (lua_getinfo(P, "Sl", ar) && ar->currentline > 0)
    snprintf(s->where, sizeof s->where, "%s:%d", ar->short_src, ar->currentline);
  if (s->spent > s->budget) {
    s->over = 1;
    lua_pushfstring(P, "%s: instruction budget of %d exceeded (an endless loop?)", s->where,
                    (int)s->budget);
    lua_error(P);
  }
  if (now_ms() > s->deadline) {
    s->over = 2;
    lua_pushfstring(P, "%s: time budget of %d ms exceeded", s->where, (int)s->millis);
    lua_error(P);
  }
}

/* The pattern functions' steps count as instructions: a match cannot run
** past the call's budgets inside one C call, where the hook never fires. */
static void charge(lua_State *P, pm_meter *m, long steps, const char *fname) {
  Script *s = (Script *)m;
  s->spent += steps;
  if (s->spent > s->budget) {
    s->over = 1;
    luaL_where(P, 1);
    lua_pushfstring(P, "%s%s: instruction budget of %d exceeded while matching a pattern "
                    "(a pathological pattern?)", lua_tostring(P, -1), fname, (int)s->budget);
    lua_error(P);
  }
  if (now_ms() > s->deadline) {
    s->over = 2;
    luaL_where(P, 1);
    lua_pushfstring(P, "%s%s: time budget of %d ms exceeded while matching a pattern",
                    lua_tostring(P, -1), fname, (int)s->millis);
    lua_error(P);
  }
}

/* string.rep(s, n, [sep]) in scripts: an empty result returns at once (the
** stock one loops n times for it); the rest is bounded by the memory cap. */
static int script_rep(lua_State *P) {
  size_t l, lsep;
  const char *str = luaL_checklstring(P, 1, &l);
  lua_Integer n = luaL_checkinteger(P, 2);
  const char *sep = luaL_optlstring(P, 3, "", &lsep);
  if (n <= 0 || l + lsep == 0) {
    lua_pushliteral(P, "");
    return 1;
  }
  if (l + lsep < l || l + lsep > ((size_t)-1 >> 1) / (size_t)n)
    return luaL_error(P, "resulting string too large");
  size_t total = (size_t)n * l + (size_t)(n - 1) * lsep;
  luaL_Buffer b;
  char *out = luaL_buffinitsize(P, &b, total);   /* the cap refuses a huge one */
  /* one period (s .. sep), then the bytes so far doubled: log2(n) copies */
  size_t done = l + lsep < total ? l + lsep : total;
  memcpy(out, str, l < done ? l : done);
  if (done > l) memcpy(out + l, sep, done - l);
  while (done < total) {
    size_t k = done < total - done ? done : total - done;
    memcpy(out + done, out, k);
    done += k;
  }
  luaL_pushresultsize(&b, total);
  return 1;
}

/* Trusted Lua run once in a new state, before any user code. */
static const char PRELUDE[] =
  "local error, type, tonumber, tostring, rawget, select = error, type, tonumber, tostring, rawget, select\n"
  "local tmove, tinsert, tremove = table.move, table.insert, table.remove\n"
  "local MAXN = 1 << 20\n"
  "local function span(name, n)\n"
  "  if type(n) == 'number' and n > MAXN then\n"
  "    error(name .. ': over ' .. MAXN .. ' elements (bounded in scripts)', 3) end\n"
  "end\n"
  "table.move = function(a, f, e, t, b)\n"
  "  local ff, ef = tonumber(f), tonumber(e)\n"
  "  if ff and ef then span('table.move', ef - ff) end\n"
  "  return tmove(a, f, e, t, b) end\n"
  "table.insert = function(t, ...)\n"
  "  if type(t) == 'table' and select('#', ...) > 1 then span('table.insert', #t) end\n"
  "  return tinsert(t, ...) end\n"
  "table.remove = function(t, ...) if type(t) == 'table' then span('table.remove', #t) end\n"
  "  return tremove(t, ...) end\n"
  "string.dump = nil\n"
  "local setmt = setmetatable\n"
  "setmetatable = function(t, mt)\n"
  "  if type(mt) == 'table' and rawget(mt, '__gc') ~= nil then error('setmetatable: __gc is not allowed in scripts', 2) end\n"
  "  return setmt(t, mt) end\n"
  "for _, k in ipairs{'dofile', 'loadfile', 'load', 'collectgarbage', 'print', 'warn', 'require'} do _G[k] = nil end\n"
  "local keep = { time = true, clock = true, date = true, difftime = true }\n"
  "for k in pairs(os) do if not keep[k] then os[k] = nil end end\n"
  "setmt(_G, { __index = function(_, k) error(\"undefined global '\" .. tostring(k) .. \"'\", 2) end })\n";

static Script *check_script(lua_State *L, int open) {
  Script *s = luaL_checkudata(L, 1, SCRIPT_MT);
  if (open && !s->P) luaL_error(L, "script is closed");
  return s;
}

static int script_close(lua_State *L) {
  Script *s = luaL_checkudata(L, 1, SCRIPT_MT);
  lua_State *P = s->P;
  s->P = NULL;
  if (P) lua_close(P);
  return 0;
}

static int script_tostring(lua_State *L) {
  Script *s = luaL_checkudata(L, 1, SCRIPT_MT);
  lua_pushfstring(L, "sbx.Script (%s, %p)", s->P ? "open" : "closed", (void *)s);
  return 1;
}

static int open_libs(lua_State *P) {
  luaL_requiref(P, LUA_GNAME, luaopen_base, 1);
  luaL_requiref(P, LUA_TABLIBNAME, luaopen_table, 1);
  luaL_requiref(P, LUA_STRLIBNAME, luaopen_string, 1);
  /* string's table is also the strings' __index: ("x"):find is bounded too */
  lua_pushlightuserdata(P, lua_touserdata(P, lua_upvalueindex(1)));
  pm_install(P, -2, -1);
  lua_pop(P, 1);
  lua_pushcfunction(P, script_rep);
  lua_setfield(P, -2, "rep");
  luaL_requiref(P, LUA_MATHLIBNAME, luaopen_math, 1);
  luaL_requiref(P, LUA_UTF8LIBNAME, luaopen_utf8, 1);
  luaL_requiref(P, LUA_OSLIBNAME, luaopen_os, 1);
  lua_settop(P, 0);
  if (luaL_loadbufferx(P, PRELUDE, sizeof PRELUDE - 1, "=(script prelude)", "t") != LUA_OK)
    return lua_error(P);
  lua_call(P, 0, 0);
  return 0;
}

/* script.new{ memory=, instructions=, millis= } -> Script */
static int script_new(lua_State *L) {
  lua_Integer mem = 8 << 20, ins = 1000000, ms = 250;
  if (!lua_isnoneornil(L, 1)) {
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_getfield(L, 1, "memory");
    mem = luaL_optinteger(L, -1, mem);
    lua_getfield(L, 1, "instructions");
    ins = luaL_optinteger(L, -1, ins);
    lua_getfield(L, 1, "millis");
    ms = luaL_optinteger(L, -1, ms);
    lua_pop(L, 3);
  }
  luaL_argcheck(L, mem >= 64 * 1024 && ins >= HOOK_EVERY && ms >= 1, 1,
                "memory >= 64 KiB, instructions >= 1000, millis >= 1");
  Script *s = lua_newuserdatauv(L, sizeof *s, 0);
  memset(s, 0, sizeof *s);
  luaL_setmetatable(L, SCRIPT_MT);
  s->limit = (size_t)mem;
  s->budget = ins;
  s->millis = (double)ms;
  strcpy(s->where, "?");
  lua_State *P = lua_newstate(capped_alloc, s);
  if (!P) return luaL_error(L, "script: cannot create a state (memory cap too small?)");
  s->P = P;
  s->meter.charge = charge;
  lua_pushlightuserdata(P, &s->meter);
  lua_pushcclosure(P, open_libs, 1);
  if (lua_pcall(P, 0, 0, 0) != LUA_OK) {
    lua_pushstring(L, lua_tostring(P, -1));
    script_close(L);
    return luaL_error(L, "script: setup failed: %s", lua_tostring(L, -1));
  }
  lua_gc(P, LUA_GCGEN, 0, 0);
  return 1;
}

/* ------------------------------------------------------------ copying */

typedef struct Copy {
  lua_State *L, *P;
  int nargs, base;         /* host arguments at base..base+nargs-1 */
  const char *field;
  char err[200];
  int nodes;
  int memo;                /* P index of the table: host pointer -> copy */
  const void *path[COPY_DEPTH + 1];
} Copy;

/* host value at idx -> pushed on P (functions, userdata become nil) */
static void copy_in(Copy *c, int idx, int depth) {
  lua_State *L = c->L, *P = c->P;
  switch (lua_type(L, idx)) {
    case LUA_TBOOLEAN: lua_pushboolean(P, lua_toboolean(L, idx)); break;
    case LUA_TNUMBER:
      if (lua_isinteger(L, idx)) lua_pushinteger(P, lua_tointeger(L, idx));
      else lua_pushnumber(P, lua_tonumber(L, idx));
      break;
    case LUA_TSTRING: {
      size_t n;
      const char *str = lua_tolstring(L, idx, &n);
      lua_pushlstring(P, str, n);
      break;
    }
    case LUA_TTABLE:
      if (depth >= COPY_DEPTH || !lua_checkstack(L, 4) || !lua_checkstack(P, 6)) {
        lua_pushnil(P);
        break;
      }
      idx = lua_absindex(L, idx);
      for (int i = 0; i < depth; i++)
        if (c->path[i] == lua_topointer(L, idx)) { lua_pushnil(P); return; }
      c->path[depth] = lua_topointer(L, idx);
      /* a table met twice in one call is copied once (stats[name] ==
      ** candidate.stats in the script as in the host) */
      lua_pushlightuserdata(P, (void *)c->path[depth]);
      if (lua_rawget(P, c->memo) == LUA_TTABLE) return;
      lua_pop(P, 1);
      {
        lua_Unsigned n = lua_rawlen(L, idx);
        lua_createtable(P, n > 64 ? 64 : (int)n, n ? 0 : 8);
      }
      lua_pushlightuserdata(P, (void *)c->path[depth]);
      lua_pushvalue(P, -2);
      lua_rawset(P, c->memo);
      lua_pushnil(L);
      while (lua_next(L, idx)) {
        int kt = lua_type(L, -2);
        if (kt == LUA_TSTRING || kt == LUA_TNUMBER || kt == LUA_TBOOLEAN) {
          copy_in(c, -2, depth + 1);
          copy_in(c, -1, depth + 1);
          if (lua_isnil(P, -2) || lua_isnil(P, -1)) lua_pop(P, 2);
          else lua_rawset(P, -3);
        }
        lua_pop(L, 1);
      }
      break;
    default: lua_pushnil(P); break;
  }
}

/* P value at idx -> pushed on L; 0 (with c->err) on a value we refuse. */
static int copy_out(Copy *c, int idx, int depth) {
  lua_State *L = c->L, *P = c->P;
  if (++c->nodes > OUT_NODES) {
    snprintf(c->err, sizeof c->err, "the result has more than %d values", OUT_NODES);
    return 0;
  }
  switch (lua_type(P, idx)) {
    case LUA_TNIL: lua_pushnil(L); return 1;
    case LUA_TBOOLEAN: lua_pushboolean(L, lua_toboolean(P, idx)); return 1;
    case LUA_TNUMBER:
      if (lua_isinteger(P, idx)) lua_pushinteger(L, lua_tointeger(P, idx));
      else lua_pushnumber(L, lua_tonumber(P, idx));
      return 1;
    case LUA_TSTRING: {
      size_t n;
      const char *str = lua_tolstring(P, idx, &n);
      if (n > 65536) {
        snprintf(c->err, sizeof c->err, "a string in the result is longer than 64 KiB");
        return 0;
      }
      lua_pushlstring(L, str, n);
      return 1;
    }
    case LUA_TTABLE: {
      idx = lua_absindex(P, idx);
      const void *me = lua_topointer(P, idx);
      for (int i = 0; i < depth; i++)
        if (c->path[i] == me) {
          snprintf(c->err, sizeof c->err, "the result is a cyclic table");
          return 0;
        }
      if (depth >= 16) {
        snprintf(c->err, sizeof c->err, "the result nests deeper than 16 tables");
        return 0;
      }
      if (!lua_checkstack(L, 4) || !lua_checkstack(P, 4)) {
        snprintf(c->err, sizeof c->err, "the result nests too deep");
        return 0;
      }
      c->path[depth] = me;
      lua_newtable(L);
      lua_pushnil(P);
      while (lua_next(P, idx)) {
        int kt = lua_type(P, -2);
        if (kt != LUA_TSTRING && kt != LUA_TNUMBER && kt != LUA_TBOOLEAN) {
          snprintf(c->err, sizeof c->err, "the result has a key of type %s", luaL_typename(P, -2));
          lua_pop(P, 2);
          return 0;
        }
        if (!copy_out(c, -2, depth + 1) || !copy_out(c, -1, depth + 1)) {
          lua_pop(P, 2);
          return 0;
        }
        lua_rawset(L, -3);
        lua_pop(P, 1);
      }
      return 1;
    }
    default:
      snprintf(c->err, sizeof c->err, "the result holds a %s", luaL_typename(P, idx));
      return 0;
  }
}

static void arm(Script *s) {
  s->spent = 0;
  s->over = 0;
  s->refused = 0;
  snprintf(s->where, sizeof s->where, "%s", s->name[0] ? s->name : "?");
  s->deadline = now_ms() + s->millis;
  lua_sethook(s->P, hook, LUA_MASKCOUNT, HOOK_EVERY);
}

/* In P, protected: load the chunk and run it; leaves its result. */
static int do_load(lua_State *P) {
  Copy *c = lua_touserdata(P, 1);
  size_t n;
  const char *src = lua_tolstring(c->L, c->base, &n);
  const char *name = lua_tostring(c->L, c->base + 1);
  lua_settop(P, 0);
  if (luaL_loadbufferx(P, src, n, name, "t") != LUA_OK) {
    c->nodes = -1;                 /* a syntax error */
    return lua_error(P);
  }
  lua_call(P, 0, 1);
  lua_pushvalue(P, -1);
  lua_setfield(P, LUA_REGISTRYINDEX, "sbx.script.module");
  return 1;
}

/* In P, protected: module[field](copies of the host arguments) */
static int do_call(lua_State *P) {
  Copy *c = lua_touserdata(P, 1);
  lua_settop(P, 0);
  lua_getfield(P, LUA_REGISTRYINDEX, "sbx.script.module");
  if (!lua_istable(P, -1)) return luaL_error(P, "the script did not return a table");
  if (lua_getfield(P, -1, c->field) != LUA_TFUNCTION)
    return luaL_error(P, "the script's '%s' is not a function", c->field);
  luaL_checkstack(P, c->nargs + 8, "too many arguments");
  lua_newtable(P);
  c->memo = lua_gettop(P);
  for (int i = 0; i < c->nargs; i++) copy_in(c, c->base + i, 0);
  lua_remove(P, c->memo);
  lua_call(P, c->nargs, 1);
  return 1;
}

/* push nil, msg, code for a failed protected call in P */
static int failed(lua_State *L, Script *s, int status, int syntax) {
  lua_State *P = s->P;
  const char *code = syntax ? "syntax" : s->refused || status == LUA_ERRMEM ? "memory"
                   : s->over ? "budget" : "error";
  lua_pushnil(L);
  if (!strcmp(code, "memory"))
    lua_pushfstring(L, "%s: memory cap of %d KiB exceeded", s->where, (int)(s->limit / 1024));
  else if (lua_type(P, -1) == LUA_TSTRING)
    lua_pushstring(L, lua_tostring(P, -1));
  else
    lua_pushfstring(L, "%s: raised a %s value", s->where, luaL_typename(P, -1));
  lua_pushstring(L, code);
  lua_settop(P, 0);
  lua_gc(P, LUA_GCCOLLECT);
  return 3;
}

/* s:load(source, chunkname) -> true, types, scalars | nil, msg, code */
static int script_load(lua_State *L) {
  Script *s = check_script(L, 1);
  luaL_checkstring(L, 2);
  luaL_checkstring(L, 3);
  lua_settop(L, 3);
  const char *cn = lua_tostring(L, 3);
  snprintf(s->name, sizeof s->name, "%s", cn[0] == '@' || cn[0] == '=' ? cn + 1 : cn);
  Copy c = { .L = L, .P = s->P, .base = 2 };
  lua_State *P = s->P;
  lua_settop(P, 0);
  arm(s);
  lua_pushcfunction(P, do_load);
  lua_pushlightuserdata(P, &c);
  int st = lua_pcall(P, 1, 1, 0);
  if (st != LUA_OK) return failed(L, s, st, c.nodes == -1);
  lua_pushboolean(L, 1);
  lua_newtable(L);
  lua_newtable(L);
  if (lua_istable(P, -1)) {
    lua_pushnil(P);
    while (lua_next(P, -2)) {
      if (lua_type(P, -2) == LUA_TSTRING) {
        const char *k = lua_tostring(P, -2);
        lua_pushstring(L, luaL_typename(P, -1));
        lua_setfield(L, -3, k);
        int t = lua_type(P, -1);
        if (t == LUA_TSTRING || t == LUA_TNUMBER || t == LUA_TBOOLEAN) {
          c.nodes = 0;
          copy_out(&c, -1, 0);
          lua_setfield(L, -2, k);
        }
      }
      lua_pop(P, 1);
    }
  } else {
    lua_pushstring(L, luaL_typename(P, -1));
    lua_setfield(L, -3, "(result)");
  }
  lua_settop(P, 0);
  return 3;
}

/* s:call(field, ...) -> true, result | nil, msg, code */
static int script_call(lua_State *L) {
  Script *s = check_script(L, 1);
  const char *field = luaL_checkstring(L, 2);
  if (!lua_checkstack(L, 2 * COPY_DEPTH + 16)) return luaL_error(L, "script: stack overflow");
  Copy c = { .L = L, .P = s->P, .base = 3, .nargs = lua_gettop(L) - 2, .field = field };
  lua_State *P = s->P;
  lua_settop(P, 0);
  arm(s);
  lua_pushcfunction(P, do_call);
  lua_pushlightuserdata(P, &c);
  int st = lua_pcall(P, 1, 1, 0);
  if (st != LUA_OK) return failed(L, s, st, 0);
  lua_pushboolean(L, 1);
  c.nodes = 0;
  if (!copy_out(&c, -1, 0)) {
    lua_settop(P, 0);
    lua_pushnil(L);
    lua_pushstring(L, c.err);
    lua_pushstring(L, "value");
    return 3;
  }
  lua_settop(P, 0);
  return 2;
}

/* s:memory() -> bytes in use */
static int script_memory(lua_State *L) {
  Script *s = check_script(L, 0);
  lua_pushinteger(L, (lua_Integer)s->used);
  return 1;
}

/* script.builtin(name) -> embedded source | nil */
static int script_builtin(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  for (const embedded *e = sbx_embedded; e->name; e++)
    if (!strcmp(e->name, name)) {
      lua_pushlstring(L, e->src, e->len);
      return 1;
    }
  return 0;
}

/* script.has_builtin(name) -> boolean: is there one (without copying it:
** the loader asks on every lookup of a provider) */
static int script_has_builtin(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  const embedded *e = sbx_embedded;
  while (e->name && strcmp(e->name, name) != 0) e++;
  lua_pushboolean(L, e->name != NULL);
  return 1;
}

/* script.builtins(prefix) -> { names with that prefix } */
static int script_builtins(lua_State *L) {
  size_t n;
  const char *prefix = luaL_checklstring(L, 1, &n);
  lua_newtable(L);
  lua_Integer i = 1;
  for (const embedded *e = sbx_embedded; e->name; e++)
    if (!strncmp(e->name, prefix, n)) {
      lua_pushstring(L, e->name);
      lua_rawseti(L, -2, i++);
    }
  return 1;
}

/* script.stat(path) -> "dev:ino:size:mtime:ctime" | nil, msg, code */
static int script_stat(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  struct stat st;
  if (stat(path, &st) < 0) {
    int e = errno;
    lua_pushnil(L);
    lua_pushfstring(L, "%s: %s", path, strerror(e));
    lua_pushstring(L, e == ENOENT ? "ENOENT" : "EIO");
    return 3;
  }
  lua_pushfstring(L, "%I:%I:%I:%I.%I:%I.%I", (lua_Integer)st.st_dev, (lua_Integer)st.st_ino,
                  (lua_Integer)st.st_size, (lua_Integer)st.st_mtim.tv_sec,
                  (lua_Integer)st.st_mtim.tv_nsec, (lua_Integer)st.st_ctim.tv_sec,
                  (lua_Integer)st.st_ctim.tv_nsec);
  return 1;
}

/* A meter for script.patterns: its calls share one budget of steps. */
typedef struct Steps { pm_meter meter; long long left; } Steps;

static void steps_charge(lua_State *L, pm_meter *m, long steps, const char *fname) {
  Steps *st = (Steps *)m;
  st->left -= steps;
  if (st->left < 0) luaL_error(L, "%s: the pattern budget of steps is spent", fname);
}

/* script.patterns(steps) -> { find =, match =, gmatch =, gsub = }: the
** bounded pattern functions scripts get, sharing a budget of `steps` */
static int script_patterns(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n > 0, 1, "expected steps > 0");
  lua_newtable(L);
  Steps *st = lua_newuserdatauv(L, sizeof *st, 0);
  st->meter.charge = steps_charge;
  st->left = n;
  pm_install(L, -2, -1);
  lua_pop(L, 1);
  return 1;
}

static const luaL_Reg methods[] = {
  {"load", script_load}, {"call", script_call}, {"memory", script_memory},
  {"close", script_close}, {NULL, NULL}
};

static const luaL_Reg funcs[] = {
  {"new", script_new}, {"builtin", script_builtin},
  {"has_builtin", script_has_builtin}, {"builtins", script_builtins},
  {"stat", script_stat}, {"patterns", script_patterns}, {NULL, NULL}
};

int luaopen_sbx_script(lua_State *L) {
  if (luaL_newmetatable(L, SCRIPT_MT)) {
    luaL_newlib(L, methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, script_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, script_close);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, script_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  luaL_newlib(L, funcs);
  return 1;
}
