--- The sbxlua subcommands: providers, ls, gc, doctor (and the way to the
--- others). Each takes the options and the positional arguments parsed
--- against lua/sbx/cli/table.lua and returns an exit status.
local sbx = require "sbx"
local owner = require "sbx.state.owner"
local providers = require "sbx.providers"

local M = {}

local function say(...) io.stdout:write(...) end
local function complain(...) io.stderr:write("sbxlua: ", ...) io.stderr:write("\n") end

-- exec: lua/sbx/cli/exec.lua
function M.exec(o, rest) return require("sbx.cli.exec").exec(o, rest) end

-- -------------------------------------------------------------- providers

local request = require "sbx.cli.request"
local ALL_CAPS = request.CAPABILITIES

function M.providers(o)
  local all = providers.describe()
  local names = {}
  for _, n in ipairs(providers.names) do names[#names + 1] = n end
  for _, n in ipairs(providers.planned) do names[#names + 1] = n end
  if o.json then
    for _, d in pairs(all) do
      d.capabilities, d.regions = d.capabilities or {}, d.regions or {}
    end
    say(request.json(all, { capabilities = true, regions = true }), "\n")
  elseif o.matrix then
    -- capabilities only: what a backend can do, not whether this machine has it
    say("| backend | isolation | ", table.concat(ALL_CAPS, " | "), " |\n")
    say("|---|---|", string.rep("---|", #ALL_CAPS), "\n")
    for _, n in ipairs(names) do
      local d, cells = all[n], {}
      local has = {}
      for _, c in ipairs(d.capabilities or {}) do has[c] = true end
      for i, c in ipairs(ALL_CAPS) do cells[i] = has[c] and "yes" or "-" end
      say("| ", n, " | ", d.isolation or "(planned)", " | ", table.concat(cells, " | "), " |\n")
    end
  else
    for _, n in ipairs(names) do
      local d = all[n]
      say(string.format("%-11s %-3s %-10s %s%s\n", n, d.available and "yes" or "no",
        d.isolation or "-", table.concat(d.capabilities or {}, ","),
        d.available and string.format("  $%.4f/h", d.price_per_hour or 0)
                    or ("  (" .. tostring(d.reason) .. ")")))
    end
  end
  return 0
end

-- --------------------------------------------------------------------- ls

function M.ls(o)
  local rows = {}
  for _, s in ipairs(owner.sessions()) do
    for _, e in ipairs(s.sandboxes) do
      rows[#rows + 1] = { id = e.id, backend = e.backend, session = s.id,
                          session_alive = s.live, created = e.created, labels = e.labels,
                          dir = e.state and e.state.dir }
    end
  end
  table.sort(rows, function(a, b) return (a.created or 0) < (b.created or 0) end)
  if o.json then
    say(request.json(rows, nil, true), "\n")
    return 0
  end
  if #rows == 0 then
    say("no sandboxes: nothing to do\n")
    return 0
  end
  for _, r in ipairs(rows) do
    say(string.format("%-16s %-8s %-7s %s  %s\n", r.id, r.backend,
      r.session_alive and "live" or "orphan", os.date("!%Y-%m-%dT%H:%M:%SZ", r.created or 0), r.session))
  end
  return 0
end

-- --------------------------------------------------------------------- gc

function M.gc(o)
  return require("sbx.state.gc").run{ all_sessions = o["all-sessions"], dry_run = o["dry-run"] }
end

-- ----------------------------------------------------------------- doctor

function M.doctor()
  local problems = 0
  local function line(ok, what, detail, fix)
    say(ok and "ok    " or "warn  ", what, detail and (": " .. detail) or "", "\n")
    if not ok and fix then say("      fix: ", fix, "\n") end
    if not ok then problems = problems + 1 end
  end
  say("sbxlua ", sbx.version, " (", _VERSION, ")\n")
  -- The configuration: a broken one is reported, and the checks below run
  -- with the built-in defaults instead.
  local config = require "sbx.core.config"
  local path = config.locate()
  local cok, cerr = pcall(config.get)
  if not cok then config.use(config.EMPTY) end
  line(cok, "configuration", cok and (path or "none (built-in defaults)")
         or (tostring(type(cerr) == "table" and cerr.message or cerr) .. "; the checks below use the built-in defaults"),
       "fix " .. tostring(path) .. ", or name another file with --config FILE or $SBX_CONFIG")
  local dir = owner.state_dir()
  local fs = require "sbx.fs"
  local probe = dir .. "/.doctor-probe"
  local j, jerr = fs.journal(probe)
  if j then j:close() os.remove(probe) end
  line(j ~= nil, "state directory", j and dir or tostring(jerr),
       "set SBX_STATE_DIR to a writable directory")
  local base, why = require("sbx.providers.builtin.host").containment()
  line(base ~= nil, "process containment",
       base and ("cgroup v2 at " .. base .. " (timeouts and destroy kill whole trees)")
            or ("no writable cgroup v2 (" .. tostring(why) .. "); using process groups and a /proc sweep"),
       "run as root, or under a delegated cgroup (systemd-run --user --scope -p Delegate=yes sbxlua ...)")
  -- Per backend: what works, what is missing, and the command that fixes it.
  local FIXES = { bwrap = "apt-get install bubblewrap",
                  docker = "apt-get install docker.io and start the engine (systemctl start docker),"
                           .. " or point DOCKER_HOST at one",
                  safehouse = "macOS: brew install eugene1g/safehouse/agent-safehouse (elsewhere: a stand-in"
                              .. " for tests only, docs/safehouse.md)" }
  for _, n in ipairs(providers.names) do
    local p = providers.get(n)
    local called, ok, reason = pcall(p.available)   -- a broken script raises its file:line
    if not called then ok, reason = false, tostring(type(ok) == "table" and ok.message or ok) end
    -- a script that answered why ("set E2B_API_KEY") said the fix itself;
    -- one that raised or does not load is for `provider check`
    local fix = FIXES[n] or (p.file and not called and ("sbxlua provider check " .. p.file))
                or (p.broken_file and ("sbxlua provider check " .. p.broken_file .. " lists every problem"))
    line(ok, "backend " .. n, ok and "available" or reason, fix)
    local dok, checks = pcall(p.doctor or function() return {} end)
    if not dok then checks = { { ok = false, what = "doctor", detail = tostring(checks) } } end
    for _, c in ipairs(checks) do
      if c.ok == nil then
        say("        -    ", c.what, c.detail and (": " .. c.detail) or "", "\n")
      else
        say(c.ok and "        ok   " or "        warn ", c.what, c.detail and (": " .. c.detail) or "", "\n")
        if not c.ok and c.fix then say("             fix: ", c.fix, "\n") end
      end
    end
  end
  for _, n in ipairs(providers.planned) do
    say("-     backend ", n, ": not in this build yet\n")
  end
  local py = require("sbx.proc").which("python3", require("sbx.providers.builtin.host").DEFAULT_PATH)
  line(py ~= nil, "python3 for execute_code", py or "not found", "apt-get install python3")
  local ok_busted = pcall(require, "busted.runner")
  line(ok_busted, "busted (test suite)", ok_busted and "found" or "not found", "apt-get install lua-busted")
  say("run `sbxlua selftest` to probe the isolating backends for escapes\n")
  return 0
end

-- --------------------------------------------------------------- provider

local function usage(cmd, msg)
  complain(cmd, ": ", msg)
  return 2
end

function M.provider(_, rest)
  if rest[1] == "check" and rest[2] and not rest[3] then
    local file = rest[2]
    local p, err = providers.check_file(file)
    if not p then
      io.stderr:write(tostring(err), "\n")
      return 1
    end
    local ops = {}
    for _, op in ipairs(require("sbx.providers.contract").OPTIONAL) do
      if p[op] and not p.defaulted[op] then ops[#ops + 1] = op end
    end
    say("ok: provider '", p.descriptor.name, "' in ", file, " meets the provider contract (",
        p.descriptor.isolation, "; ", table.concat(p.descriptor.capabilities, ","), ")",
        #ops > 0 and ("; optional operations: " .. table.concat(ops, ", ")) or "", "\n")
    return 0
  elseif rest[1] == "list" and not rest[2] then
    local path = providers.loader:dirs()
    say("search path: ", #path > 0 and table.concat(path, ":") or "(none)", "\n")
    for _, n in ipairs(providers.names) do
      local ok, p = pcall(providers.get, n)
      local where = not ok and "?" or p.file or (p.broken and "broken") or "built in"
      say(string.format("%-11s %s%s\n", n, where, ok and p.broken and (": " .. tostring(p.broken)) or ""))
    end
    return 0
  end
  return usage("provider", "expected `check FILE` or `list` (see sbxlua provider --help)")
end

-- selftest: lua/sbx/cli/selftest/init.lua
function M.selftest(o) return require("sbx.cli.selftest").main(o) end

-- route, policy: lua/sbx/cli/routing.lua
for _, name in ipairs{ "route", "policy" } do
  M[name] = function(o, rest) return require("sbx.cli.routing")[name](o, rest) end
end

function M.usage(o) return require("sbx.cli.usage").main(o) end          -- lua/sbx/cli/usage.lua
function M.dashboard(o) return require("sbx.cli.dashboard").main(o) end  -- lua/sbx/cli/dashboard/init.lua

return M
