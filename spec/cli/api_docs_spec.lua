-- docs/api.md is the project's own API reference (a clone has no
-- ../shared/API.md): every public function and table of `sbx`, every
-- method of its objects, every subcommand and option is named there, and
-- its help block is the program's own help text.
local cli_table = require "sbx.cli.table"

local SOURCE = os.getenv("SBX_SOURCE_DIR") or "."

local function read(path)
  local f = assert(io.open(SOURCE .. "/" .. path))
  local s = f:read("a")
  f:close()
  return s
end

local function has(doc, s) return doc:find(s, 1, true) ~= nil end

local function public(t)
  local out = {}
  for k in pairs(t) do
    if type(k) == "string" and not k:match("^_") then out[#out + 1] = k end
  end
  table.sort(out)
  return out
end

describe("docs/api.md", function()
  local doc = read("docs/api.md")

  it("names every public field of sbx and of its sub-tables", function()
    local sbx = require "sbx"
    for _, k in ipairs(public(sbx)) do
      assert.is_true(has(doc, "`sbx." .. k), "docs/api.md does not document sbx." .. k)
    end
    for _, sub in ipairs{ "errors", "agent", "json" } do
      for _, k in ipairs(public(sbx[sub])) do
        assert.is_true(has(doc, "sbx." .. sub .. "." .. k), "docs/api.md does not document sbx." .. sub .. "." .. k)
      end
    end
  end)

  it("names every method of a sandbox, a background process, a task and a pool", function()
    local sbx = require "sbx"
    local sb <close> = sbx.sandbox("local")
    local p = sb:spawn("true")
    local pool <close> = sbx.pool{ backend = "local", size = 1 }
    local task = sbx.spawn(function() end)
    task:join()
    local objects = { sb = getmetatable(sb).__index, p = getmetatable(p).__index,
                      pool = getmetatable(pool).__index, t = getmetatable(task).__index }
    p:wait()
    for var, methods in pairs(objects) do
      for _, m in ipairs(public(methods)) do
        if type(methods[m]) == "function" then
          assert.is_true(has(doc, var .. ":" .. m .. "(") or has(doc, var .. ":" .. m .. "{"),
                         "docs/api.md does not document " .. var .. ":" .. m)
        end
      end
    end
    for _, field in ipairs{ "sb.id", "sb.backend", "sb.workdir", "p.pid" } do
      assert.is_true(has(doc, field), field)
    end
  end)

  it("has a section for every subcommand and names every option", function()
    for _, c in ipairs(cli_table.COMMANDS) do
      assert.is_true(has(doc, "### sbxlua " .. c.name), "no section for sbxlua " .. c.name)
      for _, o in ipairs(c.options) do
        assert.is_true(has(doc, "--" .. o.name), c.name .. " --" .. o.name)
      end
    end
    for _, o in ipairs(cli_table.GLOBAL) do assert.is_true(has(doc, "--" .. o.name), o.name) end
    for _, e in ipairs(cli_table.ENV) do assert.is_true(has(doc, e[1]), e[1]) end
  end)

  it("its help block is sbxlua --help", function()
    local block = doc:match("<!%-%- help:begin %-%->\n```\n(.-)```\n<!%-%- help:end %-%->")
    assert.is_string(block, "no help block")
    assert.equal(cli_table.help_text(), block,
                 "regenerate: build/sbxlua -e 'io.write(require(\"sbx.cli\").help_text())'")
  end)

  it("the README links the project's own docs, not a file outside the clone", function()
    local readme = read("README.md")
    assert.is_nil(readme:find("../shared/", 1, true))
    assert.is_nil(read("docs/README.md"):find("../shared/", 1, true))
    assert.is_true(has(readme, "(docs/api.md)"))
  end)
end)
