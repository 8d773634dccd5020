--- Sandbox paths for backends with a filesystem of their own (containers):
--- relative paths resolve against the working directory; `..` never climbs
--- above `/`; the result is absolute and normalized.
local errors = require "sbx.core.errors"

local M = {}

---@param workdir string absolute working directory
---@param path string sandbox path
---@param op string operation name for errors
---@return string absolute normalized path
function M.resolve(workdir, path, op)
  if type(path) ~= "string" then errors.raise("ConfigError", op .. ": path must be a string") end
  if path:find("\0", 1, true) then errors.raise("PathError", op .. ": path contains a NUL byte", { op = op }) end
  if #path > 4096 then errors.raise("PathError", op .. ": path is longer than 4096 bytes", { op = op }) end
  local full = path:sub(1, 1) == "/" and path or (workdir .. "/" .. path)
  local parts = {}
  for seg in full:gmatch("[^/]+") do
    if seg == ".." then
      if #parts == 0 then
        errors.raise("PathError", op .. ": " .. path .. " leaves the sandbox", { op = op })
      end
      parts[#parts] = nil
    elseif seg ~= "." then
      parts[#parts + 1] = seg
    end
  end
  return "/" .. table.concat(parts, "/")
end

---Split an absolute normalized path into its directory and base name.
function M.split(abs)
  local dir, base = abs:match("^(.*)/([^/]+)$")
  if not dir then return "/", "" end
  return dir == "" and "/" or dir, base
end

---Does a symlink at `rel` (relative to a directory) with `target` point out
---of that directory? Absolute targets always do, and so does a ".." after a
---name: the name may be another link of the tree (x -> "." makes "x/.." the
---directory's parent), which this lexical check cannot see.
function M.link_escapes(rel, target)
  local depth, escapes = select(2, rel:gsub("/", "")), target:sub(1, 1) == "/"
  local named = false
  for seg in target:gmatch("[^/]+") do
    depth = depth + (seg == ".." and -1 or seg == "." and 0 or 1)
    if depth < 0 or (seg == ".." and named) then escapes = true end
    named = named or (seg ~= ".." and seg ~= ".")
  end
  return escapes
end

return M
