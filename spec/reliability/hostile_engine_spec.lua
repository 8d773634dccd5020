-- A hostile Docker engine (RELIABILITY.md, G8 and the archive catalogue):
-- a stand-in engine on a unix socket, written here with sbx.stream, answers
-- what the docker backend needs to create a sandbox, then serves hostile
-- archives and broken HTTP for download_dir and read_file. A job (sbxlua
-- with DOCKER_HOST pointing at the stand-in) reports what it got; the spec
-- checks the typed error, that nothing was written outside the target
-- directory (nor, when refused, inside it), that the sandbox was still
-- destroyed, and that nothing hung. Last, a case fuzz/paths_fuzz.c found:
-- symlinks that leave a downloaded directory only together.
local stream = require "sbx.stream"
local proc = require "sbx.proc"
local loop = require "sbx.loop"
local fs = require "sbx.fs"
local json = require "cjson"

local BIN = os.getenv("SBX_BIN") or "build/sbxlua"

-- ------------------------------------------------------------ tar by hand
-- (sbx.tar.pack refuses the entries this spec needs)

local function octal(n, width) return string.format("%0" .. (width - 1) .. "o", n) .. "\0" end
local function pad(s, n) return s .. string.rep("\0", n - #s) end

---One ustar header: e = { name, type = "0" file | "1" hardlink | "2" symlink
---| "3" char | "4" block | "5" dir | "6" fifo, size, link, mode, data }.
local function member(e)
  local size = e.size or #(e.data or "")
  local h = pad(e.name, 100) .. octal(e.mode or 420, 8) .. octal(0, 8) .. octal(0, 8)
    .. octal(size, 12) .. octal(0, 12) .. "        " .. (e.type or "0") .. pad(e.link or "", 100)
    .. "ustar\0" .. "00" .. pad("root", 32) .. pad("root", 32) .. octal(e.major or 0, 8)
    .. octal(e.minor or 0, 8) .. pad("", 155) .. pad("", 12)
  local sum = 0
  for i = 1, 512 do sum = sum + h:byte(i) end
  h = h:sub(1, 148) .. string.format("%06o\0 ", sum) .. h:sub(157)
  local data = e.data or ""
  return h .. data .. string.rep("\0", (512 - #data % 512) % 512)
end

local function archive(list)
  local parts = {}
  for i, e in ipairs(list) do parts[i] = member(e) end
  return table.concat(parts) .. string.rep("\0", 1024)
end

-- ------------------------------------------------------------ the engine

local base = assert(fs.mkdtemp("/tmp", "sbxhostile"))
local SOCK = base .. "/engine.sock"
local engine = { requests = {}, archive = nil, removing = nil }

local REASON = { [200] = "OK", [201] = "Created", [204] = "No Content", [404] = "Not Found",
                 [409] = "Conflict", [500] = "Internal Server Error" }

local function answer(c, status, body, ctype)
  body = body or ""
  if type(body) == "table" then body, ctype = json.encode(body), "application/json" end
  c:write(string.format("HTTP/1.1 %d %s\r\nApi-Version: 1.43\r\nContent-Type: %s\r\n"
    .. "Content-Length: %d\r\nConnection: close\r\n\r\n", status, REASON[status] or "X",
    ctype or "text/plain", #body) .. body)
end

-- The endpoints docker.lua calls to create, use (archive path) and destroy
-- a sandbox; everything else is a 404 the spec will see in `requests`.
local function route(c, method, path)
  local p = path:gsub("^/v[%d.]+", ""):gsub("%?.*$", "")
  local query = path:match("%?(.*)$") or ""
  engine.requests[#engine.requests + 1] = method .. " " .. p
  if p == "/_ping" then return answer(c, 200, "OK") end
  if method == "GET" and p:match("^/images/.*/json$") then return answer(c, 200, { Id = "sha256:fake" }) end
  if method == "POST" and p == "/volumes/create" then return answer(c, 201, { Name = "agent" }) end
  if method == "POST" and p == "/containers/create" then
    return answer(c, 201, { Id = query:find("name=sbxlua", 1, true) and "c1" or "helper", Warnings = {} })
  end
  local id, rest = p:match("^/containers/([^/]+)(.*)$")
  if id and method == "POST" and rest == "/start" then return answer(c, 204) end
  if id and method == "POST" and rest == "/exec" then
    return answer(c, 500, { message = "this engine runs no exec" })
  end
  -- engine.removing = N: another client's removal is under way; the
  -- container is listed N more times, then gone
  if id and method == "GET" and rest == "/json" then
    if engine.removing == 0 then return answer(c, 404, { message = "No such container: " .. id }) end
    if engine.removing then engine.removing = engine.removing - 1 end
    return answer(c, 200, { Id = id, State = { Running = not engine.removing, Status = engine.removing and "removing" } })
  end
  if id and method == "DELETE" and rest == "" then
    if engine.removing then
      return answer(c, 409, { message = "removal of container " .. id .. " is already in progress" })
    end
    return answer(c, 204)
  end
  if id == "helper" and method == "GET" and rest == "/archive" then   -- the agent volume is filled
    if query:find("current", 1, true) then
      return answer(c, 200, archive{ { name = "current", data = "sbx-agent-00ff" } }, "application/x-tar")
    end                                                             -- with the whole agent
    return answer(c, 200, archive{ { name = "sbx-agent-00ff", data = require "sbx.agentbin" } }, "application/x-tar")
  end
  if id and method == "GET" and rest == "/archive" then
    local a = engine.archive
    if type(a) == "function" then return a(c) end
    return answer(c, 200, a, "application/x-tar")
  end
  answer(c, 404, { message = "the stand-in engine has no " .. method .. " " .. p })
end

local function serve(c)
  local buf = ""
  while not buf:find("\r\n\r\n", 1, true) do
    local chunk = c:read(30)
    if not chunk then c:close() return end
    buf = buf .. chunk
  end
  local head, body = buf:match("^(.-\r\n)\r\n(.*)$")
  local method, path = head:match("^(%u+) (%S+) HTTP/1%.%d\r\n")
  local len = tonumber(head:lower():match("\r\ncontent%-length: *(%d+)") or "0")
  while #body < len do
    local chunk = c:read(30)
    if not chunk then break end
    body = body .. chunk
  end
  if method then route(c, method, path) end
  c:close()
end

local listener = assert(stream.listen{ unix = SOCK })
loop.spawn(function()
  while true do
    local c = listener:accept()
    if not c then break end
    loop.spawn(serve, c)
  end
end)

-- ------------------------------------------------------------ the job

local JOB = base .. "/job.lua"
do
  local f = assert(io.open(JOB, "w"))
  f:write([[
    local sb = sbx.sandbox("docker", { image = "fake/image:1" })
    local op, dest = os.getenv("HOSTILE_OP"), os.getenv("HOSTILE_DEST")
    local ok, r = pcall(function()
      if op == "read" then return sb:read_file("f.txt") end
      return sb:download_dir("out", dest)
    end)
    sb:destroy()
    io.write(sbx.json.encode{ ok = ok, kind = not ok and type(r) == "table" and r.kind or nil,
      message = not ok and tostring(r) or nil, result = ok and r or nil })
  ]])
  f:close()
end

-- Everything under base except the job's own state and the target: what a
-- hostile archive must never change.
local function outside(dest)
  local f = io.popen("cd " .. base .. " && find . -path ./state -prune -o -print | sort")
  local list = {}
  for line in f:read("a"):gmatch("[^\n]+") do
    if line ~= "./state" and line ~= "./" .. dest and line:sub(1, #dest + 3) ~= "./" .. dest .. "/" then
      list[#list + 1] = line
    end
  end
  f:close()
  return table.concat(list, "\n")
end

local n = 0
---Serve `answer` (an archive, or a function(conn) writing the raw reply)
---to GET /containers/{id}/archive; run the job; its report, the target dir.
local function job(answer_with, op, prepare)
  n = n + 1
  local dest = "dest" .. n
  engine.archive, engine.requests = answer_with, {}
  if prepare then prepare(base .. "/" .. dest) end
  local before = outside(dest)
  local t0 = loop.now()
  local r = assert(proc.spawn{ argv = { BIN, JOB }, timeout = 120,
    env = { "PATH=/usr/bin:/bin", "HOME=" .. base, "SBX_STATE_DIR=" .. base .. "/state",
            "DOCKER_HOST=unix://" .. SOCK, "SBX_DOCKER_EXEC=engine", "HOSTILE_OP=" .. (op or "download"),
            "HOSTILE_DEST=" .. base .. "/" .. dest } }):wait()
  assert.is_true(loop.now() - t0 < 60, "the job took " .. (loop.now() - t0) .. " s")
  assert.equal(0, r.exit_code, r.stderr)
  local rep = json.decode(r.stdout)
  rep.dest, rep.requests = base .. "/" .. dest, engine.requests
  assert.equal(before, outside(dest), "something was written outside " .. dest)
  local destroyed = false
  for _, q in ipairs(engine.requests) do destroyed = destroyed or q == "DELETE /containers/c1" end
  assert.is_true(destroyed, "the sandbox was not destroyed: " .. table.concat(engine.requests, ", "))
  return rep
end

local function listing(dir)
  local f = io.popen("cd " .. dir .. " 2>/dev/null && find . | sort")
  local s = f:read("a")
  f:close()
  return s
end

-- A refusal: the typed error, and nothing at all in the target.
local function refused(rep, kind, pattern)
  assert.is_false(rep.ok, "the download succeeded: " .. json.encode(rep.result or {}))
  assert.equal(kind, rep.kind, rep.message)
  if pattern then assert.matches(pattern, rep.message) end
  assert.equal("", listing(rep.dest):gsub("^%.\n", ""), "files were written before the refusal")
end

local OK = { name = "out/ok.txt", data = "fine" }
local DIR = { name = "out/", type = "5", mode = 493 }

describe("a hostile engine", function()
  setup(function() assert(os.execute("mkdir -p " .. base .. "/outside " .. base .. "/a/b")) end)
  teardown(function()
    listener:close()
    fs.rmtree(base)
  end)

  it("serves a sandbox whose plain tree downloads whole (the control)", function()
    local rep = job(archive{ DIR, OK, { name = "out/sub/", type = "5", mode = 493 },
      { name = "out/sub/data.bin", data = "\0\1\2", mode = 384 }, { name = "out/link", type = "2", link = "ok.txt" } })
    assert.is_true(rep.ok, rep.message)
    assert.equal(2, rep.result.files)
    assert.same({ "link" }, rep.result.skipped)
    assert.equal("fine", assert(io.open(rep.dest .. "/ok.txt")):read("a"))
    assert.equal("\0\1\2", assert(io.open(rep.dest .. "/sub/data.bin")):read("a"))
  end)

  it("refuses '../' escapes with PathError, writing nothing", function()
    refused(job(archive{ DIR, OK, { name = "out/../escape.txt", data = "x" } }), "PathError", "hostile")
    refused(job(archive{ DIR, OK, { name = "out/../../a/escape.txt", data = "x" } }), "PathError", "hostile")
    refused(job(archive{ DIR, OK, { name = "out/sub/../../escape.txt", data = "x" } }), "PathError", "hostile")
  end)

  it("refuses absolute entry names", function()
    refused(job(archive{ DIR, OK, { name = base .. "/outside/abs.txt", data = "x" } }), "PathError", "hostile")
  end)

  it("refuses a symlink out and a file written through it", function()
    refused(job(archive{ DIR, OK, { name = "out/link", type = "2", link = base .. "/outside" },
      { name = "out/link/pwn.txt", data = "x" } }), "PathError", "hostile")
    refused(job(archive{ DIR, OK, { name = "out/rel", type = "2", link = "../../outside" },
      { name = "out/rel/pwn.txt", data = "x" } }), "PathError", "hostile")
  end)

  it("refuses a symlink out of the requested directory, not only out of the archive", function()
    -- tar.extract judges `escapes` from the archive's root, the requested
    -- directory's parent: get_tree also asks paths.link_escapes (a fuzzer
    -- found out/l -> "x/.." with out/x -> ".")
    local cases = {
      archive{ DIR, OK, { name = "out/up", type = "2", link = ".." } },
      archive{ DIR, OK, { name = "out/side", type = "2", link = "../outside" } },
      archive{ DIR, OK, { name = "out/x", type = "2", link = "." }, { name = "out/l", type = "2", link = "x/.." } },
    }
    for _, a in ipairs(cases) do refused(job(a), "PathError", "symlink out") end
  end)

  it("refuses hard links, inside or out", function()
    refused(job(archive{ DIR, OK, { name = "out/hl", type = "1", link = "/etc/passwd" } }), "PathError", "hostile")
    refused(job(archive{ DIR, OK, { name = "out/hl", type = "1", link = "out/ok.txt" } }), "PathError", "hard link")
  end)

  it("refuses device nodes and FIFOs", function()
    refused(job(archive{ DIR, OK, { name = "out/null", type = "3", major = 1, minor = 3 } }), "PathError", "hostile")
    refused(job(archive{ DIR, OK, { name = "out/sda", type = "4", major = 8, minor = 0 } }), "PathError", "hostile")
    refused(job(archive{ DIR, OK, { name = "out/fifo", type = "6" } }), "PathError", "hostile")
  end)

  it("keeps setuid bits and duplicates from turning into anything but plain files", function()
    local rep = job(archive{ DIR, { name = "out/suid", data = "#!/bin/sh\n", mode = tonumber("4755", 8) },
      { name = "out/dup", type = "2", link = "/etc" }, { name = "out/dup", data = "last" } })
    assert.is_true(rep.ok, rep.message)
    assert.equal("last", assert(io.open(rep.dest .. "/dup")):read("a"))
    local st = assert(fs.open_root(rep.dest)):stat("suid")
    assert.equal(tonumber("755", 8), st.mode & tonumber("7777", 8))
    -- and the other order: the symlink out wins, so the download is refused
    refused(job(archive{ DIR, OK, { name = "out/dup", data = "first" },
      { name = "out/dup", type = "2", link = "/etc" } }), "PathError", "symlink out")
  end)

  it("fails a tree that needs a file to be a directory, writing nowhere else", function()
    local rep = job(archive{ DIR, { name = "out/a", data = "file" }, { name = "out/a/b", data = "under a file" } })
    assert.is_false(rep.ok)
    assert.equal("PathError", rep.kind, rep.message)
  end)

  it("does not follow a symlink already in the target directory", function()
    local rep = job(archive{ DIR, { name = "out/sub/", type = "5", mode = 493 },
      { name = "out/sub/pwn.txt", data = "x" } }, nil, function(dest)
        assert(os.execute("mkdir -p " .. dest .. " && ln -s " .. base .. "/outside " .. dest .. "/sub"))
      end)
    assert.is_false(rep.ok)
    assert.equal("PathError", rep.kind, rep.message)
    assert.is_nil(io.open(base .. "/outside/pwn.txt"))
  end)

  it("fails a huge declared size, a truncated archive and garbage with typed errors", function()
    local big = member{ name = "out/big", size = 8 * 1024 * 1024 * 1024 - 1 }
    refused(job(member(DIR) .. big), "SandboxExecutionError", "exceeds")
    local cut = archive{ DIR, { name = "out/half", data = string.rep("y", 5000) } }
    refused(job(cut:sub(1, 512 + 512 + 1000)), "SandboxExecutionError", "download_dir")
    refused(job(string.rep("not a tar archive ", 100)), "SandboxExecutionError", "download_dir")
  end)

  it("fails an archive of more than 100000 entries without unpacking it", function()
    local one = member{ name = "out/many", data = "" }
    local t0 = loop.now()
    refused(job(member(DIR) .. string.rep(one, 100001) .. string.rep("\0", 1024)),
            "SandboxExecutionError", "more than 100000 entries")
    assert.is_true(loop.now() - t0 < 60)
  end)

  it("gives a typed error, quickly, for a reply cut mid-body or not HTTP at all", function()
    local t0 = loop.now()
    local rep = job(function(c)
      c:write("HTTP/1.1 200 OK\r\nContent-Type: application/x-tar\r\nContent-Length: 100000\r\n\r\n"
              .. archive{ DIR, OK }:sub(1, 700))
    end)
    refused(rep, "SandboxConnectionError")   -- the link broke mid-operation: retryable
    assert.is_true(loop.now() - t0 < 30)
    rep = job(function(c) c:write("SSH-2.0-OpenSSH_9.2\r\n\r\n\0\0\0garbage") end)
    refused(rep, "SandboxExecutionError")
  end)

  it("read_file refuses an archive holding anything but the one regular file", function()
    local rep = job(archive{ { name = "../f.txt", data = "x" } }, "read")
    assert.equal("PathError", rep.kind, rep.message)
    rep = job(archive{ { name = "f.txt", type = "2", link = "/etc/shadow" } }, "read")
    assert.equal("PathError", rep.kind, rep.message)
    rep = job(archive{ { name = "f.txt", data = "a" }, { name = "g.txt", data = "b" } }, "read")
    assert.equal("PathError", rep.kind, rep.message)
    rep = job(archive{ { name = "f.txt", type = "3", major = 1, minor = 3 } }, "read")
    assert.equal("PathError", rep.kind, rep.message)
    rep = job(archive{ { name = "f.txt", data = "just this" } }, "read")
    assert.is_true(rep.ok, rep.message)
    assert.equal("just this", rep.result)
  end)

  it("destroy waits out a removal somebody else started (409 'already in progress')", function()
    -- a killed job's own DELETE still running when gc comes: gc returned
    -- while the engine listed the container as "removing" (G2 saw it)
    local rep = job(archive{ { name = "f.txt", data = "x" } }, "read", function() engine.removing = 3 end)
    engine.removing = nil
    assert.is_true(rep.ok, rep.message)
    local after, gets = false, 0
    for _, r in ipairs(rep.requests) do
      if r == "DELETE /containers/c1" then after = true
      elseif after and r == "GET /containers/c1/json" then gets = gets + 1 end
    end
    assert.equal(4, gets, table.concat(rep.requests, ", "))   -- 3 x removing, then gone
  end)
end)

-- Found by fuzz/paths_fuzz.c: links that each stay inside a directory can
-- leave it together (x -> ".", l -> "x/.."); local and bwrap downloads judge
-- links with paths.link_escapes, which must count "l" as a link out.
describe("a sandbox tree whose links escape only together", function()
  local sbx = require "sbx"
  local backends = { "local" }
  if require("sbx.providers.builtin.bwrap").available() then backends[2] = "bwrap" end
  local tmp
  setup(function() tmp = assert(fs.mkdtemp("/tmp", "sbxtogether")) end)
  teardown(function() fs.rmtree(tmp) end)
  for _, b in ipairs(backends) do
    it("is refused by download_dir on " .. b, function()
      local sb <close> = sbx.sandbox(b)
      sb:write_file("trap/ok.txt", "fine")
      assert.equal(0, sb:execute_command("sh", { "-c", "ln -s . trap/x && ln -s x/.. trap/l" }).exit_code)
      local dest = tmp .. "/" .. b
      local ok, err = pcall(sb.download_dir, sb, "trap", dest)
      assert.is_false(ok)
      assert.equal("PathError", err.kind, tostring(err))
      assert.matches("symlink out", err.message)
      assert.is_nil(io.open(dest .. "/ok.txt"))
    end)
  end
  it("paths.link_escapes: a '..' after a name may leave, a leading one is counted", function()
    local paths = require "sbx.core.paths"
    assert.is_true(paths.link_escapes("l", "x/.."))
    assert.is_true(paths.link_escapes("a/l", "y/../.."))
    assert.is_true(paths.link_escapes("a/l", "../.."))
    assert.is_true(paths.link_escapes("l", "/etc"))
    assert.is_false(paths.link_escapes("a/b/l", "../../c/d"))
    assert.is_false(paths.link_escapes("l", "./a/./b"))
    assert.is_false(paths.link_escapes("a/l", ".."))
  end)
end)
