--- A link to an `sbx-agent serve` over one byte stream (docs/agent-protocol.md):
--- many commands and file operations in flight at once. Whoever waits
--- reads the shared stream for everyone, one reader at a time; the others
--- wait on an event until the reader has dispatched what it read.
local loop = require "sbx.loop"
local wire = require "sbx.daemon.wire"
local errors = require "sbx.core.errors"
local handle = require "sbx.providers.process_handle"

local M = {}

-- Signal and errno names, and the result of a finished command: the
-- process-handle base's (kept here for the scripts and callers that use them).
M.SIGNAMES, M.STRERROR, M.ERRNO = handle.SIGNAMES, handle.STRERROR, handle.ERRNO
-- A file operation fails with the agent's errno name ("ENOENT", ...) or one
-- of these two, which are not errnos: the agent refused the request (an E
-- frame), or the link broke (the link, not the file, failed).
M.REFUSED, M.BROKEN = "REFUSED", "BROKEN"

local CHUNK = 1024 * 1024          -- stdin and file data go in frames of at most this
local UNCAPPED = 1 << 62           -- streaming: the host caps what it keeps
-- Streamed output not yet taken by its reader: past HIGH the agent is told
-- to stop reading that command (S), under LOW to go on (G). Other commands
-- on the link keep flowing.
local HIGH, LOW = 4 * 1024 * 1024, 1024 * 1024

---The result table of a finished command from the supervisor's status
---{kind, n}; raises for a command that never started.
M.result = handle.result

---A short, stable name for an agent build: an FNV-1a-style hash over every
---8-byte word of it (a sample of its bytes, as before, let two builds that
---differ in one constant share a docker volume or a file name). The last
---answer is kept: callers ask again for the same blob on every create.
local last_blob, last_hash
local unpack = string.unpack
function M.hash(blob)
  if blob == last_blob then return last_hash end
  local h, n, prime = 0xcbf29ce484222325 ~ #blob, #blob, 0x100000001b3
  local i = 1
  while i + 63 <= n do
    local a, b, c, d, e, f, g, k = unpack("<i8i8i8i8i8i8i8i8", blob, i)
    h = (h ~ a) * prime; h = (h ~ b) * prime; h = (h ~ c) * prime; h = (h ~ d) * prime
    h = (h ~ e) * prime; h = (h ~ f) * prime; h = (h ~ g) * prime; h = (h ~ k) * prime
    i = i + 64
  end
  for j = i, n do h = (h ~ blob:byte(j)) * prime end
  -- a product carries a word's high bits only upwards: fold them down
  -- before the name keeps 48 bits
  last_blob, last_hash = blob, string.format("%012x", (h ~ (h >> 32)) & 0xffffffffffff)
  return last_hash
end

-- ------------------------------------------------------------------ link

local Link = {}
Link.__index = Link

---t: read() -> chunk | nil, msg; write(data) -> true | nil, msg; close().
---Waits for the agent's hello; nil, message when it does not come.
function M.open(t, timeout)
  local link = setmetatable({ t = t, d = wire.decoder(), next_id = 0, waiting = {}, control = {},
                              rev = loop.event(), wev = loop.event() }, Link)
  local timer = loop.spawn(function()
    loop.sleep(timeout or 30)
    if not link.hello then link:_broken("the agent did not answer within " .. (timeout or 30) .. " s") end
  end)
  local ok, err = pcall(function() while not link.hello and link:_pump() do end end)
  timer:cancel()
  if not ok then link:close() error(err, 0) end
  if not link.hello then
    link:close()
    return nil, link.broken
  end
  return link
end

function Link:_broken(why)
  if self.broken then return end
  self.broken = why
  pcall(self.t.close)
  local waiting = self.waiting
  self.waiting = {}
  for _, w in pairs(waiting) do w:_lost(why) end
  self.rev:notify()
end

function Link:_dispatch(f)
  if f.id == 0 then
    if f.kind == "H" then
      local version, proto = wire.fields("H", f.payload)
      if proto ~= wire.VERSION then
        return self:_broken("the agent speaks protocol " .. tostring(proto) .. ", not " .. wire.VERSION)
      end
      self.hello = version
    elseif f.kind == "E" then
      self:_broken("the agent refused the stream: " .. tostring(wire.fields("E", f.payload)))
    end
    return
  end
  local w = self.waiting[f.id]
  if w then w:_on(f) end             -- frames of a request we gave up on are dropped
end

