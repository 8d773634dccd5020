--- The docker provider's files: through the agent link when the container
--- has one, else through the engine's archive endpoint and short agent
--- commands; big reads and downloaded trees go through a spool file in
--- the state directory.
local tar = require "sbx.tar"
local fs = require "sbx.fs"
local owner = require "sbx.state.owner"
local paths = require "sbx.core.paths"
local agentlink = require "sbx.daemon.link"
local hex = require("sbx.proc").random_hex
local common = require "sbx.providers.builtin.docker.common"
local engine = require "sbx.providers.builtin.docker.engine"
local link_of = require("sbx.providers.builtin.docker.link").link_of
local agent = require("sbx.providers.builtin.docker.engine_exec").agent

local M = {}
local fail, call, expect, api, q = common.fail, engine.call, engine.expect, engine.api, engine.q

local function abs(path, op) return paths.resolve(common.WORKDIR, path, op) end

-- The errno name of an agent's answer (the agent sends names; nil for
-- agentlink.REFUSED and agentlink.BROKEN, which are none).
local function name_of(errno)
  if errno == agentlink.REFUSED or errno == agentlink.BROKEN then return nil end
  return errno
end
local NOT_A_PATH = { ENOTDIR = true, EISDIR = true, ENOTEMPTY = true, EEXIST = true }

-- A failed agent file operation as the typed error of the facade.
local function file_error(op, p, errno, msg)
  local code = name_of(errno)
  if errno == agentlink.BROKEN then fail("SandboxConnectionError", op .. ": " .. tostring(msg), { op = op }) end
  if code == "ENOENT" then fail("FileNotFoundError", op .. ": " .. p .. ": No such file or directory", { op = op, errno = code }) end
  if code == "EFBIG" then fail("SandboxExecutionError", op .. ": " .. msg, { op = op, code = "ETOOBIG", errno = code }) end
  if NOT_A_PATH[code] then
    fail("PathError", op .. ": " .. msg, { op = op, code = code })
  end
  fail("SandboxExecutionError", op .. ": " .. tostring(msg), { op = op, code = code })
end

local function dirname(p) return p:match("^(.*)/[^/]*$") end

function M.write_file(h, path, data, mode)
  local p = abs(path, "write_file")
  mode = mode or tonumber("644", 8)
  if p == "/" then fail("PathError", "write_file: / is a directory", { op = "write_file" }) end
  local link = link_of(h)
  if link then
    local ok, errno, msg = link:write_file(p, data, mode)
    if not ok and name_of(errno) == "ENOENT" then   -- like the archive path: parents are made
      local dok, derr, dmsg = link:mkdir(dirname(p))
      if not dok then file_error("write_file", p, derr, dmsg) end
      ok, errno, msg = link:write_file(p, data, mode)
    end
    if not ok then file_error("write_file", p, errno, msg) end
    return
  end
  local archive, err = tar.pack({ { path = p:sub(2), data = data, mode = mode } },
                                { parents = false })
  if not archive then fail("PathError", "write_file: " .. err, { op = "write_file" }) end
  api("PUT", "/containers/" .. q(h.cid) .. "/archive?path=/", { 200 },
      { op = "write_file", body = archive, headers = { ["Content-Type"] = "application/x-tar" },
        bad_request = "PathError", timeout = 300 })
end

-- A file of the state directory that data from the sandbox goes through
-- when it is too big to gather in memory piece by piece: add(chunk), then
-- path() (for tar) or read(max), and close() (removes it; idempotent).
local function spool(h, op)
  local dir = owner.state_dir() .. "/spool"
  local made, merr = fs.mkdir_host(dir)
  local root = made and fs.open_root(dir)
  if not root then fail("SandboxExecutionError", op .. ": spool: " .. tostring(merr), { op = op }) end
  local name, first = h.id .. "-" .. hex(6), true
  local sp = {}
  function sp.add(chunk)
    local ok, err = (first and root.write or root.append)(root, name, chunk)
    if not ok then fail("SandboxExecutionError", op .. ": spool: " .. tostring(err), { op = op }) end
    first = false
  end
  function sp.path()
    if first then sp.add("") end
    return dir .. "/" .. name
  end
  function sp.read(max)
    if first then return "" end
    local data, err = root:read(name, max)
    if not data then fail("SandboxExecutionError", op .. ": spool: " .. tostring(err), { op = op }) end
    return data
  end
  function sp.close()
    if not root then return end
    root:remove(name)
    root:close()
    root = nil
  end
  return sp
