--- `sbxlua gc`: destroy what dead sessions left (G2 of RELIABILITY.md).
---
--- A session is dead when its lock is free or its sbxlua no longer runs
--- (owner.sessions). Its journal says what it created; each backend's own
--- listing of what it holds is trusted over the journal, so a sandbox the
--- journal never saw finished goes too. Then: snapshot images a dead
--- session never heard back about, what backends keep beyond sessions
--- (docker: other builds' agent volumes), and last the dead sessions
--- themselves, unless something of theirs is still busy (the next gc).
local owner = require "sbx.state.owner"
local providers = require "sbx.providers"
local errors = require "sbx.core.errors"
local fs = require "sbx.fs"
local loop = require "sbx.loop"

local M = {}

local function say(...) io.stdout:write(...) end
local function complain(...) io.stderr:write("sbxlua: ", ...) io.stderr:write("\n") end

local Run = {}
Run.__index = Run

function Run:fail(...)
  self.failed = self.failed + 1
  complain("gc: ", ...)
end

-- What a backend holds on this host. A backend that cannot be asked (no
-- Docker engine running) holds nothing gc could remove now: say so, go on.
local function owned_by(name, p)
  if not p.list_owned then return {} end
  local ok, list = pcall(p.list_owned)
  if ok then return list end
  if not errors.is(list, "BackendNotInstalledError") then error(list, 0) end
  complain("gc: ", name, " not checked: ", list.message)
  return {}
end

-- The dead sessions (this host's, or all with --all-sessions) and the live ones.
function Run:find_sessions()
  local host = owner.hostname()
  self.dead, self.live = {}, {}
  for _, s in ipairs(owner.sessions()) do
    if s.live then
      self.live[s.id] = true
    elseif self.all or s.host == nil or s.host == host then
      self.dead[s.id] = s
    end
  end
end

-- A session killed a moment ago may have requests still in flight at a
-- Docker engine or a cloud API (a container create lands after its death:
-- G2 found agent-volume helpers made after gc had listed). Such a session
-- journals each create before it asks, so gc lists only once 2 s have
-- passed since the last journal write of a dead session with a sandbox on
-- such a backend (mtimes are whole seconds: at most 3 s of waiting).
local SETTLE = 2
local IN_PROCESS = { ["local"] = true, bwrap = true }

function Run:settle()
  local newest
  for _, s in pairs(self.dead) do
    local remote = false
    for _, e in ipairs(s.sandboxes) do remote = remote or not IN_PROCESS[e.backend] end
    local st = remote and fs.stat_host(s.path .. ".jsonl")
    if st and (not newest or st.mtime > newest) then newest = st.mtime end
  end
  local wait = newest and newest + SETTLE + 1 - os.time()
  if wait and wait > 0 then loop.sleep(math.min(wait, SETTLE + 1)) end
end

-- What the backends list that no journal of a dead session names and no
-- live session owns: `extra`; and every listed resource by backend/id.
function Run:find_unjournaled()
  local journaled = {}
  for _, s in pairs(self.dead) do
    for _, e in ipairs(s.sandboxes) do journaled[e.id] = true end
  end
  self.extra, self.listed = {}, {}
  for _, name in ipairs(providers.names) do
    local p = providers.get(name)
    for _, r in ipairs(owned_by(name, p)) do
      if r.id then self.listed[name .. "/" .. r.id] = r end
      if not self.live[r.session] and not owner.session_alive(r.session, r.lock)
         and not journaled[r.id] then
        self.extra[#self.extra + 1] = { provider = p, entry = { id = r.id, session = r.session,
          backend = name, dir = r.dir, container = r.container,
          state = { dir = r.dir, own = true, container = r.container } } }
      end
    end
  end
end

function Run:reap(p, e, s)
  if self.dry then
    self.would = self.would + 1
    say("would destroy ", e.backend, " ", e.id, " (session ", e.session or "?", ")\n")
    return
  end
  local ok, err = pcall(p.reap, e)
  if not ok then return self:fail(e.id, ": ", tostring(err)) end
  self.removed = self.removed + 1
  if s then owner.journal_destroyed(s, e.id) end
end

function Run:reap_sandboxes()
  local n = #self.extra
  for _, s in pairs(self.dead) do n = n + #s.sandboxes end
  local stage <close> = require("sbx.core.progress").start("gc", function()
    return string.format("%d/%d sandboxes destroyed, %d failed", self.removed, n, self.failed),
           n > 0 and (self.removed + self.failed) / n
  end, { enabled = not self.dry })
  for _, s in pairs(self.dead) do
    self.sessions = self.sessions + 1
    for _, e in ipairs(s.sandboxes) do
      -- killed between "create" and "ready": the journal knows the id, the
      -- backend's listing knows where it is
      local r = self.listed[(e.backend or "") .. "/" .. e.id]
      if r and not e.state then
        e.state = { dir = r.dir, own = r.dir ~= nil, container = r.container }
      end
      local ok, p = pcall(providers.get, e.backend)
      if ok then self:reap(p, e, s) end
    end
  end
  for _, x in ipairs(self.extra) do self:reap(x.provider, x.entry, nil) end
end

-- Snapshots a dead session started and never heard back about.
function Run:reap_snapshots()
  for _, s in pairs(self.dead) do
    local done = 0
    for _ in pairs(s.snapshots.kept) do done = done + 1 end
    for _, name in ipairs(s.snapshots.started > done and providers.names or {}) do
      local p = providers.get(name)
      if p.reap_snapshots then
        local ok, n = pcall(p.reap_snapshots, s.id, s.snapshots.kept, self.dry)
        if ok then self.images = self.images + n
        else self:fail(name, " snapshots of ", s.id, ": ", tostring(n)) end
      end
    end
  end
end

-- What backends keep beyond sessions (docker: other builds' agent volumes).
function Run:prune()
  for _, name in ipairs(providers.names) do
    local p = providers.get(name)
    if p.prune then
      local ok, n = pcall(p.prune, self.dry)
      if ok then self.pruned = self.pruned + n
      elseif not errors.is(n, "BackendNotInstalledError") then   -- said already
        self:fail(name, ": ", tostring(n))
      end
    end
  end
end

-- The journal goes last: a session whose cgroup or directory is still
-- busy stays known, and the next gc tries again.
function Run:forget_sessions()
  for id, s in pairs(self.dead) do
    local ok = true
    for _, name in ipairs(providers.names) do
      local p = providers.get(name)
      local fok, err = pcall(p.forget_session or function() end, id)
      if not fok then
        ok = false
        self:fail(name, ": session ", id, ": ", tostring(err))
      end
    end
    if ok then owner.forget_session(s) end
  end
end

function Run:report()
  local also = (self.images > 0 and string.format(", removed %d unfinished snapshot images", self.images) or "")
    .. (self.pruned > 0 and string.format(", removed %d agent volumes of other builds", self.pruned) or "")
    .. (self.failed > 0 and string.format(", %d failed", self.failed) or "")
  if self.removed + self.sessions + self.images + self.pruned + self.failed == 0 then
    say("gc: nothing to do (no dead sessions, no leftovers)\n")
    return
  end
  say(string.format("gc: destroyed %d sandboxes from %d dead sessions%s\n", self.removed, self.sessions, also))
end

---Run gc. opts: all_sessions, dry_run. Returns the exit code (1: something failed).
function M.run(opts)
  local r = setmetatable({ all = opts.all_sessions, dry = opts.dry_run, removed = 0, failed = 0,
                           sessions = 0, images = 0, pruned = 0, would = 0 }, Run)
  r:find_sessions()
  r:settle()
  r:find_unjournaled()
  r:reap_sandboxes()
  r:reap_snapshots()
  r:prune()
  if not r.dry and r.failed == 0 then r:forget_sessions() end
  if not r.dry then r:report()
  elseif r.would + r.sessions + r.images + r.pruned + r.failed == 0 then
    say("gc --dry-run: nothing to do (no dead sessions, no leftovers)\n")
  end
  return r.failed > 0 and 1 or 0
end

return M
