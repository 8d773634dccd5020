--- Ownership: the session, its journal, the sandboxes this process owns,
--- and what `sbxlua ls` / `sbxlua gc` read back after a crash.
---
--- A session is one sbxlua process. It holds an flock on
--- `<state>/sessions/<id>.lock` for its whole life, so "is the owner alive?"
--- is a question the kernel answers (no pid reuse races). Before any
--- backend resource is created a journal line is appended and fsynced.
--- One file (~410 lines): reading other sessions' journals back for gc uses
--- owner's private helpers (the sessions directory, whether a journal's
--- owner runs); a module of its own would need them exported or a cycle.
local fs = require "sbx.fs"
local proc = require "sbx.proc"
local json = require "cjson.safe"
local errors = require "sbx.core.errors"
local claims = require "sbx.state.claims"

local M = {}

local session            -- { id=, journal=, lock= }
local owned = {}         -- id -> Sandbox, in this process
local order = {}         -- ids in creation order
local shutting_down = false
local unfinished = false -- something may be left: the journal stays for gc
local configured_dir     -- the config's state_dir (set_state_dir)
local session_hook       -- fn(session) once the session is open (on_session)
-- What each owned sandbox was claimed as: { seq =, task = } (the task that
-- created or acquired it, and when), for sbx.parallel's cleanup.
local claimed = setmetatable({}, { __mode = "k" })

---sbxlua is stopping (a signal): no new sandboxes from now on.
function M.shut_down() shutting_down = true end
function M.is_shutting_down() return shutting_down end

---Something of a sandbox may be left (a destroy or a create's cleanup
---failed): the session's journal is kept at exit, for `sbxlua gc`.
function M.keep_journal() unfinished = true end

---The config's state_dir (nil: none); $SBX_STATE_DIR still comes first.
function M.set_state_dir(dir) configured_dir = dir end

---fn(session) runs once this process's session is open (one hook: a new
---one replaces the last).
function M.on_session(fn) session_hook = fn end

---The state directory: $SBX_STATE_DIR, the config's state_dir, $XDG_STATE_HOME/sbxlua, ~/.local/state/sbxlua.
function M.state_dir()
  local d = os.getenv("SBX_STATE_DIR")
  if d and d ~= "" then return d end
  if configured_dir then return configured_dir end   -- sbx.yaml state_dir
  d = os.getenv("XDG_STATE_HOME")
  if d and d ~= "" then return d .. "/sbxlua" end
  return (os.getenv("HOME") or "/tmp") .. "/.local/state/sbxlua"
end

local function sessions_dir() return M.state_dir() .. "/sessions" end

-- (uname's nodename: one system call, where reading
-- /proc/sys/kernel/hostname took six on every create)
function M.hostname()
  local sys, _, h = proc.uname()
  if not sys or h == "" then h = "localhost" end
  return (h:gsub("%s+$", ""):gsub("[^%w%-%.]", "_"))
end

local hex = proc.random_hex

function M.new_id() return "sbx-" .. hex(12) end

-- The state directory holds journals, locks and sandbox directories: made
-- 0700; one that already existed open to others is made 0700 too (said
-- only when that fails: it is not ours to change).
local function make_private(dir)
  local root = fs.open_root(dir)
  local st = root and root:stat(".")
  if root then root:close() end
  if st and st.mode & 63 ~= 0 and not fs.chmod_host(dir, st.mode & ~63) then
    io.stderr:write(string.format("sbxlua: warning: the state directory %s is mode %04o, open to other users"
                                  .. " (its journals name every sandbox); chmod 700 it\n", dir, st.mode))
  end
end

---This process's session, opened (journal + lock) on first use.
---@return table|nil, string? error
function M.session()
  if session then return session end
  local id = string.format("%s-%d-%s", M.hostname(), proc.getpid(), hex(6))
  local base = sessions_dir() .. "/" .. id
  -- The lock before the journal: gc judges every journal it finds by its
  -- lock, and a journal seen unlocked is a dead session's, swept with its
  -- cgroup while we go on creating sandboxes in it.
  local ok, merr = fs.mkdir_host(sessions_dir())
  if not ok then return nil, merr end
  make_private(M.state_dir())
  local lock, lerr = fs.lock(base .. ".lock")
  if not lock then return nil, lerr end
  local journal, err = fs.journal(base .. ".jsonl")
  if not journal then
    lock:unlock()
    os.remove(base .. ".lock")
    return nil, err
  end
  session = { id = id, journal = journal, lock = lock, host = M.hostname() }
  local rok, werr = M.record{ event = "session", host = session.host, pid = proc.getpid(),
                             pid_start = M.process_start(proc.getpid()), started = os.time() }
  if not rok then
    session = nil
    journal:close()
    os.remove(base .. ".jsonl")
    os.remove(base .. ".lock")
    lock:unlock()
    return nil, werr
  end
  if session_hook then session_hook(session) end
  return session
