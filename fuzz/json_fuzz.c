/*
** libFuzzer target for JSON from the Docker engine: lua-cjson's decoder
** (the Debian lua-cjson that sbxlua loads as cjson.safe) and the docker
** backend's code that reads engine answers (lua/sbx/providers/builtin/docker/:
** message_of, create's Id, list_owned's list, inspect's State, exec Ids).
**
** The input is the engine's side of a conversation: byte 0 picks a backend
** entry point (list_owned, resume, create, destroy, ...); the rest is a
** series of HTTP answers separated by "\n--\n" (which no JSON text holds),
** each a status byte, a flags byte (content type, API version, truncated,
** Retry-After) and the body. The docker/ parts run unchanged, freshly loaded for
** every input, over stubs of its transport (sbx.http answers from the
** input; sockets, tar and the loop are inert). Checked:
**  J1 cjson.safe.decode never raises, on any body;
**  J2 decode is stable: when v = decode(body) encodes to s1, decode(s1) is
**     a value v2 that encodes again, and decode of that equals v2 (deep);
**  J3 every entry point returns, or raises a typed error (sbx.errors); a
**     plain Lua error ("attempt to index a nil value" ...) on the engine's
**     data is a finding: each distinct line of docker/ is reported when
**     first seen, and all of them in one line at exit. J3 aborts with SBX_FUZZ_STRICT=1 (as fuzz/run.sh
**     runs it; without it, for exploring, they are counted); J1, J2 and any crash always abort;
**     SBX_FUZZ_TRACE=1 prints each request and the answer it got;
**  J4 results have their documented types (available: boolean [+ string],
**     is_alive: boolean, list_owned: a list of tables).
** Built and run by fuzz/run.sh, which defines SBX_LUA_DIR.
*/
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "lauxlib.h"
#include "lua.h"
#include "lualib.h"
#include "luacov.h"

#ifndef SBX_LUA_DIR
#define SBX_LUA_DIR "lua"
#endif

int luaopen_cjson(lua_State *L);
int luaopen_cjson_safe(lua_State *L);