-- Read one chunk and dispatch it, or wait for the task that is reading.
-- False once the stream is gone.
function Link:_pump()
  if self.broken then return false end
  if self.reading then
    self.rev:wait()
    return not self.broken
  end
  self.reading = true
  local ok, chunk, msg = pcall(self.t.read)
  self.reading = false
  if not ok then
    self.rev:notify()
    error(chunk, 0)
  end
  if not chunk then
    self:_broken(msg or "the agent closed its stream")
    return false
  end
  local frames, ferr = self.d:feed(chunk)
  if not frames then
    self:_broken(ferr)
    return false
  end
  for _, f in ipairs(frames) do self:_dispatch(f) end
  self.rev:notify()
  -- sent after dispatching (which never waits), so frames keep their order
  if #self.control > 0 then
    local c = table.concat(self.control)
    self.control = {}
    self:_send(c)
  end
  return true
end

-- Frames from several tasks must not interleave.
function Link:_send(data)
  if self.broken then return nil, self.broken end
  while self.writing do self.wev:wait() end
  self.writing = true
  local ok, res, msg = pcall(self.t.write, data)
  self.writing = false
  self.wev:notify()
  if not ok then error(res, 0) end
  if not res then
    self:_broken(msg or "write failed")
    return nil, self.broken
  end
  return true
end

function Link:_id(w)
  self.next_id = self.next_id + 1
  self.waiting[self.next_id] = w
  return self.next_id
end

function Link:close()
  self:_broken("closed")
end

-- ------------------------------------------------------------- file ops

local Op = {}
Op.__index = Op

