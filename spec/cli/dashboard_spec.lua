-- sbxlua dashboard, as a user meets it: a job in another process holds
-- sandboxes and has spent money and made routing decisions; the dashboard,
-- reading only the state directory, shows them on its JSON endpoints and,
-- in a real headless Chromium, on its page (DOM checked, screenshot saved).
-- Read-only by default; gc from the page needs --allow-actions and the token.
local proc = require "sbx.proc"
local fs = require "sbx.fs"
local stream = require "sbx.stream"
local json = require "cjson"

local BIN = os.getenv("SBX_BIN") or "build/sbxlua"
local TMP = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/dashboard-" .. proc.getpid()
local STATE = TMP .. "/state"
local ARTIFACTS = os.getenv("SBX_ARTIFACT_DIR") or ((os.getenv("SBX_MODULE_DIR") or "build") .. "/artifacts")
local ENV = { "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" .. TMP, "SBX_STATE_DIR=" .. STATE,
              "SBX_CONFIG=" .. TMP .. "/sbx.yaml" }

-- local at $36/h, so a second of a sandbox shows as $0.01
local CONFIG = "providers:\n  local: { price: { per_hour: 36 } }\n"

-- Three routed creates (decisions, ledger lines), then three sandboxes held.
local JOB = [[
for i = 1, 3 do
  local sb <close> = sbx.sandbox{ only = { "local" }, labels = { team = "evals" } }
  sbx.sleep(0.3)
end
local keep = {}
for i = 1, 3 do keep[i] = sbx.sandbox("local", { labels = { team = "evals", run = tostring(i) } }) end
for i = 1, 3 do print("id " .. keep[i].id) end
print("ready") io.stdout:flush()
sbx.sleep(300)
]]

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

-- Start sbxlua with args; read its stdout until `pattern` matches; returns the process and what it printed.
local function start(args, pattern)
  local argv = { BIN }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local p = assert(proc.spawn{ argv = argv, env = ENV, stream = true })
  local seen = ""
  while not seen:find(pattern) do
    local which, chunk = p:read()
    assert(which, "sbxlua " .. table.concat(args, " ") .. " ended before printing " .. pattern .. ": " .. seen)
    if which == "stdout" then seen = seen .. chunk end
  end
  return p, seen
end

local function stop(p)
  if p then
    pcall(p.kill, p, 15)
    pcall(p.wait, p)
  end
end

