-- gc and destroy act only on what is sbxlua's: a journal (or a resumed
-- session_state) that names a directory outside the state directory (by
-- `..` or a symlink), a cgroup outside sbxlua's subtree, or a container
-- without this host's labels leaves it alone (sbx.claims).
local proc = require "sbx.proc"
local loop = require "sbx.loop"
local fs = require "sbx.fs"
local json = require "cjson"

local BIN = os.getenv("SBX_BIN") or "build/sbxlua"
local IMAGE = os.getenv("SBX_TEST_IMAGE") or "sbxlua-test:bookworm"
local HOST = require("sbx.state.owner").hostname()

local sh = require("spec.support").stdout

local function run(state, args)
  local argv = { BIN }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  return assert(proc.spawn{ argv = argv, timeout = 120,
    env = { "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" .. state, "SBX_STATE_DIR=" .. state } }):wait()
end

local function write(path, data)
  local f = assert(io.open(path, "a"))
  f:write(data)
  f:close()
end

-- A dead session's journal claiming sandbox `id` of `backend` with `st`.
local n = 0
local function claim(state, backend, st)
  n = n + 1
  local sid = HOST .. "-" .. (700000 + n) .. "-c1a" .. n
  local id = "sbx-" .. proc.random_hex(6)
  assert(fs.mkdir_host(state .. "/sessions"))
  write(state .. "/sessions/" .. sid .. ".jsonl", table.concat({
    json.encode{ event = "session", host = HOST, pid = 700000 + n, started = 1 },
    json.encode{ event = "create", id = id, backend = backend, created = 1, session = sid },
    json.encode{ event = "ready", id = id, state = st, session = sid }, "" }, "\n"))
  return sid, id
end

local function victim(base)
  local d = assert(fs.mkdtemp(base, "victim."))
  write(d .. "/precious.txt", "keep me")
  return d
end

local function intact(d) return fs.read_host(d .. "/precious.txt") == "keep me" end

local function has(b)
  local ok, m = pcall(require, "sbx.providers.builtin." .. b)
  return ok and m.available()
end

