-- Embedding: a stock lua5.4 loads sbx.so with require "sbx" and drives
-- sandboxes; outside any task, waiting calls run the loop themselves.
local proc = require "sbx.proc"

local MODDIR = os.getenv("SBX_MODULE_DIR") or "build"
local STATE = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/embed-" .. proc.getpid()

local function lua54(code)
  local env = { "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" .. STATE, "SBX_STATE_DIR=" .. STATE,
                "LUA_CPATH=" .. MODDIR .. "/?.so;;" }
  local preload = os.getenv("SBX_PRELOAD") or ""
  if preload ~= "" then  -- sanitizer build: the runtime must load first
    env[#env + 1] = "LD_PRELOAD=" .. preload
    env[#env + 1] = "ASAN_OPTIONS=detect_leaks=0"  -- lua5.4 itself is not ours
  end
  local p = assert(proc.spawn{ argv = { "lua5.4", "-e", code }, env = env, timeout = 60 })
  return p:wait()
end

describe("require 'sbx' from a stock lua5.4", function()
  it("runs a small job", function()
    local r = lua54([[
      local sbx = require "sbx"
      local sb <close> = sbx.sandbox("local")
      io.write(sb:execute_code("print(6 * 7)").stdout)
      sb:write_file("/x/y.txt", "embedded")
      io.write(sb:read_file("x/y.txt"), "\n")
      local res = sbx.parallel({1, 2, 3}, function(n)
        return sb:execute_command("sh", {"-c", "sleep 0.2; echo " .. n}).stdout
      end)
      io.write(table.concat(res))
      local t = sbx.spawn(function() sbx.sleep(0.05) return "joined" end)
      print(select(2, t:join()))
    ]])
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("42\nembedded\n1\n2\n3\njoined\n", r.stdout)
  end)

  it("raises typed errors", function()
    local r = lua54([[
      local sbx = require "sbx"
      local ok, err = pcall(sbx.sandbox, "nope")
      print(err.kind, sbx.errors.is(err, "SandboxError"))
    ]])
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("ConfigError\ttrue\n", r.stdout)
  end)
end)

describe("SBX_LUA_PATH (the source tree instead of the embedded modules)", function()
  local fs = require "sbx.fs"
  local function run(dir, code)
    local env = { "PATH=/usr/bin:/bin", "HOME=" .. STATE, "SBX_STATE_DIR=" .. STATE, "SBX_LUA_PATH=" .. dir }
    return require("spec.support").sbxlua({ "-e", code }, { env = env, timeout = 60, preload = true })
  end

  it("takes what the tree has, the embedded copy for the rest, and raises its syntax errors", function()
    local dir = assert(fs.mkdtemp("/tmp", "sbxlp"))
    local root = assert(fs.open_root(dir))
    assert(root:mkdir("sbx"))
    assert(root:write("sbx/wire.lua", "return { from_tree = true }"))
    local r = run(dir, 'io.write(tostring(require("sbx.wire").from_tree), " ", '
                    .. 'sbx.sandbox("local"):execute_command("echo embedded-rest").stdout)')
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("true embedded-rest\n", r.stdout)
    assert(root:write("sbx/wire.lua", "return {"))
    r = run(dir, 'require "sbx.wire"')
    assert.not_equal(0, r.exit_code)
    assert.matches("wire%.lua:1:", r.stderr)
    root:close()
    fs.rmtree(dir)
  end)
end)
