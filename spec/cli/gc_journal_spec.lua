-- Journals are data: `sbxlua ls` and `sbxlua gc` skip a line (or a file)
-- that is not a journal's and say where it is (file:line), and the orphans
-- of the same state directory are still listed and removed. The shapes
-- below are a fixed catalogue plus seeded random mutations of valid lines.
local proc = require "sbx.proc"
local loop = require "sbx.loop"
local fs = require "sbx.fs"
local json = require "cjson"

local BIN = os.getenv("SBX_BIN") or "build/sbxlua"
local BASE = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/gcj-" .. proc.getpid()
local HOST = require("sbx.state.owner").hostname()

local function run(state, args, opts)
  local argv = { BIN }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local p = assert(proc.spawn{ argv = argv, timeout = 120, stream = opts and opts.stream,
    env = { "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" .. state, "SBX_STATE_DIR=" .. state } })
  if opts and opts.stream then return p end
  return p:wait()
end

local function write(path, data)
  local f = assert(io.open(path, "a"))
  f:write(data)
  f:close()
end

-- A real orphan: an sbxlua that made a local sandbox running a tagged
-- process, SIGKILLed. Returns its sandbox dir, tag and journal path.
local function orphan(state)
  local tag = "sbxgcj" .. proc.random_hex(6)
  local job = state .. "/job.lua"
  write(job, [[
    local sb = sbx.sandbox("local")
    -- setsid: a direct child dies with its sbxlua; this one stays an orphan
    sb:spawn("bash", { "-c", "setsid bash -c 'exec -a ]] .. tag .. [[ sleep 300' & sleep 300" })
    while not sb:execute_command("pgrep -f '^]] .. tag .. [['").stdout:find("%d") do sbx.sleep(0.05) end
    print("ready " .. sb.workdir) io.stdout:flush()
    sbx.sleep(300)
  ]])
  local p = run(state, { job }, { stream = true })
  local seen = ""
  while not seen:find("ready [^\n]+\n") do
    local which, chunk = p:read()
    assert(which, "the job ended early: " .. seen)
    if which == "stdout" then seen = seen .. chunk end
  end
  os.execute("kill -9 " .. p.pid)
  p:wait()
  local journal
  for _, n in ipairs(fs.list_host(state .. "/sessions")) do
    if n:match("%.jsonl$") then journal = state .. "/sessions/" .. n end
  end
  return seen:match("ready ([^\n]+)"), tag, journal
end

local function alive(tag)
  local f = io.popen("pgrep -f '[" .. tag:sub(1, 1) .. "]" .. tag:sub(2) .. "'")
  local out = f:read("a")
  f:close()
  return out ~= ""
end

-- One line of each shape that is not a journal line the reader can trust.
local SID = "sbx-0123456789ab"
local BAD = {
  '{"event":"destroy"}',
  '{"event":"destroy","id":{"a":1}}',
  '{"event":"create","id":{"a":1},"backend":"local"}',
  '{"event":"create","id":["x"],"backend":"local"}',
  '{"event":"create","id":42,"backend":"local"}',
  '{"event":"create","id":null,"backend":"local"}',
  '{"event":"create","id":"","backend":"local"}',
  '{"event":"create","id":"../../etc","backend":"local"}',
  '{"event":"create","id":"a/b","backend":"local"}',
  '{"event":"create","id":"' .. SID .. '"}',
  '{"event":"create","id":"' .. SID .. '","backend":7}',
  '{"event":"create","id":"' .. SID .. '","backend":"local","created":"yesterday"}',
  '{"event":"create","id":"' .. SID .. '","backend":"local","labels":"x"}',
  '{"event":"create","id":"' .. SID .. '","backend":"local","session":"other-1-ab"}',
  '{"event":"ready","id":"' .. SID .. '","state":"x"}',
  '{"event":"ready","id":{},"state":{}}',
  '{"event":"snapshot_done","snapshot_id":5}',
  '{"event":"session","host":{"x":1},"pid":"12"}',
  '{"event":{"x":1}}',
  '{"id":"' .. SID .. '"}',
  '[1,2,3]', '"just a string"', '42', 'null', 'true', '{}',
  '{"event":"create",', '{{{{', string.rep("[", 5000) .. string.rep("]", 5000),
  '\0\1\2\255\254 binary', '\xff\xfe\xfd', 'not json at all',
}

