--- The provider contract, written once (docs/providers.md explains it).
---
--- A provider is a table: a descriptor that says what it is and can do, a
--- config schema, and the operations below. The built-in backends
--- (lua/sbx/providers/builtin/) and provider scripts (providers/*.lua, provider_path,
--- $SBX_PROVIDER_PATH) are held to the same table: `check` runs when a
--- script loads and from `sbxlua provider check FILE`, and names the file
--- and line of each problem.
local M = {}

---@class ProviderDescriptor
---@field name string           the provider's name (a script: its file name)
---@field description? string   one line for `sbxlua providers`
---@field isolation string      process | namespace | container | gvisor | microvm
---@field capabilities string[] exec, files, streaming, background, resume, snapshot, network, gpu
---@field options? table<string, true>  create options it honours beyond the common ones
---@field price? { per_hour?: number, per_vcpu_hour?: number, per_gib_hour?: number, per_sandbox?: number }
---@field regions? string[]
---@field limits? table         account limits it knows of (max_concurrent, max_creates_per_sec)

---@class ProcessHandle            what spawn() returns: one running command
---@field pid? integer             the command's pid where it has one (spawn{want_pid})
---@field read fun(self): string?, string?   next streamed chunk: "stdout"|"stderr", data; nil at the end
---@field write fun(self, data: string): boolean?, string?  feed stdin; nil, why when it is closed
---@field close_stdin fun(self)
---@field wait fun(self): table    { stdout, stderr, exit_code, signal, timed_out, truncated, duration_ms }
---@field kill fun(self, signum?: integer)  signal the whole tree (default SIGKILL)
---@field running fun(self): boolean
---@field expire fun(self)         the caller's deadline passed: kill it and report timed_out
---@field close fun(self)          release everything; idempotent (also __close/__gc)

---@class ProcessHandleBase: ProcessHandle  process_handle.class{...}: the shared half (lua/sbx/providers/process_handle.lua)
---@field out string[]               kept stdout (at most max bytes; outn counts them)
---@field err string[]               kept stderr (errn counts them)
---@field max integer                bytes kept per stream (req.max_output, default 1 MiB)
---@field truncated boolean          output went past max
---@field streaming boolean          req.stream: delivered chunks queue for read()
---@field qbytes integer             bytes queued and not yet read
---@field expired? boolean           expire() was called
---@field stdin_closed? boolean
---@field writer? table              a task feeding stdin; close() cancels it
---@field _deliver fun(self, which: integer, data: string): boolean  output of stream 1|2 arrived (capped, queued)
---@field _ended fun(self)           the command ended: stops the clock of duration_ms
---@field _more fun(self): boolean   driver: read and _deliver some more (may wait); false at the end
---@field _status fun(self): table   driver: { kind = exit|signal|timeout|killed|noexec|nocwd|lost, n =, why =, broken = }
---@field _write fun(self, data: string): boolean?, string?, string?  driver: feed stdin
---@field _end_stdin fun(self)       driver: end of input
---@field _release fun(self)         driver: close() of a command still running, after its kill
---@field _flow? fun(self, all: boolean)  driver, optional: read() took chunks (all: wait() takes the rest)
---@field _abandon? fun(self)        driver, optional: the waiting caller raised (after the kill)

---@class Provider
---@field descriptor ProviderDescriptor
---@field config_schema? table<string, string|table>  its keys under providers.NAME in sbx.yaml
---@field available fun(): boolean, string?           usable here? and why not
---@field create fun(spec: table): table               a new sandbox's handle (opaque to the facade)
---@field destroy fun(h: table)
---@field spawn fun(h: table, req: table): ProcessHandle
---@field session_state fun(h: table): table           plain JSON-safe data for resume
---@field resume fun(state: table): table              a handle again (state.id is the sandbox id)
---@field is_alive fun(h: table): boolean
---@field home fun(h: table): string                   the sandbox's working directory
---@field read_file fun(h: table, path: string, max?: integer): string
---@field write_file fun(h: table, path: string, data: string)
---@field list_files fun(h: table, path: string): table[]   { name=, type=, size= }
---@field mkdir fun(h: table, path: string)
---@field remove fun(h: table, path: string, recursive: boolean)
---@field put_tree? fun(h: table, dir: string, entries: table[])
---@field get_tree? fun(h: table, dir: string): table[], table[]
---@field snapshot? fun(h: table): { snapshot_id: string }
---@field stat? fun(h: table, path: string): table
---@field doctor? fun(): table[]                       { ok=, what=, detail=, fix= } lines
---@field list_owned? fun(): table[]                   { id=, session=, lock=, ... } it holds (gc)
---@field reap? fun(entry: table)                      destroy a dead session's sandbox (gc)
---@field forget_session? fun(session: string)         drop a dead session's containers (gc)
---@field prune? fun(dry_run: boolean): integer
---@field reap_snapshots? fun(session: string, keep: table, dry_run: boolean): integer
---@field rooted_at_workdir? boolean  the file API's "/" is home(h) (local: a host directory), not the sandbox's /

-- The operations, in the order docs/providers.md lists them.
M.REQUIRED = { "available", "create", "destroy", "spawn", "session_state", "resume", "is_alive",
               "home", "read_file", "write_file", "list_files", "mkdir", "remove" }
M.OPTIONAL = { "put_tree", "get_tree", "snapshot", "stat", "doctor", "list_owned", "reap",
               "forget_session", "prune", "reap_snapshots" }
-- Fields that are not operations (booleans).
M.FLAGS = { "rooted_at_workdir" }
-- A capability that needs an operation.
M.NEEDS = { snapshot = "snapshot" }

M.ISOLATION = { process = 1, namespace = 2, container = 3, gvisor = 4, microvm = 5 }
M.CAPABILITIES = { "exec", "files", "streaming", "background", "resume", "snapshot", "network", "gpu" }
M.PRICE = { "per_hour", "per_vcpu_hour", "per_gib_hour", "per_sandbox" }
M.PROCESS = { "read", "write", "close_stdin", "wait", "kill", "running", "expire", "close" }

-- Config schema types (docs/providers.md, "Configuration").
M.TYPES = { string = true, number = true, integer = true, boolean = true, strings = true, env = true }
-- Keys every provider takes (the router reads them) and may not redefine.
M.COMMON_CONFIG = { enabled = true, max_concurrent = true, max_creates_per_sec = true, price = true,
                    region = true, regions = true }

local function set(list)
  local s = {}
  for _, v in ipairs(list) do s[v] = true end
  return s
end
local OPS = set(M.REQUIRED)
for _, k in ipairs(M.OPTIONAL) do OPS[k] = true end
local CAPS = set(M.CAPABILITIES)
local PRICES = set(M.PRICE)

-- The line of `key = ...` in the source (the last one: a script may set a
-- field after building the table), else the line of the file's last
-- top-level `return`, else 1.
local function line_of(source, key)
  local n, ret, at = 0, nil, nil
  for line in (source or ""):gmatch("([^\n]*)\n?") do
    n = n + 1
    if key and (line:find("%f[%w_]" .. key .. "%s*=[^=]") or line:find("%f[%w_]" .. key .. "%s*=$")
                or line:find("function%s+[%w_.:]*[.:]" .. key .. "%s*%(")) then
      at = n
    end
    if line:match("^return[%s{]") or line:match("^return$") then ret = n end
    if n > 100000 then break end
  end
  return at or ret or 1
end
M.line_of = line_of

local function is_list(t)
  if type(t) ~= "table" then return false end
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n == #t
end

local function list_of_strings(t)
  if not is_list(t) then return false end
  for _, v in ipairs(t) do if type(v) ~= "string" then return false end end
  return true
end

---Check a schema entry; returns the normalized { type=, default=, credential=, help= } or nil, why.
function M.schema_entry(key, v)
  if type(v) == "string" then v = { type = v } end
  if type(v) ~= "table" then return nil, "config_schema." .. key .. " must be a type name or a table" end
  if not M.TYPES[v.type] then
    return nil, "config_schema." .. key .. ".type must be one of string, number, integer, boolean, "
                .. "strings, env (got " .. tostring(v.type) .. ")"
  end
  local d = v.default
  local want = ({ string = "string", env = "string", number = "number", integer = "number",
                  boolean = "boolean", strings = "table" })[v.type]
  if d ~= nil and (type(d) ~= want or (v.type == "integer" and math.type(d) ~= "integer")
                   or (v.type == "strings" and not list_of_strings(d))) then
    return nil, "config_schema." .. key .. ".default must be a " .. v.type
  end
  if v.type == "env" and d ~= nil and not d:match("^[%a_][%w_]*$") then
    return nil, "config_schema." .. key .. ".default must name an environment variable"
  end
  if v.help ~= nil and type(v.help) ~= "string" then return nil, "config_schema." .. key .. ".help must be a string" end
  return { type = v.type, default = d, help = v.help, credential = v.type == "env" }
end

---Every problem of provider `p` against the contract, as { line =, msg = }
---(lines found in `source` when given). `name`: the name it must carry.
---@return table[] problems
function M.problems(p, name, source)
  local out = {}
  local function add(key, msg, fn)
    local line = fn and debug.getinfo(fn, "S").linedefined or line_of(source, key)
    out[#out + 1] = { line = line, msg = msg, i = #out + 1 }
  end
  if type(p) ~= "table" then
    add(nil, "the file returned " .. type(p) .. ", not a provider table (descriptor and operations)")
    return out
  end
  local d = p.descriptor
  if type(d) ~= "table" then
    add("descriptor", "'descriptor' is " .. (d == nil and "missing" or type(d)) .. ", not a table")
    d = {}
  else
    if type(d.name) ~= "string" or not d.name:match("^[%w_][%w_%-]*$") then
      add("name", "descriptor.name must be a name of letters, digits, '-' and '_', got " .. tostring(d.name))
    elseif name and d.name ~= name then
      add("name", "descriptor.name is '" .. d.name .. "' but the file provides '" .. name
                  .. "' (name the file " .. d.name .. ".lua, or change the name)")
    end
    if d.description ~= nil and type(d.description) ~= "string" then
      add("description", "descriptor.description must be a string")
    end
    if not M.ISOLATION[d.isolation] then
      add("isolation", "descriptor.isolation must be one of process, namespace, container, gvisor, "
                       .. "microvm, got " .. tostring(d.isolation))
    end
    if not list_of_strings(d.capabilities) then
      add("capabilities", "descriptor.capabilities must be a list of strings")
    else
      for _, c in ipairs(d.capabilities) do
        if not CAPS[c] then
          add("capabilities", "descriptor.capabilities: unknown capability '" .. c .. "' (known: "
                              .. table.concat(M.CAPABILITIES, ", ") .. ")")
        elseif M.NEEDS[c] and type(p[M.NEEDS[c]]) ~= "function" then
          add("capabilities", "descriptor.capabilities has '" .. c .. "' but there is no " .. M.NEEDS[c]
                              .. " operation")
        end
      end
    end
    if d.options ~= nil then
      local ok = type(d.options) == "table"
      for k, v in pairs(ok and d.options or {}) do if type(k) ~= "string" or v ~= true then ok = false end end
      if not ok then add("options", "descriptor.options must map create option names to true") end
    end
    if d.price ~= nil then
      local ok = type(d.price) == "table"
      for k, v in pairs(ok and d.price or {}) do
        if not PRICES[k] or type(v) ~= "number" or v < 0 or v ~= v then ok = false end
      end
      if not ok then
        add("price", "descriptor.price must map " .. table.concat(M.PRICE, ", ") .. " to numbers >= 0")
      end
    end
    if d.regions ~= nil and not list_of_strings(d.regions) then
      add("regions", "descriptor.regions must be a list of strings")
    end
    if d.limits ~= nil and type(d.limits) ~= "table" then add("limits", "descriptor.limits must be a table") end
  end
  -- functions that are not operations (helpers are fine): a missing
  -- operation within two edits of one of them is probably its typo
  local others = {}
  for k, v in pairs(p) do
    if type(k) == "string" and not OPS[k] and type(v) == "function" then others[k] = true end
  end
  for _, op in ipairs(M.REQUIRED) do
    if p[op] == nil then
      local hint = require("sbx.core.check").suggest(op, others)
      local typo = hint:match("'(.-)'")
      if typo then add(typo, "missing operation '" .. op .. "' ('" .. typo .. "' is there: a typo?)", p[typo])
      else add(nil, "missing operation '" .. op .. "'") end
    elseif type(p[op]) ~= "function" then add(op, "'" .. op .. "' must be a function, got " .. type(p[op])) end
  end
  for _, op in ipairs(M.OPTIONAL) do
    if p[op] ~= nil and type(p[op]) ~= "function" then
      add(op, "'" .. op .. "' must be a function, got " .. type(p[op]))
    end
  end
  for _, k in ipairs(M.FLAGS) do
    if p[k] ~= nil and type(p[k]) ~= "boolean" then add(k, "'" .. k .. "' must be true or false") end
  end
  if p.config_schema ~= nil then
    if type(p.config_schema) ~= "table" then
      add("config_schema", "'config_schema' must be a table of key = type")
    else
      for k, v in pairs(p.config_schema) do
        if type(k) ~= "string" then add("config_schema", "config_schema keys must be strings")
        elseif M.COMMON_CONFIG[k] then
          add(k, "config_schema." .. k .. " is a key every provider has; leave it out")
        else
          local _, why = M.schema_entry(k, v)
          if why then add(k, why) end
        end
      end
    end
  end
  table.sort(out, function(a, b) return a.line < b.line or (a.line == b.line and a.i < b.i) end)
  return out
end

---Check `p` (loaded from `file`); raises ConfigError listing every problem
---as file:line: message.
function M.check(p, file, name, source)
  local probs = M.problems(p, name, source)
  if #probs == 0 then return p end
  local lines = {}
  for i, pr in ipairs(probs) do lines[i] = string.format("%s:%d: %s", file, pr.line, pr.msg) end
  require("sbx.core.errors").raise("ConfigError", table.concat(lines, "\n"),
                              { file = file, line = probs[1].line, problems = probs })
end

-- The classes (metatables with a table __index) whose handles had every
-- method: a handle of one with no method of its own passes at once.
local classes = setmetatable({}, { __mode = "k" })

local function own_methods(ph)
  for _, m in ipairs(M.PROCESS) do if rawget(ph, m) ~= nil then return true end end
  return false
end

---Check what spawn() returned; raises SandboxExecutionError naming `where`.
function M.check_process(ph, where)
  local mt = type(ph) == "table" and getmetatable(ph)
  if mt and classes[mt] and not own_methods(ph) then return ph end
  local missing = {}
  for _, m in ipairs(M.PROCESS) do
    local ok, v = pcall(function() return ph[m] end)
    if not ok or type(v) ~= "function" then missing[#missing + 1] = m end
  end
  if type(ph) ~= "table" and type(ph) ~= "userdata" then missing = { "(not a table: " .. type(ph) .. ")" } end
  if #missing > 0 then
    require("sbx.core.errors").raise("SandboxExecutionError", where .. ": spawn() returned a process handle without "
      .. table.concat(missing, ", ") .. " (see docs/providers.md, ProcessHandle)", { op = "exec" })
  end
  if type(mt) == "table" and type(rawget(mt, "__index")) == "table" and not own_methods(ph) then classes[mt] = true end
  return ph
end

return M
