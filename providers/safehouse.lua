-- providers/safehouse.lua: Agent Safehouse (eugene1g/agent-safehouse v0.11.1)
-- on macOS. A sandbox is a private host directory, as on `local`; each
-- command runs as
--   safehouse --workdir=DIR --trust-workdir-config=false
--             [--append-profile=DIR/.sbx-deny-network.sb] -- K=V... cmd args
-- so sandbox-exec confines it to a deny-first profile with DIR writable.
-- Its environment is built from scratch: safehouse itself gets only PATH and
-- HOME, the command's variables are the K=V tokens (never --env, which
-- passes the host's whole environment). allow_internet = false appends a
-- profile of `(deny network*)`. Timeouts and tree kill are sbxlua's own (the
-- local backend's process containment). Safehouse has no cpu/memory limits:
-- the descriptor does not list them, so a pinned request with them is a
-- FeatureNotSupportedError. Tests on Linux run spec/support/safehouse, a
-- stand-in, through providers.safehouse.program and allow_non_darwin.
-- docs/safehouse.md says what the stand-in verifies and what needs a Mac.
local L = builtin("local")

local NAME = "safehouse"
local PROFILE = ".sbx-deny-network.sb"
local DENY = ";; sbxlua: this sandbox was created with allow_internet = false\n(deny network*)\n"
-- Where a bare program name is looked up, and the PATH safehouse runs with
-- (it is a bash script that needs uname, sandbox-exec, env, mktemp).
local SEARCH = "/opt/homebrew/bin:/usr/local/bin:/usr/bin:/bin"
local TOOLS_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
local VALID_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"     -- safehouse_validate_env_var_name

-- every error names the provider, in its fields and its message
local fail = errors.raiser(NAME, NAME .. ": ")

-- The program to run, or nil and why not.
local function program()
  local c = config()
  local os_name = host.os() or "unknown"
  if os_name ~= "Darwin" and not (c.allow_non_darwin and c.program) then
    return nil, "macOS only (sandbox-exec); this host is " .. os_name
           .. " (tests run a stand-in: providers.safehouse.program and allow_non_darwin = true)"
  end
  local path = host.which(c.program or "safehouse", SEARCH)
  if not path then
    if c.program then return nil, "providers.safehouse.program " .. c.program .. " is not an executable file" end
    return nil, "safehouse is not installed (brew install eugene1g/safehouse/agent-safehouse)"
  end
  return path
end

-- safehouse's own refusals (runtime_preflight, the argument parser): the
-- first line of its stderr when it exited 1 before running anything.
local REFUSALS = {
  { "^safehouse requires macOS", "BackendNotInstalledError" },
  { "^safehouse could not find sandbox%-exec", "BackendNotInstalledError" },
  { "^Unknown option: ", "SandboxExecutionError" },
  { "^Missing value for ", "SandboxExecutionError" },
  { "^Invalid ", "SandboxExecutionError" },
  { "^Wrapped command env assignments ", "SandboxExecutionError" },
  { "^HOME is not set", "SandboxExecutionError" },
  { "^HOME does not exist", "SandboxExecutionError" },
  { "^Workdir does not exist", "SandboxExecutionError" },
  { "^Appended profile path ", "SandboxExecutionError" },
}
local function refusal(stderr)
  local first = (stderr or ""):match("^[^\n]*")
  for _, r in ipairs(REFUSALS) do
    if first:find(r[1]) then return r[2], (stderr:gsub("%s+$", ""):gsub("\n", "; ")) end
  end
end

-- `env` (BSD on macOS, GNU in the stand-in) could not run the command:
-- "env: NAME: No such file or directory" (127) or "...: Operation not
-- permitted" (126, the profile denied the exec: EPERM).
local function exec_failure(r, stderr, argv0)
  if r.exit_code ~= 127 and r.exit_code ~= 126 then return end
  local quoted = argv0:gsub("%p", "%%%0")
  for _, q in ipairs{ { "", "" }, { "'", "'" }, { "\u{2018}", "\u{2019}" } } do
    local why = stderr:match("^env: " .. q[1] .. quoted .. q[2] .. ": ([^\n]*)\n?$")
    if why then
      local code = why:find("No such file", 1, true) and "ENOENT"
                   or why:find("not permitted", 1, true) and "EPERM"
                   or why:find("Permission denied", 1, true) and "EACCES" or nil
      if code then return code, why end
    end
  end