end

local function too_big(p, max)
  fail("SandboxExecutionError", "read_file: " .. p .. " is larger than the cap of " .. max .. " bytes",
       { op = "read_file", code = "ETOOBIG" })
end

---A file's data, its size cap checked before any of it is gathered; a big
---one peaks at twice its size (the gathered bytes, and the string Lua
---makes of them), not at a multiple of frames, buffers and copies.
function M.read_file(h, path, max)
  local p = abs(path, "read_file")
  max = max or 256 * 1024 * 1024
  local link = link_of(h)
  if link then
    local st = link:stat(p)              -- nil: read_file says why
    if st and st.type == "file" and st.size > max then too_big(p, max) end
    local data, errno, msg
    if st and st.type == "file" and st.size > common.SPOOL_ABOVE then
      local sp = spool(h, "read_file")
      local ok, err = pcall(function()
        data, errno, msg = link:read_to(p, max, sp.add)
        if data then data = sp.read(max) end
      end)
      sp.close()
      if not ok then error(err, 0) end
    else
      data, errno, msg = link:read_file(p, max)
    end
    if not data and name_of(errno) == "EFBIG" then too_big(p, max) end
    if not data then file_error("read_file", p, errno, msg) end
    return data
  end
  local sp = spool(h, "read_file")
  local ok, data, err, code = pcall(function()
    local res = call("GET", "/containers/" .. q(h.cid) .. "/archive?path=" .. q(p),
                     { op = "read_file", stream = true, timeout = 300 })
    local rok, rerr = pcall(function()
      if res.status ~= 200 then
        local body = res:read() or ""
        expect({ status = res.status, headers = res.headers, body = body }, { 200 },
               { op = "read_file", not_found = "FileNotFoundError", bad_request = "PathError" })
      end
      local n = 0
      while true do
        local chunk, cerr = res:read()
        if not chunk then
          if cerr then fail("SandboxConnectionError", "read_file: " .. tostring(cerr), { op = "read_file", retryable = true }) end
          break
        end
        n = n + #chunk
        if n > max + 1024 * 1024 then too_big(p, max) end   -- headers and padding aside
        sp.add(chunk)
      end
    end)
    res:close()
    if not rok then error(rerr, 0) end
    return tar.read_one(nil, { file = sp.path(), max_bytes = max })
  end)
  sp.close()
  if not ok then error(data, 0) end
  if not data then
    if code == "EISDIR" then fail("PathError", "read_file: " .. p .. " is a directory", { op = "read_file" }) end
    if code == "ETOOBIG" then fail("SandboxExecutionError", "read_file: " .. err, { op = "read_file", code = code }) end
    fail("PathError", "read_file: " .. p .. ": " .. tostring(err), { op = "read_file", code = code })
  end
  return data
end

