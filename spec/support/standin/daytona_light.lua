-- Light sandboxes for the Daytona stand-in (`--light`): no process behind
-- them, so a run measures the clients and the wire, not bwrap (bench/
-- daytona.sh LIGHT=1), or holds thousands. The in-memory filesystem and the
-- built-in commands are tensorlake_light.lua's; on top of them this answers
-- what the toolbox (daytona_toolbox.lua) and the clients send:
--   - `sh -c SCRIPT`, SCRIPT simple commands joined by `;` and `&&`, words
--     in single quotes or bare: `exec 2>&1` (the execute endpoint's merged
--     output), `cd DIR`, `env -i [K=V...]`, built-ins, and sbxlua's agent
--     line (`.../sbx-agent-ID run [--pidfile F] [--cwd D] [--timeout T]
--     [--stdin -|F] -- ARGV`): its cwd and program checks, ARGV as a
--     built-in, its status record "\0SBXAGENT1 <kind> <n>\n" ending stderr;
--   - find PATH [-mindepth N] [-maxdepth N] -printf FMT (%y %s %m %T@ %u %g
--     %f %l %P, \t and \0), mkdir [-p] [-m MODE], chmod MODE, rmdir;
--   - anything else (a pipe, a program it does not know): exit 127 and
--     "sh: 1: NAME: not found" on stderr, as a shell without it.
local L = require "spec.support.standin.tensorlake_light"

local M = {}
local norm = L.norm

local Box = setmetatable({}, { __index = L.Box })
Box.__index = Box

local HOME = "/home/daytona"

function M.new()
  local b = L.new()
  b.dirs["/home"], b.dirs[HOME] = true, true
  b.workdir, b.modes = HOME, {}
  return setmetatable(b, Box)
end

local function abs(cwd, p) return norm(p:sub(1, 1) == "/" and p or cwd .. "/" .. p) end

-- ------------------------------------------------------------ the shell