end

local function command_ran(h, r, argv0)
  -- what read() took, unless the result has it too (the local backend's does)
  local stderr = r.stderr or ""
  if stderr:sub(1, #h.err_head) ~= h.err_head then stderr = h.err_head .. stderr end
  if r.exit_code == 1 then
    local kind, msg = refusal(stderr)
    if kind then fail(kind, msg, { op = "exec", reason = "safehouse refused" }) end
  end
  local code, why = exec_failure(r, stderr, argv0)
  if code == "EPERM" then
    fail("SandboxExecutionError", "the sandbox profile denied running " .. argv0 .. " (" .. why .. ")",
         { op = "exec", code = code })
  elseif code then
    fail("SandboxExecutionError", argv0 .. ": " .. why, { op = "exec", code = code })
  end
end

-- A ProcessHandle around the local backend's process (safehouse's), which
-- tells a command that never started from one that ran.
local Handle = {}
Handle.__index = Handle
function Handle:read()
  local which, data = self.p:read()
  if which == "stderr" and #self.err_head < 4096 then
    self.err_head = self.err_head .. data:sub(1, 4096 - #self.err_head)
  end
  return which, data
end
function Handle:wait(...)
  local r = self.p:wait(...)
  command_ran(self, r, self.argv0)
  return r
end
function Handle:write(data) return self.p:write(data) end
function Handle:close_stdin() return self.p:close_stdin() end
function Handle:kill(sig) return self.p:kill(sig) end
function Handle:running() return self.p:running() end
function Handle:expire() return self.p:expire() end
function Handle:close() return self.p:close() end
Handle.__close = Handle.close

local function write_profile(h)
  if h.deny_network then L.write_file(h, PROFILE, DENY, tonumber("644", 8)) end
end

-- The argv of safehouse for `req`; the command's environment goes in K=V
-- tokens, which safehouse reads up to the first token that is not one.
local function safehouse_argv(h, path, argv, env)
  local out = { path, "--workdir=" .. h.dir, "--trust-workdir-config=false" }
  if h.deny_network then out[#out + 1] = "--append-profile=" .. h.dir .. "/" .. PROFILE end
  out[#out + 1] = "--"
  for _, kv in ipairs(env) do
    local k = kv:match("^([^=]*)=")
    if not (k and k:find(VALID_NAME)) then
      fail("ConfigError", "environment variable " .. string.format("%q", tostring(k or kv))
           .. " is not a NAME safehouse accepts (" .. VALID_NAME .. ")", { op = "exec" })
    end
    out[#out + 1] = kv
  end
  local k = argv[1]:match("^([^=]*)=")
  if k and k:find(VALID_NAME) then
    fail("ConfigError", "a command named " .. string.format("%q", argv[1]) .. " would be read as a "
         .. "variable assignment; give its path (./" .. argv[1] .. ")", { op = "exec" })
  end
  for _, a in ipairs(argv) do out[#out + 1] = a end
  return out
end

local function safehouse_env(env, h)
  local home = h.dir
  for _, kv in ipairs(env) do home = kv:match("^HOME=(.*)$") or home end
  return { "PATH=" .. TOOLS_PATH, "HOME=" .. home }
end

local function start(h, req)
  local path, why = program()
  if not path then fail("BackendNotInstalledError", why, { op = "exec" }) end
  write_profile(h)
  local sreq = {}
  for k, v in pairs(req) do sreq[k] = v end
  sreq.argv = safehouse_argv(h, path, req.argv, req.env or {})
  sreq.env = safehouse_env(req.env or {}, h)
  local ok, p = pcall(L.spawn, h, sreq)
  if not ok then
    if errors.is(p, "SandboxExecutionError") and p.errno == "ENOENT" then
      fail("BackendNotInstalledError", path .. " is gone (" .. tostring(p.message) .. ")", { op = "exec" })
    end
    error(p, 0)
  end
  return setmetatable({ p = p, pid = p.pid, argv0 = req.argv[1], err_head = "" }, Handle)
end

-- Whether this program ran a command once (per program path): safehouse's
-- own refusals then surface at create, as BackendNotInstalledError.
local probed = {}
local function probe(h)
  local path, why = program()
  if not path then fail("BackendNotInstalledError", why, { op = "create" }) end
  if probed[path] then return end
  local p <close> = start(h, { argv = { "true" }, env = { "PATH=" .. TOOLS_PATH }, timeout = 60,
                               max_output = 65536 })
  local ok, r = pcall(p.wait, p)
  if not ok then
    if errors.is(r, "BackendNotInstalledError") then error(r, 0) end
    fail("SandboxCreationError", "a first command under " .. path .. " failed: " .. tostring(r.message or r),
         { op = "create" })
  end
  if r.exit_code ~= 0 then
    fail("SandboxCreationError", "`true` under " .. path .. " exited " .. tostring(r.exit_code or r.signal)
         .. ": " .. r.stderr:gsub("%s+$", ""), { op = "create" })
  end
  probed[path] = true
end

local p = {
  descriptor = {
    name = NAME,
    description = "host processes under an Agent Safehouse sandbox-exec profile (macOS)",
    isolation = "process",
    capabilities = { "exec", "files", "streaming", "background", "resume", "network" },
    -- no cpu, memory_mb, image: safehouse cannot limit or change them
    options = { workdir = true, allow_internet = true },
    price = { per_hour = 0, per_vcpu_hour = 0, per_gib_hour = 0 },
  },
  config_schema = {
    program = { type = "string", help = "the safehouse program: a path, or a name looked up on " .. SEARCH
                .. " (default safehouse)" },
    allow_non_darwin = { type = "boolean", default = false,
                         help = "for tests: run `program` (a stand-in, spec/support/safehouse) on a host "
                                .. "that is not macOS" },
  },
  rooted_at_workdir = true,
}

function p.available()
  local path, why = program()
  if not path then return false, why end
  return true
end

function p.create(spec)
  local h = L.create(spec)
  h.deny_network = spec.allow_internet == false
  local ok, err = pcall(function() write_profile(h) probe(h) end)
  if not ok then
    pcall(L.destroy, h)
    error(err, 0)
  end
  return h
end

function p.destroy(h)
  if h.deny_network and not h.own and h.root then pcall(L.remove, h, PROFILE) end   -- a workdir of the user's
  L.destroy(h)
end

function p.session_state(h)
  local st = L.session_state(h)
  st.deny_network = h.deny_network
  return st
end

function p.resume(state)
  local h = L.resume(state)
  h.deny_network = state.deny_network == true
  return h
end

function p.spawn(h, req) return start(h, req) end

-- The rest is the local backend's: the directory and its files. (Its
-- list_owned and forget_session stay local's alone: the directories are
-- under local's part of the state directory, which local lists and clears.)
for _, op in ipairs{ "is_alive", "home", "read_file", "write_file", "list_files", "mkdir", "remove",
                     "put_tree", "get_tree", "reap" } do
  p[op] = L[op]
end

function p.doctor()
  local c, os_name = config(), host.os()
  local lines = { { what = "host", detail = tostring(os_name) .. (os_name == "Darwin" and ""
    or (" (safehouse needs macOS; allow_non_darwin is " .. tostring(c.allow_non_darwin == true) .. ")")) } }
  if os_name == "Darwin" or (c.allow_non_darwin and c.program) then
    local path, why = program()
    lines[2] = { ok = path ~= nil, what = "program", detail = path or why,
                 fix = "brew install eugene1g/safehouse/agent-safehouse, or set providers.safehouse.program" }
  end
  return lines
end

return p
