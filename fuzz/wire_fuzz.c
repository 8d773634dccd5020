/*
** libFuzzer target for sbx.wire (lua/sbx/daemon/wire.lua), the host's decoder of
** sbx-agent frames (docs/agent-protocol.md): the bytes come from inside a
** sandbox. The input is fed to wire.decoder() whole and again in chunks
** whose sizes come from the input (empty chunks included), then once more
** with "" (the end). An independent walk of the bytes by the document's
** rules (u32 len >= 5 and <= MAX_FRAME, u8 type, u32 id, payload) is the
** oracle:
**  W1 feed() never raises; it returns a list of frames or nil + message;
**  W2 a stream without a broken length: every chunking delivers exactly the
**     oracle's frames, in order, and pending() is the bytes left over;
**  W3 a broken length: every chunking ends in nil + message, and the frames
**     delivered before are a prefix of the oracle's (frames that arrive in
**     the same feed() as the broken length are not delivered);
**  W4 wire.frame() re-encodes each frame to its exact bytes;
**  W5 wire.fields(kind, payload) for every kind that has a payload format
**     never raises; when it parses, packing the values with the document's
**     format gives the payload back (nothing dropped or left over).
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

static const char harness[] =
  "local wire = require 'sbx.daemon.wire'\n"
  "-- payload formats, from docs/agent-protocol.md (Agent to host)\n"
  "local DOC = { H = '>s4I4', P = '>I4', X = '>s4i4Bs4', Z = '>s4s4', E = '>s4' }\n"
  "local COUNT = { H = 2, P = 1, X = 4, Z = 2, E = 1 }\n"
  "local function fail(fmt, ...) error(string.format(fmt, ...), 0) end\n"
  "local function oracle(data)\n"
  "  local frames, pos = {}, 1\n"
  "  while #data - pos + 1 >= 4 do\n"
  "    local len = string.unpack('>I4', data, pos)\n"
  "    if len < 5 or len > wire.MAX_FRAME then return frames, true end\n"
  "    if #data - pos + 1 < 4 + len then break end\n"
  "    local kind, id = string.unpack('>c1I4', data, pos + 4)\n"
  "    frames[#frames + 1] = { kind = kind, id = id, payload = data:sub(pos + 9, pos + 3 + len),\n"
  "                            raw = data:sub(pos, pos + 3 + len) }\n"
  "    pos = pos + 4 + len\n"
  "  end\n"
  "  return frames, false, #data - pos + 1\n"
  "end\n"
  "local function run(data, cuts)\n"
  "  local d, got, broken = wire.decoder(), {}, nil\n"
  "  local function feed(chunk)\n"
  "    local ok, out, err = pcall(d.feed, d, chunk)\n"
  "    if not ok then fail('W1: feed raised: %s', tostring(out)) end\n"
  "    if out == nil then\n"
  "      if type(err) ~= 'string' then fail('W1: feed gave nil and a %s', type(err)) end\n"
  "      broken = err\n"
  "      return false\n"
  "    end\n"
  "    if type(out) ~= 'table' then fail('W1: feed gave a %s', type(out)) end\n"
  "    for _, f in ipairs(out) do got[#got + 1] = f end\n"
  "    return true\n"
  "  end\n"
  "  local off, k = 1, 0\n"
  "  while off <= #data do\n"
  "    local n = #cuts > 0 and cuts[k % #cuts + 1] or #data\n"
  "    k = k + 1\n"
  "    if n == 0 then if not feed('') then break end n = 1 end\n"
  "    if not feed(data:sub(off, off + n - 1)) then break end\n"
  "    off = off + n\n"
  "  end\n"
  "  if not broken then feed('') end\n"
  "  return got, broken, not broken and d.pending() or nil\n"
  "end\n"
  "local function same(f, g, i, how)\n"
  "  if f.kind ~= g.kind or f.id ~= g.id or f.payload ~= g.payload then\n"
  "    fail('%s: frame %d differs: %q/%s/%d bytes, expected %q/%s/%d bytes', how, i,\n"
  "         tostring(f.kind), tostring(f.id), #tostring(f.payload), g.kind, g.id, #g.payload)\n"
  "  end\n"
  "end\n"
  "return function(data, cutbytes)\n"
  "  local want, wbroken, wpending = oracle(data)\n"
  "  local cuts = { cutbytes:byte(1, -1) }\n"
  "  for _, c in ipairs{ {}, cuts } do\n"
  "    local got, broken, pending = run(data, c)\n"
  "    local how = #c == 0 and 'whole' or ('chunks of ' .. table.concat(c, ','))\n"
  "    if wbroken then\n"
  "      if not broken then fail('W3 (%s): a broken length went unnoticed', how) end\n"
  "      if #got > #want then fail('W3 (%s): %d frames, only %d before the break', how, #got, #want) end\n"
  "    else\n"
  "      if broken then fail('W2 (%s): broken: %s', how, broken) end\n"
  "      if #got ~= #want then fail('W2 (%s): %d frames, expected %d', how, #got, #want) end\n"
  "      if pending ~= wpending then fail('W2 (%s): pending %s, expected %d', how, tostring(pending), wpending) end\n"
  "    end\n"
  "    for i, f in ipairs(got) do same(f, want[i], i, how) end\n"
  "  end\n"
  "  for _, f in ipairs(want) do\n"
  "    if wire.frame(f.kind, f.id, f.payload) ~= f.raw then fail('W4: frame() does not give the bytes back') end\n"
  "    for kind, fmt in pairs(DOC) do\n"
  "      local r = table.pack(pcall(wire.fields, kind, f.payload))\n"
  "      if not r[1] then fail('W5: fields(%s) raised: %s', kind, tostring(r[2])) end\n"
  "      if r[2] ~= nil then\n"
  "        if r.n - 1 ~= COUNT[kind] then fail('W5: fields(%s) gave %d values', kind, r.n - 1) end\n"
  "        local ok, back = pcall(string.pack, fmt, table.unpack(r, 2, r.n))\n"
  "        if not ok or back ~= f.payload then fail('W5: fields(%s) does not pack back: %s', kind, tostring(back)) end\n"
  "      end\n"
  "    end\n"
  "  end\n"
  "end\n";

static lua_State *L;

static void init_lua(void) {
  L = luacov_newstate(SBX_LUA_DIR);
  if (luaL_loadbuffer(L, harness, sizeof harness - 1, "=wire_harness") != LUA_OK ||
      lua_pcall(L, 0, 1, 0) != LUA_OK) {
    fprintf(stderr, "wire_fuzz: %s (SBX_LUA_DIR=%s)\n", lua_tostring(L, -1), SBX_LUA_DIR);
    abort();
  }
  lua_setglobal(L, "check");
  luacov_start(L);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t ncuts;
  if (!L) init_lua();
  if (size < 1) return 0;
  ncuts = data[0] % 8;
  if (ncuts + 1 > size) return 0;
  luacov_reset();
  lua_getglobal(L, "check");
  lua_pushlstring(L, (const char *)data + 1 + ncuts, size - 1 - ncuts);
  lua_pushlstring(L, (const char *)data + 1, ncuts);
  if (lua_pcall(L, 2, 0, 0) != LUA_OK) {
    fprintf(stderr, "wire_fuzz: %s\n", lua_tostring(L, -1));
    abort();
  }
  lua_settop(L, 0);
  lua_gc(L, LUA_GCCOLLECT);               /* no leak check per input */
  return 0;
}