end

function M.session_id() return session and session.id end

---The start time of process `pid` (clock ticks after boot), and whether it
---has exited (a zombie); nil when there is no such process.
function M.process_start(pid)
  pid = math.tointeger(pid)
  local s = pid and pid > 0 and fs.read_host("/proc/" .. pid .. "/stat", 4096)
  local rest = s and s:match("%) (.*)$")          -- the fields after (comm)
  if not rest then return nil end
  local state, i = rest:sub(1, 1), 2
  for f in rest:gmatch("%S+") do                  -- field 3 is rest's first
    if i == 21 then return tonumber(f), state == "Z" end
    i = i + 1
  end
end

-- Is the sbxlua of a session's journal (`e`: its "session" event) still
-- running? A held lock alone may be a child of a killed sbxlua between
-- clone and exec, holding a copy of its fds for a moment: gc right after
-- the kill took such a session for live. Sessions of other hosts (their
-- pids mean nothing here) and journals without a pid: the lock decides.
local function owner_running(e)
  if not e or not math.tointeger(e.pid) or e.host ~= M.hostname() then return true end
  local start, zombie = M.process_start(e.pid)
  if not start or zombie then return false end
  return e.pid_start == nil or e.pid_start == start
end
M.owner_running = owner_running

---The lock file that says whether the current session is alive; backends
---label resources with it, so a gc run from any state directory can ask.
function M.lock_path() return session and (sessions_dir() .. "/" .. session.id .. ".lock") end

---Is the session that owns a resource alive? `lock` is the resource's
---sbxlua.lock label when it has one; else the session's lock in our state dir.
function M.session_alive(id, lock)
  if id and session and id == session.id then return true end
  if not (lock and lock ~= "") then
    if id == nil then return false end
    lock = sessions_dir() .. "/" .. id .. ".lock"
  end
  return fs.is_locked(lock) and owner_running(M.session_event(lock:gsub("%.lock$", ".jsonl")))
end

---Append one line to the journal: written at once, so gc sees it after a
---SIGKILL; fsynced too only when `durable` (the line before a create, G1:
---a machine that dies must still know what may exist). A "ready",
---"destroy" or snapshot line lost with the machine costs nothing: gc finds
---the resource from its create line and the backend's own listing.
---
---Durable lines written in one turn of the loop share one fdatasync (a
---group commit): the first starts a task that syncs after the others of
---its turn have written theirs, and each waits for that sync. A thousand
---creates issued at once paid for a thousand syncs on the loop thread
---before; outside a task the sync is done at once.
---@param durable? boolean
local batch            -- { done = event, ok =, err = } of the sync not yet started
function M.record(entry, durable)
  entry.session = entry.session or session.id
  local journal = session.journal
  local ok, err = journal:append(json.encode(entry) .. "\n", false)
  if not ok or not durable then return ok, err end
  local loop = require "sbx.loop"
  if not loop.current() then return journal:append("", true) end
  local b = batch
  if not b then
    b = { done = loop.event() }
    batch = b
    loop.spawn(function()
      batch = nil                   -- later lines wait for the next sync
      b.ok, b.err = journal:append("", true)   -- (never yields: no line joins meanwhile)
      b.done:notify()
    end)
  end
  b.done:wait()                     -- a batch found here has not synced yet
  return b.ok, b.err
end

