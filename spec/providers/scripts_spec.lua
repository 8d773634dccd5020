-- Provider scripts (API.md, "Provider scripts"; docs/providers.md): found
-- on the provider path, checked against the contract when they load,
-- restricted to their environment, configured through their own schema,
-- reloaded when they change, and checked by `sbxlua provider check`.
local sbx = require "sbx"
local config = require "sbx.core.config"
local providers = require "sbx.providers"
local router = require "sbx.routing"
local fs = require "sbx.fs"
local loop = require "sbx.loop"
local stream = require "sbx.stream"

local BIN = os.getenv("SBX_BIN") or "build/sbxlua"
local DIR = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/provider-scripts-" .. require("sbx.proc").getpid()

local function write(name, text)
  local f = assert(io.open(DIR .. "/" .. name, "w"))
  f:write(text)
  f:close()
  return DIR .. "/" .. name
end

local function shq(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local function host(cmd)
  local f = io.popen(cmd .. " 2>&1")
  local out = f:read("a")
  local _, _, status = f:close()
  return out, status
end

-- A provider wrapping local; `extra` goes on line 3, before the return.
local function wrapped(name, extra, tail)
  return "local p = builtin(\"local\")\n"
    .. "p.descriptor.name = " .. string.format("%q", name) .. "\n"
    .. (extra or "") .. "\n"
    .. (tail or "return p\n")
end

local function err_of(fn, ...)
  local ok, e = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return e
end

local function use_dir()
  config.use{ provider_path = { DIR } }
  router.reset()
end

setup(function()
  fs.rmtree(DIR)
  assert(fs.mkdir_host(DIR))
end)
teardown(function()
  config.use{}
  fs.rmtree(DIR)
end)
before_each(use_dir)

describe("a provider script on the path", function()
  it("is listed, routed to, described and in the matrix", function()
    write("listed.lua", wrapped("listed"))
    local has = false
    for _, n in ipairs(providers.names) do has = has or n == "listed" end
    assert.is_true(has)
    local d = sbx.providers().listed
    assert.is_true(d.available)
    assert.equal(DIR .. "/listed.lua", d.script)
    assert.equal("process", d.isolation)
    local r = sbx.route{ only = { "listed" } }
    assert.same({ "listed" }, r.order)
    local sb <close> = sbx.sandbox{ only = { "listed" } }
    assert.equal("listed", sb.backend)
    assert.equal("hi\n", sb:execute_command("echo hi").stdout)
    local out = host("SBX_PROVIDER_PATH=" .. DIR .. " " .. BIN .. " providers --matrix")
    assert.matches("| listed | process | yes", out, 1, true)
    -- gone from the listing at the next rescan (routing reuses one for
    -- providers.RESCAN_SECS; reset() rescans now)
    os.remove(DIR .. "/listed.lua")
    providers.reset()
    for _, n in ipairs(providers.names) do assert.not_equal("listed", n) end
  end)

  it("without put_tree/get_tree of its own, upload_dir and download_dir go through its file operations", function()
    write("plain.lua", wrapped("plain", "p.put_tree, p.get_tree = nil, nil"))
    local bin = string.rep("\0\255ab", 50000)
    assert(fs.mkdir_host(DIR .. "/tree"))
    assert(fs.mkdir_host(DIR .. "/tree/sub"))
    write("tree/a.txt", "alpha")
    write("tree/sub/b.bin", bin)
    local sb <close> = sbx.sandbox{ only = { "plain" } }
    sb:upload_dir(DIR .. "/tree", "up")
    assert.equal("alpha", sb:read_file("up/a.txt"))
    assert.equal(bin, sb:read_file("up/sub/b.bin"))
    sb:execute_command("ln -s a.txt up/link")
    local r = sb:download_dir("up", DIR .. "/back")
    local f = assert(io.open(DIR .. "/back/sub/b.bin", "rb"))
    assert.equal(bin, f:read("a"))
    f:close()
    assert.equal(2, r.files)
    assert.same({ "link" }, r.skipped)                -- said, not silently dropped
    assert.is_nil(io.open(DIR .. "/back/link"))
  end)

  it("a config given as a table gets its schema's defaults too (env() takes the default variable)", function()
    write("tabled.lua", wrapped("tabled", [[
p.config_schema = { key_env = { type = "env", default = "SBX_STATE_DIR" }, zone = { type = "string" } }
p.available = function()
  local c = config()
  return env(c.key_env) ~= nil and c.zone == "eu", "key_env=" .. tostring(c.key_env)
end]]))
    config.use{ provider_path = { DIR }, providers = { tabled = { zone = "eu" } } }
    router.reset()
    local d = sbx.providers().tabled
    assert.is_true(d.available, tostring(d.reason))
  end)

  it("cannot take a built-in provider's name", function()
    write("bwrap.lua", wrapped("bwrap"))
    assert.is_nil(providers.get("bwrap").file)        -- the built-in module
    local p, err = providers.check_file(DIR .. "/bwrap.lua")
    assert.is_nil(p)
    assert.matches("bwrap.lua:1: 'bwrap' is a built%-in provider", err)
    os.remove(DIR .. "/bwrap.lua")
  end)
end)

describe("a hostile or broken provider script", function()
  -- each case: the script text and the file:line message it must give
  local CASES = {
    { "io", wrapped("h_io", "local f = io.open('/etc/passwd')"), ":3: undefined global 'io'" },
    { "os.execute", wrapped("h_os", "os.execute('touch /tmp/pwned')"),
      ":3: os.execute is not available to provider scripts" },
    { "require", wrapped("h_req", "local fs = require 'sbx.fs'"), ":3: undefined global 'require'" },
    { "an undefined global", wrapped("h_glob", "local x = undefined_thing + 1"),
      ":3: undefined global 'undefined_thing'" },
    { "a global assignment", wrapped("h_set", "leaked = true"), ":3: assignment to global 'leaked'" },
    { "a syntax error", wrapped("h_syn", "local = 1"), ":3: .*near '='" },
    { "a missing operation", wrapped("h_miss", "p.spawn = nil"), ":4: missing operation 'spawn'" },
    { "a wrong descriptor type", wrapped("h_desc", "p.descriptor.capabilities = 'exec'"),
      ":3: descriptor.capabilities must be a list of strings" },
    { "a wrong operation type", wrapped("h_op", "p.mkdir = 'no'"), ":3: 'mkdir' must be a function, got string" },
    { "a name that is not its file's", wrapped("h_name", "p.descriptor.name = 'other'"),
      ":3: descriptor.name is 'other' but the file provides 'h_name'" },
    { "a bad config schema", wrapped("h_schema", "p.config_schema = { colour = 'color' }"),
      ":3: config_schema.colour.type must be one of" },
    { "no table", "return 42\n", ":1: the file returned number, not a provider table" },
    { "an endless loop at the top level", wrapped("h_loop", "while true do end"),
      ":3: the top level ran past %d+ instructions" },
  }
  for _, c in ipairs(CASES) do
    it("gives ConfigError naming file:line for " .. c[1], function()
      local name = c[2]:match('descriptor.name = "([^"]+)"') or "h_num"
      local file = write(name .. ".lua", c[2])
      local p, err = providers.check_file(file)
      assert.is_nil(p)
      assert.matches(file:gsub("%p", "%%%0") .. c[3], err)
      -- used by name: the sandbox is refused with the same words
      local e = err_of(sbx.sandbox, name)
      assert.equal("ConfigError", e.kind)
      assert.matches(c[3], e.message)
      -- routing skips it and says why; the other providers still work
      assert.matches(c[3], sbx.route{}.reasons[name])
      local sb <close> = sbx.sandbox("local")
      assert.equal(0, sb:execute_command("true").exit_code)
      os.remove(file)
    end)
  end

  it("names the line when an operation reaches outside at run time", function()
    local file = write("late.lua", wrapped("late", "p.create = function(spec)\n  return io.open('/etc/passwd')\nend"))
    assert.is_table(providers.check_file(file))
    local e = err_of(sbx.sandbox, "late")
    assert.equal("ConfigError", e.kind)
    assert.matches("late.lua:4: undefined global 'io'", e.message)
    os.remove(file)
  end)

  it("a spawn that returns no process handle is a SandboxExecutionError naming the file", function()
    local file = write("noproc.lua", wrapped("noproc", "p.spawn = function() return {} end"))
    local sb <close> = sbx.sandbox("noproc")
    local e = err_of(sb.execute_command, sb, "true")
    assert.equal("SandboxExecutionError", e.kind)
    assert.matches("noproc.lua: spawn%(%) returned a process handle without read, write", e.message)
    os.remove(file)
  end)
end)

describe("what the facade supplies", function()
  it("upload_dir without put_tree writes each file's data (mkdir + write_file)", function()
    local file = write("noputtree.lua", wrapped("noputtree", "p.put_tree = nil p.get_tree = nil"))
    local dir = assert(fs.mkdtemp("/tmp", "sbxspec-puttree-"))
    assert(os.execute("mkdir -p " .. dir .. "/sub && printf 'one' > " .. dir .. "/a.txt && printf 'two\\0' > "
                      .. dir .. "/sub/b.bin && chmod 755 " .. dir .. "/a.txt"))
    local sb <close> = sbx.sandbox("noputtree")
    assert.equal(2, sb:upload_dir(dir, "up").files)
    assert.equal("one", sb:read_file("up/a.txt"))
    assert.equal("two\0", sb:read_file("up/sub/b.bin"))
    fs.rmtree(dir)
    os.remove(file)
  end)
end)

describe("a provider's own config", function()
  local SCHEMA = [[
p.config_schema = {
  api_url = { type = "string", help = "the API" },
  api_key_env = { type = "env", default = "HOME" },
  greeting = { type = "string", default = "hello" },
  slots = "integer",
}
p.available = function()
  local c = config()
  if not c.api_url then return false, "no api_url" end
  local res, err = http.request{ url = c.api_url .. "/ping", timeout = 5,
                                 headers = { authorization = "Bearer " .. base64.encode(env(c.api_key_env)) } }
  if not res then return false, err end
  local body = json.decode(res.body)
  if res.status ~= 200 or not body.ok then return false, "HTTP " .. res.status end
  return true
end
p.doctor = function() return { { ok = true, what = config().greeting } } end
p.read_path_env = function()
  local v = env("PATH")
  return v
end]]

  local function yaml(body)
    return write("sbx.yaml", "provider_path: [" .. DIR .. "]\n" .. body)
  end

  it("is checked against its schema with file:line:col and did you mean", function()
    write("cfgd.lua", wrapped("cfgd", SCHEMA))
    local e = err_of(sbx.config, yaml("providers:\n  cfgd: { greting: hi }\n"))
    assert.equal("ConfigError", e.kind)
    assert.matches("sbx.yaml:3:11: unknown key 'greting' in providers.cfgd %(did you mean 'greeting'%?%)", e.message)
    e = err_of(sbx.config, yaml("providers:\n  cfgd: { slots: many }\n"))
    assert.matches("sbx.yaml:3:11: providers.cfgd.slots must be an integer", e.message)
    e = err_of(sbx.config, yaml("providers:\n  cfgd: { api_key_env: 'not a name' }\n"))
    assert.matches("must name an environment variable", e.message)
    e = err_of(sbx.config, yaml("providers:\n  cfgd: { api_key: s3cret }\n"))
    assert.matches("credentials are never written in the config", e.message)
    e = err_of(sbx.config, yaml("providers:\n  cfdg: {}\n"))
    assert.matches("sbx.yaml:3:3: unknown provider 'cfdg' %(did you mean 'cfgd'%?%)", e.message)
    -- the common keys every provider takes, and the defaults
    local cfg = sbx.config(yaml("providers:\n  cfgd: { slots: 3, max_concurrent: 2, price: { per_hour: 1 } }\n"))
    assert.same({ slots = 3, max_concurrent = 2, price = { per_hour = 1 }, api_key_env = "HOME",
                  greeting = "hello" }, cfg.providers.cfgd)
    assert.equal("hello", config.provider("cfgd").greeting)
    os.remove(DIR .. "/cfgd.lua")
  end)

  it("is read by the provider: HTTP to a stand-in server, JSON, base64, only its named variables", function()
    write("cfgd.lua", wrapped("cfgd", SCHEMA))
    local l, port = assert(stream.listen{ host = "127.0.0.1", port = 0 })
    local seen
    local server = loop.spawn(function()
      while true do
        local c = l:accept(30)
        if not c then return end
        local req = ""
        while not req:find("\r\n\r\n", 1, true) do
          local chunk = c:read()
          if not chunk then break end
          req = req .. chunk
        end
        seen = req
        local body = '{"ok": true}'
        c:write("HTTP/1.1 200 OK\r\nContent-Length: " .. #body .. "\r\nConnection: close\r\n\r\n" .. body)
        c:close()
      end
    end)
    sbx.config(yaml("providers:\n  cfgd: { api_url: 'http://127.0.0.1:" .. port .. "', greeting: hey }\n"))
    router.reset()
    local d = sbx.providers().cfgd
    assert.is_true(d.available, d.reason)
    local b64 = require("sbx.providers.script").base64.encode(assert(os.getenv("HOME")))
    assert.matches(("authorization: bearer " .. b64):lower(), seen:lower(), 1, true)
    assert.equal("hey", providers.get("cfgd").doctor()[1].what)
    local e = err_of(providers.get("cfgd").read_path_env)
    assert.equal("ConfigError", e.kind)
    assert.matches("cfgd.lua:%d+: env%('PATH'%): not a variable this provider's config names", e.message)
    server:cancel()
    l:close()
    os.remove(DIR .. "/cfgd.lua")
  end)
end)

describe("reloading a provider script", function()
  local V = [[
local create = p.create
p.create = function(spec)
  local h = create(spec)
  h.version = "%s"
  return h
end
local read = p.read_file
p.read_file = function(h, path, max)
  if path == "version" then return h.version end
  return read(h, path, max)
end]]

  it("new sandboxes use the new version, live ones keep theirs, a broken edit keeps the last good", function()
    local file = write("rel.lua", wrapped("rel", V:format("one")))
    local old <close> = sbx.sandbox("rel")
    assert.equal("one", old:read_file("version"))
    loop.sleep(0.01)
    write("rel.lua", wrapped("rel", V:format("two, longer")))
    local new <close> = sbx.sandbox("rel")
    assert.equal("two, longer", new:read_file("version"))
    -- both keep working, each with its own version
    assert.equal("one", old:read_file("version"))
    assert.equal("a\n", old:execute_command("echo a").stdout)
    assert.equal("b\n", new:execute_command("echo b").stdout)
    -- a broken edit: the last good version stays, and routing still takes it
    write("rel.lua", wrapped("rel", V:format("three") .. "\nlocal = broken"))
    local third <close> = sbx.sandbox("rel")
    assert.equal("two, longer", third:read_file("version"))
    assert.is_true(sbx.providers().rel.available)
    -- fixed again: picked up
    write("rel.lua", wrapped("rel", V:format("four")))
    local fourth <close> = sbx.sandbox("rel")
    assert.equal("four", fourth:read_file("version"))
    assert.equal("one", old:read_file("version"))
    os.remove(file)
  end)
end)

describe("sbxlua provider", function()
  it("check FILE: ok exits 0, a broken script exits 1 with file:line, bad usage exits 2", function()
    local good = write("good.lua", wrapped("good"))
    local out, st = host(BIN .. " provider check " .. shq(good))
    assert.equal(0, st, out)
    assert.matches("ok: provider 'good' in .*good.lua meets the provider contract %(process;", out)
    local bad = write("bad.lua", "return {\n  descriptor = { name = 'bad', isolation = 'cloud', capabilities = {} },\n"
      .. "  available = function() return true end,\n  create = 42,\n}\n")
    out, st = host(BIN .. " provider check " .. shq(bad))
    assert.equal(1, st, out)
    assert.matches("bad.lua:1: missing operation 'destroy'\n", out, 1, true)
    assert.matches("bad.lua:2: descriptor.isolation must be one of", out, 1, true)
    assert.matches("bad.lua:4: 'create' must be a function, got number", out, 1, true)
    out, st = host(BIN .. " provider check " .. shq(DIR .. "/nope.lua"))
    assert.equal(1, st, out)
    assert.matches("nope.lua: No such file", out, 1, true)
    out, st = host(BIN .. " provider check")
    assert.equal(2, st, out)
    assert.matches("expected `check FILE` or `list`", out, 1, true)
    out, st = host(BIN .. " provider frobnicate x")
    assert.equal(2, st, out)
  end)

  it("list: the search path and where each provider comes from", function()
    write("good.lua", wrapped("good"))
    write("broke.lua", "return {")
    local out, st = host("SBX_PROVIDER_PATH=" .. DIR .. " " .. BIN .. " provider list")
    assert.equal(0, st, out)
    assert.matches("search path: " .. DIR, out, 1, true)
    assert.matches("local +built in\n", out)
    assert.matches("good +" .. DIR:gsub("%p", "%%%0") .. "/good.lua\n", out)
    assert.matches("broke +broken: .*broke.lua:1:", out)
    -- doctor reports a broken script and goes on
    out, st = host("SBX_PROVIDER_PATH=" .. DIR .. " " .. BIN .. " doctor")
    assert.equal(0, st, out)
    assert.matches("warn  backend broke: provider script broke: .*broke.lua:1:", out)
    assert.matches("fix: sbxlua provider check .*broke.lua lists every problem", out)
    assert.matches("ok    backend good: available", out, 1, true)
    assert.matches("python3 for execute_code", out, 1, true)
  end)
end)

describe("looking a built-in provider up (on every request of a cloud provider)", function()
  it("neither copies the embedded source nor re-checks its schema each time", function()
    local script = require "sbx.script"
    assert.is_true(script.has_builtin("providers/e2b"))
    assert.is_false(script.has_builtin("providers/no-such-provider"))
    assert.equal(providers.schema("e2b"), providers.schema("e2b"))      -- normalized once
    assert.equal(config.provider("e2b"), config.provider("e2b"))        -- defaulted once per config
    assert.equal("/workspace", config.provider("e2b").workdir)
    -- 200 lookups of e2b's settings, as its requests make them: a copy of
    -- providers/e2b.lua (~25 KB) per lookup would be 5 MB
    collectgarbage("stop")
    local before = collectgarbage("count")
    for _ = 1, 200 do config.provider("e2b") end
    local kb = collectgarbage("count") - before
    collectgarbage("restart")
    assert.is_true(kb < 1024, string.format("200 lookups allocated %.0f KB", kb))
  end)
end)