static const char harness[] =
  "local DIR, strict, trace = ...\n"
  "local function stub(name, t)\n"
  "  return setmetatable(t or {}, { __index = function(_, k)\n"
  "    return function() error('fuzz stub: ' .. name .. '.' .. tostring(k) .. ' is not available', 0) end\n"
  "  end })\n"
  "end\n"
  "local queue, qi = {}, 0\n"
  "local STATUS = { 200, 201, 204, 304, 400, 404, 409, 500, 503, 429, 101, 302 }\n"
  "local VERSION = { false, '1.43', '1.24', 'garbage' }\n"
  "local http = stub('sbx.http', {})\n"
  "function http.escape(s)\n"
  "  if type(s) ~= 'string' and type(s) ~= 'number' then\n"
  "    -- as the C function raises, blamed on the docker/*.lua line calling q(): a tail call\n"
  "    error(\"bad argument #1 to 'escape' (string expected, got \" .. type(s) .. ')', 2)\n"
  "  end\n"
  "  return (tostring(s):gsub('[^%w%-._~]', function(c) return string.format('%%%02X', c:byte()) end))\n"
  "end\n"
  "function http.request(o)\n"
  "  qi = qi + 1\n"
  "  local seg = queue[qi]\n"
  "  if trace then io.stderr:write(string.format('json: %s %s -> answer %d %q\\n', o.method, o.url, qi, seg or '(none)')) end\n"
  "  if not seg then return nil, 'the fuzz input has no more answers', 'ECONNRESET' end\n"
  "  local st, fl = seg:byte(1) or 0, seg:byte(2) or 1\n"
  "  local res = { status = STATUS[st % #STATUS + 1], body = o.method == 'HEAD' and '' or seg:sub(3),\n"
  "                headers = { ['content-type'] = fl & 1 == 1 and 'application/json' or 'text/plain',\n"
  "                            ['api-version'] = VERSION[(fl >> 1) % 4 + 1] or nil,\n"
  "                            ['retry-after'] = fl & 16 == 16 and '0' or nil },\n"
  "                truncated = fl & 8 == 8 or nil }\n"
  "  if o.stream then\n"
  "    res.stream = true\n"
  "    function res:read() return nil end\n"
  "    function res:close() end\n"
  "  end\n"
  "  return res\n"
  "end\n"
  "local function inert(name) return stub(name, {}) end\n"
  "local pre = package.preload\n"
  "pre['sbx.http'] = function() return http end\n"
  "pre['sbx.stream'] = function() return stub('sbx.stream', { connect = function()\n"
  "  return nil, 'no sockets in the fuzz target', 'ECONNREFUSED' end }) end\n"
  "pre['sbx.tar'] = function() local f = function() return nil, 'no archives in the fuzz target', 'EPROTO' end\n"
  "  return stub('sbx.tar', { pack = function() return 'TAR' end, extract = f, read_one = f, list = f }) end\n"
  "pre['sbx.demux'] = function() return stub('sbx.demux', { new = function()\n"
  "  return { feed = function() return {} end, finish = function() return true end } end }) end\n"
  "pre['sbx.loop'] = function() return stub('sbx.loop', { sleep = function() end, now = function() return 0 end,\n"
  "  spawn = function() return { cancel = function() end } end,\n"
  "  event = function() return { wait = function() end, notify = function() end } end }) end\n"
  "pre['sbx.state.owner'] = function() return stub('sbx.state.owner', { hostname = function() return 'fuzzhost' end,\n"
  "  session_id = function() return 'fuzzsession' end, lock_path = function() return '/nonexistent' end }) end\n"
  "pre['sbx.proc'] = function() return stub('sbx.proc', { random_hex = function(n) return string.rep('a', 2 * n) end }) end\n"
  "pre['sbx.agentbin'] = function() return 'AGENT' end\n"
  "package.path = DIR .. '/?.lua;' .. DIR .. '/?/init.lua'\n"
  "package.cpath = ''\n"
  "-- a module docker/*.lua may start to need: inert rather than a load failure\n"
  "table.insert(package.searchers, function(name) return function() return inert(name) end end)\n"
  "local errors = require 'sbx.core.errors'\n"
  "local json = require 'cjson.safe'\n"
  "-- the docker provider's facade and parts, compiled once and run afresh\n"
  "-- for every input (no state kept)\n"
  "local chunks = {}\n"
  "local ls = assert(io.popen('ls ' .. DIR .. '/sbx/providers/builtin/docker'))\n"
  "for f in ls:lines() do\n"
  "  local part = f:match('^([%w_]+)%.lua$')\n"
  "  local name = part == 'init' and 'sbx.providers.builtin.docker' or 'sbx.providers.builtin.docker.' .. tostring(part)\n"
  "  if part then chunks[name] = assert(loadfile(DIR .. '/sbx/providers/builtin/docker/' .. f)) end\n"
  "end\n"
  "ls:close()\n"
  "for name, c in pairs(chunks) do pre[name] = function(...) return c(...) end end\n"
  "local function chunk()\n"
  "  for name in pairs(chunks) do package.loaded[name] = nil end\n"
  "  return require 'sbx.providers.builtin.docker'\n"
  "end\n"
  "local function fail(fmt, ...) error(string.format(fmt, ...), 0) end\n"
  "local function deep(a, b, depth)\n"
  "  if type(a) ~= 'table' or type(b) ~= 'table' then return a == b end\n"
  "  for k, v in pairs(a) do if not deep(v, b[k]) then return false end end\n"
  "  for k in pairs(b) do if a[k] == nil then return false end end\n"
  "  return true\n"
  "end\n"
  "local function check_json(body)\n"
  "  local ok, v = pcall(json.decode, body)\n"
  "  if not ok then fail('J1: cjson.safe.decode raised: %s', tostring(v)) end\n"
  "  if v == nil then return end\n"
  "  local s1 = json.encode(v)\n"
  "  if not s1 then return end        -- Infinity, NaN: decoded, never encoded\n"
  "  local v2, err = json.decode(s1)\n"
  "  if v2 == nil then fail('J2: decode refuses what encode wrote (%s): %q', tostring(err), s1:sub(1, 200)) end\n"
  "  local s2, err2 = json.encode(v2)\n"
  "  if not s2 then fail('J2: encode refuses what decode read back (%s)', tostring(err2)) end\n"
  "  local v3 = json.decode(s2)\n"
  "  if not deep(v2, v3) then fail('J2: decode/encode is not stable: %q then %q', s1:sub(1, 200), s2:sub(1, 200)) end\n"
  "end\n"
  "local H = { cid = 'c1', id = 'x', session = 's' }\n"
  "local ENTRIES = {\n"
  "  { 'available', function(M) local ok, why = M.available()\n"
  "      if type(ok) ~= 'boolean' or (not ok and type(why) ~= 'string') then fail('J4: available() gave %s, %s', tostring(ok), tostring(why)) end end },\n"
  "  { 'list_owned', function(M) local l = M.list_owned()\n"
  "      if type(l) ~= 'table' then fail('J4: list_owned() gave a %s', type(l)) end\n"
  "      for _, e in ipairs(l) do if type(e) ~= 'table' then fail('J4: list_owned() holds a %s', type(e)) end end end },\n"
  "  { 'resume', function(M) M.resume{ container = 'c1', id = 'x', session = 's' } end },\n"
  "  { 'is_alive', function(M) local a = M.is_alive(H)\n"
  "      if type(a) ~= 'boolean' then fail('J4: is_alive() gave a %s', type(a)) end end },\n"
  "  { 'destroy', function(M) M.destroy(H) end },\n"
  "  { 'snapshot', function(M) M.snapshot(H) end },\n"
  "  { 'create', function(M) M.create{ id = 'x', session = 's', ttl = 60, image = 'img:1' } end },\n"
  "  { 'reap', function(M) M.reap{ id = 'x' } end },\n"
  "  { 'list_files', function(M) M.list_files(H, 'dir') end },\n"
  "  { 'read_file', function(M) M.read_file(H, 'f') end },\n"
  "  { 'get_tree', function(M) M.get_tree(H, 'd') end },\n"
  "  { 'spawn', function(M) M.spawn(H, { argv = { 'true' } }) end },\n"
  "  { 'mkdir', function(M) M.mkdir(H, 'd') end },\n"
  "}\n"
  "local findings, order, gaps, ngaps = {}, {}, {}, 0\n"
  "local function report()\n"
  "  local parts = {}\n"
  "  for _, site in ipairs(order) do parts[#parts + 1] = site .. ' x' .. findings[site].n end\n"
  "  for g in pairs(gaps) do parts[#parts + 1] = 'harness gap: ' .. g end\n"
  "  if #parts == 0 then return '' end\n"
  "  return 'json: J3 findings (untyped errors on engine JSON; SBX_FUZZ_STRICT=1 fails on them): '\n"
  "         .. table.concat(parts, ', ')\n"
  "end\n"
  "local function run(data)\n"
  "  queue, qi = {}, 0\n"
  "  local body = data:sub(2)\n"
  "  local i = 1\n"
  "  while true do\n"
  "    local j = body:find('\\n--\\n', i, true)\n"
  "    queue[#queue + 1] = body:sub(i, (j or 0) - 1)\n"
  "    if not j then break end\n"
  "    i = j + 4\n"
  "  end\n"
  "  for _, seg in ipairs(queue) do check_json(seg:sub(3)) end\n"
  "  local M = chunk()\n"
  "  M.exec_mode = 'engine'\n"
  "  local e = ENTRIES[(data:byte(1) or 0) % #ENTRIES + 1]\n"
  "  local site\n"
  "  local ok, err = xpcall(e[2], function(x)\n"
  "    for level = 2, 40 do       -- the docker/*.lua line that was running\n"
  "      local d = debug.getinfo(level, 'Sl')\n"
  "      if not d then break end\n"
  "      local part = d.source:match('/docker/([%w_]+%.lua)$')\n"
  "      if part then site = 'docker/' .. part .. ':' .. d.currentline break end\n"
  "    end\n"
  "    return x\n"
  "  end, M)\n"
  "  if ok or (type(err) == 'table' and errors.kinds[err.kind] ~= nil) then return end\n"
  "  local msg = tostring(err)\n"
  "  if msg:find('^J4') then fail('%s', msg) end\n"
  "  if msg:find('fuzz stub', 1, true) then\n"
  "    if not gaps[msg] and ngaps < 20 then gaps[msg], ngaps = true, ngaps + 1 end\n"
  "    return\n"
  "  end\n"
  "  site = site or msg:match('([%w_]+%.lua:%d+):') or '?'\n"
  "  if strict then fail('J3: %s() raised an untyped error: %s', e[1], msg) end\n"
  "  if not findings[site] then\n"
  "    findings[site] = { n = 0 }\n"
  "    order[#order + 1] = site\n"
  "    io.stderr:write(string.format('json: J3 finding: %s() raised an untyped error: %s\\n', e[1], msg:sub(1, 300)))\n"
  "  end\n"
  "  findings[site].n = findings[site].n + 1\n"
  "end\n"
  "return run, report\n";

