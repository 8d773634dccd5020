--- The sbxlua command line (API.md, "Running").
local loop = require "sbx.loop"

local M = {}

local cli_table = require "sbx.cli.table"

---The help text (of one subcommand, or of sbxlua): lua/sbx/cli/table.lua.
M.help_text = cli_table.help_text

local function die(msg, status)
  io.stderr:write("sbxlua: ", msg, "\n")
  return status or 2
end

-- os.exit inside a job unwinds like an error, so sandboxes are destroyed.
local Exit = {}
Exit.__tostring = function(e) return "os.exit(" .. tostring(e.code) .. ")" end

local function exit_code(code)
  if code == nil or code == true then return 0 end
  if code == false then return 1 end
  return math.tointeger(code) or 1
end

local function install_exit()
  local real = os.exit
  os.exit = function(code) error(setmetatable({ code = exit_code(code) }, Exit), 0) end
  return real
end

-- What to do about a typed error, by kind: the fix, said on the same line.
local FIXES = {
  NoRouteError = "see `sbxlua route --explain` with the same options",
  BackendNotInstalledError = "see `sbxlua doctor`",
  BudgetExceededError = "raise the budget or lower timeout_secs",
  AuthenticationError = "check the provider's credentials (the variable its api_key_env names)",
}

---One line for a typed error that ended a subcommand (never a traceback of
---sbxlua's own code); the status: 2 for a ConfigError (the user's
---arguments or configuration), 1 for a failed operation.
---@return string line, integer status
function M.present(err)
  local errors = require "sbx.core.errors"
  local line = tostring(err):gsub("%s*\n%s*", "; ")
  local fix = FIXES[err.kind]
  if err.kind == "ConfigError" and err.file then
    fix = "fix " .. err.file .. ", or name another file with --config FILE or $SBX_CONFIG"
  end
  if fix then line = line .. " (" .. fix .. ")" end
  return line, errors.is(err, "ConfigError") and 2 or 1
end

local function is_typed(err)
  return type(err) == "table" and getmetatable(err) == require("sbx.core.errors").Error
end

---Run fn as the root task with signals wired to a clean shutdown. A job's
---error prints with its traceback; a subcommand's typed error (`command`)
---prints as one line.
---@return integer status
local function run_root(command, fn, ...)
  require "sbx"            -- typed errors for the C core
  local owner = require "sbx.state.owner"
  local real_exit = install_exit()
  local status
  local root = loop.spawn(fn, ...)
  local function on_signal(sig)
    if status then return end
    status = sig == "SIGINT" and 130 or 143
    owner.shut_down()
    io.stderr:write("sbxlua: ", sig, ": stopping; destroying sandboxes (again to force)\n")
    root:cancel()
  end
  loop.on_signal(on_signal)
  -- A second signal kills the session's process trees from the handler.
  owner.on_session(function(s)
    local base = require("sbx.providers.builtin.host").containment()
    if base then loop.on_signal(on_signal, base .. "/" .. s.id) end
  end)
  loop.run(root)
  local ok, err = root:join()
  if ok and not status then status = math.tointeger(err) end
  if not ok and not status then
    if getmetatable(err) == Exit then
      status = err.code
    elseif command and is_typed(err) then
      local line
      line, status = M.present(err)
      io.stderr:write("sbxlua: ", command, ": ", line, "\n")
    else
      local tb = root:traceback() or ""
      local msg = tostring(err)
      if not tb:find(msg, 1, true) then tb = msg .. "\n" .. tb end
      io.stderr:write("sbxlua: ", tb, "\n")
      status = 1
    end
  end
  owner.destroy_all()
  io.stdout:flush()
  os.exit = real_exit
  return status or 0
end

local function run_chunk(chunk, args)
  _G.sbx = require "sbx"
  return run_root(nil, function() return chunk(table.unpack(args, 1, args.n)) end)
end

local function closest_command(name)
  local known = {}
  for n in pairs(cli_table.by_name) do known[n] = true end
  return require("sbx.core.check").suggest(name, known)
end

local function job(argv, i)
  local path = argv[i]
  local chunk, err = loadfile(path)
  if not chunk then
    -- `sbxlua provders`: a mistyped command, not a missing job file
    local hint = not path:find("[/.]") and closest_command(path) or ""
    if hint ~= "" then
      return die("unknown command '" .. path .. "'" .. hint .. " (see sbxlua --help)", 2)
    end
    return die(err, 1)
  end
  local a = { [0] = path, [-1] = argv[0] }
  for k = i + 1, #argv do a[k - i] = argv[k] end
  _G.arg = a
  local args = table.pack(table.unpack(a, 1, #argv - i))
  return run_chunk(chunk, args)
end

local function inline(argv, i)
  local code = argv[i + 1]
  if not code then return die("-e needs an argument (sbxlua -e 'LUA CODE')") end
  local chunk, err = load(code, "=(command line)")
  if not chunk then return die(err, 1) end
  _G.arg = { [0] = "-e" }
  for k = i + 2, #argv do _G.arg[k - i - 1] = argv[k] end
  return run_chunk(chunk, table.pack())
end

M.commands = {}

local function version()
  io.stdout:write("sbxlua ", require("sbx").version, " (", _VERSION, ")\n")
  return 0
end

function M.main(argv)
  local cfg = argv[1] and argv[1]:match("^%-%-config=(.*)$")
  if argv[1] == "--config" or cfg then
    cfg = cfg or argv[2]
    if not cfg or cfg == "" then return die("--config needs a file (sbxlua --config FILE COMMAND ...)") end
    require("sbx.core.config").set_path(cfg)
    table.remove(argv, 1)
    if argv[1] == cfg then table.remove(argv, 1) end
  end
  local mode = argv[1] and argv[1]:match("^%-%-progress=(.*)$")
  if argv[1] == "--progress" or mode then
    mode = mode or argv[2]
    local ok, err = require("sbx.core.progress").set_mode(mode or "")
    if not ok then return die(err, 2) end
    table.remove(argv, 1)
    if argv[1] == mode then table.remove(argv, 1) end
  end
  local first = argv[1]
  if first == nil then
    io.stderr:write(cli_table.help_text())
    return 2
  end
  if first == "--help" or first == "-h" or first == "help" then
    if argv[2] and first == "help" then
      local text, err = cli_table.help_text(argv[2])
      if not text then return die(err .. closest_command(argv[2]) .. " (see sbxlua --help)") end
      io.stdout:write(text)
      return 0
    end
    io.stdout:write(cli_table.help_text())
    return 0
  end
  if first == "--version" or first == "-v" then return version() end
  if first == "-e" then return inline(argv, 1) end
  local entry = cli_table.by_name[first]
  local cmd = M.commands[first] or (entry and (first == "version" and version or require("sbx.cli.commands")[first]))
  if cmd then
    local rest = {}
    for k = 2, #argv do rest[#rest + 1] = argv[k] end
    local opts, args = rest, nil
    if entry then
      opts, args = cli_table.parse(first, rest)
      if not opts then return die(args, 2) end
      if opts.help then
        io.stdout:write(cli_table.help_text(first))
        return 0
      end
    end
    return run_root(first, function() return cmd(opts, args) end)
  end
  if first:sub(1, 1) == "-" then return die("unknown option " .. first .. " (see sbxlua --help)") end
  return job(argv, 1)
end

return M
