--- The bwrap provider's files: sandbox paths resolved the way the sandbox
--- does (symlinks followed inside its tree, across its mounts; every access
--- beneath one mount's host directory), the read-only parts refused, and
--- the file operations and trees over them.
local fs = require "sbx.fs"
local native = require "sbx.bwrap"
local errors = require "sbx.core.errors"
local paths = require "sbx.core.paths"
local common = require "sbx.providers.builtin.bwrap.common"
local layout = require "sbx.providers.builtin.bwrap.layout"
local holder = require "sbx.providers.builtin.bwrap.holder"

local M = {}
local fail, core_fail, own = common.fail, common.core_fail, holder.own
local segments, under, SPECIAL = layout.segments, layout.under, common.SPECIAL

-- Where sandbox path p (absolute, normalized) lives: { kind = "mount"
-- (dir, rel, m), "virtual" (a directory of a tmpfs, or a hidden one),
-- "null" (a hidden file: /dev/null in its place), "missing" (inside a
-- tmpfs or a hidden directory), "special" (/proc, /dev) }.
local function where(h, p)
  for _, s in ipairs(SPECIAL) do
    if p == s or p:sub(1, #s + 1) == s .. "/" then return { kind = "special", path = p } end
  end
  local L = layout.layout()
  for _, e in ipairs(L.hidden) do
    if p == e.path then return { kind = e.dir and "virtual" or "null", path = p, hidden = true } end
    if under(p, e.path) then return { kind = "missing", path = p } end
  end
  if L.virtual[p] then return { kind = "virtual", path = p } end
  for _, m in ipairs(h.mounts) do
    local prefix = m.path == "/" and "/" or m.path .. "/"
    if m.path == p or p:sub(1, #prefix) == prefix then
      if m.tmpfs or (m.name and m.path ~= p) then return { kind = "missing", path = p, m = m } end
      local rel = m.path == p and "" or p:sub(#prefix + 1)
      if m.name then rel = m.name end
      return { kind = "mount", m = m, dir = m.dir, rel = rel, path = p }
    end
  end
end

local MAXLINKS = 40

-- Resolve a sandbox path as the sandbox would, following symlinks across
-- its mounts (the last one only when `follow`); returns where() of it.
local function resolve(h, path, op, follow)
  local parts = segments(paths.resolve(common.WORKDIR, path, op))
  local hops, i = 0, 1
  while i <= #parts do
    if i < #parts or follow then
      local cur = "/" .. table.concat(parts, "/", 1, i)
      local t, target = where(h, cur)
      if t.kind == "special" then
        fail("PathError", op .. ": " .. path .. ": /proc and /dev are not reachable through the file API", { op = op })
      elseif t.kind == "missing" then
        break
      elseif t.kind == "mount" then
        local st, err, code = native.lookup(t.dir, t.rel)
        if st and st.type == "link" then target = st.target
        elseif not st and (code == "ENOENT" or code == "ENOTDIR") then break
        elseif not st then core_fail(op, path, err, code) end
      end
      if target then
        hops = hops + 1
        if hops > MAXLINKS then
          fail("PathError", op .. ": " .. path .. ": too many levels of symbolic links", { op = op, code = "ELOOP" })
        end
        local base = target:sub(1, 1) == "/" and "" or table.concat(parts, "/", 1, i - 1)
        parts = segments(base .. "/" .. target .. "/" .. table.concat(parts, "/", i + 1))
        i = 0
      end
    end
    i = i + 1
  end
  return where(h, "/" .. table.concat(parts, "/"))
end

local function root_of(h, dir)
  local r = h.roots[dir]
  if not r then
    local err, code
    r, err, code = fs.open_root(dir)
    if not r then errors.core(err, code, "bwrap", "open") end
    h.roots[dir] = r
  end
  return r
end

local function read_only(op, path)
  fail("PathError", op .. ": " .. path .. ": read-only in a bwrap sandbox", { op = op, code = "EROFS" })
end

local function not_found(op, path)
  fail("FileNotFoundError", op .. ": " .. path .. ": No such file or directory", { op = op, code = "ENOENT" })
end

local function writable(h, path, op, follow)
  local t = resolve(h, path, op, follow)
  if t.kind == "mount" and not t.m.ro then return t end
  if t.kind == "special" then
    fail("PathError", op .. ": " .. path .. ": /proc and /dev are not reachable through the file API", { op = op })
  end
  read_only(op, path)
end

local function call(h, t, op, path, method, ...)
  local root = root_of(h, t.dir)
  local r, err, code = root[method](root, t.rel, ...)
  if r == nil then core_fail(op, path, err, code) end
  -- the sandbox's own files, as if it had written them (sbxlua as root)
  if h.uid and t.m.path == "/" and (method == "write" or method == "mkdir") then own(h, t.rel) end
  return r
end

function M.read_file(h, path, max)
  local t = resolve(h, path, "read_file", true)
  if t.kind == "virtual" then fail("PathError", "read_file: " .. path .. ": Is a directory", { op = "read_file", code = "EISDIR" }) end
  if t.kind == "null" then return "" end
  if t.kind ~= "mount" then not_found("read_file", path) end
  return call(h, t, "read_file", path, "read", max)
end

function M.write_file(h, path, data, mode)
  call(h, writable(h, path, "write_file", true), "write_file", path, "write", data, mode)
end

function M.mkdir(h, path)
  local t = resolve(h, path, "mkdir", true)
  if t.kind == "virtual" then return end
  if t.kind == "mount" and t.m.ro then
    local st = native.lookup(t.dir, t.rel)
    if st and st.type == "dir" then return end
    read_only("mkdir", path)
  end
  if t.kind ~= "mount" then read_only("mkdir", path) end
  call(h, t, "mkdir", path, "mkdir")
end

-- The names of the root the sandbox's layout depends on, and mount paths.
local function protected(h, p)
  if p == "/" or layout.layout().virtual[p] then return true end
  for _, e in ipairs(h.top) do if p == "/" .. e.name then return true end end
  for _, m in ipairs(h.mounts) do if m.path == p then return true end end
  return false
end

function M.remove(h, path, recursive)
  local t = resolve(h, path, "remove", false)
  if protected(h, t.path) then
    fail("PathError", "remove: " .. path .. " is part of the sandbox's layout", { op = "remove", code = "EBUSY" })
  end
  if t.kind == "missing" then not_found("remove", path) end
  if t.kind ~= "mount" or t.m.ro then read_only("remove", path) end
  call(h, t, "remove", path, "remove", recursive)
end

local function entry(name, prefix, st)
  return { name = name, path = prefix .. name, is_dir = st.type == "dir", type = st.type,
           size = st.size or 0, mtime = st.mtime or 0 }
end

-- stat of what sandbox path p shows (through its mount), or nil
local function shown(h, p)
  local t = where(h, p)
  if t.kind == "virtual" then return { type = "dir", size = 0, mtime = 0 } end
  if t.kind == "null" then return { type = "char", size = 0, mtime = 0 } end
  if t.kind == "mount" then return native.lookup(t.dir, t.rel) end
end

function M.list_files(h, path)
  local t = resolve(h, path, "list_files", true)
  local prefix = (path == "" or path == ".") and "" or (path:sub(-1) == "/" and path or path .. "/")
  local base = t.path == "/" and "/" or t.path .. "/"
  if t.kind == "virtual" then
    local names, seen = {}, {}
    local L = layout.layout()
    local function consider(p)
      if p:sub(1, #base) == base and not p:find("/", #base + 1, true) and not seen[p] then
        seen[p] = true
        names[#names + 1] = p:sub(#base + 1)
      end
    end
    for _, m in ipairs(h.mounts) do consider(m.path) end
    for v in pairs(L.virtual) do consider(v) end
    table.sort(names)
    local list = {}
    for _, n in ipairs(names) do
      local st = shown(h, base .. n)
      if st then list[#list + 1] = entry(n, prefix, st) end
    end
    return list
  end
  if t.kind ~= "mount" then not_found("list_files", path) end
  local list = call(h, t, "list_files", path, "list")
  for _, e in ipairs(list) do
    e.path = prefix .. e.name
    local child = base .. e.name
    local c = where(h, child)
    if c.kind ~= "mount" or c.m ~= t.m then     -- a mount point: show what is mounted
      local st = shown(h, child)
      if st then
        e.type, e.is_dir, e.size, e.mtime = st.type, st.type == "dir", st.size, st.mtime
      end
    end
  end
  return list
end

local function join(a, b) return (a == "" or a == ".") and b or (a:gsub("/+$", "") .. "/" .. b) end

---Write a tree of entries ({path, type = "dir"|"file", data, mode}) under dir,
---each path resolved as the sandbox would.
function M.put_tree(h, dir, entries)
  M.mkdir(h, dir)
  for _, e in ipairs(entries) do
    local p = join(dir, e.path)
    if e.type == "dir" then M.mkdir(h, p)
    elseif e.type == "file" then   -- root to root through a small buffer
      local t = writable(h, p, "upload_dir", true)
      require("sbx.core.transfer").copy_in(e, root_of(h, t.dir), t.rel)
    end
  end
end

-- lookup of what sandbox path p names, not following a last symlink
local function lstat(h, p, op)
  local t = resolve(h, p, op, false)
  if t.kind == "mount" then return native.lookup(t.dir, t.rel) end
  return shown(h, t.path)
end

---Read the tree under dir: entries, and the rejected ones (links are not
---followed; one pointing out of the directory is hostile).
function M.get_tree(h, dir)
  local entries, rejected = {}, {}
  local function walk(rel)
    for _, it in ipairs(M.list_files(h, rel == "" and dir or join(dir, rel))) do
      local r = rel == "" and it.name or rel .. "/" .. it.name
      local full = join(dir, r)
      local st = lstat(h, full, "download_dir") or {}
      if it.type == "dir" then
        entries[#entries + 1] = { path = r, type = "dir", mode = st.mode }
        walk(r)
      elseif it.type == "file" then   -- copied at write time, through a small buffer
        local t = resolve(h, full, "download_dir", true)
        local e = { path = r, type = "file", mode = st.mode }
        if t.kind == "mount" then
          local root = root_of(h, t.dir)
          e.copy = function(dst, rel, mode) return root:copy(t.rel, dst, rel, mode) end
        elseif t.kind == "null" then e.data = ""         -- a hidden file reads empty
        else not_found("download_dir", full) end
        entries[#entries + 1] = e
      elseif it.type == "link" then
        local target = st.target or "/"
        if require("sbx.core.paths").link_escapes(r, target) then rejected[#rejected + 1] = { path = r, reason = "symlink out of the directory" }
        else entries[#entries + 1] = { path = r, type = "symlink" } end
      else
        entries[#entries + 1] = { path = r, type = it.type }
      end
    end
  end
  walk("")
  return entries, rejected
end

M.resolve, M.not_found = resolve, not_found

return M
