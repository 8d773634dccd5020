--- What a journal line or a resumed session_state claims, checked before
--- gc or destroy acts on it. Journals and states are data anyone could have
--- written: a directory is removed only when its canonical path (realpath:
--- no `..`, no symlink) is a sandbox directory of this state directory and
--- of the session and sandbox named; a cgroup is killed only when it is a
--- sandbox's group in sbxlua's own subtree; a container is removed only when
--- it carries this host's sbxlua labels (the docker backend inspects, then
--- asks `container`). One place, so local, bwrap and docker agree. And
--- the journal reader itself: a line that is not a journal's is skipped.
local realpath = require("sbx.bwrap").realpath
local fs = require "sbx.fs"
local json = require "cjson.safe"

local M = {}

local function owner() return require "sbx.state.owner" end

-- One path component: no "/", never "." or "..".
local function component(s, max)
  return type(s) == "string" and #s <= max and s:match("^[%w][%w_%.%-]*$") ~= nil
         and not s:find("..", 1, true)
end

---A sandbox id (owner.new_id: sbx-<hex>) usable as a file or cgroup name.
function M.id_ok(s) return component(s, 128) end

---A session id (owner.session: <host>-<pid>-<hex>) usable as a file or cgroup name.
function M.session_ok(s) return component(s, 255) end

function M.warn(...)
  io.stderr:write("sbxlua: ", ...)
  io.stderr:write("\n")
end

