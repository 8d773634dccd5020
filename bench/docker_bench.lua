-- sbxlua side of bench/docker.sh: the docker backend on a real engine.
--   sbxlua bench/docker_bench.lua create N       p50 of sbx.sandbox("docker", ...) (destroy not timed)
--   sbxlua bench/docker_bench.lua exec N         p50 of execute_command("true", {}) on one sandbox
--   sbxlua bench/docker_bench.lua rw N           p50 of write_file("f.txt", 1 KiB) + read_file("f.txt")
--   sbxlua bench/docker_bench.lua round N        p50 of exec + write + read (an agent's step)
--   (SBX_DOCKER_EXEC=engine: the engine's exec/archive path instead of the agent stream)
--   sbxlua bench/docker_bench.lua concurrent S C S sandboxes (sbx.parallel, concurrency S) x C commands
--   sbxlua bench/docker_bench.lua trace N [DIR]  every Engine call of N creates / execs / rw rounds,
--       timed (http.request and stream.connect wrapped); with DIR, writes the
--       create body (labels replaced by sbxbench=1) and the agent archive there
--       (create.json, agent.tar) for engine_floor's "as sbxlua" create.
-- Image: $SBX_BENCH_IMAGE (default sbxlua-test:bookworm). Every sandbox is
-- labelled sbxbench=$SBX_BENCH_RUN (default 1) so bench/docker.sh can remove leftovers.
-- Output: one "s <ms>" line per sample, then "p50 X p90 X mean X min X n N"
-- (concurrent: "ok <bool> wall_ms <ms> cmds <n> vmhwm_kb <kB>").
local B = dofile((arg[0]:match("^(.*)/") or ".") .. "/common.lua")
local mode, n = arg[1], tonumber(arg[2]) or 20
local IMAGE = os.getenv("SBX_BENCH_IMAGE") or "sbxlua-test:bookworm"
local OPTS = { image = IMAGE, labels = { sbxbench = os.getenv("SBX_BENCH_RUN") or "1" } }
local DATA = ("abcdefghijklmnopqrstuvwxyz"):rep(40):sub(1, 1024)

local function samples(t)
  for _, v in ipairs(t) do print(string.format("s %.4f", v)) end
  B.report(t)
end

local function exec_true(sb)
  local r = sb:execute_command("true", {})
  assert(r.exit_code == 0, "exit " .. tostring(r.exit_code) .. ": " .. r.stderr)
end

local function rw(sb)
  sb:write_file("f.txt", DATA)
  assert(sb:read_file("f.txt") == DATA, "read back differs")
end

if mode == "create" then
  local t = {}
  for i = 0, n do          -- i == 0: warm-up (engine connection, agent blob)
    local t0 = B.now()
    local sb = sbx.sandbox("docker", OPTS)
    local dt = (B.now() - t0) * 1e3
    sb:destroy()
    if i > 0 then t[i] = dt end
  end
  samples(t)
elseif mode == "exec" or mode == "rw" or mode == "round" then
  local sb <close> = sbx.sandbox("docker", OPTS)
  local fn = ({ exec = function() exec_true(sb) end, rw = function() rw(sb) end,
                round = function() exec_true(sb) rw(sb) end })[mode]
  samples(B.time(n, 10, fn))
elseif mode == "concurrent" then
  local ncmd = tonumber(arg[3]) or 10
  local items = {}
  for i = 1, n do items[i] = i end
  local t0 = B.now()
  local res = sbx.parallel(items, function()
    local sb <close> = sbx.sandbox("docker", OPTS)
    local ok = 0
    for _ = 1, ncmd do
      if sb:execute_command("true", {}).exit_code == 0 then ok = ok + 1 end
    end
    return ok
  end, { concurrency = n })
  local wall = (B.now() - t0) * 1e3
  local total = 0
  for _, v in ipairs(res) do total = total + (tonumber(v) or 0) end
  local f = assert(io.open("/proc/self/status"))
  local hwm = tonumber(f:read("a"):match("VmHWM:%s*(%d+)"))
  f:close()
  print(string.format("ok %s wall_ms %.2f cmds %d vmhwm_kb %d", tostring(total == n * ncmd), wall, total, hwm))
elseif mode == "trace" then
  local http, stream, json = require "sbx.http", require "sbx.stream", require "cjson.safe"
  local dir = arg[3]
  local log                 -- list of {name, ms, bytes} for the current op
  local orig_req, orig_conn = http.request, stream.connect
  local function name_of(method, url)
    local p = url:gsub("^http://[^/]+", ""):gsub("^/v[%d.]+", ""):gsub("%?.*", "")
    p = p:gsub("/containers/" .. ("%x"):rep(12) .. "%x*", "/containers/{id}")
    p = p:gsub("/exec/" .. ("%x"):rep(12) .. "%x*", "/exec/{id}")
    return method .. " " .. p
  end
  http.request = function(o)
    local t0 = B.now()
    local res, a, b = orig_req(o)
    local name = name_of(o.method or "GET", o.url)
    if log then log[#log + 1] = { name, (B.now() - t0) * 1e3, o.body and #o.body or 0 } end
    if dir and name == "POST /containers/create" then
      local body = json.decode(o.body)
      body.Labels = { sbxbench = OPTS.labels.sbxbench }
      local f = assert(io.open(dir .. "/create.json", "w"))
      f:write(json.encode(body))
      f:close()
    elseif dir and name == "PUT /containers/{id}/archive" and #o.body > 100000 then
      local f = assert(io.open(dir .. "/agent.tar", "wb"))
      f:write(o.body)
      f:close()
    end
    return res, a, b
  end
  -- the hijacked exec stream: time spent blocked in its reads, split at the
  -- end of the HTTP 101 head (engine starting the exec) and after (output to EOF)
  stream.connect = function(o)
    local t0 = B.now()
    local s, a, b = orig_conn(o)
    if log then log[#log + 1] = { "connect (for the exec start)", (B.now() - t0) * 1e3, 0 } end
    if not s then return s, a, b end
    local head, in_body = "", false
    local proxy = {}
    function proxy.read(_, ...)
      local t1 = B.now()
      local chunk, e1, e2 = s:read(...)
      local name = in_body and "read output to EOF (hijacked)" or "POST /exec/{id}/start: until 101 (hijacked)"
      if log then log[#log + 1] = { name, (B.now() - t1) * 1e3, 0 } end
      if not in_body and chunk then
        head = head .. chunk
        in_body = head:find("\r\n\r\n", 1, true) ~= nil
      end
      return chunk, e1, e2
    end
    return setmetatable(proxy, { __index = function(_, k)
      return function(_, ...) return s[k](s, ...) end
    end })
  end
  -- op name -> { totals = {ms...}, calls = { name -> {ms...} }, order = {name...}, bytes = {name -> n} }
  local ops, order = {}, {}
  local function measure(op, fn)
    local o = ops[op]
    if not o then
      o = { totals = {}, calls = {}, order = {}, bytes = {}, count = {} }
      ops[op] = o
      order[#order + 1] = op
    end
    log = {}
    local t0 = B.now()
    fn()
    local total = (B.now() - t0) * 1e3
    local calls = log
    log = nil
    o.totals[#o.totals + 1] = total
    local sum, seen = 0, {}
    for _, c in ipairs(calls) do
      if not o.calls[c[1]] then o.calls[c[1]] = {}; o.order[#o.order + 1] = c[1] end
      local l = o.calls[c[1]]
      if not seen[c[1]] then seen[c[1]] = 0; l[#l + 1] = 0 end
      l[#l] = l[#l] + c[2]       -- several calls of one kind in one op: summed
      seen[c[1]] = seen[c[1]] + 1
      o.bytes[c[1]] = math.max(o.bytes[c[1]] or 0, c[3])
      sum = sum + c[2]
    end
    for k, v in pairs(seen) do o.count[k] = (o.count[k] or 0) + v end
    o.calls["(rest: sbxlua, not in an Engine call)"] = o.calls["(rest: sbxlua, not in an Engine call)"] or {}
    local r = o.calls["(rest: sbxlua, not in an Engine call)"]
    r[#r + 1] = total - sum
  end
  do local sb = sbx.sandbox("docker", OPTS); sb:destroy() end     -- warm-up, and the dump
  for _ = 1, math.max(3, n // 10) do
    local sb
    measure("create (sbx.sandbox)", function() sb = sbx.sandbox("docker", OPTS) end)
    measure("destroy (not in create p50)", function() sb:destroy() end)
  end
  local sb <close> = sbx.sandbox("docker", OPTS)
  for _ = 1, 5 do exec_true(sb); rw(sb) end
  for _ = 1, n do measure('execute_command("true", {})', function() exec_true(sb) end) end
  for _ = 1, n do measure("write_file", function() sb:write_file("f.txt", DATA) end) end
  for _ = 1, n do measure("read_file", function() assert(sb:read_file("f.txt") == DATA) end) end
  for _, op in ipairs(order) do
    local o = ops[op]
    local nops = #o.totals
    local reqs = 0          -- Engine round trips: HTTP requests + hijacked exec starts
    for k, c in pairs(o.count) do
      if (k:match("^%u+ /") and not k:find("hijacked", 1, true)) or k:match("^connect") then reqs = reqs + c end
    end
    print(string.format("%-30s p50 %8.2f ms  (%d ops, %.2f Engine requests/op)", op, B.stats(o.totals).p50,
                        nops, reqs / nops))
    local names = o.order
    names[#names + 1] = "(rest: sbxlua, not in an Engine call)"
    for _, k in ipairs(names) do
      local per = o.count[k] and string.format(k:find("hijacked", 1, true) and "%4.1f rd" or "%4.1f/op",
                                               o.count[k] / nops) or "       "
      local bytes = (o.bytes[k] or 0) > 0 and string.format("  body %d B", o.bytes[k]) or ""
      print(string.format("    %-44s %s p50 %8.2f ms%s", k, per, B.stats(o.calls[k]).p50, bytes))
    end
  end
else
  io.stderr:write("usage: docker_bench.lua create|exec|rw|concurrent|trace N [...]\n")
  os.exit(2)
end