-- Creates in flight (id -> the task making it; create_on clears it) and
-- tasks the session must outlive (M.hold: a create's engine call, the fill
-- of docker's agent volume): destroy_all cancels the first and waits for
-- both, so nothing a create made can land after the journal is gone.
local inflight, held = {}, {}

---The create of sandbox `id` is over (made, or failed and cleaned up).
function M.created(id) inflight[id] = nil end

---Keep the session (and its journal) until task `t` has ended.
function M.hold(t)
  if #held > 32 then
    local live = {}
    for _, h in ipairs(held) do if h:status() ~= "done" then live[#live + 1] = h end end
    held = live
  end
  held[#held + 1] = t
end

---Journal the sandbox about to exist; raises SandboxCreationError when the
---journal cannot be written (nothing is created unrecorded).
function M.before_create(entry)
  if shutting_down then
    errors.raise("SandboxCreationError", "sbxlua is shutting down: no new sandboxes",
                 { backend = entry.backend, op = "create" })
  end
  local s, err = M.session()
  local ok = s and M.record(entry, true)
  if not ok then
    errors.raise("SandboxCreationError",
      "cannot record the sandbox in the state directory " .. M.state_dir()
      .. " (" .. tostring(err or "write failed") .. "); set SBX_STATE_DIR to a writable directory",
      { backend = entry.backend, op = "create" })
  end
  entry.session = s.id
  local t = require("sbx.loop").current()
  if t and entry.id then inflight[entry.id] = t end
  return s
end

-- Each engine call has its own deadline; this one bounds them all (G4):
-- what is still in flight then keeps the journal (keep_journal) for gc.
M.SETTLE_SECS = 30

local function settle()
  local loop = require "sbx.loop"
  local me, deadline = loop.current(), loop.now() + M.SETTLE_SECS
  local function wait(t)
    while t ~= me and t:status() ~= "done" and loop.now() < deadline do loop.sleep(0.02) end
    return t == me or t:status() == "done"
  end
  local late = 0
  for _, t in pairs(inflight) do if t ~= me then t:cancel() end end
  while next(inflight) do      -- waiting runs other tasks: one at a time
    local id, t = next(inflight)
    inflight[id] = nil
    if not wait(t) then late = late + 1 end
  end
  local i = 1
  while i <= #held do          -- a held task may hold another: the list grows
    if not wait(held[i]) then late = late + 1 end
    i = i + 1
  end
  held = {}
  if late > 0 then
    unfinished = true
    io.stderr:write("sbxlua: at exit: ", late, " engine calls of creates still running after ", M.SETTLE_SECS,
                    " s; the journal stays for `sbxlua gc`\n")
  end
end

-- Embedded in another host (require "sbx" from lua5.4), nobody calls
-- destroy_all at exit: closing the Lua state does, through a finalizer.
-- lua_close runs finalizers newest-marked first, so the sentinel is made
-- anew after the session's journal, the engine connection and each
-- sandbox exist: it runs before they are closed (an older one does nothing).
local sentinel
local function arm()
  sentinel = setmetatable({}, { __gc = function(me)
    if me == sentinel then pcall(M.destroy_all, { finalizer = true }) end
  end })
end
arm()

local seq = 0
function M.seq() return seq end

---Own `sb`: it is destroyed at exit, and counts as made by the calling task.
function M.add(sb)
  seq = seq + 1
  claimed[sb] = { seq = seq, task = require("sbx.loop").current() }
  owned[sb.id] = sb
  order[#order + 1] = sb.id
  arm()
end

function M.remove(id) owned[id] = nil end

---An owned sandbox handed to the calling task (a warm pool's acquire):
---it counts as made by that task, after everything created so far.
function M.claim(sb)
  claimed[sb] = { seq = seq + 0.5, task = require("sbx.loop").current() }
end

---The owned sandboxes task `task` created or claimed after seq() was `mark`.
function M.made_since(task, mark)
  local list = {}
  for _, sb in ipairs(M.owned()) do
    local c = claimed[sb]
    if c and c.task == task and c.seq > mark then list[#list + 1] = sb end
  end
  return list
end

function M.owned()
  local list = {}
  for _, id in ipairs(order) do
    if owned[id] then list[#list + 1] = owned[id] end
  end
  return list
end

local closers = {}

---fn(wait) runs first in every destroy_all (warm pools close there, so no
---create of theirs lands after it); `wait` is false in a finalizer, where
---nothing may wait.
function M.on_destroy_all(fn) closers[#closers + 1] = fn end

---Destroy everything this process owns, newest first; errors are reported, not raised.
---opts.finalizer: called while the Lua state closes.
function M.destroy_all(opts)
  local wait = not (opts and opts.finalizer)
  for _, fn in ipairs(closers) do
    local ok, err = pcall(fn, wait)
    if not ok then io.stderr:write("sbxlua: at exit: ", tostring(err), "\n") end
  end
  settle()
  local list = M.owned()
  for i = #list, 1, -1 do
    local ok, err = pcall(list[i].destroy, list[i])
    if not ok then
      io.stderr:write("sbxlua: could not destroy ", list[i].id, ": ", tostring(err), "\n")
    end
  end
  order = {}
  if next(owned) == nil then M.end_session() end
end

---Everything was destroyed: remove the session's journal, lock and
---per-backend containers. (After a crash they stay for `sbxlua gc`.)
function M.end_session()
  if not session then return end
  local s = session
  session = nil
  local base = sessions_dir() .. "/" .. s.id
  s.journal:close()
  local providers = require "sbx.providers"
  local all = true
  for _, name in ipairs(providers.names) do
    local p = providers.get(name)
    if p.forget_session and not pcall(p.forget_session, s.id) then all = false end
  end
  -- a cgroup still busy, or a destroy that failed (keep_journal): the
  -- journal stays, so `sbxlua gc` finishes the job
  if all and not unfinished then os.remove(base .. ".jsonl") end
  os.remove(base .. ".lock")
  s.lock:unlock()
end

---Sandbox directories a host-directory backend keeps under
---<state>/<kind>/<session>/<id>.XXXXXX, as gc's list of what exists.
function M.sandbox_dirs(kind)
  local found = {}
  local top = M.state_dir() .. "/" .. kind
  for _, session in ipairs(fs.list_host(top) or {}) do
    for _, name in ipairs(claims.session_ok(session) and fs.list_host(top .. "/" .. session) or {}) do
      local id = name:match("^(.-)%.") or name
      if claims.id_ok(id) then
        found[#found + 1] = { session = session, id = id, dir = top .. "/" .. session .. "/" .. name }
      end
    end
  end
  return found
end

-- ------------------------------------------------------------- read back

---The "session" event of the journal at `path` (its first line), or nil.
function M.session_event(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local line = f:read("l")
  f:close()
  local e = line and json.decode(line)
  return type(e) == "table" and e.event == "session" and e or nil
end

---Every session in the state directory with its live sandboxes. A line or
---a file that is not a journal's is skipped and reported on stderr (file
---and line), or to opts.report(path, line, why).
---@return table[] { id=, live=, host=, pid=, path=, sandboxes = { entry... }, snapshots = { started=, kept = { [snapshot_id] = true } } }
function M.sessions(opts)
  local report = opts and opts.report or claims.say_skipped
  local dir = sessions_dir()
  local names = fs.list_host(dir) or {}
  local list = {}
  for _, name in ipairs(names) do
    local id = name:match("^(.*)%.jsonl$")
    if id and not claims.session_ok(id) then
      report(dir .. "/" .. name, 0, "not a session journal's name")
    elseif id then
      local live = fs.is_locked(dir .. "/" .. id .. ".lock")
      -- a live session may be appending its last line right now
      local info = claims.read_journal(dir .. "/" .. name, id, function(p, n, why)
        if not (live and why:find("^truncated")) then report(p, n, why) end
      end)
      local s = { id = id, path = dir .. "/" .. id, host = info.host, pid = info.pid,
                  started = info.started, sandboxes = {}, snapshots = info.snapshots,
                  live = live and owner_running(info.event) }
      for _, sid in ipairs(info.order) do
        if info.sandboxes[sid] then s.sandboxes[#s.sandboxes + 1] = info.sandboxes[sid] end
      end
      list[#list + 1] = s
    end
  end
  return list
end

---Close the dead session `s` in the journal: a destroy line per sandbox.
function M.forget_session(s)
  os.remove(s.path .. ".jsonl")
  os.remove(s.path .. ".lock")
end

function M.journal_destroyed(s, id)
  local j = fs.journal(s.path .. ".jsonl")
  if j then
    j:append(json.encode{ event = "destroy", id = id, session = s.id, by = "gc" } .. "\n")
    j:close()
  end
end

return M
