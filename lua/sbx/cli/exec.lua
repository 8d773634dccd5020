--- sbxlua exec [OPTIONS] -- CMD [ARGS...]: one sandbox, one command, its
--- output streamed, the sandbox destroyed (API.md, "Running").
local sbx = require "sbx"
local errors = require "sbx.core.errors"
local proc = require "sbx.proc"
local loop = require "sbx.loop"
local request = require "sbx.cli.request"

local M = {}

local function complain(...) io.stderr:write("sbxlua: exec: ", ...) io.stderr:write("\n") end
local function usage(...)
  complain(...)
  return 2
end

local SIGNUM = { SIGHUP = 1, SIGINT = 2, SIGQUIT = 3, SIGILL = 4, SIGABRT = 6, SIGFPE = 8,
                 SIGKILL = 9, SIGSEGV = 11, SIGPIPE = 13, SIGALRM = 14, SIGTERM = 15 }

-- --env K=V, or --env K: the value from sbxlua's own environment (so it
-- need not be in sbxlua's argv, where `ps` shows it).
local function env_vars(list)
  local out = {}
  for _, kv in ipairs(list or {}) do
    local k, v = kv:match("^([^=]*)=(.*)$")
    k = k or kv
    if not k:match("^[%a_][%w_]*$") then
      return nil, "--env expects K=V or K (a variable name), got '" .. kv .. "'"
    end
    if not v then
      v = os.getenv(k)
      if v == nil then
        return nil, "--env " .. k .. ": " .. k .. " is not set in sbxlua's environment (set it, or pass --env "
                    .. k .. "=VALUE)"
      end
    end
    out[k] = v
  end
  return out
end

-- --file LOCAL:REMOTE, each local file readable before anything is created.
local function files(list)
  local out = {}
  for _, spec in ipairs(list or {}) do
    local from, to = spec:match("^(.-):(.+)$")
    if not from or from == "" then return nil, "--file expects LOCAL:REMOTE, got '" .. spec .. "'" end
    local f, err = io.open(from, "rb")
    if not f then return nil, "--file " .. spec .. ": cannot read " .. tostring(err) end
    f:close()
    out[#out + 1] = { from, to }
  end
  return out
end

-- sbxlua's stdin, read by a host `cat` of /proc/<sbxlua>/fd/0 whose output
-- the loop reads in chunks (sbxlua never blocks on its own fd 0); each chunk
-- goes to the command before the next is read, so nothing piles up.
local function stdin_reader()
  return proc.spawn{ argv = { "cat", "/proc/" .. proc.getpid() .. "/fd/0" },
                     env = { "PATH=/usr/bin:/bin" }, stream = true, max_output = 0 }
end

local function feed_stdin(p, reader)
  pcall(function()
    while reader do
      local which, chunk = reader:read()
      if not which then break end
      if which == "stdout" then p:write(chunk)
      else io.stderr:write("sbxlua: exec -i: ", chunk) end
    end
  end)
  pcall(p.close_stdin, p)
end

local function stream_out(c) io.stdout:write(c) io.stdout:flush() end
local function stream_err(c) io.stderr:write(c) io.stderr:flush() end

local function run(sb, rest, o, timeout)
  local cmd_args = #rest > 1 and { table.unpack(rest, 2) } or nil
  if o.json then
    return sb:execute_command(rest[1], cmd_args, { timeout = timeout })
  end
  -- Everything is streamed as it comes: no copy is kept (max_output_bytes 0).
  local copts = { timeout = timeout, max_output_bytes = 0, on_stdout = stream_out, on_stderr = stream_err }
  if not o.interactive then return sb:execute_command(rest[1], cmd_args, copts) end
  copts.timeout = timeout or 600
  local p = sb:spawn(rest[1], cmd_args, copts)
  -- closed (its cat killed) however this ends: the command's exit, an
  -- error, a signal cancelling the job
  local reader <close> = stdin_reader()
  local feeder = loop.spawn(feed_stdin, p, reader)
  local r = p:wait()
  feeder:cancel()
  feeder:join()
  return r
end

---sbxlua exec: the command's exit status (124 timeout, 127 not found, 126 not runnable).
function M.exec(o, rest)
  if #rest == 0 then return usage("no command given (sbxlua exec [OPTIONS] -- CMD [ARGS...])") end
  local opts, err = request.options(o)
  if not opts then return usage(err) end
  if o.json and o.interactive then return usage("--json and --interactive do not go together") end
  local env
  env, err = env_vars(o.env)
  if not env then return usage(err) end
  opts.env_vars = env
  local uploads
  uploads, err = files(o.file)
  if not uploads then return usage(err) end
  local timeout
  timeout, err = request.seconds(o, "timeout")
  if not timeout then return usage(err) end
  timeout = o.timeout and timeout or nil
  local sb <close> = sbx.sandbox(opts)
  for _, f in ipairs(uploads) do sb:upload_file(f[1], f[2]) end
  local ok, r = pcall(run, sb, rest, o, timeout)
  if not ok then
    -- the command itself is missing or cannot run: one line, docker's codes
    if errors.is(r, "SandboxExecutionError") and (r.errno == "ENOENT" or r.errno == "EACCES") then
      local missing = r.errno == "ENOENT"
      complain(rest[1], missing and ": command not found in the sandbox (" or ": cannot run it (",
               r.message, ")")
      return missing and 127 or 126
    end
    error(r, 0)
  end
  if o.json then
    local null = sbx.json.null   -- every key, always: one shape
    io.stdout:write(sbx.json.encode{ stdout = r.stdout, stderr = r.stderr, exit_code = r.exit_code or null,
      signal = r.signal or null, timed_out = r.timed_out, truncated = r.truncated, duration_ms = r.duration_ms,
      backend = sb.backend, id = sb.id }, "\n")
  end
  if r.timed_out then
    complain("the command timed out after ", tostring(timeout or 600), " s; its process tree was killed")
    return 124
  end
  if o.json and r.truncated then complain("output beyond 1 MiB per stream was dropped from the result") end
  if r.signal then return 128 + (SIGNUM[r.signal] or 0) end
  return r.exit_code or 1
end

return M
