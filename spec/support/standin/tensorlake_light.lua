-- Light sandboxes for the Tensorlake stand-in (`--light`): no process behind
-- them, for scale runs of thousands. A light sandbox has the methods of an
-- sbx sandbox the daemon (tensorlake_daemon.lua) uses, over an in-memory
-- filesystem, and answers commands itself:
--   - built-ins: true, false, echo, cat, printf (its format's %s and \n),
--     mkdir -p, chmod (no-op), rm [-d|-r|-f];
--   - sbxlua's prelude (providers/tensorlake.lua: sh -c '<prelude>' sbxlua
--     TAG CWD IN OUT ERR ARGV...): its cwd and program checks, its "TAG go"
--     line, its redirects, then ARGV as a built-in;
--   - anything else: exit 127, "sh: 1: NAME: not found" on stderr.
local loop = require "sbx.loop"

local M = {}

local PRELUDE = "m=$1 d=$2 i=$3 o=$4 e=$5; shift 5; "

local function norm(path)
  local parts = {}
  for part in path:gmatch("[^/]+") do
    if part == ".." then parts[#parts] = nil elseif part ~= "." then parts[#parts + 1] = part end
  end
  return "/" .. table.concat(parts, "/")
end

local function missing(path) error({ kind = "FileNotFoundError", message = "no such file or directory: " .. path }, 0) end

local Box = {}
Box.__index = Box

function M.new()
  return setmetatable({ files = {}, dirs = { ["/"] = true, ["/tmp"] = true, ["/workspace"] = true }, next_pid = 1 }, Box)
end

function Box:mkdirs(path)
  local cur = ""
  for part in norm(path):gmatch("[^/]+") do
    cur = cur .. "/" .. part
    if self.files[cur] then return nil, "not a directory: " .. cur end
    self.dirs[cur] = true
  end
  return true
end

function Box:write_file(path, data)
  path = norm(path)
  assert(self:mkdirs(path:match("^(.*)/[^/]*$")))
  if self.dirs[path] then error({ kind = "PathError", message = "is a directory: " .. path }, 0) end
  self.files[path] = data
end

function Box:read_file(path)
  path = norm(path)
  return self.files[path] or missing(path)
end

function Box:list_files(path)
  path = norm(path)
  if not self.dirs[path] then missing(path) end
  local prefix = path == "/" and "/" or path .. "/"
  local out = {}
  for map, is_dir in pairs{ [self.dirs] = true, [self.files] = false } do
    for p, v in pairs(map) do
      if p ~= path and p:sub(1, #prefix) == prefix and not p:find("/", #prefix + 1, true) then
        out[#out + 1] = { name = p:sub(#prefix + 1), is_dir = is_dir, size = is_dir and 0 or #v, mtime = os.time() }
      end
    end
  end
  table.sort(out, function(a, b) return a.name < b.name end)
  return out
end

function Box:remove(path)
  path = norm(path)
  if not self.files[path] and not self.dirs[path] then missing(path) end
  local prefix = path .. "/"
  for _, map in ipairs{ self.files, self.dirs } do
    for p in pairs(map) do if p == path or p:sub(1, #prefix) == prefix then map[p] = nil end end
  end
end

function Box:destroy() self.files, self.dirs = {}, {} end

-- ------------------------------------------------------------ commands

local BUILTIN = {}
function BUILTIN.true_() return 0 end
function BUILTIN.false_() return 1 end
function BUILTIN.echo(_, args, io) io.out(table.concat(args, " ") .. "\n") return 0 end
function BUILTIN.cat(box, args, io)
  if #args == 0 then io.out(io.stdin) return 0 end
  for _, f in ipairs(args) do
    local p = norm(io.cwd .. "/" .. f)
    if not box.files[p] then io.err("cat: " .. f .. ": No such file or directory\n") return 1 end
    io.out(box.files[p])
  end
  return 0
end
function BUILTIN.printf(_, args, io)     -- the format again for arguments left, as printf(1)
  local fmt, i = (args[1] or ""):gsub("\\n", "\n"), 1
  repeat
    local used = false
    io.out((fmt:gsub("%%s", function() i, used = i + 1, true return args[i] or "" end)))
  until not used or i >= #args
  return 0
end
function BUILTIN.mkdir(box, args, io)
  for _, a in ipairs(args) do
    if a ~= "-p" and a ~= "--" then
      local ok, why = box:mkdirs(a:sub(1, 1) == "/" and a or io.cwd .. "/" .. a)
      if not ok then io.err("mkdir: " .. why .. "\n") return 1 end
    end
  end
  return 0
end
function BUILTIN.chmod() return 0 end
function BUILTIN.rm(box, args, io)
  for _, a in ipairs(args) do
    if a:sub(1, 1) ~= "-" then
      local ok = pcall(box.remove, box, a:sub(1, 1) == "/" and a or io.cwd .. "/" .. a)
      if not ok and not args[1]:find("f", 1, true) then
        io.err("rm: cannot remove '" .. a .. "': No such file or directory\n") return 1
      end
    end
  end
  return 0
end

local function builtin(name)
  return BUILTIN[name] or BUILTIN[name .. "_"]
end

local Proc = {}
Proc.__index = Proc
function Proc:wait() return self.result end
function Proc:kill() end
function Proc:write(data) self.fed = (self.fed or "") .. data return true end
function Proc:close_stdin() end
function Proc:close() end

---spawn(cmd, args, opts): the command answered at once (opts: on_stdout, on_stderr, stdin, cwd).
function Box:spawn(cmd, args, opts)
  local out, err = opts.on_stdout, opts.on_stderr
  local argv = { cmd, table.unpack(args) }
  local cwd, code = opts.cwd or "/", nil
  local sink = { out = out, err = err, stdin = opts.stdin or "", cwd = cwd }
  if cmd == "sh" and argv[2] == "-c" and (argv[3] or ""):sub(1, #PRELUDE) == PRELUDE then
    local m, d, i, o, e = argv[5], argv[6], argv[7], argv[8], argv[9]
    local rest = { table.unpack(argv, 10) }
    d = norm(d)
    if not self.dirs[d] and not self.files[d] then out(m .. " nocwd\n") code = 126
    elseif not self.dirs[d] then out(m .. " notdir\n") code = 126
    elseif not builtin(rest[1] or "") then out(m .. " noexec\n") code = 127
    else
      out(m .. " go\n")
      if i ~= "-" then sink.stdin = i == "/dev/null" and "" or (self.files[norm(i)] or "") end
      local bufs = { o = {}, e = {} }
      if o ~= "-" then sink.out = function(s) bufs.o[#bufs.o + 1] = s end end
      if e ~= "-" then sink.err = function(s) bufs.e[#bufs.e + 1] = s end end
      sink.cwd = d
      code = builtin(rest[1])(self, { table.unpack(rest, 2) }, sink)
      if o ~= "-" then self:write_file(o, table.concat(bufs.o)) end
      if e ~= "-" then self:write_file(e, table.concat(bufs.e)) end
    end
  elseif builtin(cmd) then
    code = builtin(cmd)(self, args, sink)
  else
    err("sh: 1: " .. cmd .. ": not found\n")
    code = 127
  end
  self.next_pid = self.next_pid + 1
  loop.sleep(0)
  return setmetatable({ pid = self.next_pid, result = { exit_code = code, timed_out = false } }, Proc)
end

-- for the other stand-ins' light sandboxes (daytona_light.lua)
M.Box, M.Proc, M.BUILTIN, M.norm = Box, Proc, BUILTIN, norm

return M