-- One request over a fresh connection; `raw` is sent as is when given.
local function http(port, method, path, headers, raw)
  local c = assert(stream.connect{ host = "127.0.0.1", port = tostring(port) })
  if not raw then
    local h = { method .. " " .. path .. " HTTP/1.1" }
    headers = headers or {}
    if headers.Host == nil then headers.Host = "127.0.0.1:" .. port end
    for k, v in pairs(headers) do if v ~= false then h[#h + 1] = k .. ": " .. v end end
    raw = table.concat(h, "\r\n") .. "\r\n\r\n"
  end
  assert(c:write(raw))
  local out = {}
  while true do
    local chunk = c:read(30)
    if not chunk then break end
    out[#out + 1] = chunk
  end
  c:close()
  local resp = table.concat(out)
  return tonumber(resp:match("^HTTP/1%.1 (%d+)")), resp:match("\r\n\r\n(.*)$"), resp
end

local function get_json(port, path)
  local status, body = http(port, "GET", path)
  assert.equal(200, status, body)
  return json.decode(body)
end

local function chromium_argv(extra, url)
  local argv = { "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--hide-scrollbars",
                 "--user-data-dir=" .. TMP .. "/chromium" }
  for _, a in ipairs(extra) do argv[#argv + 1] = a end
  argv[#argv + 1] = url
  return argv
end

describe("sbxlua dashboard", function()
  local job, dash, port, ids

  setup(function()
    assert(fs.mkdir_host(TMP))
    write(TMP .. "/sbx.yaml", CONFIG)
    write(TMP .. "/job.lua", JOB)
    local out
    job, out = start({ TMP .. "/job.lua" }, "ready")
    ids = {}
    for id in out:gmatch("id (%S+)") do ids[#ids + 1] = id end
    local text
    dash, text = start({ "dashboard" }, "http://127%.0%.0%.1:%d+/")
    port = tonumber(text:match("http://127%.0%.0%.1:(%d+)/"))
  end)

  teardown(function()
    stop(dash)
    stop(job)
    fs.rmtree(TMP)
  end)

  it("prints its address and serves the JSON endpoints from the state directory", function()
    assert.equal(3, #ids)
    local rows = get_json(port, "/api/sandboxes")
    local seen = {}
    for _, r in ipairs(rows) do
      seen[r.id] = r
      assert.equal("local", r.backend)
      assert.equal("running", r.state)
      assert.equal("evals", r.labels.team)
      assert.is_true(r.age_secs >= 0)
    end
    for _, id in ipairs(ids) do assert.is_truthy(seen[id], id .. " not listed") end
    assert.equal(3, #rows)

    local spend = get_json(port, "/api/spend")
    assert.equal(3, spend.sandboxes)
    assert.is_true(spend.total_usd > 0)
    local sum = 0
    for _, v in ipairs(spend.by_provider["local"]) do sum = sum + v end
    assert.near(spend.total_usd, sum, 1e-12)
    assert.is_truthy(spend.by_label["team=evals"])
    assert.equal(#spend.starts, #spend.by_label["team=evals"])

    local decisions = get_json(port, "/api/decisions")
    assert.is_true(#decisions >= 3)
    for i = 1, 3 do
      assert.same({ "local" }, decisions[i].order)
      assert.equal("local", decisions[i].backend)
      assert.is_truthy(decisions[i].reason)
      assert.equal("not in 'only'", decisions[i].skipped.docker)
    end

    local health = get_json(port, "/api/health")
    assert.equal(3, health["local"].creates)
    assert.equal(0, health["local"].error_rate)
    assert.equal("closed", health["local"].breaker)
    assert.is_true(health["local"].p50_create_ms >= 0)
    assert.is_true(health["local"].available)

    local all = get_json(port, "/api/summary?since=2h&bucket=600")
    assert.equal(3, #all.sandboxes)
    assert.equal(600, all.spend.bucket_secs)
    assert.is_false(all.actions)
    -- the live ones, priced so far: $36/h x their age
    local accruing = 0
    for _, r in ipairs(all.sandboxes) do accruing = accruing + 36 * r.age_secs / 3600 end
    assert.near(accruing, all.spend.accruing_usd, 1e-9)
  end)

  it("shows the job's sandboxes and spend in a real headless Chromium (DOM and screenshot)", function()
    if not proc.which("chromium", "/usr/bin:/bin") then
      assert(os.getenv("CI") ~= "true", "chromium is missing; CI installs it from ./dev's PACKAGES")
      pending("chromium is missing (apt-get install chromium): the browser check is skipped")
      return
    end
    local url = "http://127.0.0.1:" .. port .. "/"
    local r = assert(proc.spawn{ argv = chromium_argv({ "--virtual-time-budget=3000", "--dump-dom" }, url),
                                 env = ENV, timeout = 120 }):wait()
    assert.equal(0, r.exit_code, r.stderr)
    local dom = r.stdout
    -- the rows are made by the page's script (the table body is empty in the HTML)
    for _, id in ipairs(ids) do
      assert.is_truthy(dom:find('<tr data%-id="' .. id:gsub("%-", "%%-") .. '">'), id .. " not on the page")
    end
    assert.matches('<td class="state running">running</td>', dom)
    assert.matches("run=1, team=evals", dom)
    assert.matches('<span id="sandbox%-count" class="count">3 on this host</span>', dom)
    assert.matches('<p id="spend%-total">%$0%.%d+ over 3 finished sandboxes', dom)
    assert.matches("team=evals %$0%.%d+", dom)                       -- the label chart's legend
    assert.matches('<rect x="[%d.]+" y="[%d.]+" width="[%d.]+" height="[%d.]+" fill="#4e79a7">', dom)
    assert.matches('<tr data%-provider="local"><td class="id">local</td><td>yes</td>', dom)
    assert.matches("not in 'only'", dom)
    assert.matches('<section id="actions" hidden="">', dom)         -- read-only: no action shown
    -- what the user sees, kept as a test artifact
    assert(fs.mkdir_host(ARTIFACTS))
    local shot = ARTIFACTS .. "/dashboard.png"
    os.remove(shot)
    r = assert(proc.spawn{ argv = chromium_argv({ "--window-size=1280,1100", "--screenshot=" .. shot }, url),
                           env = ENV, timeout = 120 }):wait()
    assert.equal(0, r.exit_code, r.stderr)
    local png = assert(fs.read_host(shot, 16 << 20), "no screenshot at " .. shot)
    assert.equal("\137PNG\r\n\26\n", png:sub(1, 8))
    assert.is_true(#png > 20000, "a blank page? " .. #png .. " bytes")
    print("dashboard screenshot: " .. shot)
  end)

  it("is read-only by default and answers bad requests with clear statuses", function()
    local status, body = http(port, "POST", "/api/gc", { ["Content-Length"] = "0" })
    assert.equal(403, status)
    assert.matches("actions are off: start sbxlua dashboard %-%-allow%-actions", body)
    -- another Host (DNS rebinding): refused
    status = http(port, "GET", "/api/sandboxes", { Host = "attacker.example:" .. port })
    assert.equal(403, status)
    status = http(port, "GET", "/api/sandboxes", { Host = false }, "GET /api/sandboxes HTTP/1.0\r\n\r\n")
    assert.equal(403, status)
    status, body = http(port, nil, nil, nil, "GARBAGE\r\n\r\n")
    assert.equal(400, status)
    assert.matches("bad method", body)
    status = http(port, "GET", "/api/sandboxes", { ["X-Big"] = string.rep("x", 9000) })
    assert.equal(431, status)
    status = http(port, "PUT", "/api/sandboxes")
    assert.equal(405, status)
    status = http(port, "GET", "/api/sandboxes", { ["Content-Length"] = "5" })
    assert.equal(413, status)
    status, body = http(port, "GET", "/nope")
    assert.equal(404, status)
    assert.matches("no such page", body)
    status, body = http(port, "GET", "/api/summary?since=soon")
    assert.equal(400, status)
    assert.matches("since expects", body)
    -- a client that sends nothing does not block the others
    local idle = assert(stream.connect{ host = "127.0.0.1", port = tostring(port) })
    assert.equal(200, (http(port, "GET", "/app.js")))
    idle:close()
  end)

  it("--allow-actions: gc from the page needs the token printed at start", function()
    local admin, text = start({ "dashboard", "--allow-actions", "--listen", "127.0.0.1:0" }, "token=%x+")
    local aport = tonumber(text:match("http://127%.0%.0%.1:(%d+)/"))
    local token = text:match("token=(%x+)")
    assert.equal(32, #token)
    local ok, err = pcall(function()
      assert.is_true(get_json(aport, "/api/summary").actions)
      -- the job dies without cleaning up: its sandboxes are orphans now
      job:kill(9)
      job:wait()
      job = nil
      for _, r in ipairs(get_json(aport, "/api/sandboxes")) do assert.equal("orphaned", r.state) end
      local status = http(aport, "POST", "/api/gc", { ["Content-Length"] = "0" })
      assert.equal(403, status)
      status = http(aport, "POST", "/api/gc", { ["X-Sbx-Token"] = string.rep("0", 32) })
      assert.equal(403, status)
      status = http(aport, "POST", "/api/gc", { ["X-Sbx-Token"] = token, Origin = "http://attacker.example" })
      assert.equal(403, status)
      local body
      status, body = http(aport, "POST", "/api/gc", { ["X-Sbx-Token"] = token,
                                                      Origin = "http://127.0.0.1:" .. aport })
      assert.equal(200, status, body)
      local res = json.decode(body)
      assert.equal(0, res.exit_code)
      assert.matches("gc: destroyed 3 sandboxes from 1 dead sessions", res.report)
      local _, empty = http(aport, "GET", "/api/sandboxes")
      assert.equal("[]", empty)
    end)
    stop(admin)
    assert(ok, err)
  end)

  it("bad --listen values are usage errors; a port in use is a clear error", function()
    local r = assert(proc.spawn{ argv = { BIN, "dashboard", "--listen", "localhost:80" }, env = ENV,
                                 timeout = 30 }):wait()
    assert.equal(2, r.exit_code)
    assert.matches("%-%-listen expects PORT, IPV4:PORT or IPV4, got 'localhost:80'", r.stderr)
    r = assert(proc.spawn{ argv = { BIN, "dashboard", "--listen", "127.0.0.1:" .. port }, env = ENV,
                           timeout = 30 }):wait()
    assert.equal(1, r.exit_code)
    assert.matches("cannot listen on 127%.0%.0%.1:" .. port, r.stderr)
  end)
end)
