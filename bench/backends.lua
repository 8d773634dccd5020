-- bench/backends.lua — the backends side by side, one run, one table:
-- create+destroy and command latency on local, bwrap and docker, each
-- through sbx-agent and through its fallback, interleaved in rounds so that
-- the machine's drift spreads over every column.
--
--   build/sbxlua bench/backends.lua [ROUNDS]        (default 5; QUICK=1: 2)
--
-- Environment: N_BEXEC (commands per round and column, default 100),
-- N_BCREATE (creates per round, default 4), SBX_BENCH_IMAGE (docker image,
-- default sbxlua-test:bookworm). A backend that is not available is
-- reported as such. Times are ms, p50 over all rounds.
local B = dofile((arg[0]:match("^(.*)/") or ".") .. "/common.lua")
local bwrap = require "sbx.providers.builtin.bwrap"
local docker = require "sbx.providers.builtin.docker"

local QUICK = os.getenv("QUICK") == "1"
local ROUNDS = tonumber(arg[1]) or (QUICK and 2 or 5)
local N_EXEC = tonumber(os.getenv("N_BEXEC") or "") or (QUICK and 20 or 100)
local N_CREATE = tonumber(os.getenv("N_BCREATE") or "") or (QUICK and 2 or 4)
local IMAGE = os.getenv("SBX_BENCH_IMAGE") or "sbxlua-test:bookworm"

-- name, backend, options, how to select the exec path
local COLUMNS = {
  { "local", "local", {} },
  { "bwrap (agent)", "bwrap", {}, function(m) bwrap.exec_mode = m and nil end },
  { "bwrap (bwrap per command)", "bwrap", {}, function(m) bwrap.exec_mode = m and "direct" end },
  { "docker (agent)", "docker", { image = IMAGE }, function(m) docker.exec_mode = m and nil end },
  { "docker (engine exec)", "docker", { image = IMAGE }, function(m) docker.exec_mode = m and "engine" end },
}

local samples, why = {}, {}
local function add(col, what, list)
  local key = col .. "\0" .. what
  samples[key] = samples[key] or {}
  for _, v in ipairs(list) do table.insert(samples[key], v) end
end

local function measure(c)
  local name, backend, opts, select = c[1], c[2], c[3], c[4]
  if select then select(true) end
  local ok, err = pcall(function()
    local creates = {}
    for i = 1, N_CREATE do
      local t0 = B.now()
      local sb = sbx.sandbox(backend, opts)
      sb:execute_command("true", {})   -- the first command: it starts an agent where there is one
      sb:destroy()
      creates[i] = (B.now() - t0) * 1e3
    end
    add(name, "create", creates)
    local sb <close> = sbx.sandbox(backend, opts)
    add(name, "argv", B.time(N_EXEC, 10, function()
      assert(sb:execute_command("true", {}).exit_code == 0)
    end))
    add(name, "sh", B.time(N_EXEC, 10, function()
      assert(sb:execute_command("true").exit_code == 0)
    end))
    add(name, "rw", B.time(N_EXEC, 10, function()
      sb:write_file("f.txt", "x")
      assert(sb:read_file("f.txt") == "x")
    end))
  end)
  if select then select(false) end
  if not ok then why[name] = tostring(type(err) == "table" and err.message or err):sub(1, 60) end
end

local avail = {}
for _, c in ipairs(COLUMNS) do
  local p = c[2] == "bwrap" and bwrap or c[2] == "docker" and docker or nil
  local ok, reason = true, nil
  if p then ok, reason = p.available() end
  avail[c[1]] = ok
  if not ok then why[c[1]] = "unavailable: " .. tostring(reason):sub(1, 50) end
end

local load0 = io.open("/proc/loadavg"):read("l"):match("^(%S+ %S+ %S+)")
for r = 1, ROUNDS do
  io.stderr:write(string.format("[bench backends] round %d/%d\n", r, ROUNDS))
  for _, c in ipairs(COLUMNS) do
    if avail[c[1]] and not why[c[1]] then measure(c) end
  end
end
local load1 = io.open("/proc/loadavg"):read("l"):match("^(%S+ %S+ %S+)")

local function p50(col, what)
  local s = samples[col .. "\0" .. what]
  return s and #s > 0 and B.stats(s).p50 or nil
end

print(string.format("sbxlua backends — %s, %d cores, loadavg %s -> %s; p50 ms over %d rounds "
  .. "(%d commands, %d creates per round and column)", os.date("!%Y-%m-%dT%H:%MZ"),
  tonumber(io.popen("nproc"):read("l")), load0, load1, ROUNDS, N_EXEC, N_CREATE))
print(string.format("%-28s %22s %20s %20s %18s", "backend", "create+1st cmd+destroy",
  'exec("true", {})', 'exec("true") [sh]', "write+read 1 B"))
local base = p50("local", "sh")
for _, c in ipairs(COLUMNS) do
  local name = c[1]
  if why[name] then
    print(string.format("%-28s %s", name, "n/a (" .. why[name] .. ")"))
  else
    local function f(w) local v = p50(name, w) return v and string.format("%.2f", v) or "n/a" end
    local sh = p50(name, "sh")
    local ratio = (sh and base) and string.format(" (%.2fx)", sh / base) or ""
    print(string.format("%-28s %22s %20s %20s %18s", name, f("create"), f("argv"), f("sh") .. ratio, f("rw")))
  end
end
local bw = p50("bwrap (agent)", "sh")
if bw and base then
  print(string.format('target: bwrap execute_command("true") within 2x of local: %.2fx %s', bw / base,
                      bw / base <= 2 and "PASS" or "MISS"))
end
