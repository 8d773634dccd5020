--- The sbxlua subcommands: exec, providers, ls, gc, doctor.
--- Each takes the remaining argv and returns an exit status.
local sbx = require "sbx"
local owner = require "sbx.owner"
local providers = require "sbx.providers"

local M = {}

local function say(...) io.stdout:write(...) end
local function complain(...) io.stderr:write("sbxlua: ", ...) io.stderr:write("\n") end

-- Parse --flag / --flag VALUE options; `spec` maps names to "bool", "value" or "list".
local function parse(args, spec, cmd)
  local opts, rest, i = {}, {}, 1
  while i <= #args do
    local a = args[i]
    if a == "--" then
      for k = i + 1, #args do rest[#rest + 1] = args[k] end
      break
    end
    local name, inline = a:match("^%-%-([%w%-]+)=(.*)$")
    name = name or a:match("^%-%-([%w%-]+)$")
    if not name then
      rest[#rest + 1] = a
    else
      local kind = spec[name]
      if not kind then return nil, "sbxlua " .. cmd .. ": unknown option --" .. name end
      if kind == "bool" then
        opts[name] = true
      else
        local v = inline
        if v == nil then
          i = i + 1
          v = args[i]
        end
        if v == nil then return nil, "sbxlua " .. cmd .. ": --" .. name .. " needs a value" end
        if kind == "list" then
          opts[name] = opts[name] or {}
          table.insert(opts[name], v)
        else
          opts[name] = v
        end
      end
    end
    i = i + 1
  end
  return opts, rest
end

-- ------------------------------------------------------------------- exec

local SIGNUM = { SIGHUP = 1, SIGINT = 2, SIGQUIT = 3, SIGILL = 4, SIGABRT = 6, SIGFPE = 8,
                 SIGKILL = 9, SIGSEGV = 11, SIGPIPE = 13, SIGALRM = 14, SIGTERM = 15 }

function M.exec(args)
  local o, rest = parse(args, { backend = "value", policy = "value", image = "value",
    need = "list", timeout = "value", env = "list", file = "list", preset = "value" }, "exec")
  if not o then complain(rest) return 2 end
  if #rest == 0 then complain("exec: no command given (sbxlua exec [OPTIONS] -- CMD [ARGS...])") return 2 end
  local opts = { backend = o.backend, policy = o.policy, image = o.image, needs = o.need,
                 preset = o.preset, env_vars = {} }
  for _, kv in ipairs(o.env or {}) do
    local k, v = kv:match("^([^=]+)=(.*)$")
    if not k then complain("exec: --env expects K=V, got ", kv) return 2 end
    opts.env_vars[k] = v
  end
  local timeout = o.timeout and tonumber(o.timeout)
  if o.timeout and not (timeout and timeout > 0) then
    complain("exec: --timeout expects seconds > 0, got ", o.timeout) return 2
  end
  local sb <close> = sbx.sandbox(opts)
  for _, spec in ipairs(o.file or {}) do
    local from, to = spec:match("^(.-):(.+)$")
    if not from then complain("exec: --file expects LOCAL:REMOTE, got ", spec) return 2 end
    sb:upload_file(from, to)
  end
  local cmd_args = #rest > 1 and { table.unpack(rest, 2) } or nil
  local r = sb:execute_command(rest[1], cmd_args, {
    timeout = timeout,
    on_stdout = function(c) io.stdout:write(c) io.stdout:flush() end,
    on_stderr = function(c) io.stderr:write(c) io.stderr:flush() end,
  })
  if r.timed_out then
    complain("exec: the command timed out after ", tostring(timeout or 600), " s; its process tree was killed")
    return 124
  end
  if r.truncated then complain("exec: output beyond the cap was dropped") end
  if r.signal then return 128 + (SIGNUM[r.signal] or 0) end
  return r.exit_code
end

-- -------------------------------------------------------------- providers

local function sorted_names(t)
  local names = {}
  for k in pairs(t) do names[#names + 1] = k end
  table.sort(names)
  return names
end

local ALL_CAPS = { "exec", "files", "streaming", "background", "resume", "snapshot",
                   "network", "gpu" }

function M.providers(args)
  local o, err = parse(args, { json = "bool", matrix = "bool" }, "providers")
  if not o then complain(err) return 2 end
  local all = providers.describe()
  local names = {}
  for _, n in ipairs(providers.names) do names[#names + 1] = n end
  for _, n in ipairs(providers.planned) do names[#names + 1] = n end
  if o.json then
    say(sbx.json.encode(all), "\n")
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

function M.ls(args)
  local o, err = parse(args, { json = "bool" }, "ls")
  if not o then complain(err) return 2 end
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
    say(sbx.json.encode(rows), "\n")
    return 0
  end
  for _, r in ipairs(rows) do
    say(string.format("%-16s %-8s %-7s %s  %s\n", r.id, r.backend,
      r.session_alive and "live" or "orphan", os.date("!%Y-%m-%dT%H:%M:%SZ", r.created or 0), r.session))
  end
  return 0
end

-- --------------------------------------------------------------------- gc

function M.gc(args)
  local o, err = parse(args, { ["all-sessions"] = "bool", ["dry-run"] = "bool" }, "gc")
  if not o then complain(err) return 2 end
  return require("sbx.gc").run{ all_sessions = o["all-sessions"], dry_run = o["dry-run"] }
end

-- ----------------------------------------------------------------- doctor

function M.doctor(args)
  local o, err = parse(args, {}, "doctor")
  if not o then complain(err) return 2 end
  local problems = 0
  local function line(ok, what, detail, fix)
    say(ok and "ok    " or "warn  ", what, detail and (": " .. detail) or "", "\n")
    if not ok and fix then say("      fix: ", fix, "\n") end
    if not ok then problems = problems + 1 end
  end
  say("sbxlua ", sbx.version, " (", _VERSION, ")\n")
  local dir = owner.state_dir()
  local fs = require "sbx.fs"
  local probe = dir .. "/.doctor-probe"
  local j, jerr = fs.journal(probe)
  if j then j:close() os.remove(probe) end
  line(j ~= nil, "state directory", j and dir or tostring(jerr),
       "set SBX_STATE_DIR to a writable directory")
  local base, why = require("sbx.backends.local").containment()
  line(base ~= nil, "process containment",
       base and ("cgroup v2 at " .. base .. " (timeouts and destroy kill whole trees)")
            or ("no writable cgroup v2 (" .. tostring(why) .. "); using process groups and a /proc sweep"),
       "run as root, or under a delegated cgroup (systemd-run --user --scope -p Delegate=yes sbxlua ...)")
  -- Per backend: what works, what is missing, and the command that fixes it.
  local FIXES = { bwrap = "apt-get install bubblewrap",
                  docker = "apt-get install docker.io and start the engine (systemctl start docker),"
                           .. " or point DOCKER_HOST at one" }
  for _, n in ipairs(providers.names) do
    local p = providers.get(n)
    local ok, reason = p.available()
    line(ok, "backend " .. n, ok and "available" or reason, FIXES[n])
    for _, c in ipairs(p.doctor and p.doctor() or {}) do
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
  local py = require("sbx.proc").which("python3", require("sbx.sandbox").DEFAULT_PATH)
  line(py ~= nil, "python3 for execute_code", py or "not found", "apt-get install python3")
  local ok_busted = pcall(require, "busted.runner")
  line(ok_busted, "busted (test suite)", ok_busted and "found" or "not found", "apt-get install lua-busted")
  say("run `sbxlua selftest` to probe the isolating backends for escapes\n")
  return 0
end

-- selftest: lua/sbx/selftest.lua
function M.selftest(args) return require("sbx.selftest").main(args, parse) end

-- route, usage, policy: lua/sbx/commands_routing.lua
for _, name in ipairs{ "route", "usage", "policy" } do
  M[name] = function(args) return require("sbx.commands_routing")[name](args, parse) end
end

return M
