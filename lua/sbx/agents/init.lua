--- Agents: an agent CLI run inside a sandbox (sbx.agent.inside), or a Lua
--- runner outside it that works through a capability-limited context
--- (sbx.agent.external, sb:agent_tools). The context never exposes the
--- sandbox itself: only the granted operations, as closures.
local errors = require "sbx.core.errors"
local check = require "sbx.core.check"
local difftool = require "sbx.sandbox.diff"

local M = {}

local MODES = { argv = true, stdin = true, file = true, none = true }
-- As the peer: the prompt goes on stdin unless the spec says otherwise
-- (any size, nothing in argv or in the process list).
M.DEFAULT_INPUT_MODE = "stdin"
local CAPS = { shell = { "shell" }, files = { "list_files", "read_file", "write_file" },
               patch = { "patch" } }
local ARG_MAX = 128 * 1024     -- the kernel's limit for one argument

local Spec = {}
Spec.__index = Spec

---An agent CLI that runs inside the sandbox.
---@param t table name, command (list), cwd, env, input_mode (default "stdin"), input_path, timeout
function M.inside(t)
  t = check.options(t, { name = "string", command = "list", cwd = "string", env = "map",
                         input_mode = "string", input_path = "string", timeout = "number" }, "agent.inside")
  if not t.name then check.bad("agent.inside", "name is required") end
  local command = check.list(t.command or {}, "agent.inside", "command")
  if #command == 0 then check.bad("agent.inside", "command must name the agent CLI, e.g. {\"codex\", \"exec\"}") end
  local mode = t.input_mode or M.DEFAULT_INPUT_MODE
  if not MODES[mode] then
    check.bad("agent.inside", "input_mode must be \"argv\", \"stdin\", \"file\" or \"none\", got \"" .. mode .. "\"")
  end
  return setmetatable({ kind = "inside", name = t.name, command = command, cwd = t.cwd,
                        env = check.env(t.env, "agent.inside", "env"), input_mode = mode,
                        input_path = t.input_path or ".sbx-prompt.txt", timeout = t.timeout }, Spec)
end

---An agent whose runner(ctx, prompt) runs outside the sandbox.
---@param t table name, capabilities (list of "shell", "files", "patch"), runner
function M.external(t)
  t = check.options(t, { name = "string", capabilities = "list", runner = "function" }, "agent.external")
  if not t.name then check.bad("agent.external", "name is required") end
  if not t.runner then check.bad("agent.external", "runner = function(ctx, prompt) ... end is required") end
  local caps = check.list(t.capabilities or {}, "agent.external", "capabilities")
  for _, c in ipairs(caps) do
    if not CAPS[c] then check.bad("agent.external", "unknown capability '" .. c .. "' (shell, files, patch)") end
  end
  return setmetatable({ kind = "external", name = t.name, capabilities = caps, runner = t.runner }, Spec)
end

function M.is_spec(x) return getmetatable(x) == Spec end

---The capability-limited context over `sb`.
function M.tools(sb, caps)
  local granted = {}
  for _, c in ipairs(check.list(caps or {}, "agent_tools", "capabilities")) do
    if not CAPS[c] then check.bad("agent_tools", "unknown capability '" .. c .. "' (shell, files, patch)") end
    for _, m in ipairs(CAPS[c]) do granted[m] = true end
  end
  local ops = {
    shell = function(_, cmd, args, opts) return sb:execute_command(cmd, args, opts) end,
    list_files = function(_, path) return sb:list_files(path) end,
    read_file = function(_, path) return sb:read_file(path) end,
    write_file = function(_, path, data) return sb:write_file(path, data) end,
    patch = function(_, diff, opts) return difftool.apply(sb, diff, opts) end,
  }
  return setmetatable({}, {
    __index = function(_, k)
      if granted[k] then return ops[k] end
      return function()
        errors.raise("FeatureNotSupportedError", "this agent was not granted '" .. tostring(k)
          .. "' (granted: " .. table.concat((function()
            local l = {}
            for g in pairs(granted) do l[#l + 1] = g end
            table.sort(l)
            return l
          end)(), ", ") .. ")", { op = tostring(k) })
      end
    end,
    __newindex = function() check.bad("agent_tools", "the context is read-only") end,
    __metatable = false,
  })
end

local Agent = {}
Agent.__index = Agent

---Bind a spec to a sandbox.
function M.bind(sb, spec)
  if not M.is_spec(spec) then check.bad("agent", "expected sbx.agent.inside{...} or sbx.agent.external{...}") end
  return setmetatable({ name = spec.name, _sb = sb, _spec = spec }, Agent)
end

---Run the agent on a prompt: a command result (inside) or the runner's value.
function Agent:run(prompt)
  if type(prompt) ~= "string" then check.bad("agent.run", "the prompt must be a string") end
  local s, sb = self._spec, self._sb
  if s.kind == "external" then return s.runner(M.tools(sb, s.capabilities), prompt) end
  local args = { table.unpack(s.command, 2) }
  local opts = { cwd = s.cwd, env = s.env, timeout = s.timeout }
  if s.input_mode == "argv" then
    if #prompt >= ARG_MAX or prompt:find("\0", 1, true) then
      check.bad("agent.run", string.format("a prompt of %d bytes cannot go through argv (one argument "
        .. "holds under 128 KiB, and no NUL); use input_mode = \"file\" or \"stdin\"", #prompt))
    end
    args[#args + 1] = prompt
  elseif s.input_mode == "stdin" then
    opts.stdin = prompt
  elseif s.input_mode == "file" then
    local path = s.input_path
    if s.cwd and path:sub(1, 1) ~= "/" then path = s.cwd:gsub("/+$", "") .. "/" .. path end
    sb:write_file(path, prompt)
    -- the absolute path the agent can open (on local, the host path inside
    -- the sandbox directory: its commands see host paths)
    args[#args + 1] = sb:_command_path(path)
  end
  return sb:execute_command(s.command[1], args, opts)
end

return M
