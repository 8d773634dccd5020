--- One loader for the files sbxlua reads as scripts (providers, policies
--- and presets): a search path
--- ($ENV, the config's list, then the copies built into the binary),
--- compile through a kind-specific function, reload when the file's stat
--- signature changes, an atomic swap, and the last good version kept when
--- an edit is broken (STYLE.md 14-16).
---
---   local L = scripts.new{ kind = "provider", env = "SBX_PROVIDER_PATH",
---                          key = "provider_path", builtin = "providers/",
---                          compile = function(source, chunkname, name, key) ... end }
---   L:get(name [, dirs]) -> entry | nil, why, "missing"|"broken"
---   entry: { value =, name =, key =, file =, sig =, version = }
local script = require "sbx.script"
local fs = require "sbx.fs"

local M = {}

M.MAX_SOURCE = 256 * 1024

local Loader = {}
Loader.__index = Loader

---@param o table kind, env, key, builtin (prefix of embedded names), compile, warn?, max_source?,
---on_swap? (called with a version that is replaced or forgotten: close what it holds),
---dirs? (a function returning the directories, instead of $ENV and the config's list)
function M.new(o)
  assert(type(o.compile) == "function", "scripts.new: compile is required")
  return setmetatable({ kind = o.kind, env = o.env, key = o.key, prefix = o.builtin,
                        compile = o.compile, max_source = o.max_source or M.MAX_SOURCE,
                        on_swap = o.on_swap or function() end, dirs_fn = o.dirs,
                        warn = o.warn or function(msg) io.stderr:write("sbxlua: ", msg, "\n") end,
                        cache = {}, versions = 0 }, Loader)
end

---The directories searched, in order: $ENV, then the config's list (a
---broken config only drops its part).
function Loader:dirs()
  if self.dirs_fn then return self.dirs_fn() end
  return require("sbx.core.config").search_path(self.env, self.key, true)
end

local function valid_name(name) return type(name) == "string" and name:match("^[%w_][%w_%-%.]*$") ~= nil end

---Resolve a name (or a path to a file) to its cache key: the path of the
---first file on the search path, or "builtin:<name>".
function Loader:resolve(name, dirs)
  if type(name) ~= "string" or name == "" then return nil, "a " .. self.kind .. " name must be a non-empty string" end
  if name:find("/", 1, true) then
    if not script.stat(name) then return nil, "no " .. self.kind .. " file " .. name end
    return name
  end
  if not valid_name(name) then return nil, "bad " .. self.kind .. " name '" .. name .. "'" end
  for _, d in ipairs(dirs or self:dirs()) do
    local p = d .. "/" .. name .. ".lua"
    if script.stat(p) then return p end
  end
  if self.prefix and script.has_builtin(self.prefix .. name) then return "builtin:" .. name end
  return nil, "unknown " .. self.kind .. " '" .. name .. "'"
end

---Names of every script on the search path and built in (first one wins).
---Each call lists the directories again: a directory's mtime is too coarse
---(a clock tick) to tell that a file was added since the last listing.
function Loader:names(dirs)
  local seen, out = {}, {}
  for _, d in ipairs(dirs or self:dirs()) do
    for _, f in ipairs(fs.list_host(d) or {}) do
      local n = f:match("^(.+)%.lua$")
      if n and valid_name(n) and not seen[n] then seen[n] = true; out[#out + 1] = n end
    end
  end
  for _, full in ipairs(self.prefix and script.builtins(self.prefix) or {}) do
    local n = full:sub(#self.prefix + 1)
    if not seen[n] then seen[n] = true; out[#out + 1] = n end
  end
  table.sort(out)
  return out
end

---The source of a key: text, chunkname (without "@"), or nil, why.
function Loader:source(key)
  if key:sub(1, 8) == "builtin:" then
    local src = script.builtin(self.prefix .. key:sub(9))
    if not src then return nil, nil, "no built-in " .. self.kind .. " '" .. key:sub(9) .. "'" end
    return src, self.prefix .. key:sub(9) .. ".lua (built-in)"
  end
  local src, err = fs.read_host(key, self.max_source + 1)
  if not src then return nil, nil, (tostring(err):gsub("^read: ", "")) end
  if #src > self.max_source then return nil, nil, key .. ": larger than " .. self.max_source .. " bytes" end
  return src, key
end

local function name_of(key)
  return key:match("^builtin:(.*)$") or key:match("([^/]+)%.lua$") or key:match("([^/]+)$")
end

---Compile `key` now, without caching: value, or nil, why.
function Loader:load(key)
  local src, file, err = self:source(key)
  if not src then return nil, err end
  local ok, value, cerr = pcall(self.compile, src, file, name_of(key), key)
  if not ok then return nil, type(value) == "table" and value.message or tostring(value) end
  if value == nil then return nil, tostring(cerr) end
  return value, nil, file
end

-- (Re)load `key`: swap in the new version only when it compiles; a broken
-- edit keeps the last good one (and says why, once per broken version).
function Loader:reload(key, sig)
  local cur = self.cache[key]
  local value, err, file = self:load(key)
  if value == nil then
    if cur and cur.value ~= nil then
      if cur.broken_sig ~= sig then
        cur.broken_sig, cur.error = sig, err
        self.warn(self.kind .. " " .. key .. " changed but the new version is broken (" .. err
                  .. "); keeping the last good version")
      end
      return cur
    end
    self.cache[key] = { key = key, sig = sig, error = err }
    return self.cache[key]
  end
  self.versions = self.versions + 1
  local entry = { value = value, key = key, file = file, name = name_of(key), sig = sig,
                  version = self.versions }
  self.cache[key] = entry          -- the atomic swap: users of the old value keep it
  if cur and cur.value ~= nil then self.on_swap(cur.value) end
  return entry
end

---The current good version of `name`, reloading it when its file changed.
---@return table|nil entry, string? why, string? "missing"|"broken"
function Loader:get(name, dirs)
  local key, err = self:resolve(name, dirs)
  if not key then return nil, err, "missing" end
  return self:get_key(key)
end

---The same for a key resolve() (or the caller's own resolution) gave.
function Loader:get_key(key)
  local sig = key:sub(1, 8) == "builtin:" and "builtin" or script.stat(key) or "gone"
  local cur = self.cache[key]
  if not cur or (cur.sig ~= sig and cur.broken_sig ~= sig) then cur = self:reload(key, sig) end
  if cur.value == nil then return nil, cur.error, "broken" end
  return cur
end

---Forget everything loaded (tests).
function Loader:reset()
  for _, e in pairs(self.cache) do if e.value ~= nil then self.on_swap(e.value) end end
  self.cache = {}
end

return M