---The sandbox directory `dir` of backend `kind` as <state>/<kind>/<session>/<id>.XXXXXX,
---or nil and why not. A directory that does not exist is nil without a reason.
function M.sandbox_dir(kind, dir, session, id)
  if type(dir) ~= "string" then return nil, "the directory is not a string" end
  local real, _, code = realpath(dir)
  if not real then
    if code == "ENOENT" then return nil end
    return nil, "cannot resolve " .. dir .. " (" .. tostring(code) .. ")"
  end
  local top = realpath(owner().state_dir() .. "/" .. kind)
  local s, name
  if top and real:sub(1, #top + 1) == top .. "/" then s, name = real:sub(#top + 2):match("^([^/]+)/([^/]+)$") end
  if not s then
    return nil, dir .. " is not a " .. kind .. " sandbox directory of the state directory "
                .. owner().state_dir()
  end
  if session and s ~= session then return nil, dir .. " belongs to session " .. s .. ", not " .. session end
  if id and name:sub(1, #id + 1) ~= id .. "." then return nil, dir .. " is not sandbox " .. id .. "'s directory" end
  return owner().state_dir() .. "/" .. kind .. "/" .. s .. "/" .. name
end

local mount
local function cgroup_mount()
  if mount == nil then
    mount = false
    for line in (fs.read_host("/proc/self/mountinfo", 1 << 20) or ""):gmatch("[^\n]+") do
      local mp = line:find(" - cgroup2 ", 1, true) and line:match("^%S+ %S+ %S+ %S+ (%S+)")
      if mp then mount = mp break end
    end
  end
  return mount or nil
end

---The cgroup `cg` if it is sandbox `id`'s of `session` in sbxlua's own
---subtree (.../sbxlua/<session>/<id> on the cgroup2 mount), else nil and why.
---A cgroup that does not exist is nil without a reason (nothing to kill).
function M.cgroup(cg, session, id)
  if cg == nil then return nil end
  if type(cg) ~= "string" then return nil, "the cgroup is not a string" end
  local real, _, code = realpath(cg)
  if not real then
    if code == "ENOENT" then return nil end
    return nil, "cannot resolve the cgroup " .. cg .. " (" .. tostring(code) .. ")"
  end
  local mnt = cgroup_mount()
  local s, i = real:match("/sbxlua/([^/]+)/([^/]+)$")
  if real ~= cg or not mnt or real:sub(1, #mnt + 1) ~= mnt .. "/" or not s
     or (session and s ~= session) or (id and i ~= id) then
    return nil, "the cgroup " .. cg .. " is not " .. (id or "a sandbox") .. "'s in sbxlua's cgroup subtree"
  end
  return real
end

---Is the container with labels `labels` (its inspect's Config.Labels) this
---host's sbxlua sandbox `id` of `session` (each checked when given)?
function M.container(labels, id, session)
  if type(labels) ~= "table" or labels["sbxlua.host"] ~= owner().hostname() then
    return false, "it does not carry this host's sbxlua labels"
  end
  if id and labels["sbxlua.id"] ~= id then return false, "it is not sandbox " .. id end
  if session and labels["sbxlua.session"] ~= session then return false, "it is not session " .. session .. "'s" end
  return true
end

---A gc entry (journal line or listing) with its directory and cgroup
---checked: what fails the check is dropped and said, so reap never acts on it.
function M.reap_entry(kind, entry)
  local e = {}
  for k, v in pairs(entry) do e[k] = v end
  if not M.id_ok(e.id) then error("gc: not a sandbox id: " .. tostring(e.id), 0) end
  if not M.session_ok(e.session) then e.session = nil end
  local st = {}
  for k, v in pairs(type(entry.state) == "table" and entry.state or {}) do st[k] = v end
  local where = e.id
  local dir = st.dir or e.dir
  if dir ~= nil then
    local ok, why = M.sandbox_dir(kind, dir, e.session, e.id)
    if why then M.warn("gc: ", kind, " ", where, ": not removing: ", why) end
    st.dir, e.dir = ok, ok
    if not ok then st.own = false end
  end
  if st.cg ~= nil then
    local ok, why = M.cgroup(st.cg, e.session, e.id)
    if why then M.warn("gc: ", kind, " ", where, ": not killing: ", why) end
    st.cg = ok
  end
  e.state = st
  return e
end

---A session_state handed to resume, checked the same way: a directory it
---owns must be a sandbox directory of this state directory, and a cgroup
---sbxlua's own. Raises ConfigError naming the field otherwise.
function M.resume(kind, state)
  local function bad(msg)
    require("sbx.core.errors").raise("ConfigError", "session state for " .. kind .. ": " .. msg,
                                { backend = kind, op = "resume" })
  end
  if state.own and type(state.dir) == "string" then
    local _, why = M.sandbox_dir(kind, state.dir)
    if why then bad("'dir' is owned (own = true) but " .. why) end
  end
  if state.cg ~= nil then
    local ok, why = M.cgroup(state.cg, state.session, state.id)
    if why then bad("'cg': " .. why) end
    if not ok then state.cg = nil end
  end
  return state
end

-- ------------------------------------------------------ journals

-- What each event must hold (a journal is data: a line that does not fit is
-- skipped and said, never trusted or crashed on).
local function num(v) return v == nil or type(v) == "number" end
local function str(v) return v == nil or type(v) == "string" end
local EVENTS = {
  session = function(e) return str(e.host) and (e.pid == nil or math.tointeger(e.pid) ~= nil)
                        and num(e.pid_start) and num(e.started) end,
  create = function(e) return M.id_ok(e.id) and type(e.backend) == "string" and num(e.created)
                       and num(e.ttl) and (e.labels == nil or type(e.labels) == "table") end,
  ready = function(e) return M.id_ok(e.id) and type(e.state) == "table" end,
  destroy = function(e) return M.id_ok(e.id) end,
  snapshot = function() return true end,
  snapshot_done = function(e) return type(e.snapshot_id) == "string" end,
}

---The sandboxes, session event and snapshots journal `path` (of session
---`id`) records; each line that is not one is skipped and given to report(path, line, why).
function M.read_journal(path, id, report)
  local data = fs.read_host(path, 64 * 1024 * 1024)
  local info = { sandboxes = {}, order = {}, snapshots = { started = 0, kept = {} } }
  local n = 0
  for line, nl in (data or ""):gmatch("([^\n]*)(\n?)") do
    if line == "" and nl == "" then break end
    n = n + 1
    local e, why = json.decode(line), nil
    if line == "" then
      e = nil
    elseif nl == "" then
      why = "truncated last line (a write cut short)"
    elseif type(e) ~= "table" then
      why = "not a JSON object"
    elseif type(e.event) ~= "string" then
      why = "no event name"
    elseif EVENTS[e.event] and not EVENTS[e.event](e) then
      why = "a \"" .. e.event .. "\" event with missing or mistyped fields"
    elseif e.session ~= nil and e.session ~= id then
      why = "names session " .. tostring(e.session) .. ", not the journal's"
    elseif e.event == "session" and n ~= 1 then
      why = "a second session event"
    end
    if why then
      if report then report(path, n, why) end
    elseif e then
      e.session = id
      if e.event == "session" then
        info.host, info.pid, info.started, info.event = e.host, e.pid, e.started, e
      elseif e.event == "create" then
        if not info.sandboxes[e.id] then info.order[#info.order + 1] = e.id end
        info.sandboxes[e.id] = e
      elseif e.event == "ready" and info.sandboxes[e.id] then
        info.sandboxes[e.id].state = e.state
      elseif e.event == "destroy" then
        info.sandboxes[e.id] = nil
      elseif e.event == "snapshot" then
        info.snapshots.started = info.snapshots.started + 1
      elseif e.event == "snapshot_done" then
        info.snapshots.kept[e.snapshot_id] = true
      end
    end
  end
  return info
end

---Say a skipped line (n > 0) or file (n == 0) on stderr.
function M.say_skipped(path, n, why)
  if n == 0 then io.stderr:write("sbxlua: ", path, ": ", why, "; file skipped\n")
  else io.stderr:write("sbxlua: ", path, ":", n, ": ", why, "; line skipped\n") end
end

return M
