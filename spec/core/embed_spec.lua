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

describe("exit cleanup in a stock lua5.4", function()
  local fs = require "sbx.fs"
  local json = require "cjson"
  local IMAGE = os.getenv("SBX_TEST_IMAGE") or "sbxlua-test:bookworm"
  local sh = require("spec.support").stdout
  local function docker_ok()
    local ok, d = pcall(require, "sbx.providers.builtin.docker")
    return ok and d.available() and sh("docker image inspect " .. IMAGE .. " >/dev/null 2>&1 && echo y") == "y\n"
  end
  -- What is left of this spec's state dir: session files, sandbox
  -- directories, and containers whose lock label is under it.
  local function left()
    local out = {}
    for _, n in ipairs(fs.list_host(STATE .. "/sessions") or {}) do out[#out + 1] = "sessions/" .. n end
    for _, b in ipairs{ "local", "bwrap" } do
      for _, s in ipairs(fs.list_host(STATE .. "/" .. b) or {}) do
        for _, n in ipairs(fs.list_host(STATE .. "/" .. b .. "/" .. s) or {}) do
          -- an empty spare directory is kept on purpose (docs/README.md, state directory)
          local spare = s == ".spare" and #(fs.list_host(STATE .. "/" .. b .. "/" .. s .. "/" .. n) or { 1 }) == 0
          if not spare then out[#out + 1] = b .. "/" .. s .. "/" .. n end
        end
      end
    end
    if docker_ok() then
      local list = json.decode(sh("curl -s --unix-socket /var/run/docker.sock "
        .. "'http://d/containers/json?all=true&filters=%7B%22label%22%3A%5B%22sbxlua.lock%22%5D%7D'"))
      for _, c in ipairs(list) do
        if c.Labels["sbxlua.lock"]:sub(1, #STATE + 1) == STATE .. "/" then out[#out + 1] = "container " .. c.Id:sub(1, 12) end
      end
    end
    return out
  end

  for _, b in ipairs{ "local", "docker" } do
    local make = b == "docker" and ('sbx.sandbox("docker", { image = "' .. IMAGE .. '" })') or 'sbx.sandbox("local")'
    it(b .. ": a sandbox never closed is destroyed when the state closes, without a word", function()
      if b == "docker" and not docker_ok() then return pending("docker or " .. IMAGE .. " not available") end
      local r = lua54([[
        local sbx = require "sbx"
        local a, b = ]] .. make .. ", " .. make .. [[
        io.write(a:execute_command("echo", { "one" }).stdout, b:execute_command("echo", { "two" }).stdout)
      ]])
      assert.equal(0, r.exit_code, r.stderr)
      assert.equal("one\ntwo\n", r.stdout)
      assert.equal("", r.stderr)
      assert.same({}, left())
    end)

    it(b .. ": os.exit(3) exits 3 and leaves nothing", function()
      if b == "docker" and not docker_ok() then return pending("docker or " .. IMAGE .. " not available") end
      local r = lua54([[
        local sbx = require "sbx"
        local sb = ]] .. make .. [[
        io.write(sb:execute_command("echo", { "up" }).stdout) io.stdout:flush()
        os.exit(3)
      ]])
      assert.equal(3, r.exit_code, r.stderr)
      assert.equal("up\n", r.stdout)
      assert.equal("", r.stderr)
      assert.same({}, left())
    end)
  end
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
    assert(root:mkdir("sbx/daemon"))
    assert(root:write("sbx/daemon/wire.lua", "return { from_tree = true }"))
    local r = run(dir, 'io.write(tostring(require("sbx.daemon.wire").from_tree), " ", '
                    .. 'sbx.sandbox("local"):execute_command("echo embedded-rest").stdout)')
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("true embedded-rest\n", r.stdout)
    assert(root:write("sbx/daemon/wire.lua", "return {"))
    r = run(dir, 'require "sbx.daemon.wire"')
    assert.not_equal(0, r.exit_code)
    assert.matches("wire%.lua:1:", r.stderr)
    root:close()
    fs.rmtree(dir)
  end)
end)
