--- The sbxlua command line (API.md, "Running").
local loop = require "sbx.loop"

local M = {}

local USAGE = [[
usage: sbxlua JOB.lua [ARGS...]        run a job script (ARGS in the global `arg`)
       sbxlua -e 'LUA CODE'            run inline code
       sbxlua exec [OPTIONS] -- CMD [ARGS...]
                                       create a sandbox, run, stream output, destroy;
                                       exit status = the command's; 124 on timeout
          --backend B  --policy P  --image I  --need CAP  --timeout S
          --env K=V  --file LOCAL:REMOTE  --preset NAME
       sbxlua providers [--json|--matrix]   every provider: available? capabilities, price
       sbxlua route [--need CAP] [--only B] [--ignore B] [--isolation I] [--max-price USD]
                    [--region R] [--cpu N] [--memory-mb N] [--policy P] [--explain] [--json]
                                       dry-run routing: the plan and why
       sbxlua usage [--since T] [--by provider|label|job] [--format table|json|csv]
                                       spend from the ledger (a chart per day on a terminal)
       sbxlua policy check FILE | list load + self-check a policy without using it
       sbxlua ls [--json]              live sandboxes this host owns
       sbxlua gc [--all-sessions] [--dry-run]
                                       destroy leftovers of dead sbxlua sessions
       sbxlua doctor                   what works on this machine, and fixes
       sbxlua dashboard [--listen ADDR] [--allow-actions]
                                       a local web page: live sandboxes, spend, routing, health
       sbxlua selftest [--backend B] [--image I] [--json]
                                       escape probes inside each isolating backend
       sbxlua version | --help

options: --config FILE (before the command) instead of $SBX_CONFIG, ./sbx.yaml,
$XDG_CONFIG_HOME/sbxlua/config.yaml
         --progress=auto|tty|plain|off (after --config) live progress on stderr: a line
redrawn in place on a terminal (auto), one line per stage (plain), none (off)

environment: SBX_STATE_DIR (journal, sandboxes, ledger), SBX_CONFIG, SBX_POLICY_PATH,
SBX_LUA_PATH (load lua/ from a source tree instead of the embedded copy),
SBX_PROGRESS (0 or off, auto, plain, tty: as --progress, which wins)
]]

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

---Run fn as the root task with signals wired to a clean shutdown.
---@return integer status
local function run_root(fn, ...)
  require "sbx"            -- typed errors for the C core
  local owner = require "sbx.owner"
  local real_exit = install_exit()
  local status
  local root = loop.spawn(fn, ...)
  local function on_signal(sig)
    if status then return end
    status = sig == "SIGINT" and 130 or 143
    owner.shutting_down = true
    io.stderr:write("sbxlua: ", sig, ": stopping; destroying sandboxes (again to force)\n")
    root:cancel()
  end
  loop.on_signal(on_signal)
  -- A second signal kills the session's process trees from the handler.
  owner.on_session = function(s)
    local base = require("sbx.backends.local").containment()
    if base then loop.on_signal(on_signal, base .. "/" .. s.id) end
  end
  loop.run(root)
  local ok, err = root:join()
  if ok and not status then status = math.tointeger(err) end
  if not ok and not status then
    if getmetatable(err) == Exit then
      status = err.code
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
  return run_root(function() return chunk(table.unpack(args, 1, args.n)) end)
end

local function job(argv, i)
  local path = argv[i]
  local chunk, err = loadfile(path)
  if not chunk then return die(err, 1) end
  local a = { [0] = path, [-1] = argv[0] }
  for k = i + 1, #argv do a[k - i] = argv[k] end
  _G.arg = a
  local args = table.pack(table.unpack(a, 1, #argv - i))
  return run_chunk(chunk, args)
end

local function inline(argv, i)
  local code = argv[i + 1]
  if not code then return die("-e needs an argument") end
  local chunk, err = load(code, "=(command line)")
  if not chunk then return die(err, 1) end
  _G.arg = { [0] = "-e" }
  for k = i + 2, #argv do _G.arg[k - i - 1] = argv[k] end
  return run_chunk(chunk, table.pack())
end

M.commands = {}

function M.main(argv)
  if argv[1] == "--config" then
    if not argv[2] then return die("--config needs a file") end
    require("sbx.config").set_path(argv[2])
    table.remove(argv, 1)
    table.remove(argv, 1)
  end
  local mode = argv[1] and argv[1]:match("^%-%-progress=(.*)$")
  if mode then
    local ok, err = require("sbx.progress").set_mode(mode)
    if not ok then return die(err) end
    table.remove(argv, 1)
  end
  local first = argv[1]
  if first == nil or first == "--help" or first == "-h" or first == "help" then
    io.stdout:write(USAGE)
    return first == nil and 2 or 0
  end
  if first == "version" or first == "--version" or first == "-v" then
    io.stdout:write("sbxlua ", require("sbx").version, " (", _VERSION, ")\n")
    return 0
  end
  if first == "-e" then return inline(argv, 1) end
  local cmd = M.commands[first] or require("sbx.commands")[first]
  if cmd then
    local rest = {}
    for k = 2, #argv do rest[#rest + 1] = argv[k] end
    return run_root(function() return cmd(rest) end)
  end
  if first:sub(1, 1) == "-" then return die("unknown option " .. first .. " (see sbxlua --help)") end
  return job(argv, 1)
end

return M
