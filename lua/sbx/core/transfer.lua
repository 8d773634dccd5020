--- Directory transfer between the host and a sandbox (upload_dir,
--- download_dir). Host directories are read and written through jailed roots
--- (sbx.fs): nothing follows a symlink out of them. Providers move the tree
--- with put_tree/get_tree. File data never sits whole in memory: it moves
--- root to root through one small buffer (root:copy), or a chunk at a time
--- (M.chunks, a stream's sink), so memory stays bounded whatever the size.
local fs = require "sbx.fs"
local errors = require "sbx.core.errors"

local M = {}

local PERM = tonumber("777", 8)    -- setuid/setgid/sticky never travel
M.CHUNK = 1024 * 1024              -- a piece of file data in flight

local function join(a, b) return a == "" and b or (a .. "/" .. b) end

---Read a host directory's tree (no data): entries (dirs before their
---contents; files with `size` and `src`, the host root to read them from),
---the symlinks and special files left out, and that root (close it after).
function M.read_host_tree(dir)
  local root, err, code = fs.open_root(dir)
  if not root then
    errors.raise(code == "ENOENT" and "FileNotFoundError" or "PathError", "upload_dir: " .. err,
                 { op = "upload_dir" })
  end
  local entries, skipped = {}, {}
  local function walk(rel)
    local list, lerr = root:list(rel == "" and "." or rel)
    if not list then root:close() errors.raise("PathError", "upload_dir: " .. lerr, { op = "upload_dir" }) end
    for _, it in ipairs(list) do
      local p = join(rel, it.name)
      if it.type == "dir" then
        local st = root:stat(p)
        entries[#entries + 1] = { path = p, type = "dir", mode = (st and st.mode or 493) & PERM }
        walk(p)
      elseif it.type == "file" then
        local st = root:stat(p)
        entries[#entries + 1] = { path = p, type = "file", size = it.size, src = root,
                                  mode = (st and st.mode or 420) & PERM }
      else
        skipped[#skipped + 1] = p   -- symlinks are not followed; devices never travel
      end
    end
  end
  walk("")
  return entries, skipped, root
end

---Copy a host file entry (from read_host_tree) to `rel` under `dst` (a root).
function M.copy_in(e, dst, rel)
  local n, err, code = e.src:copy(e.path, dst, rel, e.mode)
  if not n then errors.core("upload_dir: " .. err, code, nil, "upload_dir") end
  return n
end

---Iterate a host file entry's data a chunk at a time: for offset, chunk in
---M.chunks(e) (an empty file gives one empty chunk).
function M.chunks(e, size)
  size = size or M.CHUNK
  local off, done = 0, false
  return function()
    if done then return nil end
    local data, err, code = e.src:read_at(e.path, off, size)
    if not data then errors.core("upload_dir: " .. err, code, nil, "upload_dir") end
    if #data < size then done = true end
    if data == "" and off > 0 then return nil end
    local at = off
    off = off + #data
    return at, data
  end
end

---Write entries (from a sandbox) under a host directory, after checking all
---of them: one hostile entry and nothing is written. A file entry carries
---`data`, or `copy(dst_root, rel, mode)`; or, with `stream`, its data comes
---through stream.run(sink): sink(path, chunk) for each piece, in order.
function M.write_host_tree(dir, entries, rejected, stream)
  if rejected and #rejected > 0 then
    local names = {}
    for i, r in ipairs(rejected) do
      if i > 5 then names[#names + 1] = "..." break end
      names[#names + 1] = (r.path or "?") .. " (" .. (r.reason or r.code or "unsafe") .. ")"
    end
    errors.raise("PathError", "download_dir: refusing hostile entries: " .. table.concat(names, ", "),
                 { op = "download_dir" })
  end
  local ok, err = fs.mkdir_host(dir)
  if not ok then errors.raise("PathError", "download_dir: " .. err, { op = "download_dir" }) end
  local root = assert(fs.open_root(dir))
  local skipped, modes = {}, {}
  local function check(r, werr, code)
    if not r then
      root:close()
      errors.core("download_dir: " .. werr, code, nil, "download_dir")
    end
  end
  for _, e in ipairs(entries) do
    if e.type == "dir" then
      check(root:mkdir(e.path))
    elseif e.type == "file" then
      local mode = (e.mode or 420) & PERM
      if e.copy then
        local cok, n, werr, code = pcall(e.copy, root, e.path, mode)
        if not cok then root:close() error(n, 0) end
        check(n, werr, code)
      else
        check(root:write(e.path, e.data or "", mode))   -- a streamed file fills later
        modes[e.path] = mode
      end
    else
      skipped[#skipped + 1] = e.path
    end
  end
  if stream then
    local last
    local sok, serr = pcall(stream.run, function(path, chunk)
      local mode = modes[path]
      if not mode then return end            -- not an entry we took
      if path ~= last then                   -- a later duplicate starts it over
        last = path
        check(root:write(path, chunk, mode))
      else
        check(root:append(path, chunk))
      end
    end)
    if not sok then pcall(root.close, root) error(serr, 0) end
  end
  root:close()
  return skipped
end

return M
