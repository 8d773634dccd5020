--- The sbx-agent protocol's frames (docs/agent-protocol.md): pure
--- encoding and decoding, no I/O.
local M = {}

M.VERSION = 3
M.MAX_FRAME = 16 * 1024 * 1024 + 5

---One frame: type letter, request id, payload.
function M.frame(kind, id, payload)
  payload = payload or ""
  return string.pack(">I4c1I4", #payload + 5, kind, id) .. payload
end

local function strings(list)
  local parts = { string.pack(">I4", #list) }
  for i, s in ipairs(list) do parts[i + 1] = string.pack(">s4", s) end
  return table.concat(parts)
end

---req: argv, env (list of "K=V"), cwd, stdin, keep_stdin, timeout (secs), max_output
function M.run(id, req)
  local flags = req.keep_stdin and 1 or 0
  local ms = req.timeout and math.max(1, math.ceil(req.timeout * 1000)) or 0
  return M.frame("R", id, string.pack(">I4I4I8s4", flags, math.min(ms, 0xffffffff),
      req.max_output or 1048576, req.cwd or "")
    .. strings(req.argv) .. strings(req.env or {}) .. string.pack(">s4", req.stdin or ""))
end

function M.stdin(id, data) return M.frame("I", id, data) end
function M.signal(id, signo) return M.frame("K", id, string.pack(">I4", signo)) end
function M.read(id, path, max) return M.frame("r", id, string.pack(">I8s4", max, path)) end
function M.write(id, path, data, mode, append)
  return M.frame("w", id, string.pack(">I4I4s4", mode or 420, append and 1 or 0, path) .. data)
end
function M.list(id, path) return M.frame("l", id, string.pack(">s4", path)) end
function M.remove(id, path, recursive)
  return M.frame("d", id, string.pack(">I4s4", recursive and 1 or 0, path))
end
function M.mkdir(id, path) return M.frame("m", id, string.pack(">s4", path)) end
function M.stat(id, path) return M.frame("s", id, string.pack(">s4", path)) end

-- Payload readers for the agent's frames: the values, or nil when the
-- payload does not parse (string.unpack raises on short input).
local FORMATS = { H = ">s4I4", P = ">I4", X = ">s4i4Bs4", Z = ">s4s4", E = ">s4" }

function M.fields(kind, payload)
  local fmt = FORMATS[kind]
  if not fmt then return nil end
  local r = table.pack(pcall(string.unpack, fmt, payload))
  if not r[1] or r[r.n] ~= #payload + 1 then return nil end
  return table.unpack(r, 2, r.n - 1)
end

---An incremental decoder: d:feed(chunk) -> list of frames {kind, id, payload},
---or nil, message when the stream is broken.
---Bytes not yet parsed are `buf` from `pos` on, then the chunks in `parts`:
---while a frame is known to need more than has come, a chunk is only
---remembered, so a big frame costs one join instead of a copy per chunk.
function M.decoder()
  local buf, pos = "", 1
  local parts, nparts, extra = {}, 0, 0   -- chunks after buf, their bytes
  local need = 0                          -- bytes the next frame needs (0: unknown)
  local d = {}
  function d.feed(_, chunk)
    local have = #buf - pos + 1 + extra + #chunk
    if have < need then
      nparts = nparts + 1
      parts[nparts] = chunk
      extra = extra + #chunk
      return {}
    end
    if nparts > 0 then
      buf = buf:sub(pos) .. table.concat(parts, "", 1, nparts) .. chunk
      parts, nparts, extra = {}, 0, 0
    else
      buf = buf:sub(pos) .. chunk
    end
    pos, need = 1, 0
    local out = {}
    while #buf - pos + 1 >= 4 do
      local len = string.unpack(">I4", buf, pos)
      if len < 5 or len > M.MAX_FRAME then
        return nil, "broken agent stream: a frame of " .. len .. " bytes"
      end
      if #buf - pos + 1 < 4 + len then
        need = 4 + len
        break
      end
      local kind, id = string.unpack(">c1I4", buf, pos + 4)
      out[#out + 1] = { kind = kind, id = id, payload = buf:sub(pos + 9, pos + 3 + len) }
      pos = pos + 4 + len
    end
    return out
  end
  function d.pending() return #buf - pos + 1 + extra end
  return d
end

return M