static lua_State *L;

static void report(void) {
  if (!L) return;
  lua_getglobal(L, "report");
  if (lua_pcall(L, 0, 1, 0) == LUA_OK && lua_rawlen(L, -1) > 0)
    fprintf(stderr, "%s\n", lua_tostring(L, -1));
}

static void init_lua(void) {
  const char *strict = getenv("SBX_FUZZ_STRICT");
  L = luaL_newstate();
  luaL_openlibs(L);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_cjson);
  lua_setfield(L, -2, "cjson");
  lua_pushcfunction(L, luaopen_cjson_safe);
  lua_setfield(L, -2, "cjson.safe");
  lua_pop(L, 1);
  if (luaL_loadbuffer(L, harness, sizeof harness - 1, "=json_harness") != LUA_OK) abort();
  lua_pushstring(L, SBX_LUA_DIR);
  lua_pushboolean(L, strict && *strict && *strict != '0');
  lua_pushboolean(L, getenv("SBX_FUZZ_TRACE") != NULL);
  if (lua_pcall(L, 3, 2, 0) != LUA_OK) {
    fprintf(stderr, "json_fuzz: %s (SBX_LUA_DIR=%s)\n", lua_tostring(L, -1), SBX_LUA_DIR);
    abort();
  }
  lua_setglobal(L, "report");
  lua_setglobal(L, "run");
  atexit(report);
  luacov_start(L);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!L) init_lua();
  luacov_reset();
  lua_getglobal(L, "run");
  lua_pushlstring(L, (const char *)data, size);
  if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
    fprintf(stderr, "json_fuzz: %s\n", lua_tostring(L, -1));
    abort();
  }
  lua_settop(L, 0);
  lua_gc(L, LUA_GCCOLLECT);               /* no leak check per input */
  return 0;
}
