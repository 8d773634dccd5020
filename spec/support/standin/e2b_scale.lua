-- The lightweight sandboxes of the E2B stand-in's --scale mode: no process
-- behind them. A command is answered by the stand-in (echo prints its
-- arguments, false exits 1, anything else exits 0 with no output) and
-- files live in a table, so thousands fit in one stand-in. The object has
-- the methods of an sbx sandbox that e2b_envd.lua calls.
local M = {}

local Box = {}
Box.__index = Box

local Proc = {}
Proc.__index = Proc

local pids = 1000

function Box:spawn(cmd, args, opts)
  -- providers/e2b.lua runs /bin/sh -c WRAP sbx CWD ARGV...: answer ARGV
  if cmd == "/bin/sh" and args[1] == "-c" and args[3] == "sbx" then
    cmd, args = args[5], table.move(args, 6, #args, 1, {})
  end
  pids = pids + 1
  return setmetatable({ pid = pids, cmd = cmd, args = args, opts = opts }, Proc)
end

function Proc:wait()
  local cmd = self.cmd and self.cmd:match("[^/]+$")
  if cmd == "echo" then
    if self.opts.on_stdout then self.opts.on_stdout(table.concat(self.args, " ") .. "\n") end
  elseif cmd == "false" then
    return { exit_code = 1 }
  end
  return { exit_code = 0 }
end
function Proc:kill() end
function Proc:write() return true end
function Proc:close_stdin() end

local function missing(path)
  error({ kind = "FileNotFoundError", message = "no such file: " .. path }, 0)
end

function Box:write_file(path, data) self.files[path] = data end
function Box:read_file(path) return self.files[path] or missing(path) end
function Box:mkdir() end
function Box:remove(path) self.files[path] = nil end
function Box:list_files() return {} end
function Box:execute_command() return { exit_code = 2, stdout = "", stderr = "" } end
function Box:destroy() self.files = {} end

function M.box() return setmetatable({ files = {} }, Box) end

return M
