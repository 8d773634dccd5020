--- The command line as data: every subcommand, its arguments, options and
--- help, and the environment sbxlua reads. The option parser, `sbxlua
--- --help`, `sbxlua COMMAND --help`, docs/api.md's spec and a man page all
--- come from this one table (API.md, "Running").
local M = {}

-- An option: { name, kind, metavar, help, short = "-x" }. kind: "bool",
-- "value" (the last one wins) or "list" (repeatable; `split` also splits
-- each value on commas).
local function opt(name, kind, metavar, help, extra)
  local o = { name = name, kind = kind, metavar = metavar, help = help }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

-- Options that shape a request (exec creates a sandbox, route only plans one).
local function request_opts(extra, pinned)
  local list = {
    opt("policy", "value", "P", "routing policy: a name or a file"),
    opt("need", "list", "CAP", "a capability the backend must have (repeatable, or CAP,CAP)", { split = true }),
    opt("only", "list", "B", "route only to these backends (repeatable, or B,B)", { split = true }),
    opt("ignore", "list", "B", "never route to these backends (repeatable, or B,B)", { split = true }),
    opt("isolation", "value", "I", "minimum isolation: process, namespace, container, gvisor, microvm"),
    opt("max-price", "value", "USD", "skip backends above this price per sandbox-hour"),
    opt("region", "value", "R", "the region, where a backend has regions"),
    opt("preset", "value", "NAME", "a preset (sbxlua -e 'for n in pairs(sbx.presets()) do print(n) end')"),
    opt("image", "value", "I", "container image (docker)"),
    opt("cpu", "value", "N", "vCPUs (> 0)"),
    opt("memory-mb", "value", "N", "memory limit in MiB (> 0)"),
    opt("no-internet", "bool", nil, "allow_internet = false (backends that cannot enforce it are skipped)"),
  }
  if pinned then
    table.insert(list, 1, opt("backend", "value", "B", "pin the backend (local, bwrap, docker, ...); no routing"))
  end
  for _, o in ipairs(extra) do list[#list + 1] = o end
  return list
end

local JSON = opt("json", "bool", nil, "print JSON instead of text")

---The subcommands in help order. Each: name, args (synopsis of the
---positional arguments), max_args (nil: any), summary, options, notes.
M.COMMANDS = {
  { name = "exec", args = "-- CMD [ARGS...]", summary =
    "create a sandbox, run one command in it, stream its output, destroy it",
    stop_at_positional = true,
    options = request_opts({
      opt("timeout", "value", "S", "kill the command's process tree after S seconds (default 600); exit 124"),
      opt("env", "list", "K=V|K", "set K in the command's environment; a bare K takes its value from "
          .. "sbxlua's own environment (so the value is not in sbxlua's argv)"),
      opt("file", "list", "LOCAL:REMOTE", "upload a host file before the command runs (repeatable)"),
      opt("interactive", "bool", nil, "pass sbxlua's stdin to the command, streamed (as docker run -i)",
          { short = "i" }),
      opt("json", "bool", nil, "print the result table (stdout, stderr, exit_code, ...) instead of streaming"),
    }, true),
    notes = {
      "The exit status is the command's: 128+N when a signal killed it, 124 (and a message) on",
      "timeout, 127 when the command does not exist in the sandbox, 126 when it cannot be run.",
      "One lone CMD runs through sh -c; CMD ARGS... is the exact argv. The first argument",
      "that is not an option starts the command, so `--` is only needed before a CMD",
      "that starts with '-'. The host environment is never inherited: pass --env.",
    } },
  { name = "providers", max_args = 0, summary =
    "every provider: available? why not? capabilities, isolation, price",
    options = { opt("json", "bool", nil, "one object: name -> descriptor (capabilities and regions are lists)"),
                opt("matrix", "bool", nil, "the README's capability table (markdown)") } },
  { name = "route", max_args = 0, summary = "dry-run routing: the order of backends and why",
    options = request_opts{
      opt("timeout", "value", "S", "the sandbox's lifetime (timeout_secs), for the projected cost"),
      opt("explain", "bool", nil, "one line per backend: kept (rank, price, stats) or skipped (why)"),
      JSON,
    },
    notes = { "Exit status 1 when no backend can take the request." } },
  { name = "ls", max_args = 0, summary = "live sandboxes this host owns, all backends",
    options = { opt("json", "bool", nil, "a JSON array of sandboxes ([] when there are none)") } },
  { name = "gc", max_args = 0, summary = "destroy leftovers of dead sbxlua sessions (crash, SIGKILL)",
    options = { opt("all-sessions", "bool", nil, "also dead sessions other hosts recorded in a shared state directory"),
                opt("dry-run", "bool", nil, "say what would be destroyed; destroy nothing") } },
  { name = "usage", max_args = 0, summary = "spend from the ledger",
    options = { opt("since", "value", "T", "24h, 30m, 7d, 90s, an epoch or YYYY-MM-DD"),
                opt("by", "value", "KEY", "provider (default), label or job"),
                opt("format", "value", "F", "table (default; on a terminal with a chart of spend per UTC day), "
                    .. "json or csv"),
                opt("json", "bool", nil, "the same as --format json") } },
  { name = "policy", args = "check FILE | list", min_args = 1, max_args = 2, summary =
    "check: load and self-check a policy file without using it; list: built-ins and the search path",
    options = {} },
  { name = "provider", args = "check FILE | list", min_args = 1, max_args = 2, summary =
    "check: load a provider script and check it against the provider contract; list: what is found where",
    options = {},
    notes = { "check exits 1 and prints one file:line: problem per line when the script breaks the",
              "contract (docs/providers.md); list shows the search path and every provider on it." } },
  { name = "doctor", max_args = 0, summary = "what works on this machine and what is missing, with fixes",
    options = {} },
  { name = "selftest", max_args = 0, summary = "escape probes inside each available isolating backend",
    options = { opt("backend", "value", "B", "probe only this backend"),
                opt("image", "value", "I", "docker: the image to probe in (default: the configured image)"),
                JSON } },
  { name = "dashboard", max_args = 0, summary =
    "a local web page: live sandboxes, spend over time, routing decisions, provider health",
    options = { opt("listen", "value", "ADDR", "PORT, IPV4:PORT or IPV4 (default 127.0.0.1 and a free port)"),
                opt("allow-actions", "bool", nil, "allow gc from the page, with the token printed at start") } },
  { name = "version", max_args = 0, summary = "print the version", options = {} },
}

M.by_name = {}
for _, c in ipairs(M.COMMANDS) do M.by_name[c.name] = c end

---Options before the command.
M.GLOBAL = {
  opt("config", "value", "FILE", "the configuration file, instead of $SBX_CONFIG, ./sbx.yaml, "
      .. "$XDG_CONFIG_HOME/sbxlua/config.yaml"),
  opt("help", "bool", nil, "this text; `sbxlua COMMAND --help` for one command", { short = "h" }),
  opt("version", "bool", nil, "the version"),
  opt("progress", "value", "MODE", "auto (a live line on a terminal), tty, plain (one line per stage) or off"),
}

---The environment sbxlua reads: { name, help }.
M.ENV = {
  { "SBX_CONFIG", "the configuration file (after --config)" },
  { "SBX_STATE_DIR", "journal, local sandboxes, ledger, decision log (else $XDG_STATE_HOME/sbxlua, "
    .. "~/.local/state/sbxlua)" },
  { "SBX_POLICY_PATH", "directories searched for policy files first (colon-separated)" },
  { "SBX_PRESET_PATH", "directories searched for preset files first (colon-separated)" },
  { "SBX_PROVIDER_PATH", "directories searched for provider scripts first (colon-separated)" },
  { "DOCKER_HOST", "the Docker engine: unix:///path or tcp://host:port (default unix:///var/run/docker.sock)" },
  { "SBX_DOCKER_IMAGE", "docker's default image when neither the request nor sbx.yaml names one" },
  { "SBX_JOB", "the job name recorded in the ledger (default: the script's path)" },
  { "XDG_CONFIG_HOME", "where $XDG_CONFIG_HOME/sbxlua/config.yaml is looked up (default ~/.config)" },
  { "XDG_STATE_HOME", "the state directory's parent when SBX_STATE_DIR is unset" },
  { "SBX_PROGRESS", "0 or off, auto, plain, tty: as --progress=MODE, which wins" },
  { "SBX_LOOP_BOOST", "nice steps sbxlua's own threads run above its commands where it may (default 5, 0 off)" },
  { "SBX_LUA_PATH", "load lua/ from this source tree instead of the embedded copy (development)" },
}

-- "--name METAVAR" / "-i, --interactive"
local function flag(o)
  local s = (o.short and ("-" .. o.short .. ", ") or "") .. "--" .. o.name
  if o.metavar then s = s .. " " .. o.metavar end
  return s
end
M.flag = flag

local function synopsis(c)
  local s = "sbxlua " .. c.name
  if #c.options > 0 then s = s .. " [OPTIONS]" end
  if c.args then s = s .. " " .. c.args end
  return s
end

M.WIDTH = 100

-- "  NAME  text", the text wrapped at M.WIDTH under itself.
local function columns(out, indent, w, name, text)
  local lead = string.format("%s%-" .. w .. "s  ", indent, name)
  local line = lead
  for word in text:gmatch("%S+") do
    if #line + #word >= M.WIDTH and #line > #lead then
      out[#out + 1] = (line:gsub("%s+$", ""))
      line = string.rep(" ", #lead)
    end
    line = line .. word .. " "
  end
  out[#out + 1] = (line:gsub("%s+$", ""))
end

local function option_lines(out, options, indent)
  local w = 0
  for _, o in ipairs(options) do w = math.max(w, #flag(o)) end
  for _, o in ipairs(options) do columns(out, indent, w, flag(o), o.help) end
end

---The help text: of one command (its synopsis, options, notes), or of
---sbxlua as a whole (every command with every option, the environment).
---@param name? string a subcommand
---@return string|nil text, string|nil err
function M.help_text(name)
  local out = {}
  if name then
    local c = M.by_name[name]
    if not c then return nil, "unknown command '" .. tostring(name) .. "'" end
    out[#out + 1] = "usage: " .. synopsis(c)
    out[#out + 1] = ""
    out[#out + 1] = c.summary
    if #c.options > 0 then
      out[#out + 1] = ""
      out[#out + 1] = "options:"
      option_lines(out, c.options, "  ")
    end
    if c.notes then
      out[#out + 1] = ""
      for _, l in ipairs(c.notes) do out[#out + 1] = l end
    end
    return table.concat(out, "\n") .. "\n"
  end
  out[#out + 1] = "usage: sbxlua [--config FILE] JOB.lua [ARGS...]   run a job script (ARGS in the global `arg`)"
  out[#out + 1] = "       sbxlua [--config FILE] -e 'LUA CODE'      run inline code"
  out[#out + 1] = "       sbxlua [--config FILE] COMMAND [OPTIONS] [ARGS]"
  out[#out + 1] = "       sbxlua --help | --version | COMMAND --help"
  out[#out + 1] = ""
  out[#out + 1] = "commands:"
  for _, c in ipairs(M.COMMANDS) do
    out[#out + 1] = ""
    out[#out + 1] = "  " .. synopsis(c)
    out[#out + 1] = "      " .. c.summary
    option_lines(out, c.options, "      ")
  end
  out[#out + 1] = ""
  out[#out + 1] = "global options (before the command):"
  option_lines(out, M.GLOBAL, "  ")
  out[#out + 1] = ""
  out[#out + 1] = "environment:"
  local w = 0
  for _, e in ipairs(M.ENV) do w = math.max(w, #e[1]) end
  for _, e in ipairs(M.ENV) do columns(out, "  ", w, e[1], e[2]) end
  out[#out + 1] = ""
  out[#out + 1] = "Exit status: 2 for a usage error (unknown option, missing or malformed argument,"
  out[#out + 1] = "unknown name), 1 for a failed job or operation; exec: the command's status."
  return table.concat(out, "\n") .. "\n"
end

-- ------------------------------------------------------------- parsing

---Parse a subcommand's arguments against its table entry.
---Returns opts, positional | nil, message (a usage error). `opts.help` is
---true for -h/--help.
function M.parse(name, args)
  local c = assert(M.by_name[name], name)
  local long, short = { help = { name = "help", kind = "bool" } }, { h = "help" }
  for _, o in ipairs(c.options) do
    long[o.name] = o
    if o.short then short[o.short] = o.name end
  end
  local opts, rest, i = {}, {}, 1
  local function set(o, v)
    if o.kind == "bool" then opts[o.name] = true
    elseif o.kind == "list" then
      opts[o.name] = opts[o.name] or {}
      if o.split then
        for part in v:gmatch("[^,]+") do table.insert(opts[o.name], part) end
      else
        table.insert(opts[o.name], v)
      end
    else opts[o.name] = v end
  end
  while i <= #args do
    local a = args[i]
    if a == "--" then
      for k = i + 1, #args do rest[#rest + 1] = args[k] end
      break
    end
    local nm, inline = a:match("^%-%-([%w%-]+)=(.*)$")
    nm = nm or a:match("^%-%-([%w%-]+)$")
    if not nm and a:match("^%-%w$") then nm = short[a:sub(2)] or a end
    if nm then
      local o = long[nm]
      if not o then
        local known = {}
        for k in pairs(long) do known[k] = true end
        local hint = require("sbx.core.check").suggest(nm:gsub("^%-+", ""), known)
        return nil, name .. ": unknown option " .. (nm:sub(1, 1) == "-" and nm or ("--" .. nm))
                    .. hint .. " (see sbxlua " .. name .. " --help)"
      end
      if o.kind == "bool" then
        if inline ~= nil then return nil, name .. ": --" .. o.name .. " takes no value" end
        set(o, true)
      else
        local v = inline
        if v == nil then
          i = i + 1
          v = args[i]
        end
        if v == nil or v == "" then
          return nil, name .. ": " .. flag(o) .. " needs a value (see sbxlua " .. name .. " --help)"
        end
        set(o, v)
      end
    elseif a:sub(1, 1) == "-" and #a > 1 then
      return nil, name .. ": unknown option " .. a .. " (see sbxlua " .. name .. " --help)"
    else
      rest[#rest + 1] = a
      if c.stop_at_positional then
        for k = i + 1, #args do rest[#rest + 1] = args[k] end
        break
      end
    end
    i = i + 1
  end
  if opts.help then return opts, rest end
  if c.max_args and #rest > c.max_args then
    return nil, name .. ": unexpected argument '" .. rest[c.max_args + 1] .. "' (usage: " .. synopsis(c) .. ")"
  end
  if c.min_args and #rest < c.min_args then
    return nil, name .. ": missing argument (usage: " .. synopsis(c) .. ")"
  end
  return opts, rest
end

return M