-- Words and operators of a script: single quotes, backslash escapes,
-- `;`, `&&`, `||`, `|` and `&` apart (the last three are refused later).
local function tokens(script)
  local out, i, n = {}, 1, #script
  while i <= n do
    local c = script:sub(i, i)
    if c:match("%s") then
      i = i + 1
    elseif script:sub(i, i + 1) == "&&" or script:sub(i, i + 1) == "||" then
      out[#out + 1] = { op = script:sub(i, i + 1) } i = i + 2
    elseif c == ";" or c == "|" or (c == "&" and script:sub(i - 1, i - 1) ~= ">" and script:sub(i - 1, i - 1) ~= "<") then
      out[#out + 1] = { op = c } i = i + 1
    else
      local w = {}
      while i <= n do
        c = script:sub(i, i)
        if c == "'" then
          local e = script:find("'", i + 1, true) or n + 1
          w[#w + 1] = script:sub(i + 1, e - 1)
          i = e + 1
        elseif c == "\\" then
          w[#w + 1] = script:sub(i + 1, i + 1) i = i + 2
        elseif c:match("[%s;|]") or (c == "&" and not (w[#w] or ""):match("[<>]$")) then
          break
        else
          w[#w + 1] = c i = i + 1
        end
      end
      out[#out + 1] = table.concat(w)
    end
  end
  return out
end

local BUILTIN = {}

local function builtin(name)
  name = name and name:match("[^/]*$")
  return BUILTIN[name] or L.BUILTIN[name] or L.BUILTIN[(name or "") .. "_"]
end

local function not_found(sink, name)
  sink.err("sh: 1: " .. tostring(name) .. ": not found\n")
  return 127
end

-- sbx-agent run: the checks it makes before the command, the command, its record.
local function agent_run(box, words, sink)
  local o, i = {}, 1
  while words[i] and words[i] ~= "--" do
    local k = words[i]:match("^%-%-(%a+)$")
    if not k then return not_found(sink, words[i]) end
    o[k], i = words[i + 1], i + 2
  end
  local argv = { table.unpack(words, i + 1) }
  local cwd = abs(sink.cwd, o.cwd or sink.cwd)
  local function record(kind, n) sink.err("\0SBXAGENT1 " .. kind .. " " .. n .. "\n") end
  if o.pidfile then box.files[abs(sink.cwd, o.pidfile)] = tostring(box.next_pid) .. "\n" end
  if not box.dirs[cwd] then record("nocwd", box.files[cwd] and 20 or 2) return 127 end
  local fn = builtin(argv[1])
  if not fn then record("noexec", 2) return 127 end
  local io = { out = sink.out, err = sink.err, cwd = cwd, stdin = "" }
  if o.stdin and o.stdin ~= "-" then io.stdin = box.files[abs(sink.cwd, o.stdin)] or "" end
  if o.stdin == "-" then io.stdin = sink.stdin end
  local code = fn(box, { table.unpack(argv, 2) }, io)
  record("exit", code)
  return code
end

-- One simple command.
local function simple(box, words, sink)
  if #words == 0 then return 0 end
  if words[1] == "exec" and words[2] == "2>&1" and #words == 2 then
    sink.err = sink.out
    return 0
  elseif words[1] == "cd" then
    local d = abs(sink.cwd, words[2] or box.workdir)
    if not box.dirs[d] then sink.err("sh: 1: cd: can't cd to " .. tostring(words[2]) .. "\n") return 2 end
    sink.cwd = d
    return 0
  end
  local i = 1
  if words[1] == "env" then
    i = 2
    if words[i] == "-i" then i = i + 1 end
    while words[i] and words[i]:match("^[%a_][%w_]*=") do i = i + 1 end
  end
  local prog = words[i]
  if prog and prog:match("/sbx%-agent%-[%w]+$") and words[i + 1] == "run" then
    return agent_run(box, { table.unpack(words, i + 2) }, sink)
  end
  local fn = builtin(prog)
  if not fn then return not_found(sink, prog) end
  return fn(box, { table.unpack(words, i + 1) }, sink)
end

---The exit code of SCRIPT, its output through sink.out and sink.err.
function Box:script(script, sink)
  local code, words, skip = 0, {}, false
  local function flush()
    if not skip then code = simple(self, words, sink) end
    words = {}
  end
  for _, t in ipairs(tokens(script)) do
    if type(t) == "string" then
      words[#words + 1] = t
    elseif t.op == ";" then
      flush() skip = false
    elseif t.op == "&&" then
      flush() skip = skip or code ~= 0
    else
      return not_found(sink, t.op)            -- pipes, lists in the background, ||: not here
    end
  end
  flush()
  return code
end

-- ------------------------------------------------------------ commands

local FMT = {
  y = function(e) return e.dir and "d" or "f" end,
  s = function(e) return tostring(e.dir and 4096 or #e.data) end,
  m = function(e) return string.format("%o", e.mode) end,
  ["T@"] = function() return string.format("%.6f", os.time()) end,
  u = function() return "daytona" end,
  g = function() return "daytona" end,
  f = function(e) return e.path == "/" and "/" or e.path:match("[^/]*$") end,
  l = function() return "" end,
  P = function(e) return e.rel end,
}

local function format(fmt, e)
  fmt = fmt:gsub("\\t", "\t"):gsub("\\0", "\0"):gsub("\\n", "\n")
  return (fmt:gsub("%%(T?@?)(%a?)", function(t, c) local f = FMT[t ~= "" and t or c] return f and f(e) or "" end))
end

function BUILTIN.find(box, args, io)
  local root, mind, maxd, fmt = args[1], 0, math.huge, "%p\n"
  for i = 2, #args, 2 do
    if args[i] == "-mindepth" then mind = tonumber(args[i + 1])
    elseif args[i] == "-maxdepth" then maxd = tonumber(args[i + 1])
    elseif args[i] == "-printf" then fmt = args[i + 1]
    else io.err("find: unknown predicate `" .. args[i] .. "'\n") return 1 end
  end
  local top = abs(io.cwd, root or ".")
  if not box.dirs[top] and not box.files[top] then
    io.err("find: '" .. tostring(root) .. "': No such file or directory\n") return 1
  end
  local found = {}
  local function entry(p, dir)
    local rel = p == top and "" or p:sub(#top + (top == "/" and 1 or 2))
    local depth = rel == "" and 0 or select(2, rel:gsub("/", "")) + 1
    if depth >= mind and depth <= maxd then
      found[#found + 1] = { path = p, rel = rel, dir = dir, data = box.files[p],
                            mode = box.modes[p] or (dir and 493 or 420) }
    end
  end
  local prefix = top == "/" and "/" or top .. "/"
  for map, dir in pairs{ [box.dirs] = true, [box.files] = false } do
    for p in pairs(map) do if p == top or p:sub(1, #prefix) == prefix then entry(p, dir) end end
  end
  table.sort(found, function(a, b) return a.path < b.path end)
  for _, e in ipairs(found) do io.out(format(fmt, e)) end
  return 0
end

function BUILTIN.mkdir(box, args, io)
  local mode, i = nil, 1
  while args[i] and args[i]:sub(1, 1) == "-" do
    if args[i] == "-m" then mode, i = tonumber(args[i + 1], 8), i + 1 end
    i = i + 1
  end
  for j = i, #args do
    local p = abs(io.cwd, args[j])
    local ok, why = box:mkdirs(p)
    if not ok then io.err("mkdir: " .. why .. "\n") return 1 end
    if mode then box.modes[p] = mode end
  end
  return 0
end

function BUILTIN.chmod(box, args, io)
  local mode = tonumber(args[1] or "", 8)
  for j = 2, #args do
    local p = abs(io.cwd, args[j])
    if not box.dirs[p] and not box.files[p] then
      io.err("chmod: cannot access '" .. args[j] .. "': No such file or directory\n") return 1
    end
    box.modes[p] = mode
  end
  return 0
end

function BUILTIN.rmdir(box, args, io)
  for _, a in ipairs(args) do
    if a ~= "--" then
      local p = abs(io.cwd, a)
      if #box:list_files(p) > 0 then io.err("rmdir: failed to remove '" .. a .. "': Directory not empty\n") return 1 end
      box:remove(p)
    end
  end
  return 0
end

-- ------------------------------------------------------------ the sandbox

---spawn(cmd, args, opts): the command answered at once (opts: on_stdout, on_stderr, stdin, cwd).
function Box:spawn(cmd, args, opts)
  local function drop() end
  local sink = { out = opts.on_stdout or drop, err = opts.on_stderr or drop, stdin = opts.stdin or "",
                 cwd = norm(opts.cwd or self.workdir) }
  local code
  if (cmd == "sh" or cmd == "/bin/sh") and args[1] == "-c" then
    code = self:script(args[2] or "", sink)
  else
    local fn = builtin(cmd)
    code = fn and fn(self, args, sink) or not_found(sink, cmd)
  end
  self.next_pid = self.next_pid + 1
  return setmetatable({ pid = self.next_pid, result = { exit_code = code, timed_out = false } }, L.Proc)
end

function Box:execute_command(cmd, args, opts)
  local out, err = {}, {}
  opts = opts or {}
  local p = self:spawn(cmd, args or {}, { stdin = opts.stdin, cwd = opts.cwd,
    on_stdout = function(s) out[#out + 1] = s end, on_stderr = function(s) err[#err + 1] = s end })
  local r = p:wait()
  return { exit_code = r.exit_code, timed_out = false, stdout = table.concat(out), stderr = table.concat(err) }
end

function Box:upload_dir()
  error({ kind = "FeatureNotSupportedError", message = "a light sandbox restores no snapshot" }, 0)
end

return M
