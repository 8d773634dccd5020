-- sbxlua(1) from `sbxlua --help`: run by the sbxlua just built, at build time.
--   sbxlua cmake/manpage.lua SBXLUA OUT.1 VERSION
-- The help's first block (usage: ...) becomes SYNOPSIS; a block that starts
-- with "WORD:" becomes the section WORD; lines keep their layout (.nf).
local bin, out, version = arg[1], arg[2], arg[3]
assert(bin and out and version, "usage: sbxlua cmake/manpage.lua SBXLUA OUT.1 VERSION")

local p = assert(io.popen("'" .. bin:gsub("'", "'\\''") .. "' --help", "r"))
local help = p:read("a")
assert(p:close(), "sbxlua --help failed")
assert(help:find("^usage:"), "sbxlua --help does not start with usage:")

-- roff: a backslash is \e, a minus \-, a line may not start with . or '
local function roff(line)
  line = line:gsub("\\", "\\e"):gsub("%-", "\\-")
  if line:find("^[.']") then line = "\\&" .. line end
  return line
end

local blocks, cur = {}, nil
for line in (help .. "\n"):gmatch("(.-)\n") do
  if line:find("^%s*$") then
    cur = nil
  else
    if not cur then
      cur = {}
      blocks[#blocks + 1] = cur
    end
    cur[#cur + 1] = line
  end
end

local page = {
  '.TH SBXLUA 1 "" "sbxlua ' .. version .. '" "User Commands"',
  ".SH NAME",
  "sbxlua \\- a sandbox orchestrator: Lua 5.4 jobs that create, route and clean up sandboxes",
}
for i, b in ipairs(blocks) do
  -- a section starts with a lone "WORD:" line; "Exit status: 2 ..." is text
  local head, first = b[1]:match("^(%a[%w ()]-):%s*(.*)$")
  if first ~= "" then head = nil end
  local title
  if i == 1 then
    title, first = "SYNOPSIS", b[1]:gsub("^usage:%s*", "")
  elseif head then
    title = head:gsub("%s*%b()", ""):upper()
  else
    title, first = "DESCRIPTION", b[1]
  end
  page[#page + 1] = ".SH " .. title
  page[#page + 1] = ".nf"
  -- continuation lines lose the indent of the first line's label
  local indent = i == 1 and #"usage: " or (head and #head + 2 or 0)
  if first ~= "" then page[#page + 1] = roff(first) end
  for k = 2, #b do
    local l = b[k]
    local lead = #l:match("^%s*")
    page[#page + 1] = roff(l:sub(math.min(lead, indent) + 1))
  end
  page[#page + 1] = ".fi"
end
page[#page + 1] = ".SH FILES"
page[#page + 1] = ".nf"
page[#page + 1] = roff("$SBX_STATE_DIR, else $XDG_STATE_HOME/sbxlua, else ~/.local/state/sbxlua:")
page[#page + 1] = roff("    sessions/ (journals and locks), ledger.jsonl (spend), decisions.jsonl (routing)")
page[#page + 1] = roff("share/sbxlua/: the built-in policies, presets and provider docs (for reading and copying)")
page[#page + 1] = ".fi"
page[#page + 1] = ".SH SEE ALSO"
page[#page + 1] = "lua5.4(1), bwrap(1), docker(1); the README and docs in share/doc/sbxlua"
local f = assert(io.open(out .. ".tmp", "w"))
f:write(table.concat(page, "\n"), "\n")
f:close()
assert(os.rename(out .. ".tmp", out))
