-- Plain `sbxlua gc` removes another build's docker agent volume only when
-- this host's sbxlua filled it in a session now dead and no container uses
-- it: a volume a live process filled (or is filling), one of another host,
-- an unlabelled one and one in use all stay. The volumes here use a name
-- prefix of their own (the backend's VOLUME_PREFIX), so no other gc on a
-- shared engine can take them and this gc touches no one else's.
local proc = require "sbx.proc"
local fs = require "sbx.fs"
local json = require "cjson"

local BIN = os.getenv("SBX_BIN") or "build/sbxlua"
local IMAGE = os.getenv("SBX_TEST_IMAGE") or "sbxlua-test:bookworm"
local HOST = require("sbx.state.owner").hostname()

local sh = require("spec.support").stdout

local function api(method, path, body)
  return sh("curl -s -X " .. method .. " --unix-socket /var/run/docker.sock -H 'Content-Type: application/json' "
            .. (body and ("-d '" .. json.encode(body) .. "' ") or "") .. "'http://d/v1.41" .. path .. "'")
end

local function usable()
  local ok, d = pcall(require, "sbx.providers.builtin.docker")
  return ok and d.available() and sh("docker image inspect " .. IMAGE .. " >/dev/null 2>&1 && echo y") == "y\n"
end

describe("gc and other builds' agent volumes", function()
  local state, prefix, holder, cid
  local names = {}
  local function volume(labels)
    local name = prefix .. proc.random_hex(6)
    api("POST", "/volumes/create", { Name = name, Labels = labels })
    names[#names + 1] = name
    return name
  end
  local function exists(name) return (json.decode(api("GET", "/volumes/" .. name)) or {}).Name == name end
  local function gc(dry)
    return assert(proc.spawn{ argv = { BIN, "-e", "require('sbx.providers.builtin.docker').VOLUME_PREFIX = '" .. prefix
      .. "' return require('sbx.cli.commands').gc({" .. (dry and "['dry-run'] = true" or "") .. "})" }, timeout = 120,
      env = { "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" .. state, "SBX_STATE_DIR=" .. state } }):wait()
  end

  before_each(function()
    state = assert(fs.mkdtemp(os.getenv("SBX_STATE_DIR") or "/tmp", "gcv."))
    prefix = "sbxgv" .. proc.random_hex(4) .. "-"
  end)
  after_each(function()
    if holder then holder:kill(9) holder:wait() end
    if cid then api("DELETE", "/containers/" .. cid .. "?force=true") end
    for _, v in ipairs((json.decode(api("GET", "/volumes")) or {}).Volumes or {}) do   -- the fill's too
      if v.Name:sub(1, #prefix) == prefix then names[#names + 1] = v.Name end
    end
    for _, n in ipairs(names) do api("DELETE", "/volumes/" .. n) end
    holder, cid, names = nil, nil, {}
    fs.rmtree(state)
  end)

  it("keeps what a live session filled, another host's, unlabelled or used ones; removes a dead session's", function()
    if not usable() then return pending("docker or " .. IMAGE .. " not available") end
    local lock = state .. "/live.lock"
    holder = assert(proc.spawn{ argv = { "flock", lock, "sleep", "60" } })
    while not fs.is_locked(lock) do require("sbx.loop").sleep(0.02) end
    local function labels(session, l, host)
      return { ["sbxlua.agent"] = "1", ["sbxlua.host"] = host or HOST, ["sbxlua.session"] = session,
               ["sbxlua.lock"] = l }
    end
    local live = volume(labels(HOST .. "-1-live", lock))
    local dead = volume(labels(HOST .. "-2-dead", state .. "/gone.lock"))
    local other_host = volume(labels("elsewhere-3-dead", state .. "/gone.lock", "elsewhere"))
    local unlabelled = volume({ ["sbxlua.agent"] = "1" })
    local used = volume(labels(HOST .. "-4-dead", state .. "/gone.lock"))
    cid = json.decode(api("POST", "/containers/create", { Image = IMAGE, Cmd = { "true" },
      HostConfig = { Mounts = { { Type = "volume", Source = used, Target = "/v" } } } })).Id
    assert.truthy(cid)

    local r = gc(true)
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal(1, select(2, r.stdout:gsub("would remove docker volume", "")), r.stdout)
    assert.matches("would remove docker volume " .. dead, r.stdout, 1, true)
    r = gc()
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("removed 1 agent volumes of other builds", r.stdout, 1, true)
    assert.is_false(exists(dead))
    for _, n in ipairs{ live, other_host, unlabelled, used } do assert.is_true(exists(n), n) end
    -- once the live session is gone, its volume goes too
    holder:kill(9) holder:wait() holder = nil
    r = gc()
    assert.equal(0, r.exit_code, r.stderr)
    assert.is_false(exists(live))
    for _, n in ipairs{ other_host, unlabelled, used } do assert.is_true(exists(n), n) end
  end)

  it("a process whose volume was removed and filled again by another process uses the new fill", function()
    if not usable() then return pending("docker or " .. IMAGE .. " not available") end
    local function start(code)
      return assert(proc.spawn{ argv = { BIN, "-e", "require('sbx.providers.builtin.docker').VOLUME_PREFIX = '" .. prefix
        .. "' " .. code }, timeout = 120, stream = true, keep_stdin = true,
        env = { "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" .. state, "SBX_STATE_DIR=" .. state } })
    end
    local function until_line(p, want)
      local seen = ""
      while not seen:find(want, 1, true) do
        local which, chunk = p:read()
        assert(which, "ended before " .. want .. ": " .. seen)
        seen = seen .. chunk
      end
      return seen
    end
    local job = "local function one() local sb <close> = sbx.sandbox('docker', { image = '" .. IMAGE .. "' })"
                .. " return sb:execute_command('echo', { 'ok' }).stdout end"
    local a = start(job .. " io.write('a1 ', one()) io.stdout:flush() io.read('l') io.write('a2 ', one())")
    until_line(a, "a1 ok\n")
    local vol
    for _, v in ipairs((json.decode(api("GET", "/volumes")) or {}).Volumes or {}) do
      if v.Name:sub(1, #prefix) == prefix then vol = v.Name end
    end
    assert.truthy(vol)
    api("DELETE", "/volumes/" .. vol)             -- as another build's gc did
    local b = start(job .. " io.write('b ', one())")   -- another process fills it again
    assert.matches("b ok\n", until_line(b, "b ok\n"))
    assert.equal(0, b:wait().exit_code)
    a:write("go\n")
    local rest = until_line(a, "\n")
    local r = a:wait()
    assert.equal(0, r.exit_code, rest .. (r.stderr or ""))
    assert.matches("a2 ok\n", rest)
  end)

  it("a volume this build fills is labelled with its host and session", function()
    if not usable() then return pending("docker or " .. IMAGE .. " not available") end
    local r = assert(proc.spawn{ argv = { BIN, "-e", "require('sbx.providers.builtin.docker').VOLUME_PREFIX = '" .. prefix
      .. "' local sb = sbx.sandbox('docker', { image = '" .. IMAGE .. "' }) print(sb:execute_command('echo ok').stdout)"
      .. " print(require('sbx.state.owner').session_id())" }, timeout = 120,
      env = { "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" .. state, "SBX_STATE_DIR=" .. state } }):wait()
    assert.equal(0, r.exit_code, r.stderr)
    local session = r.stdout:match("ok\n\n([^\n]+)")
    local list = json.decode(api("GET", "/volumes")).Volumes
    local mine
    for _, v in ipairs(list) do
      if v.Name:sub(1, #prefix) == prefix then mine = v names[#names + 1] = v.Name end
    end
    assert.truthy(mine)
    assert.equal(HOST, mine.Labels["sbxlua.host"])
    assert.equal(session, mine.Labels["sbxlua.session"])
    assert.equal(state .. "/sessions/" .. session .. ".lock", mine.Labels["sbxlua.lock"])
  end)
end)
