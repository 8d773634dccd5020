-- G2 harness (RELIABILITY.md): run short sbxlua jobs that create sandboxes on
-- local, bwrap and docker, SIGKILL them at random points, run `sbxlua gc`,
-- and count what is left: tagged processes, sandbox directories, containers,
-- cgroups, and snapshot images nobody heard back about. Used as a library by spec/reliability/g2_spec.lua and as a script
-- by bench/g2.sh:  sbxlua spec/harness/sigkill.lua [N] [MAX_DELAY_S] [BATCH] [SIGINT_RUNS]
-- Over 400 lines: one harness, the jobs it kills and the counts it takes
-- after gc belong together.
local proc = require "sbx.proc"
local loop = require "sbx.loop"
local fs = require "sbx.fs"
local json = require "cjson"

local M = {}

M.BIN = os.getenv("SBX_BIN") or "build/sbxlua"
M.IMAGE = os.getenv("SBX_TEST_IMAGE") or "sbxlua-test:bookworm"
M.KINDS = { "procs", "dirs", "containers", "cgroups", "images" }

-- The job each killed sbxlua runs. arg: tag, backends (comma list), rounds.
-- It prints "phase X" before each phase so the harness knows where it died.
M.JOB = [==[
local tag, list, rounds = arg[1], arg[2], tonumber(arg[3] or "1000")
local IMAGE = os.getenv("SBX_TEST_IMAGE") or "sbxlua-test:bookworm"
local function phase(p) io.stdout:write("phase ", p, "\n") io.stdout:flush() end
local backends = {}
for b in list:gmatch("[^,]+") do backends[#backends + 1] = b end
phase("start")
for round = 1, rounds do
  local sbs = {}
  for _, b in ipairs(backends) do
    phase("create")
    local sb = sbx.sandbox(b, b == "docker" and { image = IMAGE } or nil)
    sbs[#sbs + 1] = sb
    phase("exec")
    local name = "sbxg2-" .. tag .. "-" .. b
    sb:spawn("bash", { "-c", "setsid bash -c 'exec -a " .. name .. " sleep 300' </dev/null >/dev/null 2>&1 & exec -a "
                             .. name .. " sleep 300" })
    assert(sb:execute_command("echo ok").stdout == "ok\n")
    phase("copy")
    local data = string.rep("g2", 50000)
    sb:write_file("g2.txt", data)
    assert(sb:read_file("g2.txt") == data)
    if b == "docker" then
      phase("snapshot")
      sb:snapshot()
    end
  end
  for _, sb in ipairs(sbs) do
    phase("destroy")
    sb:destroy()
  end
  phase("round")
end
phase("done")
]==]

-- Job that holds one live sandbox until told to go (stdin), for the
-- "gc never deletes a live session's sandboxes" case.
M.LIVE_JOB = [==[
local b = arg[1]
local IMAGE = os.getenv("SBX_TEST_IMAGE") or "sbxlua-test:bookworm"
local sb <close> = sbx.sandbox(b, b == "docker" and { image = IMAGE } or nil)
sb:write_file("keep.txt", "kept")
print("ready") io.stdout:flush()
io.read("l")
print(sb:read_file("keep.txt"), sb:execute_command("echo", { "alive" }).stdout)
]==]

-- Job for the SIGINT batches: `per` sandboxes of each backend created in
-- parallel, each then running a tagged process; arg: tag, backends, per.
-- G2_VOLUME_PREFIX: a docker agent volume of its own, so the fill (and its
-- helper container) happens inside the interrupted creates.
M.PAR_JOB = [==[
local tag, list, per = arg[1], arg[2], tonumber(arg[3] or "3")
local IMAGE = os.getenv("SBX_TEST_IMAGE") or "sbxlua-test:bookworm"
local prefix = os.getenv("G2_VOLUME_PREFIX")
if prefix and prefix ~= "" then require("sbx.providers.builtin.docker").VOLUME_PREFIX = prefix end
local function phase(p) io.stdout:write("phase ", p, "\n") io.stdout:flush() end
local items = {}
for b in list:gmatch("[^,]+") do for _ = 1, per do items[#items + 1] = b end end
phase("create")
sbx.parallel(items, function(b)
  local sb = sbx.sandbox(b, b == "docker" and { image = IMAGE } or nil)
  sb:spawn("bash", { "-c", "exec -a sbxg2-" .. tag .. "-" .. b .. " sleep 300" })
  phase("exec")
  sbx.sleep(300)
end)
phase("done")
]==]

local sh = require("spec.support").stdout

function M.available()
  local av = { "local" }
  for _, b in ipairs{ "bwrap", "docker" } do
    local ok, mod = pcall(require, "sbx.providers.builtin." .. b)
    if ok and mod.available() then
      if b ~= "docker" or sh("docker image inspect " .. M.IMAGE .. " >/dev/null 2>&1 && echo y") == "y\n" then
        av[#av + 1] = b
      end
    end
  end
  return av
end

---A fresh run: its own state dir and random tag.
function M.new_run(opts)
  opts = opts or {}
  local r = setmetatable({}, { __index = M })
  r.tag = proc.random_hex(10)
  r.state = opts.state or ((os.getenv("TMPDIR") or "/tmp") .. "/sbxg2-" .. r.tag)
  os.execute("mkdir -p " .. r.state)
  r.job = r.state .. "/job.lua"
  r.live_job = r.state .. "/live.lua"
  r.par_job = r.state .. "/par.lua"
  for path, code in pairs{ [r.job] = M.JOB, [r.live_job] = M.LIVE_JOB, [r.par_job] = M.PAR_JOB } do
    local f = assert(io.open(path, "w")) f:write(code) f:close()
  end
  r.backends = opts.backends or M.available()
  r.pids = {}                -- pids of every sbxlua we started (cgroup names carry them)
  r.old_cgroups = M.cgroup_names()   -- there before the run: an old session's whose pid we reuse
  r.runs, r.kills, r.exited = 0, {}, 0
  r.leftovers = {}           -- [backend][kind] = n
  r.leaks = {}               -- descriptions
  r.kept = {}                -- snapshot images the journals say were finished (the user's)
  r.stops = {}               -- SIGINT batches: [how] = jobs
  r.unclean, r.unlisted = 0, 0   -- left by a clean stop before gc; left but not in `ls`
  r.volumes = {}             -- agent volumes of our own (G2_VOLUME_PREFIX)
  return r
end

function M:env()
  return { "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" .. (os.getenv("HOME") or self.state),
           "SBX_STATE_DIR=" .. self.state, "SBX_TEST_IMAGE=" .. M.IMAGE }
end

function M:start(args, opts)
  local argv = { M.BIN }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local env = self:env()
  if opts and opts.volume then env[#env + 1] = "G2_VOLUME_PREFIX=" .. opts.volume end
  local p = assert(proc.spawn{ argv = argv, env = env, stream = true,
                               keep_stdin = opts and opts.stdin })
  self.pids[p.pid] = true
  return p
end

-- Collect a streaming process's stdout in a task; returns a record.
local function collect(p)
  local rec = { p = p, out = "", err = "" }
  rec.task = loop.spawn(function()
    while true do
      local which, chunk = p:read()
      if not which then break end
      if which == "stdout" then rec.out = rec.out .. chunk else rec.err = rec.err .. chunk end
    end
    rec.eof = true
  end)
  return rec
end

function M:gc()
  local p = assert(proc.spawn{ argv = { M.BIN, "gc" }, env = self:env(), timeout = 120 })
  local r = p:wait()
  if r.exit_code ~= 0 then
    self.leaks[#self.leaks + 1] = "gc exited " .. tostring(r.exit_code) .. ": " .. (r.stderr or "")
  end
  return r
end

-- The engine's list of containers or images carrying `label`, as JSON text.
local function engine_list(what, label)
  local filters = json.encode{ label = { label } }
  return sh("curl -s --unix-socket /var/run/docker.sock 'http://d/" .. what .. "/json?all=true&filters="
            .. filters:gsub("[^%w]", function(c) return string.format("%%%02X", c:byte()) end) .. "'")
end

local function session_pid(name)
  return tonumber((name or ""):match("^.-%-(%d+)%-%x+$") or "")
end

local function tally(t, b, kind, n)
  t[b] = t[b] or {}
  t[b][kind] = (t[b][kind] or 0) + n
end

---Count what this run left: { [backend] = { procs=, dirs=, containers=, cgroups= } }, details.
function M:count(exclude_tags)
  local found, details, ids = {}, {}, {}
  for _, b in ipairs{ "local", "bwrap", "docker" } do
    local out = sh("pgrep -af '[s]bxg2-" .. self.tag .. "-" .. b .. "'")
    local n = 0
    for line in out:gmatch("[^\n]+") do n = n + 1 details[#details + 1] = b .. " process: " .. line end
    tally(found, b, "procs", n)
  end
  for _, b in ipairs{ "local", "bwrap" } do
    local top = self.state .. "/" .. b
    for _, s in ipairs(fs.list_host(top) or {}) do
      if exclude_tags and exclude_tags[session_pid(s)] then goto next_session end
      for _, name in ipairs(fs.list_host(top .. "/" .. s) or {}) do
        -- the spare directories destroys keep: a leftover only if not empty
        if s == ".spare" and #(fs.list_host(top .. "/" .. s .. "/" .. name) or { 1 }) == 0 then goto next_dir end
        tally(found, b, "dirs", 1)
        details[#details + 1] = b .. " dir: " .. top .. "/" .. s .. "/" .. name
        ids[#ids + 1] = name:match("^(.-)%.") or name
        ::next_dir::
      end
      ::next_session::
    end
  end
  if self:has("docker") then
    local ok, list = pcall(json.decode, engine_list("containers", "sbxlua.host"))
    local prefix = self.state .. "/sessions/"
    for _, c in ipairs(ok and type(list) == "table" and list or {}) do
      local lock = (c.Labels or {})["sbxlua.lock"] or ""
      if lock:sub(1, #prefix) == prefix
         and not (exclude_tags and exclude_tags[session_pid((c.Labels or {})["sbxlua.session"])]) then
        tally(found, "docker", "containers", 1)
        details[#details + 1] = "docker container: " .. c.Id:sub(1, 12) .. " " .. tostring(c.State)
                                .. " session " .. tostring(c.Labels["sbxlua.session"])
                                .. (c.Labels["sbxlua.helper"] and " (agent volume helper)" or "")
        if not c.Labels["sbxlua.helper"] then ids[#ids + 1] = c.Labels["sbxlua.id"] end
      end
    end
    for _, img in ipairs(self:images(exclude_tags)) do
      if not self.kept[img.Id] then
        tally(found, "docker", "images", 1)
        details[#details + 1] = "docker snapshot image: " .. img.Id:sub(1, 19) .. " session "
                                .. tostring(img.Labels["sbxlua.session"])
      end
    end
  end
  for path in pairs(M.cgroup_names()) do
    local pid = session_pid(path:match("[^/]+$"))
    if pid and self.pids[pid] and not self.old_cgroups[path] and not (exclude_tags and exclude_tags[pid]) then
      tally(found, "cgroup", "cgroups", 1)
      details[#details + 1] = "cgroup: " .. path
    end
  end
  return found, details, ids
end

---The session cgroups on this host ({ [path] = true }): under the v2 base,
---and the v1 groups that limit bwrap sandboxes (sbx.limits).
function M.cgroup_names()
  local bases, out = { require("sbx.providers.builtin.local").containment() }, {}
  for _, how in pairs(require("sbx.providers.builtin.limits").controllers()) do
    if how.v == 1 then bases[#bases + 1] = how.dir end
  end
  for _, cgbase in ipairs(bases) do
    for _, name in ipairs(fs.list_host(cgbase) or {}) do out[cgbase .. "/" .. name] = true end
  end
  return out
end

---Snapshot images of this run's sessions (but those of `exclude_tags`).
function M:images(exclude_tags)
  local ok, list = pcall(json.decode, engine_list("images", "sbxlua.snapshot"))
  local out = {}
  for _, img in ipairs(ok and type(list) == "table" and list or {}) do
    local pid = session_pid((img.Labels or {})["sbxlua.session"])
    if pid and self.pids[pid] and not (exclude_tags and exclude_tags[pid]) then out[#out + 1] = img end
  end
  return out
end

function M:has(b)
  for _, x in ipairs(self.backends) do if x == b then return true end end
  return false
end

---One batch: start `n` jobs in parallel, SIGKILL each after a random delay
---(0..max_delay s), gc, count. Returns the leftover table and details.
function M:batch(n, max_delay, opts)
  opts = opts or {}
  local recs = {}
  for i = 1, n do
    local list = opts.backends_for and opts.backends_for(i) or self.backends
    local rec = collect(self:start{ self.job, self.tag, table.concat(list, ","), opts.rounds or "1000" })
    rec.delay = math.random() * max_delay
    rec.started = loop.now()
    recs[i] = rec
  end
  local cgc
  if opts.concurrent_gc then   -- a gc racing the jobs (and any live session)
    cgc = assert(proc.spawn{ argv = { M.BIN, "gc" }, env = self:env(), timeout = 120 })
  end
  table.sort(recs, function(a, b) return a.delay < b.delay end)
  for _, rec in ipairs(recs) do
    local wait = rec.started + rec.delay - loop.now()
    if wait > 0 then loop.sleep(wait) end
    os.execute("kill -9 " .. rec.p.pid)
  end
  for _, rec in ipairs(recs) do
    local r = rec.p:wait()
    self.runs = self.runs + 1
    if r.exit_code ~= nil and r.signal ~= 9 and r.exit_code ~= 137 then self.exited = self.exited + 1 end
  end
  if cgc then
    local r = cgc:wait()
    if r.exit_code ~= 0 then self.leaks[#self.leaks + 1] = "concurrent gc exited " .. tostring(r.exit_code) end
  end
  -- keep the dead sessions' journals, to explain any leftover afterwards
  local journals = {}
  for _, name in ipairs(fs.list_host(self.state .. "/sessions") or {}) do
    if name:match("%.jsonl$") then journals[#journals + 1] = fs.read_host(self.state .. "/sessions/" .. name, 1 << 24) or "" end
  end
  for _, j in ipairs(journals) do      -- finished snapshots are the user's: gc keeps them
    for line in j:gmatch("[^\n]+") do
      local ok, e = pcall(json.decode, line)
      if ok and type(e) == "table" and e.event == "snapshot_done" then self.kept[e.snapshot_id] = true end
    end
  end
  self:gc()
  loop.sleep(0.2)
  -- stdout must reach EOF once gc ran: a leftover holding it open is a leak too
  local deadline = loop.now() + 3
  for _, rec in ipairs(recs) do
    while not rec.eof and loop.now() < deadline do loop.sleep(0.05) end
    local ph = "start"
    for p in rec.out:gmatch("phase (%w+)") do ph = p end
    if ph == "round" then ph = "create" end       -- died between rounds: counted as next create
    rec.phase = ph
    self.kills[ph] = (self.kills[ph] or 0) + 1
    if not rec.eof then
      self.leaks[#self.leaks + 1] = "stdout of killed sbxlua " .. rec.p.pid .. " still open after gc (phase " .. ph .. ")"
      rec.task:cancel()
    end
  end
  local found, details = self:count(opts.exclude)
  for b, kinds in pairs(found) do
    for kind, c in pairs(kinds) do
      tally(self.leftovers, b, kind, c)
      if c > 0 then
        local phases = {}
        for _, rec in ipairs(recs) do phases[#phases + 1] = rec.phase end
        self.leaks[#self.leaks + 1] = string.format("%d %s %s after kills in phases [%s]", c, b, kind,
                                                    table.concat(phases, ","))
      end
    end
  end
  for _, d in ipairs(details) do
    self.leaks[#self.leaks + 1] = "  " .. d
    local id = d:match("/(sbx%-%x+)%.[^/]*$")
    for _, j in ipairs(id and journals or {}) do
      for line in j:gmatch("[^\n]+") do
        if line:find(id, 1, true) then self.leaks[#self.leaks + 1] = "    journal: " .. line end
      end
    end
  end
  if #details > 0 then       -- does a second gc finish the job? (G2 asks for one)
    self:gc()
    loop.sleep(0.2)
    local _, again = self:count(opts.exclude)
    self.leaks[#self.leaks + 1] = string.format("  after a second gc: %d of %d still left", #again, #details)
    self.second_gc_left = (self.second_gc_left or 0) + #again
  end
  return found, details, recs
end

-- Sandbox ids `sbxlua ls --json` lists for this run's state directory.
function M:listed()
  local p = assert(proc.spawn{ argv = { M.BIN, "ls", "--json" }, env = self:env(), timeout = 60 })
  local r = p:wait()
  local ok, rows = pcall(json.decode, r.stdout or "")
  local ids = {}
  for _, row in ipairs(ok and type(rows) == "table" and rows or {}) do ids[row.id] = true end
  if r.exit_code ~= 0 then self.leaks[#self.leaks + 1] = "ls exited " .. tostring(r.exit_code) .. ": " .. r.stderr end
  return ids
end

---One batch of `n` jobs creating sandboxes in parallel (`per` of each
---backend), each sent SIGINT after a random delay (0..max_delay s): once
---(how = "int"); twice at the same moment, as timeout(1) does ("twin"); or
---twice 0.5 s apart ("double": the second forces the teardown). A clean
---stop (int, twin) exits 130 and leaves nothing even before gc; whatever a
---forced one leaves, `sbxlua ls` lists; after gc nothing is left.
function M:signal_batch(n, max_delay, how, opts)
  opts = opts or {}
  local recs = {}
  local volume = self:has("docker") and ("sbxg2vol-" .. self.tag .. "-" .. proc.random_hex(3) .. "-") or nil
  for i = 1, n do
    local rec = collect(self:start({ self.par_job, self.tag, table.concat(self.backends, ","),
                                     tostring(opts.per or 3) }, { volume = volume }))
    rec.delay = math.random() * max_delay
    rec.started = loop.now()
    recs[i] = rec
  end
  if volume then self.volumes[#self.volumes + 1] = volume end
  table.sort(recs, function(a, b) return a.delay < b.delay end)
  for _, rec in ipairs(recs) do
    local wait = rec.started + rec.delay - loop.now()
    if wait > 0 then loop.sleep(wait) end
    if how == "twin" then os.execute("kill -INT " .. rec.p.pid .. "; kill -INT " .. rec.p.pid)
    else os.execute("kill -INT " .. rec.p.pid) end
  end
  if how == "double" then
    loop.sleep(0.5)
    for _, rec in ipairs(recs) do os.execute("kill -INT " .. rec.p.pid .. " 2>/dev/null") end
  end
  for _, rec in ipairs(recs) do
    local watchdog = loop.spawn(function()   -- G4: a stop that never ends is a leak too
      loop.sleep(60)
      self.leaks[#self.leaks + 1] = "sbxlua " .. rec.p.pid .. " still running 60 s after SIGINT (" .. how
        .. "); it and its children:\n" .. sh("ps -o pid,stat,wchan:24,etimes,args -p " .. rec.p.pid
        .. " --ppid " .. rec.p.pid .. " 2>&1") .. "fds: " .. sh("ls -l /proc/" .. rec.p.pid .. "/fd 2>&1 | wc -l")
      os.execute("kill -9 " .. rec.p.pid)
    end)
    local r = rec.p:wait()
    watchdog:cancel()
    self.stops[how] = (self.stops[how] or 0) + 1
    local ph = "start"
    for p in rec.out:gmatch("phase (%w+)") do ph = p end
    -- (killed by the default action: signalled before sbxlua installed its handler)
    local early = ph == "start" and r.signal ~= nil
    if r.exit_code ~= 130 and ph ~= "done" and not early then
      self.leaks[#self.leaks + 1] = string.format("SIGINT (%s) in phase %s: exit %s, want 130: %s", how, ph,
                                                  tostring(r.exit_code or r.signal), (rec.err or ""):sub(1, 300))
    end
  end
  loop.sleep(0.2)
  local before, details, ids = self:count()
  local listed = self:listed()
  for _, id in ipairs(ids) do
    if not listed[id] then
      self.unlisted = self.unlisted + 1
      self.leaks[#self.leaks + 1] = "left after SIGINT (" .. how .. ") but not in `sbxlua ls`: " .. tostring(id)
    end
  end
  if how ~= "double" and #details > 0 then
    self.unclean = self.unclean + #details
    self.leaks[#self.leaks + 1] = #details .. " left by a clean SIGINT stop (" .. how .. ") before gc:"
    for _, d in ipairs(details) do self.leaks[#self.leaks + 1] = "  " .. d end
  end
  self:gc()
  loop.sleep(0.2)
  local found, after = self:count()
  for b, kinds in pairs(found) do
    for kind, c in pairs(kinds) do tally(self.leftovers, b, kind, c) end
  end
  for _, d in ipairs(after) do self.leaks[#self.leaks + 1] = "after gc (" .. how .. "): " .. d end
  for _, rec in ipairs(recs) do if not rec.eof then rec.task:cancel() end end
  return before, details, after
end

function M:total_leftovers()
  local t = 0
  for _, kinds in pairs(self.leftovers) do for _, c in pairs(kinds) do t = t + c end end
  return t
end

function M:figure()
  local lines = {}
  local order = { "start", "create", "exec", "copy", "snapshot", "destroy", "done" }
  local ph = {}
  for _, p in ipairs(order) do if self.kills[p] then ph[#ph + 1] = p .. "=" .. self.kills[p] end end
  lines[#lines + 1] = string.format("G2 runs: %d SIGKILLs (%d jobs finished before the kill), backends: %s",
                                    self.runs, self.exited, table.concat(self.backends, ","))
  lines[#lines + 1] = "G2 kills by phase: " .. table.concat(ph, " ")
  local cols = {}
  for _, b in ipairs{ "local", "bwrap", "docker" } do
    local k = self.leftovers[b] or {}
    if self:has(b) then
      cols[#cols + 1] = string.format("%s procs=%d dirs=%d containers=%d", b, k.procs or 0, k.dirs or 0,
                                      k.containers or 0) .. (b == "docker" and (" images=" .. (k.images or 0)) or "")
    end
  end
  cols[#cols + 1] = "cgroups=" .. ((self.leftovers.cgroup or {}).cgroups or 0)
  lines[#lines + 1] = "G2 leftovers after gc: " .. table.concat(cols, "; ")
  if next(self.stops) then
    local st = {}
    for _, how in ipairs{ "int", "twin", "double" } do
      if self.stops[how] then st[#st + 1] = how .. "=" .. self.stops[how] end
    end
    lines[#lines + 1] = string.format("G2 SIGINT stops during parallel creates: %s; left by a clean stop"
      .. " before gc: %d; left but not in ls: %d", table.concat(st, " "), self.unclean, self.unlisted)
  end
  lines[#lines + 1] = "G2 total leftovers: " .. self:total_leftovers()
                      .. " (still there after a second gc: " .. (self.second_gc_left or 0) .. ")"
  return table.concat(lines, "\n")
end

function M:cleanup()
  self:gc()
  for _, prefix in ipairs(self.volumes) do
    local ok, list = pcall(json.decode, sh("curl -s --unix-socket /var/run/docker.sock 'http://d/volumes'"))
    for _, v in ipairs(ok and type(list) == "table" and list.Volumes or {}) do
      if v.Name:sub(1, #prefix) == prefix then
        sh("curl -s -X DELETE --unix-socket /var/run/docker.sock 'http://d/volumes/" .. v.Name .. "' >/dev/null")
      end
    end
  end
  for _, img in ipairs(self:has("docker") and self:images() or {}) do   -- the finished snapshots
    sh("curl -s -X DELETE --unix-socket /var/run/docker.sock 'http://d/images/" .. img.Id .. "?force=true' >/dev/null")
  end
  fs.rmtree(self.state)
end

-- Script mode: sbxlua spec/harness/sigkill.lua [N] [MAX_DELAY] [BATCH]
if arg and arg[0] and arg[0]:match("sigkill%.lua$") then
  local n = tonumber(arg[1] or os.getenv("N") or "200")
  local max_delay = tonumber(arg[2] or os.getenv("G2_MAX_DELAY") or "1.5")
  local batch = tonumber(arg[3] or os.getenv("G2_BATCH") or "3")
  math.randomseed(tonumber(proc.random_hex(8), 16))
  local run = M.new_run()
  io.stderr:write("G2: state ", run.state, " tag ", run.tag, " backends ", table.concat(run.backends, ","), "\n")
  local done = 0
  while done < n do
    local k = math.min(batch, n - done)
    -- each job uses 1-3 backends: a random non-empty subset
    run:batch(k, max_delay, { backends_for = function()
      local list = {}
      for _, b in ipairs(run.backends) do if math.random() < 0.6 then list[#list + 1] = b end end
      if #list == 0 then list[1] = run.backends[math.random(#run.backends)] end
      return list
    end })
    done = done + k
    if done % 30 < batch then io.stderr:write("G2: ", done, "/", n, " leftovers so far ", run:total_leftovers(), "\n") end
  end
  local stops = tonumber(arg[4] or os.getenv("G2_SIGINT") or "0")
  local hows = { "int", "twin", "double" }
  for i = 1, math.ceil(stops / batch) do
    run:signal_batch(math.min(batch, stops - (i - 1) * batch), max_delay * 2, hows[(i - 1) % 3 + 1])
  end
  print(run:figure())
  for _, l in ipairs(run.leaks) do print("LEAK " .. l) end
  run:cleanup()
  os.exit(run:total_leftovers() == 0 and #run.leaks == 0 and 0 or 1)
end

return M