describe("gc trusts no path, cgroup or container a journal claims", function()
  local state, outside
  before_each(function()
    local tmp = os.getenv("SBX_STATE_DIR") or "/tmp"
    state = assert(fs.mkdtemp(tmp, "gct."))
    outside = assert(fs.mkdtemp(tmp, "gct-outside."))
  end)
  after_each(function()
    fs.rmtree(state)
    fs.rmtree(outside)
  end)

  for _, b in ipairs{ "local", "bwrap" } do
    it(b .. ": a dir with .. or through a symlink is not removed", function()
      local v1, v2, v3 = victim(outside), victim(outside), victim(outside)
      assert(fs.mkdir_host(state .. "/" .. b .. "/x"))
      local sid = claim(state, b, { dir = state .. "/" .. b .. "/x/../../../" .. v1:match("[^/]+/[^/]+$"), own = true })
      claim(state, b, { dir = v2, own = true })
      -- a "sandbox directory" of the listing that is a symlink out
      assert(fs.mkdir_host(state .. "/" .. b .. "/" .. sid))
      assert(os.execute("ln -s " .. v3 .. " " .. state .. "/" .. b .. "/" .. sid .. "/sbx-0a0b0c.lnk"))
      local r = run(state, { "gc" })
      assert.equal(0, r.exit_code, r.stderr)
      assert.is_true(intact(v1), "removed through ..")
      assert.is_true(intact(v2), "removed outside the state directory")
      assert.is_true(intact(v3), "removed through a symlink")
      assert.matches("not removing: [^\n]+ is not a " .. b .. " sandbox directory", r.stderr)
    end)

    it(b .. ": resume of a state owning a directory elsewhere is refused, and nothing removed", function()
      if not has(b) then return pending(b .. " not available") end
      local v = victim(outside)
      local r = run(state, { "-e", [[
        local ok, err = pcall(sbx.resume, { backend = "]] .. b .. [[", id = "sbx-00aa11bb22cc",
                                             state = { dir = "]] .. v .. [[", own = true } })
        if ok then err:destroy() print("destroyed") else print(err.kind, err.message) end
        ok, err = pcall(sbx.resume, { backend = "]] .. b .. [[", id = "sbx-00aa11bb22cc",
                                       state = { dir = "]] .. v .. [[", cg = "/sys/fs/cgroup" } })
        if ok then err:destroy() print("destroyed") else print(err.kind, err.message) end
      ]] })
      assert.equal(0, r.exit_code, r.stderr)
      assert.is_true(intact(v))
      assert.matches("^ConfigError\tsession state for " .. b .. ": 'dir' is owned %(own = true%) but [^\n]+ is not a "
                     .. b .. " sandbox directory[^\n]*\nConfigError\tsession state for " .. b .. ": 'cg': ", r.stdout)
    end)
  end

  describe("a foreign cgroup", function()
    local cg, sleeper
    before_each(function()
      local base = require("sbx.providers.builtin.local").containment()
      if not base then return end
      cg = base:gsub("/sbxlua$", "") .. "/sbxg-foreign-" .. proc.random_hex(4)
      assert(require("sbx.cgroup").create(cg))
      sleeper = assert(proc.spawn{ argv = { "sleep", "300" } })
      write(cg .. "/cgroup.procs", tostring(sleeper.pid))
    end)
    after_each(function()
      if sleeper then sleeper:kill() sleeper:wait() end
      if cg then os.remove(cg) end
      cg, sleeper = nil, nil
    end)

    it("is never killed by gc (named directly or by .. from sbxlua's subtree)", function()
      if not cg then return pending("no writable cgroup v2") end
      local base = require("sbx.providers.builtin.local").containment()
      claim(state, "local", { dir = state .. "/local/none", own = true, cg = cg })
      claim(state, "bwrap", { dir = state .. "/bwrap/none", own = true, cg = base .. "/.." .. cg:sub(#base - 6) })
      local r = run(state, { "gc" })
      assert.equal(0, r.exit_code, r.stderr)
      loop.sleep(0.1)
      assert.is_true(sleeper:running(), "the foreign cgroup's process was killed")
      assert.truthy(fs.read_host(cg .. "/cgroup.procs"), "the foreign cgroup was removed")
      assert.matches("not killing: the cgroup [^\n]+ is not sbx%-%x+'s in sbxlua's cgroup subtree", r.stderr)
    end)
  end)

  describe("docker", function()
    local cid
    local function api(method, path, body)
      return sh("curl -s -X " .. method .. " --unix-socket /var/run/docker.sock -H 'Content-Type: application/json' "
                .. (body and ("-d '" .. json.encode(body) .. "' ") or "") .. "'http://d/v1.41" .. path .. "'")
    end
    before_each(function()
      if not (has("docker") and sh("docker image inspect " .. IMAGE .. " >/dev/null 2>&1 && echo y") == "y\n") then return end
      local res = json.decode(api("POST", "/containers/create", { Image = IMAGE, Cmd = { "sleep", "300" },
                                   Labels = { ["sbxg.test"] = "gc-trust" } }))
      cid = res.Id
      api("POST", "/containers/" .. cid .. "/start")
    end)
    after_each(function()
      if cid then api("DELETE", "/containers/" .. cid .. "?force=true") end
      cid = nil
    end)

    it("a container without this host's labels is neither removed by gc nor resumed", function()
      if not cid then return pending("docker or " .. IMAGE .. " not available") end
      claim(state, "docker", { container = cid })
      local r = run(state, { "gc" })
      assert.equal(0, r.exit_code, r.stderr)
      local info = json.decode(api("GET", "/containers/" .. cid .. "/json"))
      assert.is_true(info.State and info.State.Running, "gc removed or stopped a foreign container")
      assert.matches("not removing container " .. cid .. ": it does not carry this host's sbxlua labels", r.stderr)
      r = run(state, { "-e", [[
        local ok, err = pcall(sbx.resume, { backend = "docker", id = "sbx-00aa11bb22cc", state = { container = "]] .. cid .. [[" } })
        if ok then err:destroy() print("destroyed") else print(err.kind, err.message) end
      ]] })
      assert.equal(0, r.exit_code, r.stderr)
      assert.matches("^ConfigError\tsession state for docker: container " .. cid
                     .. ": it does not carry this host's sbxlua labels", r.stdout)
      info = json.decode(api("GET", "/containers/" .. cid .. "/json"))
      assert.is_true(info.State.Running)
    end)
  end)
end)
