--- Sandbox objects: the methods of API.md over a provider's primitives.
local loop = require "sbx.loop"
local errors = require "sbx.core.errors"
local owner = require "sbx.state.owner"
local check = require "sbx.core.check"
local process = require "sbx.sandbox.process"

local M = {}

local Sandbox = {}
Sandbox.__index = Sandbox
Sandbox.__close = function(sb) sb:destroy() end
Sandbox.__tostring = function(sb)
  return string.format("Sandbox(%s, %s%s)", sb.backend, sb.id, sb._h and "" or ", destroyed")
end
M.Sandbox = Sandbox

local DEFAULT_PATH = require("sbx.providers.builtin.host").DEFAULT_PATH
M.DEFAULT_PATH = DEFAULT_PATH
local MAX_OUTPUT = 1024 * 1024

local function live(sb, op)
  if not sb._h then
    errors.raise("SandboxNotFoundError", "sandbox " .. sb.id .. " was destroyed",
                 { backend = sb.backend, op = op })
  end
  return sb._h
end

-- The environment of every command: defaults, env_vars, then opts.env.
-- Never anything from sbxlua's own environment. Without opts.env it is the
-- same list for every command of the sandbox: made once (providers only
-- read req.env), as sb._envlist.
local function environment(sb, extra)
  if extra == nil and sb._envlist then return sb._envlist end
  local env = { PATH = DEFAULT_PATH, HOME = sb._p.home(sb._h) }
  for k, v in pairs(sb._env) do env[k] = v end
  for k, v in pairs(extra or {}) do env[k] = v end
  local list = {}
  for k, v in pairs(env) do list[#list + 1] = k .. "=" .. v end
  table.sort(list)
  if extra == nil then sb._envlist = list end
  return list
end

local COMMAND_OPTS = { timeout = "number", cwd = "string", env = "map", stdin = "string",
                       max_output_bytes = "number", on_stdout = "function",
                       on_stderr = "function", check = "boolean" }

local NO_OPTS = {}        -- (read only)
local MAX_OUTPUT_RANGE = { integer = true, min = 0, max = 1 << 48 }

local function request(sb, argv, opts, op)
  opts = opts == nil and NO_OPTS or check.options(opts, COMMAND_OPTS, op)
  local timeout = check.seconds(opts.timeout or sb._command_timeout, op, "timeout")
  local max = opts.max_output_bytes == nil and MAX_OUTPUT
              or check.number(opts.max_output_bytes, op, "max_output_bytes", MAX_OUTPUT_RANGE)
  return {
    argv = argv, env = environment(sb, opts.env and check.env(opts.env, op, "env")), cwd = opts.cwd, stdin = opts.stdin,
    timeout = timeout, max_output = max,
    stream = (opts.on_stdout or opts.on_stderr) and true or false,
  }, opts
end

local function run(sb, argv, opts, op)
  local h = live(sb, op)
  local req
  req, opts = request(sb, argv, opts, op)
  local p <close> = sb._p.spawn(h, req)
  if req.stream then process.pump(p, opts) end
  local r = p:wait()
  if opts.check then return process.checked(sb.backend, r, argv, op) end
  return r
end

---Run a command: with `args` (a list) the exact argv, without it `sh -c cmd`.
---@return table result stdout, stderr, exit_code, signal, timed_out, truncated, duration_ms
function Sandbox:execute_command(cmd, args, opts)
  if type(cmd) ~= "string" or cmd == "" then
    check.bad("execute_command", "the command must be a non-empty string")
  end
  local argv
  if args == nil then
    argv = { "sh", "-c", cmd }
  else
    argv = { cmd }
    for i, a in ipairs(check.list(args, "execute_command", "args")) do argv[i + 1] = a end
  end
  return run(self, argv, opts, "execute_command")
end

-- interpreter, file suffix, flag that takes the code as an argument
local INTERPRETERS = {
  python = { "python3", ".py", "-c" }, python3 = { "python3", ".py", "-c" },
  node = { "node", ".js", "-e" }, javascript = { "node", ".js", "-e" },
  bash = { "bash", ".sh", "-c" }, sh = { "sh", ".sh", "-c" }, ruby = { "ruby", ".rb", "-e" },
  perl = { "perl", ".pl", "-e" }, lua = { "lua5.4", ".lua", "-e" }, php = { "php", ".php", "-r" },
}
-- Code up to this size goes as an argument (one argument may hold 128 KiB);
-- larger code is written to a file in the sandbox first.
local INLINE_MAX = 64 * 1024

local code_seq = 0

---Run `code` with an interpreter on the sandbox's PATH (opts.language, default "python").
function Sandbox:execute_code(code, opts)
  if type(code) ~= "string" then check.bad("execute_code", "code must be a string") end
  opts = opts or {}
  if type(opts) ~= "table" then check.bad("execute_code", "options must be a table") end
  local lang = opts.language or "python"
  if type(lang) ~= "string" or not lang:match("^[%w_%.%+%-]+$") then
    check.bad("execute_code", "language must be an interpreter name like \"python\" or \"node\"")
  end
  local interp = INTERPRETERS[lang] or { lang, "" }
  local rest = {}
  for k, v in pairs(opts) do if k ~= "language" then rest[k] = v end end
  local argv, file
  if interp[3] and #code <= INLINE_MAX and not code:find("\0", 1, true) then
    argv = { interp[1], interp[3], code }
  else
    code_seq = code_seq + 1
    file = string.format(".sbx-code-%d-%d%s", require("sbx.proc").getpid(), code_seq, interp[2])
    self:write_file(file, code)
    argv = { interp[1], file }
  end
  local ok, r = pcall(run, self, argv, rest, "execute_code")
  if file then pcall(self.remove, self, file) end
  if not ok then
    if errors.is(r, "SandboxExecutionError") and r.errno == "ENOENT" and not errors.is(r, "CommandFailedError") then
      errors.raise("SandboxExecutionError", string.format(
        "execute_code: no %s interpreter (%s) on the sandbox's PATH", lang, interp[1]),
        { backend = self.backend, op = "execute_code", errno = "ENOENT", cause = r })
    end
    error(r, 0)
  end
  return r
end

-- --------------------------------------------------------- background

---Start a background process; its stdin stays open until p:close_stdin().
function Sandbox:spawn(cmd, args, opts)
  if type(cmd) ~= "string" or cmd == "" then check.bad("spawn", "the command must be a non-empty string") end
  local argv = args == nil and { "sh", "-c", cmd } or { cmd }
  if args ~= nil then
    for i, a in ipairs(check.list(args, "spawn", "args")) do argv[i + 1] = a end
  end
  local h = live(self, "spawn")
  local o = opts or {}
  local req
  req, o = request(self, argv, o, "spawn")
  if not (opts and opts.timeout) then req.timeout = nil end
  req.keep_stdin = o.stdin == nil
  req.want_pid = true
  local p = self._p.spawn(h, req)
  local bp = process.new(p, { backend = self.backend, opts = o, stream = req.stream, check = o.check and argv,
                              done = function(x) self._procs[x] = nil end })
  self._procs[bp] = true
  return bp
end

-- -------------------------------------------------------------- files

local function path_arg(op, path)
  if type(path) ~= "string" then check.bad(op, "path must be a string, got " .. type(path)) end
  if path:find("\0", 1, true) then
    errors.raise("PathError", op .. ": path contains a NUL byte", { op = op })
  end
  return path
end

function Sandbox:write_file(path, data)
  path_arg("write_file", path)
  if type(data) ~= "string" then check.bad("write_file", "data must be a string, got " .. type(data)) end
  self._p.write_file(live(self, "write_file"), path, data)
end

function Sandbox:read_file(path, opts)
  path_arg("read_file", path)
  local max = check.options(opts, { max_bytes = "number" }, "read_file").max_bytes
  if max ~= nil then max = check.number(max, "read_file", "max_bytes", { integer = true, min = 0, max = 1 << 48 }) end
  return self._p.read_file(live(self, "read_file"), path, max)
end

-- The directory the file API resolves relative paths against: the working
-- directory, or "/" where the file API's root is the working directory (local).
local function file_base(sb)
  return sb._p.rooted_at_workdir and "/" or sb.workdir
end

---Entries of a directory, sorted by name; each `path` is absolute in the sandbox.
function Sandbox:list_files(path)
  path = path_arg("list_files", path or ".")
  local list = self._p.list_files(live(self, "list_files"), path)
  local dir = require("sbx.core.paths").resolve(file_base(self), path, "list_files")
  local prefix = dir == "/" and "/" or dir .. "/"
  for _, e in ipairs(list) do e.path = prefix .. e.name end
  return list
end

---The path a command in the sandbox sees for file-API path `path`: the same
---on backends with a filesystem of their own; on local, the host path.
function Sandbox:_command_path(path)
  local abs = require("sbx.core.paths").resolve(file_base(self), path, "path")
  if self._p.rooted_at_workdir then return abs == "/" and self.workdir or self.workdir .. abs end
  return abs
end

function Sandbox:remove(path, opts)
  path_arg("remove", path)
  self._p.remove(live(self, "remove"), path, opts and opts.recursive or false)
end

function Sandbox:mkdir(path)
  path_arg("mkdir", path)
  self._p.mkdir(live(self, "mkdir"), path)
end

---Copy a host file in, keeping its permission bits (setuid/setgid/sticky dropped).
function Sandbox:upload_file(local_path, sandbox_path)
  path_arg("upload_file", sandbox_path)
  check.string(local_path, "upload_file", "local_path")
  local fs = require "sbx.fs"
  local st, serr, scode = fs.stat_host(local_path)
  if not st then
    errors.raise(scode == "ENOENT" and "FileNotFoundError" or "PathError", "upload_file: " .. serr,
                 { op = "upload_file", code = scode, context = { path = local_path } })
  end
  if st.type ~= "file" then
    errors.raise("PathError", "upload_file: " .. local_path .. " is not a regular file (" .. st.type .. ")",
                 { op = "upload_file", context = { path = local_path } })
  end
  local data, rerr, rcode = fs.read_host(local_path)
  if not data then errors.core("upload_file: " .. rerr, rcode, self.backend, "upload_file") end
  self._p.write_file(live(self, "upload_file"), sandbox_path, data, st.mode & tonumber("777", 8))
end

function Sandbox:download_file(sandbox_path, local_path)
  local data = self:read_file(sandbox_path)
  local f, err = io.open(check.string(local_path, "download_file", "local_path"), "wb")
  if not f then errors.raise("PathError", "download_file: " .. err, { op = "download_file" }) end
  f:write(data)
  f:close()
end

---Copy a host directory into the sandbox (modes kept, symlinks not
---followed). Returns { files =, dirs =, skipped = { paths... } }.
function Sandbox:upload_dir(local_dir, sandbox_dir)
  check.string(local_dir, "upload_dir", "local_dir")
  path_arg("upload_dir", sandbox_dir)
  local h = live(self, "upload_dir")
  local transfer = require "sbx.core.transfer"
  local entries, skipped, src = transfer.read_host_tree(local_dir)
  local ok, err = pcall(self._p.put_tree, h, sandbox_dir, entries)
  src:close()
  if not ok then error(err, 0) end
  local files = 0
  for _, e in ipairs(entries) do if e.type == "file" then files = files + 1 end end
  return { files = files, dirs = #entries - files, skipped = skipped }
end

---Copy a sandbox directory to the host; hostile entries (.., absolute
---paths, links out) raise PathError before anything is written.
function Sandbox:download_dir(sandbox_dir, local_dir)
  path_arg("download_dir", sandbox_dir)
  check.string(local_dir, "download_dir", "local_dir")
  local h = live(self, "download_dir")
  local entries, rejected, stream = self._p.get_tree(h, sandbox_dir)
  local ok, skipped = pcall(require("sbx.core.transfer").write_host_tree, local_dir, entries, rejected, stream)
  if stream and stream.close then stream.close() end
  if not ok then error(skipped, 0) end
  local files = 0
  for _, e in ipairs(entries) do if e.type == "file" then files = files + 1 end end
  return { files = files, skipped = skipped }
end

---Materialize workspace entries (API.md "Workspace") into this sandbox, in
---order; returns how many. Bad entries: ConfigError before anything is
---written; a failure while materializing: WorkspaceError (context.dest).
function Sandbox:apply_workspace(entries)
  live(self, "apply_workspace")
  local workspace = require "sbx.sandbox.workspace"
  return workspace.apply(self, workspace.validate(entries, "apply_workspace"))
end

-- -------------------------------------------------------------- agents

---Bind an agent spec (sbx.agent.inside/external) to this sandbox.
function Sandbox:agent(spec)
  live(self, "agent")
  local agent = require "sbx.agents"
  if spec == nil or type(spec) == "string" then
    local preset = spec and require("sbx.sandbox.presets").get(spec) or self._preset
    if not (preset and preset.agent) then
      check.bad("agent", (spec and ("preset '" .. spec .. "'") or "this sandbox's preset")
        .. " has no agent spec; pass sbx.agent.inside{...} or sbx.agent.external{...}")
    end
    spec = preset.agent
  end
  return agent.bind(self, spec)
end

---The capability-limited context an external agent gets: { capabilities = {...} }.
function Sandbox:agent_tools(opts)
  live(self, "agent_tools")
  opts = check.options(opts, { capabilities = "list" }, "agent_tools")
  return require("sbx.agents").tools(self, opts.capabilities or {})
end

-- ---------------------------------------------------- state, lifetime

function Sandbox:snapshot()
  local h = live(self, "snapshot")
  if not self._p.snapshot then
    errors.raise("FeatureNotSupportedError", self.backend .. " cannot take snapshots",
                 { backend = self.backend, op = "snapshot" })
  end
  -- Journaled on both sides: an image a killed sbxlua never heard back
  -- about is found by gc (started, not done) and removed.
  if self._journaled then
    local ok, err = owner.record{ event = "snapshot", id = self.id, backend = self.backend }
    if not ok then
      errors.raise("SandboxExecutionError", "cannot journal the snapshot: " .. tostring(err),
                   { backend = self.backend, op = "snapshot" })
    end
  end
  local res = self._p.snapshot(h)
  if self._journaled then
    owner.record{ event = "snapshot_done", id = self.id, snapshot_id = res.snapshot_id }
  end
  return res
end

local function table_copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

---A plain, JSON-safe table that sbx.resume() turns back into this sandbox
---(a copy: changing it changes nothing of the sandbox).
function Sandbox:session_state()
  local h = live(self, "session_state")
  return { version = 1, backend = self.backend, id = self.id, workdir = self.workdir,
           env_vars = table_copy(self._env), command_timeout_secs = self._command_timeout,
           state = self._p.session_state(h) }
end

function Sandbox:is_alive()
  return self._h ~= nil and self._p.is_alive(self._h)
end

---Destroy the sandbox; a second call is a no-op.
function Sandbox:destroy()
  local h = self._h
  if not h then return end
  self._h = nil
  for p in pairs(self._procs) do process.close(p) end
  if self._ttl then self._ttl:cancel() end
  owner.remove(self.id)
  if self._on_destroy then pcall(self._on_destroy, self) end   -- a warm pool's bookkeeping
  local ok, err = pcall(self._p.destroy, h)
  if not ok then        -- something of it may be left: the journal stays for gc
    owner.keep_journal()
    error(err, 0)
  end
  if self._journaled then owner.record{ event = "destroy", id = self.id } end
end

---Wrap a provider handle. fields: id, backend, provider, handle, env,
---command_timeout, journaled, preset (the preset it was made from: sb:agent()).
function M.new(f)
  local sb = setmetatable({
    id = f.id, backend = f.backend, workdir = f.provider.home(f.handle),
    _p = f.provider, _h = f.handle, _env = f.env or {}, _procs = setmetatable({}, { __mode = "k" }),
    _command_timeout = f.command_timeout or 600, _journaled = f.journaled, _preset = f.preset,
  }, Sandbox)
  return sb
end

---Has `sb` not been destroyed yet? (No question to the provider: see is_alive.)
function M.live(sb) return sb._h ~= nil end

---fn(sb) runs when `sb` is destroyed, before the provider's destroy (a warm
---pool's bookkeeping); one hook per sandbox.
function M.on_destroy(sb, fn) sb._on_destroy = fn end

---Destroy at the end of the sandbox's lifetime (its TTL), `secs` from now;
---a lifetime set before is replaced.
function M.expire_after(sb, secs)
  if sb._ttl then sb._ttl:cancel() end
  sb._ttl = loop.spawn(function()
    loop.sleep(secs)
    sb:destroy()
  end)
end

return M