function Op:_on(f)
  if f.kind == "D" then
    if self.sink then
      local ok, err = pcall(self.sink, f.payload)
      if not ok and not self.sink_err then self.sink_err = err end
    else
      self.data[#self.data + 1] = f.payload
    end
  elseif f.kind == "Z" then
    self.errno, self.msg = wire.fields("Z", f.payload)
    self.done = true
    self.link.waiting[self.id] = nil
  elseif f.kind == "E" then
    self.errno, self.msg, self.done = M.REFUSED, wire.fields("E", f.payload) or "bad answer", true
    self.link.waiting[self.id] = nil
  end
end

function Op:_lost(why)
  self.errno, self.msg, self.done = M.BROKEN, "the agent's stream broke: " .. why, true
end

-- Send a request and wait for its Z: data, or nil, errno name, message
-- (M.REFUSED: the agent refused the request; M.BROKEN: the link broke; a Z
-- that does not parse: EPROTO).
function Link:_call(make, sink)
  local op = setmetatable({ link = self, data = {}, sink = sink }, Op)
  op.id = self:_id(op)
  local ok, err = self:_send(make(op.id))
  if not ok then return nil, M.BROKEN, err end
  while not op.done and self:_pump() do end
  if not op.done then op:_lost(self.broken or "closed") end
  if op.sink_err then error(op.sink_err, 0) end
  if op.errno == nil then return nil, "EPROTO", "a bad answer from the agent" end
  if op.errno ~= "" then return nil, op.errno, op.msg end
  return table.concat(op.data)
end

function Link:read_file(path, max)
  return self:_call(function(id) return wire.read(id, path, max) end)
end

---Read a file a frame at a time into sink(chunk), none of it kept here;
---true | nil, errno, message. A sink that raises ends the read with its error.
function Link:read_to(path, max, sink)
  return self:_call(function(id) return wire.read(id, path, max) end, sink)
end

function Link:write_file(path, data, mode)
  local pos = 1
  repeat
    local part = data:sub(pos, pos + CHUNK - 1)
    local ok, errno, msg = self:_call(function(id) return wire.write(id, path, part, mode, pos > 1) end)
    if not ok then return nil, errno, msg end
    pos = pos + CHUNK
  until pos > #data
  return true
end

---Write a file from an iterator of (offset, chunk) pieces (offset 0 first):
---one piece on the link at a time, whatever the file's size.
function Link:write_stream(path, mode, pieces)
  for off, data in pieces do
    for pos = 1, math.max(#data, 1), CHUNK do
      local part = data:sub(pos, pos + CHUNK - 1)
      local first = off == 0 and pos == 1
      local ok, errno, msg = self:_call(function(id) return wire.write(id, path, part, mode, not first) end)
      if not ok then return nil, errno, msg end
    end
  end
  return true
end

-- A list of { name, type, size, mtime }.
function Link:list(path)
  local raw, errno, msg = self:_call(function(id) return wire.list(id, path) end)
  if not raw then return nil, errno, msg end
  local out = {}
  for kind, size, mtime, name in raw:gmatch("(%Z*)%z(%Z*)%z(%Z*)%z(%Z*)%z") do
    out[#out + 1] = { name = name, type = kind, size = tonumber(size), mtime = tonumber(mtime) }
  end
  return out
end

function Link:stat(path)
  local raw, errno, msg = self:_call(function(id) return wire.stat(id, path) end)
  if not raw then return nil, errno, msg end
  local kind, size, mtime, mode = raw:match("^(%Z*)%z(%Z*)%z(%Z*)%z(%Z*)%z$")
  return { type = kind, size = tonumber(size), mtime = tonumber(mtime), mode = tonumber(mode or "", 8) }
end

function Link:remove(path, recursive)
  return self:_call(function(id) return wire.remove(id, path, recursive) end)
end

function Link:mkdir(path)
  return self:_call(function(id) return wire.mkdir(id, path) end)
end

-- ------------------------------------------------------------- commands

-- A command on the link: a ProcessHandle on the base (process_handle.lua);
-- its output comes in the link's frames, whoever reads them.
local Handle = handle.class()

---Start a command. req: argv, env, cwd, stdin, keep_stdin, timeout,
---max_output, stream. Returns a ProcessHandle (read, wait, running, kill, expire,
---write, close_stdin, close).
function Link:spawn(req)
  local e = handle.new(Handle, req, { link = self })
  e.id = self:_id(e)
  local stdin = req.stdin or ""
  local big = #stdin > CHUNK
  local ok, err = self:_send(wire.run(e.id, {
    argv = req.argv, env = req.env, cwd = req.cwd or "", timeout = req.timeout,
    keep_stdin = req.keep_stdin or big, stdin = big and "" or stdin,
    max_output = req.stream and UNCAPPED or e.max }))
  if not ok then
    self.waiting[e.id] = nil
    errors.raise("SandboxConnectionError", "exec: the agent's stream broke: " .. tostring(err), { op = "exec" })
  end
  if big then
    -- a task of its own: a command that answers while it reads must not
    -- deadlock against us
    e.writer = loop.spawn(function()
      for pos = 1, #stdin, CHUNK do
        if e.status or not self:_send(wire.stdin(e.id, stdin:sub(pos, pos + CHUNK - 1))) then return end
      end
      self:_send(wire.stdin(e.id, ""))
    end)
  end
  if req.want_pid then
    while not e.pid and not e.status and self:_pump() do end
  end
  return e
end

function Handle:_on(f)
  if f.kind == "O" then
    if self:_deliver(f.payload:byte(1), f.payload:sub(2))
       and self.qbytes > HIGH and not self.paused and not self.status then
      self.paused = true
      self.link.control[#self.link.control + 1] = wire.frame("S", self.id)
    end
  elseif f.kind == "P" then
    self.pid = wire.fields("P", f.payload)
  elseif f.kind == "X" then
    local kind, n, truncated, errno = wire.fields("X", f.payload)
    self.status = { kind = kind or "lost", n = n, errno = errno ~= "" and errno or nil,
                    why = not kind and "a bad exit record" or nil }
    if truncated == 1 then self.truncated = true end
    self:_end()
  elseif f.kind == "E" then
    self.status = { kind = "lost", why = "the agent refused the command: " .. tostring(wire.fields("E", f.payload)) }
    self:_end()
  end
end

function Handle:_end()
  self:_ended()
  self.link.waiting[self.id] = nil
end

function Handle:_lost(why)
  if self.status then return end
  self.status = { kind = "lost", why = why, broken = true }
  self:_ended()
end

-- The driver's side of the base (process_handle.lua).
function Handle:_more() return not self.status and self.link:_pump() end

function Handle:_status()
  if not self.status then self:_lost(self.link.broken or "closed") end
  return self.status
end

-- Under LOW bytes queued again (or wait() takes the rest): the agent goes on.
function Handle:_flow(all)
  if self.paused and (all or self.qbytes < LOW) then self:_go() end
end

function Handle:_go()
  self.paused = false
  if not self.status then self.link:_send(wire.frame("G", self.id)) end
end

function Handle:running() return not self.status end

function Handle:kill(sig)
  if self.status then return end
  self.link:_send(wire.signal(self.id, sig or 9))
end

function Handle:_write(data)
  for pos = 1, #data, CHUNK do
    local ok, err = self.link:_send(wire.stdin(self.id, data:sub(pos, pos + CHUNK - 1)))
    if not ok then return nil, "write: " .. tostring(err), "EPIPE" end
  end
  return true
end

function Handle:_end_stdin() self.link:_send(wire.stdin(self.id, "")) end

function Handle:_release()
  self.link.waiting[self.id] = nil
  self.status = { kind = "killed" }
end

return M
