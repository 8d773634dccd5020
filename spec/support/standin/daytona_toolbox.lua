-- The toolbox half of the Daytona stand-in (spec/support/standin/daytona.lua):
-- {toolboxProxyUrl}/{sandboxId}/... served from the backing sbx sandbox.
-- Checked against daytona-toolbox.json; errors in the daemon's shape
-- {statusCode,message,code,source:"DAYTONA_DAEMON",path,method,timestamp};
-- an unknown sandbox is a 400 from the proxy, as Daytona's is.
local loop = require "sbx.loop"
local json = require "cjson"

local M = {}

local function now_iso() return os.date("!%Y-%m-%dT%H:%M:%S.000Z") end

local function err(req, status, message, code)
  return status, { statusCode = status, message = message, code = code, source = "DAYTONA_DAEMON",
                   path = req.path, method = req.method, timestamp = now_iso() }
end

local function raw_json(s) return 200, s, { ["Content-Type"] = "application/json" } end

-- Output in a JSON string as the daemon (Go's encoding/json) sends it:
-- bytes that are not UTF-8 become U+FFFD.
function M.utf8(s)
  if utf8.len(s) then return s end
  local out, i = {}, 1
  while i <= #s do
    local ok, n = utf8.len(s, i)
    if ok then out[#out + 1] = s:sub(i) break end
    out[#out + 1] = s:sub(i, n - 1)
    out[#out + 1] = "\u{FFFD}"
    i = n + 1
  end
  return table.concat(out)
end
local U = M.utf8

-- ------------------------------------------------------------ multipart

---parts(body, content_type) -> { { name =, filename =, data = } } | nil, why
function M.multipart(body, ctype)
  local boundary = (ctype or ""):match('boundary="?([^";]+)"?')
  if not boundary then return nil, "multipart body without a boundary" end
  local delim = "--" .. boundary
  local parts, pos = {}, 1
  local s = body:find(delim, pos, true)
  if not s then return nil, "no multipart boundary in the body" end
  pos = s + #delim
  while true do
    if body:sub(pos, pos + 1) == "--" then break end
    pos = pos + 2                                            -- CRLF after the boundary
    local he = body:find("\r\n\r\n", pos, true)
    if not he then return nil, "a multipart part without headers" end
    local head = body:sub(pos, he - 1)
    local nxt = body:find("\r\n" .. delim, he + 4, true)
    if not nxt then return nil, "a multipart part without its end" end
    local p = { data = body:sub(he + 4, nxt - 1) }
    p.name = head:match('[Nn]ame="([^"]*)"')
    p.filename = head:match('filename="([^"]*)"')
    parts[#parts + 1] = p
    pos = nxt + 2 + #delim
  end
  return parts
end

-- ------------------------------------------------------------ files

-- Run argv in the backing sandbox (the stand-in's own helper commands).
local function run(sb, argv, stdin)
  return sb:execute_command(argv[1], { table.unpack(argv, 2) }, { stdin = stdin, timeout = 60,
                            max_output_bytes = 64 << 20 })
end

local function abs(sb, path)
  if not path or path == "" then return sb.workdir end
  if path:sub(1, 1) ~= "/" then return sb.workdir .. "/" .. path end
  return path
end

local TYPECH = { d = "d", l = "L", f = "-", p = "p", s = "S", c = "c", b = "b" }

-- find's record -> FileInfo
local function info_of(rec, dir)
  local y, size, mode, mtime, owner, group, name = rec:match("^(%a)\t(%d+)\t(%d+)\t([%d.]+)\t([^\t]*)\t([^\t]*)\t(.*)$")
  if not y then return nil end
  local m = tonumber(mode, 8)
  local bits = {}
  for i = 8, 0, -1 do bits[#bits + 1] = (m >> i) & 1 == 1 and ("rwx"):sub(3 - i % 3, 3 - i % 3) or "-" end
  local t = os.date("!%Y-%m-%dT%H:%M:%SZ", math.floor(tonumber(mtime)))
  return { name = name, isDir = y == "d", size = tonumber(size), mode = (TYPECH[y] or "?") .. table.concat(bits),
           permissions = string.format("0%o", m), owner = owner, group = group, modTime = t, modifiedAt = t,
           path = (dir == "/" and "" or dir) .. "/" .. name }
end

local FIND_FMT = "%y\t%s\t%m\t%T@\t%u\t%g\t%f\\0"

local function stat(sb, path)
  local r = run(sb, { "find", path, "-maxdepth", "0", "-printf", FIND_FMT })
  if r.exit_code ~= 0 then return nil, r.stderr end
  local dir = path:match("^(.*)/[^/]*$") or ""
  return info_of(r.stdout:gsub("%z$", ""), dir == "" and "/" or dir)
end

local function list(sb, path)
  local st, why = stat(sb, path)
  if not st then return nil, 404, why end
  if not st.isDir then return nil, 400, path .. ": not a directory" end
  local r = run(sb, { "find", path, "-mindepth", "1", "-maxdepth", "1", "-printf", FIND_FMT })
  if r.exit_code ~= 0 then return nil, 400, r.stderr end
  local out = {}
  for rec in r.stdout:gmatch("([^%z]+)%z") do
    out[#out + 1] = json.encode(info_of(rec, path:gsub("/+$", "") == "" and "/" or path:gsub("/+$", "")))
  end
  return "[" .. table.concat(out, ",") .. "]"
end

local function write(sb, path, data)
  local dir = path:match("^(.*)/[^/]*$")
  if dir and dir ~= "" then run(sb, { "mkdir", "-p", dir }) end
  sb:write_file(path, data)
end

-- ------------------------------------------------------------ sessions

local function session_view(s)
  local cmds = {}
  for _, c in ipairs(s.order) do
    cmds[#cmds + 1] = json.encode{ id = c.id, command = c.command, exitCode = c.exitCode }
  end
  return '{"sessionId":' .. json.encode(s.id) .. ',"commands":[' .. table.concat(cmds, ",") .. "]}"
end

-- A session command; an asynchronous one (async) is waited for by a task
-- of its own, the others by the request.
local function start_command(sb, s, command, async)
  local c = { id = require("sbx.proc").random_hex(16), command = command, stdout = {}, stderr = {}, output = {} }
  c.p = sb:spawn("sh", { "-c", command }, { timeout = 7 * 86400, max_output_bytes = 256 << 20,
    on_stdout = function(d) c.stdout[#c.stdout + 1] = d c.output[#c.output + 1] = d end,
    on_stderr = function(d) c.stderr[#c.stderr + 1] = d c.output[#c.output + 1] = d end })
  local function wait()
    local ok, r = pcall(c.p.wait, c.p)
    c.exitCode = ok and (r.exit_code or (128 + 9)) or -1
  end
  if async then c.task = loop.spawn(wait) else wait() end
  s.commands[c.id] = c
  s.order[#s.order + 1] = c
  return c
end

-- ------------------------------------------------------------ routes

function M.handle(st, req, res, sid, path)
  local s = st.sandboxes[sid] or st:by_name(sid)
  if not s or not s.sb or s.state ~= "started" then
    return err(req, 400, "sandbox " .. sid .. " is not running or does not exist")
  end
  local sb = s.sb
  local r, params = st.tbdoc:route(req.method, path)
  if not r then return err(req, 404, "no route " .. req.method .. " " .. path) end
  local body
  local ctype = req.headers["content-type"] or ""
  if ctype:find("application/json", 1, true) and req.body ~= "" then
    local ok, v = pcall(json.decode, req.body)
    if not ok then return err(req, 400, "invalid JSON body") end
    body = v
  end
  local ok, why = st.tbdoc:check(r, { query = req.query, headers = req.headers, body = body, params = params })
  if not ok then
    st.rejected[#st.rejected + 1] = "toolbox " .. req.method .. " " .. path .. ": " .. why
    return err(req, 400, why, "BAD_REQUEST")
  end
  local op, q = r.op.operationId, req.query
  if op == "GetUserHomeDir" or op == "GetWorkDir" then return 200, { dir = sb.workdir }
  elseif op == "GetVersion" then return 200, { version = "0.190.0" }
  elseif op == "ExecuteCommand" then
    local o = { timeout = body.timeout and body.timeout > 0 and body.timeout or 7 * 86400,
                max_output_bytes = 64 << 20, env = body.envs }
    local cmd = "exec 2>&1; " .. body.command
    if body.cwd then cmd = "cd " .. require("spec.support").shq(body.cwd) .. " && " .. cmd end
    local x = sb:execute_command("sh", { "-c", cmd }, o)
    if x.timed_out then return err(req, 408, "command execution timeout", "TIMEOUT") end
    return 200, { exitCode = x.exit_code or 137, result = U(x.stdout) }
  elseif op == "CreateSession" then
    if s.sessions[body.sessionId] then return err(req, 409, "session already exists", "CONFLICT") end
    s.sessions[body.sessionId] = { id = body.sessionId, commands = {}, order = {} }
    return 201, ""
  elseif op == "ListSessions" then
    local out = {}
    for _, x in pairs(s.sessions) do out[#out + 1] = session_view(x) end
    return raw_json("[" .. table.concat(out, ",") .. "]")
  end
  local sess = params.sessionId and s.sessions[params.sessionId]
  if params.sessionId and not sess then return err(req, 404, "session not found", "NOT_FOUND") end
  local c = sess and params.commandId and sess.commands[params.commandId]
  if params.commandId and not c then return err(req, 404, "command not found", "NOT_FOUND") end
  if op == "GetSession" then return raw_json(session_view(sess))
  elseif op == "DeleteSession" then
    for _, x in ipairs(sess.order) do if not x.exitCode then pcall(x.p.kill, x.p, "SIGKILL") end end
    s.sessions[sess.id] = nil
    return 204, ""
  elseif op == "SessionExecuteCommand" then
    local async = body.runAsync or body.async
    local cmd = start_command(sb, sess, body.command, async)
    if async then return 202, { cmdId = cmd.id } end
    return 200, { cmdId = cmd.id, exitCode = cmd.exitCode, output = U(table.concat(cmd.output)),
                  stdout = U(table.concat(cmd.stdout)), stderr = U(table.concat(cmd.stderr)) }
  elseif op == "GetSessionCommand" then
    return 200, { id = c.id, command = c.command, exitCode = c.exitCode }
  elseif op == "GetSessionCommandLogs" then
    return 200, { stdout = U(table.concat(c.stdout)), stderr = U(table.concat(c.stderr)),
                  output = U(table.concat(c.output)) }
  elseif op == "SendInput" then
    if c.exitCode then return err(req, 410, "command has exited", "GONE") end
    local okw = pcall(c.p.write, c.p, body.data)
    if not okw then return err(req, 410, "the command's input is closed", "GONE") end
    return 204, ""
  end
  -- files
  local p = q.path and abs(sb, q.path)
  if op == "ListFiles" then
    local out, status, why2 = list(sb, p or sb.workdir)
    if not out then return err(req, status, why2, status == 404 and "FILE_NOT_FOUND" or "BAD_REQUEST") end
    return raw_json(out)
  elseif op == "GetFileInfo" then
    local i, why2 = stat(sb, p)
    if not i then return err(req, 404, "file not found: " .. tostring(why2), "FILE_NOT_FOUND") end
    return 200, i
  elseif op == "DownloadFile" then
    local i = stat(sb, p)
    if not i then return err(req, 404, "file not found", "FILE_NOT_FOUND") end
    if i.isDir then return err(req, 400, "path is a directory", "BAD_REQUEST") end
    return 200, sb:read_file(p), { ["Content-Type"] = "application/octet-stream" }
  elseif op == "UploadFile" then
    local data = req.body
    if ctype:find("multipart/form-data", 1, true) then
      local parts, why2 = M.multipart(req.body, ctype)
      if not parts then return err(req, 400, why2) end
      data = nil
      for _, part in ipairs(parts) do if part.name == "file" then data = part.data end end
      if not data then return err(req, 400, "the multipart body has no file part") end
    end
    write(sb, p, data)
    return 200, { name = p:match("[^/]*$"), path = p, type = "file" }
  elseif op == "UploadFiles" then
    local parts, why2 = M.multipart(req.body, ctype)
    if not parts then return err(req, 400, why2) end
    local paths, files = {}, {}
    for _, part in ipairs(parts) do
      local i, field = (part.name or ""):match("^files%[(%d+)%]%.(%a+)$")
      if field == "path" then paths[i] = part.data elseif field == "file" then files[i] = part.data end
    end
    local done = {}
    for i, dest in pairs(paths) do
      if not files[i] then return err(req, 400, "files[" .. i .. "] has no file") end
      write(sb, abs(sb, dest), files[i])
      done[#done + 1] = json.encode{ path = dest, bytes = #files[i] }
    end
    return raw_json('{"files":[' .. table.concat(done, ",") .. '],"errors":[]}')
  elseif op == "DownloadFiles" then
    local boundary = "standin" .. require("sbx.proc").random_hex(8)
    local out = {}
    for _, want in ipairs(body.paths) do
      local ap = abs(sb, want)
      local i = stat(sb, ap)
      if i and not i.isDir then
        out[#out + 1] = "--" .. boundary .. "\r\nContent-Disposition: form-data; name=\"file\"; filename=\""
          .. want .. "\"\r\nContent-Type: application/octet-stream\r\n\r\n" .. sb:read_file(ap) .. "\r\n"
      else
        out[#out + 1] = "--" .. boundary .. "\r\nContent-Disposition: form-data; name=\"error\"; filename=\""
          .. want .. "\"\r\nContent-Type: application/json\r\n\r\n"
          .. json.encode{ message = "file not found", statusCode = 404, code = "FILE_NOT_FOUND" } .. "\r\n"
      end
    end
    out[#out + 1] = "--" .. boundary .. "--\r\n"
    return 200, table.concat(out), { ["Content-Type"] = "multipart/form-data; boundary=" .. boundary }
  elseif op == "CreateFolder" then
    local x = run(sb, { "mkdir", "-p", "-m", q.mode, p })
    if x.exit_code ~= 0 then return err(req, 400, x.stderr, "BAD_REQUEST") end
    return 201, ""
  elseif op == "SetFilePermissions" then
    if not stat(sb, p) then return err(req, 404, "file not found", "FILE_NOT_FOUND") end
    if q.mode then
      local x = run(sb, { "chmod", q.mode, p })
      if x.exit_code ~= 0 then return err(req, 400, x.stderr, "BAD_REQUEST") end
    end
    return 200, ""
  elseif op == "DeleteFile" then
    local i = stat(sb, p)
    if not i then return err(req, 404, "file not found", "FILE_NOT_FOUND") end
    local x = run(sb, q.recursive == "true" and { "rm", "-rf", "--", p } or (i.isDir and { "rmdir", "--", p } or { "rm", "-f", "--", p }))
    if x.exit_code ~= 0 then return err(req, 400, "cannot delete " .. q.path .. ": directory not empty", "BAD_REQUEST") end
    return 204, ""
  end
  return err(req, 501, "the stand-in does not serve " .. req.method .. " " .. path)
end

return M
