--- Workspaces (API.md "Workspace"): an ordered list of entries, each a
--- destination in the sandbox and one source (literal content, a host file,
--- a host tree, a git repository, or a custom function). Entries are checked
--- whole before anything is created or written (ConfigError); a failure while
--- materializing one is a WorkspaceError naming its dest, with the cause.
--- The create options `git_repo`/`git_ref` and `files` are shorthands for
--- entries, applied before `workspace`.
local errors = require "sbx.core.errors"
local check = require "sbx.core.check"
local fs = require "sbx.fs"

local M = {}

local SOURCES = { "content", "file", "dir", "git", "materialize" }
local FIELDS = { dest = "string", content = "string", file = "string", dir = "string",
                 git = "string", materialize = "function", ref = "string", depth = "integer" }

local function bad(op, i, msg)
  errors.raise("ConfigError", string.format("%s: workspace entry %d: %s", op, i, msg),
               { op = op, context = { index = i } })
end

-- Lexically normalize dest; nil when it climbs above where it starts
-- (the working directory for a relative dest, "/" for an absolute one).
local function normalize(dest)
  local parts = {}
  for seg in dest:gmatch("[^/]+") do
    if seg == ".." then
      if #parts == 0 then return nil end
      parts[#parts] = nil
    elseif seg ~= "." then
      parts[#parts + 1] = seg
    end
  end
  local rel = table.concat(parts, "/")
  if dest:sub(1, 1) == "/" then return "/" .. rel end
  return rel == "" and "." or rel
end

---Check one entry; returns a clean copy with `source` (its kind) set.
local function entry(e, i, op)
  if type(e) ~= "table" then bad(op, i, "must be a table like { dest = \"x\", content = \"...\" }, got " .. type(e)) end
  local ok, err = pcall(check.options, e, FIELDS, op .. ": workspace entry " .. i)
  if not ok then error(err, 0) end
  local dest = e.dest
  if dest == nil then bad(op, i, "has no dest (the sandbox path it goes to)") end
  if dest:match("^%s*$") then bad(op, i, "dest is blank") end
  if dest:find("\0", 1, true) then bad(op, i, "dest contains a NUL byte") end
  if #dest > 4096 then bad(op, i, "dest is longer than 4096 bytes") end
  local norm = normalize(dest)
  if not norm then
    bad(op, i, "dest '" .. dest .. "' leaves " .. (dest:sub(1, 1) == "/" and "the sandbox" or "the working directory"))
  end
  local source
  for _, s in ipairs(SOURCES) do
    if e[s] ~= nil then
      if source then bad(op, i, "(dest '" .. dest .. "') has two sources, " .. source .. " and " .. s .. "; give one") end
      source = s
    end
  end
  if not source then
    bad(op, i, "(dest '" .. dest .. "') has no source: give one of content, file, dir, git, materialize")
  end
  if (e.ref ~= nil or e.depth ~= nil) and source ~= "git" then
    bad(op, i, "(dest '" .. dest .. "') ref and depth go with git only")
  end
  if (source == "content" or source == "file") and (norm == "." or norm == "/" or dest:sub(-1) == "/") then
    bad(op, i, "dest '" .. dest .. "' names a directory, not a file")
  end
  if source == "file" or source == "dir" then
    local path = e[source]
    local st, serr = fs.stat_host(path)
    if not st then bad(op, i, "(dest '" .. dest .. "') " .. source .. " " .. tostring(serr)) end
    local want = source == "file" and "file" or "dir"
    if st.type ~= want then
      bad(op, i, string.format("(dest '%s') %s %s is not a %s", dest, source, path,
                               want == "file" and "regular file" or "directory"))
    end
  elseif source == "git" then
    if e.git == "" or e.git:sub(1, 1) == "-" or e.git:find("[%z\n]") then
      bad(op, i, "(dest '" .. dest .. "') git must be a repository URL or path, got '" .. e.git .. "'")
    end
    if e.ref ~= nil and (e.ref == "" or e.ref:sub(1, 1) == "-" or e.ref:find("[%z%s]")) then
      bad(op, i, "(dest '" .. dest .. "') ref must be a branch, tag or commit, got '" .. e.ref .. "'")
    end
    if e.depth ~= nil and e.depth < 1 then bad(op, i, "(dest '" .. dest .. "') depth must be >= 1") end
  end
  local out = {}
  for k, v in pairs(e) do out[k] = v end
  out.source, out.index = source, i
  return out
end

---Check a list of entries (ConfigError naming the entry); returns clean copies.
---@param entries table[]
---@param op string the call, for messages
function M.validate(entries, op)
  if type(entries) ~= "table" then check.bad(op, "a workspace is a list of entries, got " .. type(entries)) end
  local n = #entries
  for k in pairs(entries) do
    if math.type(k) ~= "integer" or k < 1 or k > n then
      check.bad(op, "a workspace is a list of entries (found the key '" .. tostring(k) .. "')")
    end
  end
  local out = {}
  for i = 1, n do out[i] = entry(entries[i], i, op) end
  return out
end

---The entries a create makes: git_repo/git_ref, then files (sorted by
---path), then workspace (API.md's order), checked.
function M.from_options(opts)
  local list = {}
  if opts.git_repo then
    local name = opts.git_repo:gsub("/+$", ""):match("([^/:]+)$")
    name = name and name:gsub("%.git$", "")
    if not name or name == "" or name == "." or name == ".." then
      check.bad("sandbox", "git_repo '" .. opts.git_repo .. "' names no repository")
    end
    list[#list + 1] = { dest = name, git = opts.git_repo, ref = opts.git_ref, depth = 1 }
  end
  local paths = {}
  for p in pairs(opts.files or {}) do paths[#paths + 1] = p end
  table.sort(paths)
  for _, p in ipairs(paths) do list[#list + 1] = { dest = p, content = tostring(opts.files[p]) } end
  local ws = opts.workspace
  if ws ~= nil then
    if type(ws) ~= "table" then check.bad("sandbox", "workspace must be a list of entries, got " .. type(ws)) end
    for i = 1, #ws do list[#list + 1] = ws[i] end
    for k in pairs(ws) do
      if math.type(k) ~= "integer" or k < 1 or k > #ws then
        check.bad("sandbox", "workspace must be a list of entries (found the key '" .. tostring(k) .. "')")
      end
    end
  end
  return M.validate(list, "sandbox")
end

-- ------------------------------------------------------------ materialize

-- A failure of a step of ours: message, details, cause.
local Failure = {}

local function failure(msg, context, cause)
  error(setmetatable({ msg = msg, context = context, cause = cause }, Failure), 0)
end

local function git(sb, e)
  local function run(args)
    local ok, r = pcall(sb.execute_command, sb, "git", args)
    if not ok then
      if errors.is(r, "SandboxExecutionError") and r.errno == "ENOENT" then
        failure("git is not available in the sandbox", nil, r)
      end
      error(r, 0)
    end
    return r
  end
  local function failed(r, what)
    failure(what .. " failed (" .. (r.timed_out and "timed out" or r.signal
      or ("exit " .. tostring(r.exit_code))) .. "): " .. (r.stderr .. r.stdout):sub(-2000),
      { exit_code = r.exit_code, result = r })
  end
  local dest = sb:_command_path(e.dest)     -- git sees the paths commands see
  local args = { "clone", "--quiet" }
  if e.depth then args[#args + 1] = "--depth"; args[#args + 1] = tostring(e.depth) end
  if e.ref then args[#args + 1] = "--branch"; args[#args + 1] = e.ref end
  args[#args + 1] = "--"
  args[#args + 1] = e.git
  args[#args + 1] = dest
  local r = run(args)
  if r.exit_code == 0 then return end
  -- --branch takes branches and tags; a commit is fetched by itself
  if not (e.ref and e.ref:match("^%x+$") and #e.ref >= 7) then failed(r, "git clone " .. e.git) end
  r = run{ "init", "--quiet", "--", dest }
  if r.exit_code ~= 0 then failed(r, "git init " .. e.dest) end
  local fetch = { "-C", dest, "fetch", "--quiet" }
  if e.depth then fetch[#fetch + 1] = "--depth"; fetch[#fetch + 1] = tostring(e.depth) end
  fetch[#fetch + 1] = "--"
  fetch[#fetch + 1] = e.git
  fetch[#fetch + 1] = e.ref
  r = run(fetch)
  if r.exit_code ~= 0 then failed(r, "git fetch " .. e.git .. " " .. e.ref) end
  r = run{ "-C", dest, "checkout", "--quiet", "FETCH_HEAD" }
  if r.exit_code ~= 0 then failed(r, "git checkout " .. e.ref) end
end

local function materialize(sb, e)
  if e.source == "content" then sb:write_file(e.dest, e.content)
  elseif e.source == "file" then sb:upload_file(e.file, e.dest)
  elseif e.source == "dir" then sb:upload_dir(e.dir, e.dest)
  elseif e.source == "git" then git(sb, e)
  else e.materialize(sb, e.dest) end
end

local function describe(e)
  if e.source == "content" then return "content of " .. #e.content .. " bytes" end
  if e.source == "materialize" then return "materialize" end
  return e.source .. " " .. e[e.source]
end

---Materialize checked entries (from validate/from_options) in order;
---returns how many. Raises WorkspaceError (context.dest, .index, .source; cause).
function M.apply(sb, entries)
  for i, e in ipairs(entries) do
    local ok, err = pcall(materialize, sb, e)
    if not ok then
      if errors.is(err, "Cancelled") then error(err, 0) end
      local context = { dest = e.dest, index = e.index or i, source = e.source }
      local why, cause
      if getmetatable(err) == Failure then
        for k, v in pairs(err.context or {}) do context[k] = v end
        why, cause = err.msg, err.cause
      else
        why, cause = type(err) == "table" and tostring(err) or tostring(err), err
      end
      errors.raise("WorkspaceError", string.format("workspace entry %d (dest '%s', %s): %s",
        context.index, e.dest, describe(e), why),
        { backend = sb.backend, op = "workspace", context = context, cause = cause })
    end
  end
  return #entries
end

return M
