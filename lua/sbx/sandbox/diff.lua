--- Applying a unified diff to files in a sandbox, like `patch -p1` in a
--- directory, but all or nothing: if any hunk does not apply, nothing is
--- written and the error lists the rejected hunks.
local errors = require "sbx.core.errors"
local check = require "sbx.core.check"

local M = {}

local FUZZ = 50   -- how far (in lines) a hunk may have moved

-- Split into lines that keep their "\n" (the last one may lack it).
local function lines_of(text)
  local out = {}
  for line in text:gmatch("[^\n]*\n?") do
    if line ~= "" then out[#out + 1] = line end
  end
  return out
end

local function strip_path(p, n)
  p = p:gsub("\t.*$", "")
  if p == "/dev/null" then return nil end
  for _ = 1, n do
    local rest = p:match("^[^/]*/(.*)$")
    if not rest then return p end
    p = rest
  end
  return p
end

---Parse a unified diff: { { old =, new =, hunks = { {old_start, lines = {{op, text}}} } } }
function M.parse(diff, strip)
  local files, cur, hunk = {}, nil, nil
  local lines = lines_of(diff)
  local i = 1
  while i <= #lines do
    local l = lines[i]
    if l:match("^%-%-%- ") and lines[i + 1] and lines[i + 1]:match("^%+%+%+ ") then
      cur = { old = strip_path(l:sub(5):gsub("\n$", ""), strip),
              new = strip_path(lines[i + 1]:sub(5):gsub("\n$", ""), strip), hunks = {} }
      files[#files + 1] = cur
      hunk = nil
      i = i + 2
    elseif l:match("^@@ ") then
      local os_, _, ns = l:match("^@@ %-(%d+),?(%d*) %+(%d+)")
      if not cur or not os_ then
        errors.raise("SandboxExecutionError", "patch: malformed hunk header: " .. l:gsub("\n$", ""), { op = "patch" })
      end
      hunk = { old_start = tonumber(os_), new_start = tonumber(ns), lines = {}, header = l:gsub("\n$", "") }
      cur.hunks[#cur.hunks + 1] = hunk
      i = i + 1
    elseif hunk and (l:match("^[ %-%+]") or l == "\n") then
      local op = l == "\n" and " " or l:sub(1, 1)
      hunk.lines[#hunk.lines + 1] = { op, l == "\n" and "\n" or l:sub(2) }
      i = i + 1
    elseif hunk and l:match("^\\") then   -- "\ No newline at end of file"
      local last = hunk.lines[#hunk.lines]
      if last then last[2] = last[2]:gsub("\n$", "") end
      i = i + 1
    else
      hunk = nil                           -- commentary between files
      i = i + 1
    end
  end
  if #files == 0 then
    errors.raise("SandboxExecutionError", "patch: no file changes found in the diff", { op = "patch" })
  end
  return files
end

local function matches_at(src, at, want)
  for k, w in ipairs(want) do
    if src[at + k - 1] ~= w then return false end
  end
  return true
end

-- Apply the hunks of one file to its lines; returns new lines or nil, rejects.
local function apply_hunks(src, hunks)
  local out, pos, offset, rejects = {}, 1, 0, {}
  for n, h in ipairs(hunks) do
    local old, new = {}, {}
    for _, e in ipairs(h.lines) do
      if e[1] ~= "+" then old[#old + 1] = e[2] end
      if e[1] ~= "-" then new[#new + 1] = e[2] end
    end
    local want = math.max(h.old_start + offset, 1)
    if #old == 0 then want = h.old_start + 1 + offset end   -- a pure insertion
    local at
    for d = 0, FUZZ do
      for _, cand in ipairs{ want - d, want + d } do
        if not at and cand >= pos and cand <= #src + 1 and matches_at(src, cand, old) then at = cand end
      end
      if at then break end
    end
    if not at then
      rejects[#rejects + 1] = string.format("hunk %d (%s)", n, h.header)
    else
      for k = pos, at - 1 do out[#out + 1] = src[k] end
      for _, l in ipairs(new) do out[#out + 1] = l end
      pos = at + #old
      offset = offset + (at - want)
    end
  end
  for k = pos, #src do out[#out + 1] = src[k] end
  if #rejects > 0 then return nil, rejects end
  return out
end

---Apply `diff` to the files under opts.cwd (default the working directory).
---@return table { files = { paths changed } }
function M.apply(sb, diff, opts)
  if type(diff) ~= "string" then check.bad("patch", "the diff must be a string") end
  opts = check.options(opts, { cwd = "string", strip = "integer" }, "patch")
  local strip = opts.strip or 1
  local base = opts.cwd and (opts.cwd:gsub("/+$", "") .. "/") or ""
  local files = M.parse(diff, strip)
  local writes, removes, rejects = {}, {}, {}
  for _, f in ipairs(files) do
    local target = f.new or f.old
    if not target then
      errors.raise("SandboxExecutionError", "patch: a file change names no file", { op = "patch" })
    end
    local src = {}
    if f.old then
      local ok, text = pcall(sb.read_file, sb, base .. f.old)
      if ok then src = lines_of(text)
      else rejects[#rejects + 1] = f.old .. ": " .. tostring(type(text) == "table" and text.message or text) end
    end
    local out, why = apply_hunks(src, f.hunks)
    if not out then
      for _, r in ipairs(why) do rejects[#rejects + 1] = target .. ": " .. r end
    elseif f.new then
      writes[#writes + 1] = { base .. f.new, table.concat(out) }
    else
      removes[#removes + 1] = base .. f.old
    end
  end
  if #rejects > 0 then
    errors.raise("SandboxExecutionError", "patch: " .. #rejects .. " rejected, nothing applied: "
      .. table.concat(rejects, "; "), { op = "patch", rejects = rejects })
  end
  local changed = {}
  for _, w in ipairs(writes) do sb:write_file(w[1], w[2]) changed[#changed + 1] = w[1] end
  for _, r in ipairs(removes) do sb:remove(r) changed[#changed + 1] = r end
  return { files = changed }
end

return M