function M.list_files(h, path)
  local p = abs(path, "list_files")
  local link = link_of(h)
  if link then
    local entries, errno, msg = link:list(p)
    if not entries then file_error("list_files", p, errno, msg) end
    local prefix = path == "" and "" or (path:sub(-1) == "/" and path or path .. "/")
    for _, e in ipairs(entries) do
      e.path, e.is_dir = prefix .. e.name, e.type == "dir"
      e.size, e.mtime = math.tointeger(e.size), math.tointeger(e.mtime)
    end
    table.sort(entries, function(a, b) return a.name < b.name end)
    return entries
  end
  local out, err, code = agent(h, { "ls", p }, "list_files")
  if code == 3 then fail("FileNotFoundError", "list_files: " .. p .. ": No such file or directory", { op = "list_files" }) end
  if code == 4 then fail("PathError", "list_files: " .. p .. ": Not a directory", { op = "list_files" }) end
  if code ~= 0 then fail("SandboxExecutionError", "list_files: " .. err, { op = "list_files" }) end
  local list, fields = {}, {}
  for field in out:gmatch("([^%z]*)%z") do
    fields[#fields + 1] = field
    if #fields == 4 then
      local name = fields[4]
      local prefix = path == "" and "" or (path:sub(-1) == "/" and path or path .. "/")
      list[#list + 1] = { name = name, path = prefix .. name, type = fields[1], is_dir = fields[1] == "dir",
                          size = math.tointeger(tonumber(fields[2])), mtime = math.tointeger(tonumber(fields[3])) }
      fields = {}
    end
  end
  table.sort(list, function(a, b) return a.name < b.name end)
  return list
end

---Write a tree of host entries (transfer.read_host_tree) under dir: through
---the agent link a chunk at a time; without it, one archive upload.
function M.put_tree(h, dir, entries)
  local transfer = require "sbx.core.transfer"
  local p = abs(dir, "upload_dir")
  M.mkdir(h, p)
  local link = link_of(h)
  if link then
    for _, e in ipairs(entries) do
      local dest = p .. "/" .. e.path
      if e.type == "dir" then
        M.mkdir(h, dest)
      elseif e.type == "file" then
        local ok, errno, msg = link:write_stream(dest, e.mode or tonumber("644", 8), transfer.chunks(e))
        if not ok then file_error("upload_dir", dest, errno, msg) end
      end
    end
    return
  end
  local list, total = {}, 0
  for _, e in ipairs(entries) do
    if e.type == "file" then
      total = total + (e.size or 0)
      if total > common.MAX_ARCHIVE_UPLOAD then
        fail("SandboxExecutionError", "upload_dir: more than " .. common.MAX_ARCHIVE_UPLOAD
             .. " bytes without the agent link (one archive in memory)", { op = "upload_dir", code = "ETOOBIG" })
      end
    end
  end
  for _, e in ipairs(entries) do
    local data
    if e.type == "file" then
      local parts = {}
      for _, chunk in transfer.chunks(e) do parts[#parts + 1] = chunk end
      data = table.concat(parts)
    end
    list[#list + 1] = { path = e.path, type = e.type, data = data, mode = e.mode }
  end
  if #list == 0 then return end
  local archive, err = tar.pack(list)
  if not archive then fail("PathError", "upload_dir: " .. err, { op = "upload_dir" }) end
  api("PUT", "/containers/" .. q(h.cid) .. "/archive?path=" .. q(p), { 200 },
      { op = "upload_dir", body = archive, headers = { ["Content-Type"] = "application/x-tar" },
        not_found = "FileNotFoundError", bad_request = "PathError", timeout = 600 })
end

-- The engine's archive of p, written to a spool file as it arrives (its
-- size costs no memory); returns the spool (path(), close()).
local function spool_archive(h, p, op)
  local res = call("GET", "/containers/" .. q(h.cid) .. "/archive?path=" .. q(p),
                   { op = op, stream = true, timeout = 600 })
  local sp
  local ok, err = pcall(function()
    if res.status ~= 200 then            -- the engine's message: a small body
      local body = res:read() or ""
      expect({ status = res.status, headers = res.headers, body = body }, { 200 },
             { op = op, not_found = "FileNotFoundError", bad_request = "PathError" })
    end
    sp = spool(h, op)
    local n = 0
    while true do
      local chunk, rerr = res:read()
      if not chunk then
        -- the engine's reply broke off mid-body: the link broke, not the command
        if rerr then fail("SandboxConnectionError", op .. ": " .. tostring(rerr), { op = op, retryable = true }) end
        break
      end
      n = n + #chunk
      if n > common.MAX_TREE_BYTES then
        fail("SandboxExecutionError", op .. ": " .. p .. " is larger than " .. common.MAX_TREE_BYTES .. " bytes",
             { op = op, code = "ETOOBIG" })
      end
      sp.add(chunk)
    end
    sp.size = n
  end)
  res:close()
  if not ok then
    if sp then sp.close() end
    error(err, 0)
  end
  return sp
end

---The tree under dir from one archive download, spooled to disk and read
---twice as hostile: first its entries (entries relative to dir, and the
---rejected ones), then, through the returned stream, its file data.
function M.get_tree(h, dir)
  local p = abs(dir, "download_dir")
  local sp = spool_archive(h, p, "download_dir")
  local file = sp.path()
  local ok, out, rejected, map = pcall(function()
    -- no tree holds more data than its archive: a bigger size is a lie
    local entries, rej = tar.extract(nil, { file = file, skip_unsafe = true, data = false,
                                            max_bytes = sp.size })
    if not entries then fail("SandboxExecutionError", "download_dir: " .. tostring(rej), { op = "download_dir" }) end
    local base = p == "/" and "" or p:match("[^/]+$")
    local res, by = {}, {}
    rej = rej or {}
    for _, e in ipairs(entries) do
      local rel = base == "" and e.path or (e.path == base and "" or e.path:match("^" .. base:gsub("%p", "%%%0") .. "/(.*)$"))
      if rel == nil then
        rej[#rej + 1] = { path = e.path, reason = "outside the requested directory" }
      elseif rel ~= "" then
        -- `escapes` is judged from the archive's root, the parent of `dir`
        if e.type == "symlink" and (e.escapes or paths.link_escapes(rel, e.target or "")) then
          rej[#rej + 1] = { path = rel, reason = "symlink out of the directory" }
        else
          res[#res + 1] = { path = rel, type = e.type, mode = e.mode }
          if e.type == "file" then by[e.path] = rel end
        end
      end
    end
    return res, rej, by
  end)
  if not ok then sp.close() error(out, 0) end
  local stream = {
    run = function(sink)
      local done, err = tar.extract(nil, { file = file, skip_unsafe = true, max_bytes = sp.size,
        sink = function(ap, chunk) local rel = map[ap] if rel then sink(rel, chunk) end end })
      if not done then fail("SandboxExecutionError", "download_dir: " .. tostring(err), { op = "download_dir" }) end
    end,
    close = sp.close,
  }
  return out, rejected, stream
end

function M.mkdir(h, path)
  local p = abs(path, "mkdir")
  local link = link_of(h)
  if link then
    local ok, errno, msg = link:mkdir(p)
    if not ok then file_error("mkdir", p, errno, msg) end
    return
  end
  local _, err, code = agent(h, { "mkdir", p }, "mkdir")
  if code == 4 then fail("PathError", "mkdir: " .. err, { op = "mkdir" }) end
  if code ~= 0 then fail("SandboxExecutionError", "mkdir: " .. err, { op = "mkdir" }) end
end

function M.remove(h, path, recursive)
  local p = abs(path, "remove")
  if p == "/" then fail("PathError", "remove: refusing to remove /", { op = "remove" }) end
  local link = link_of(h)
  if link then
    local ok, errno, msg = link:remove(p, recursive)
    if not ok and name_of(errno) == "ENOTEMPTY" then fail("PathError", "remove: " .. p .. ": directory not empty", { op = "remove" }) end
    if not ok then file_error("remove", p, errno, msg) end
    return
  end
  local args = recursive and { "rm", "-r", p } or { "rm", p }
  local _, err, code = agent(h, args, "remove")
  if code == 3 then fail("FileNotFoundError", "remove: " .. p .. ": No such file or directory", { op = "remove" }) end
  if code == 4 then fail("PathError", "remove: " .. p .. ": directory not empty", { op = "remove" }) end
  if code ~= 0 then fail("SandboxExecutionError", "remove: " .. err, { op = "remove" }) end
end

return M
