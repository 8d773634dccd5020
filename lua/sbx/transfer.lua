--- Directory transfer between the host and a sandbox (upload_dir,
--- download_dir). Host directories are read and written through jailed roots
--- (sbx.fs): nothing follows a symlink out of them. Providers move the tree
--- with put_tree/get_tree (an archive on container backends).
local fs = require "sbx.fs"
local errors = require "sbx.errors"

local M = {}

local PERM = tonumber("777", 8)    -- setuid/setgid/sticky never travel
local MAX_BYTES = 1024 * 1024 * 1024

local function join(a, b) return a == "" and b or (a .. "/" .. b) end

---Read a host directory: entries (dirs before their contents) and the
---symlinks and special files that were left out.
function M.read_host_tree(dir)
  local root, err, code = fs.open_root(dir)
  if not root then
    errors.raise(code == "ENOENT" and "FileNotFoundError" or "PathError", "upload_dir: " .. err,
                 { op = "upload_dir" })
  end
  local entries, skipped, total = {}, {}, 0
  local function walk(rel)
    local list, lerr = root:list(rel == "" and "." or rel)
    if not list then errors.raise("PathError", "upload_dir: " .. lerr, { op = "upload_dir" }) end
    for _, it in ipairs(list) do
      local p = join(rel, it.name)
      if it.type == "dir" then
        local st = root:stat(p)
        entries[#entries + 1] = { path = p, type = "dir", mode = (st and st.mode or 493) & PERM }
        walk(p)
      elseif it.type == "file" then
        local data, rerr, rcode = root:read(p)
        if not data then errors.core("upload_dir: " .. rerr, rcode, nil, "upload_dir") end
        total = total + #data
        if total > MAX_BYTES then
          errors.raise("SandboxExecutionError", "upload_dir: " .. dir .. " holds more than 1 GiB",
                       { op = "upload_dir", code = "ETOOBIG" })
        end
        local st = root:stat(p)
        entries[#entries + 1] = { path = p, type = "file", data = data, mode = (st and st.mode or 420) & PERM }
      else
        skipped[#skipped + 1] = p   -- symlinks are not followed; devices never travel
      end
    end
  end
  walk("")
  root:close()
  return entries, skipped
end

---Write entries (from a sandbox) under a host directory, after checking all
---of them: one hostile entry and nothing is written.
function M.write_host_tree(dir, entries, rejected)
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
  local skipped = {}
  for _, e in ipairs(entries) do
    local r, werr, code
    if e.type == "dir" then
      r, werr, code = root:mkdir(e.path)
    elseif e.type == "file" then
      r, werr, code = root:write(e.path, e.data, (e.mode or 420) & PERM)
    else
      skipped[#skipped + 1] = e.path
      r = true
    end
    if not r then
      root:close()
      errors.core("download_dir: " .. werr, code, nil, "download_dir")
    end
  end
  root:close()
  return skipped
end

return M