local function random_line(rng)
  local valid = json.encode{ event = ({ "create", "ready", "destroy", "session" })[rng(4)],
                             id = SID, backend = "local", state = { dir = "/x" }, pid = 1 }
  local kind = rng(3)
  if kind == 1 then           -- random bytes, no newline inside
    local t = {}
    for i = 1, rng(60) do t[i] = string.char(rng(256) - 1) end
    return (table.concat(t):gsub("\n", " "))
  elseif kind == 2 then       -- a valid line cut short
    return valid:sub(1, rng(#valid - 1))
  end
  local i = rng(#valid)       -- a valid line with one byte changed
  return (valid:sub(1, i - 1) .. string.char(rng(256) - 1) .. valid:sub(i + 1)):gsub("\n", " ")
end

describe("ls and gc with malformed journals", function()
  local state
  before_each(function()
    state = BASE .. "-" .. proc.random_hex(4)
    assert(fs.mkdir_host(state .. "/sessions"))
  end)
  after_each(function()
    run(state, { "gc" })
    fs.rmtree(state)
  end)

  it("skip and report every bad line (file:line) and still remove the orphans", function()
    local dir, tag, journal = orphan(state)
    assert.is_true(alive(tag))
    -- the orphan's own journal gets junk between its lines' ends; other
    -- dead sessions' journals are nothing but junk
    local n = 0
    local expect = {}
    local function session_file()
      n = n + 1
      local p = state .. "/sessions/" .. HOST .. "-" .. (900000 + n) .. "-abcde" .. n
      write(p .. ".jsonl", json.encode{ event = "session", host = HOST, pid = 900000 + n, started = 1 } .. "\n")
      return p .. ".jsonl"
    end
    for i, line in ipairs(BAD) do
      local target = i % 2 == 0 and journal or session_file()
      write(target, line .. "\n")
      expect[#expect + 1] = target
    end
    local seed = os.time()
    math.randomseed(seed)
    local rng = math.random
    for _ = 1, 40 do write(session_file(), random_line(rng) .. "\n") end
    write(session_file(), '{"event":"create","id":"' .. SID .. '","backend":"lo')   -- torn last line
    write(state .. "/sessions/not a session.jsonl", "{}\n")
    write(state .. "/sessions/...jsonl", "{}\n")

    local r = run(state, { "ls", "--json" })
    assert.equal(0, r.exit_code, r.stderr)
    local rows = json.decode(r.stdout)
    local ids = {}
    for _, row in ipairs(rows) do ids[#ids + 1] = row.id end
    assert.is_true(#ids >= 1, "seed " .. seed .. ": " .. r.stdout)
    -- a byte changed inside an id can make another valid one ("Ybx-..."):
    -- what ls lists must only be a single path component, never a path
    for _, id in ipairs(ids) do
      assert.is_true(type(id) == "string" and id ~= "" and not id:find("[/%z]") and id ~= "." and id ~= "..",
                     "seed " .. seed .. ": " .. tostring(id))
    end
    for _, p in ipairs(expect) do
      assert.matches(p:gsub("%p", "%%%0") .. ":%d+: [^\n]+; line skipped", r.stderr)
    end
    assert.matches("abcde%d+%.jsonl:2: truncated last line", r.stderr)
    assert.matches("not a session%.jsonl: not a session journal's name; file skipped", r.stderr)
    assert.not_matches("traceback", r.stderr)

    r = run(state, { "ls" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("orphan", r.stdout)

    r = run(state, { "gc" })
    assert.equal(0, r.exit_code, "seed " .. seed .. ": " .. r.stderr)
    assert.not_matches("traceback", r.stderr)
    assert.matches("line skipped", r.stderr)
    loop.sleep(0.1)
    assert.is_false(alive(tag))
    assert.is_nil(fs.open_root(dir))
    -- the dead sessions are forgotten; only the files that are no journal's stay
    local left = {}
    for _, name in ipairs(fs.list_host(state .. "/sessions")) do left[#left + 1] = name end
    table.sort(left)
    assert.same({ "...jsonl", "not a session.jsonl" }, left)
    r = run(state, { "ls", "--json" })
    assert.equal(0, r.exit_code)
    assert.equal(0, #json.decode(r.stdout))
  end)

  it("never crash on 200 seeded random journals", function()
    local dir, tag = orphan(state)
    local seed = os.time() + 1
    math.randomseed(seed)
    for i = 1, 200 do
      local p = state .. "/sessions/" .. HOST .. "-" .. (800000 + i) .. "-f" .. i .. ".jsonl"
      local lines = {}
      for k = 1, math.random(4) do
        lines[k] = math.random() < 0.3 and BAD[math.random(#BAD)] or random_line(math.random)
      end
      write(p, table.concat(lines, "\n") .. (math.random() < 0.5 and "\n" or ""))
    end
    local r = run(state, { "ls" })
    assert.equal(0, r.exit_code, "seed " .. seed .. ": " .. r.stderr)
    r = run(state, { "gc" })
    assert.equal(0, r.exit_code, "seed " .. seed .. ": " .. r.stderr)
    assert.not_matches("traceback", r.stderr)
    loop.sleep(0.1)
    assert.is_false(alive(tag))
    assert.is_nil(fs.open_root(dir))
  end)
end)

-- A session killed a moment ago may still have a container create in
-- flight at the engine (G2 saw an agent-volume helper land after gc had
-- listed): gc lists once 2 s have passed since such a session's last
-- journal write; sessions of only local and bwrap sandboxes wait for nothing.
describe("gc right after a session died", function()
  local function dead_session(state, backend, age)
    local sid = "gcjsettle-999999-" .. proc.random_hex(6)
    local path = state .. "/sessions/" .. sid .. ".jsonl"
    write(path, json.encode{ event = "session", host = HOST, pid = 999999, started = 1 } .. "\n"
      .. json.encode{ event = "create", id = "sbx-" .. proc.random_hex(12), backend = backend,
                      session = sid } .. "\n")
    if age > 0 then assert(os.execute("touch -d '-" .. age .. " seconds' " .. path)) end
  end
  local function timed_gc(state)
    local t0 = loop.now()
    local argv = { BIN, "gc" }
    assert(proc.spawn{ argv = argv, timeout = 60, env = { "PATH=/usr/local/bin:/usr/bin:/bin",
      "HOME=" .. state, "SBX_STATE_DIR=" .. state, "DOCKER_HOST=unix://" .. state .. "/no-engine.sock" } }):wait()
    return loop.now() - t0
  end
  local state
  before_each(function()
    state = BASE .. "-" .. proc.random_hex(4)
    assert(fs.mkdir_host(state .. "/sessions"))
  end)
  after_each(function() fs.rmtree(state) end)

  it("waits about 2 s after a docker session's last journal line", function()
    dead_session(state, "docker", 0)
    local took = timed_gc(state)
    assert.is_true(took >= 1.5 and took < 10, "gc took " .. took .. " s")
  end)
  it("does not wait for a docker session dead for a while, nor for a local one", function()
    dead_session(state, "docker", 30)
    dead_session(state, "local", 0)
    local took = timed_gc(state)
    assert.is_true(took < 1.5, "gc took " .. took .. " s")
  end)
end)
