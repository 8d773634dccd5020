-- sbx.http: libcurl's multi interface in the event loop, against a real
-- stand-in server (spec/support/httpd.c) on loopback TCP and a unix socket.
-- Over 400 lines: the cases share the stand-in server and the helpers below.
local http = require "sbx.http"
local proc = require "sbx.proc"
local loop = require "sbx.loop"
local fs = require "sbx.fs"
require "sbx"  -- typed errors (Cancelled) for the core
local S = require "spec.support"

local PATH = "PATH=/usr/local/bin:/usr/bin:/bin"
local HERE = debug.getinfo(1, "S").source:match("^@(.*)/core/[^/]*$") or "spec"
local MiB = 1024 * 1024

-- this sbxlua (a concurrent rebuild may have replaced the file)
local function sbxlua()
  return os.getenv("SBX_BIN") or (fs.readlink("/proc/self/exe"):gsub(" %(deleted%)$", ""))
end

local function vm_kb(field)
  local f = assert(io.open("/proc/self/status"))
  local kb = tonumber(f:read("a"):match(field .. ":%s+(%d+)"))
  f:close()
  return kb
end

local sanitized = S.sanitized    -- RSS bounds say nothing under ASan

-- byte i (from 0) of a /big body
local function pattern(from, n)
  local t = {}
  for i = from, from + n - 1 do t[#t + 1] = string.char(97 + i % 26) end
  return table.concat(t)
end

local function fails(code, res, msg, got)
  assert.is_nil(res, "expected a failure")
  assert.is_string(msg)
  assert.matches("^http: ", msg)
  if type(code) == "table" then
    local hit = false
    for _, c in ipairs(code) do hit = hit or c == got end
    assert.is_true(hit, "code " .. tostring(got) .. " (" .. msg .. ")")
  else
    assert.equal(code, got, msg)
  end
  return msg
end

describe("sbx.http", function()
  local dir, srv, base, sock, closed_port

  local function get(path, o)
    o = o or {}
    o.url = o.url or base .. path
    return http.request(o)
  end

  local function server_conns()
    return tonumber(assert(get("/conns")).body)
  end

  setup(function()
    dir = assert(fs.mkdtemp("/tmp", "httpspec"))
    local bin = dir .. "/httpd"
    local cc = assert(proc.spawn{ argv = { "cc", "-O1", "-o", bin, HERE .. "/support/httpd.c" },
                                  env = { PATH } }):wait()
    assert(cc.exit_code == 0, "cannot build the stand-in server: " .. cc.stderr)
    sock = dir .. "/httpd.sock"
    srv = assert(proc.spawn{ argv = { bin, sock }, env = { PATH }, stream = true })
    local line = ""
    while not line:find("\n") do
      local which, chunk = srv:read()
      assert(which, "the stand-in server exited")
      if which == "stdout" then line = line .. chunk end
    end
    local port, closed = line:match("port (%d+) closed (%d+)")
    base, closed_port = "http://127.0.0.1:" .. port, closed
  end)

  teardown(function()
    if srv then srv:kill() srv:wait() srv:close() end
    if dir then fs.rmtree(dir) end
  end)

  -- First, while the process's peak RSS is still low.
  it("streams a 50 MB body to a slow reader with bounded memory (backpressure)", function()
    collectgarbage()
    local hwm0, rss0, peak = vm_kb("VmHWM"), vm_kb("VmRSS"), 0
    local n = 50 * 1000 * 1000
    local resp = assert(get("/big?n=" .. n, { stream = true, timeout = 120 }))
    assert.equal(200, resp.status)
    assert.equal(tostring(n), resp.headers["content-length"])
    local got, reads = 0, 0
    while true do
      local chunk, err = resp:read()
      assert.is_nil(err)
      if not chunk then break end
      assert.is_true(#chunk <= 256 * 1024)
      assert.equal(pattern(got, 8), chunk:sub(1, 8))
      got, reads = got + #chunk, reads + 1
      if reads % 16 == 0 then
        loop.sleep(0.005)            -- slower than loopback
        peak = math.max(peak, vm_kb("VmRSS") - rss0)
        collectgarbage("step", 0)
      end
    end
    resp:close()
    assert.equal(n, got)
    assert.is_false(resp.truncated)
    if sanitized() then return end
    assert.is_true(peak < 24 * 1024, "RSS grew by " .. peak .. " KiB while streaming")
    assert.is_true(vm_kb("VmHWM") - hwm0 < 32 * 1024, "peak RSS grew by more than 32 MiB")
  end)

  it("GETs a JSON document: status, lower-cased headers, body", function()
    local res = assert(get("/ok"))
    assert.equal(200, res.status)
    assert.equal("application/json", res.headers["content-type"])
    assert.equal("11", res.headers["content-length"])
    assert.is_nil(res.headers["Content-Type"])
    assert.equal('{"ok":true}', res.body)
    assert.is_false(res.truncated)
  end)

  it("sends every method with binary bodies and headers both ways", function()
    local body = "\0\1\2\255 binary\r\n\0" .. string.rep("z", 100000)
    for _, m in ipairs({ "POST", "PUT", "PATCH", "DELETE", "GET", "PROPFIND" }) do
      local res = assert(get("/echo?q=1", { method = m, body = body,
        headers = { ["X-Token"] = "abc def", ["Content-Type"] = "application/x-tar", ["X-Num"] = 42 } }))
      assert.equal(200, res.status)
      assert.equal(m, res.headers["x-method"])
      assert.equal("/echo?q=1", res.headers["x-path"])
      assert.equal(tostring(#body), res.headers["x-body-length"])
      assert.equal(body, res.body)
      assert.equal("abc def", res.headers["x-req-x-token"])
      assert.equal("42", res.headers["x-req-x-num"])
      assert.equal("application/x-tar", res.headers["x-req-content-type"])
      assert.is_nil(res.headers["x-req-expect"])        -- no 100-continue stall
    end
  end)

  it("defaults to GET, or POST when a body is given; empty POST sends Content-Length 0", function()
    local res = assert(get("/echo"))
    assert.equal("GET", res.headers["x-method"])
    assert.equal("", res.body)
    res = assert(get("/echo", { body = "x" }))
    assert.equal("POST", res.headers["x-method"])
    res = assert(get("/echo", { method = "POST" }))
    assert.equal("POST", res.headers["x-method"])
    assert.equal("0", res.headers["x-req-content-length"])
    res = assert(get("/echo", { method = "DELETE" }))
    assert.equal("DELETE", res.headers["x-method"])
    res = assert(get("/echo", { headers = { ["X-Empty"] = "" } }))
    assert.equal("", res.headers["x-req-x-empty"])
  end)

  it("HEAD returns the headers and no body", function()
    local res = assert(get("/ok", { method = "HEAD" }))
    assert.equal(200, res.status)
    assert.equal("11", res.headers["content-length"])
    assert.equal("", res.body)
  end)

  it("joins repeated headers with ', ', unfolds and trims values", function()
    local h = assert(get("/headers")).headers
    assert.equal("a=1, b=2", h["set-cookie"])
    assert.equal("one, two", h["x-multi"])
    assert.equal("", h["x-empty"])
    assert.equal("first second", h["x-folded"])
    assert.equal("padded value", h["x-spaces"])
  end)

  it("returns HTTP error statuses as results, and does not follow redirects", function()
    for _, code in ipairs({ 400, 404, 409, 500, 502, 503 }) do
      local res = assert(get("/status/" .. code))
      assert.equal(code, res.status)
      assert.equal("status " .. code .. "\n", res.body)
    end
    local res = assert(get("/retry-after"))
    assert.equal(429, res.status)
    assert.equal("2", res.headers["retry-after"])
    res = assert(get("/redirect"))
    assert.equal(302, res.status)
    assert.equal("/ok", res.headers["location"])
    assert.equal("moved", res.body)
  end)

  it("skips interim 1xx responses and decodes chunked bodies", function()
    local res = assert(get("/interim"))
    assert.equal(200, res.status)
    assert.is_nil(res.headers["x-interim"])
    assert.equal("final", res.body)
    res = assert(get("/chunked"))
    assert.equal("hello chunked world", res.body)
  end)

  it("talks over a unix socket", function()
    local res = assert(http.request{ url = "http://localhost/ok", unix_socket = sock })
    assert.equal(200, res.status)
    assert.equal('{"ok":true}', res.body)
    res = assert(http.request{ url = "http://localhost/echo", unix_socket = sock, method = "PUT", body = "u" })
    assert.equal("PUT", res.headers["x-method"])
    assert.equal("u", res.body)
  end)

  it("reports connection refused, a missing socket file, and a non-socket", function()
    local msg = fails("ECONNREFUSED", http.request{ url = "http://127.0.0.1:" .. closed_port .. "/x" })
    assert.matches("127.0.0.1:" .. closed_port, msg, 1, true)
    msg = fails("ENOENT", http.request{ url = "http://localhost/_ping", unix_socket = dir .. "/missing.sock" })
    assert.matches("unix socket " .. dir .. "/missing.sock: No such file", msg, 1, true)
    fails("ENOENT", http.request{ url = "http://localhost/_ping", unix_socket = "/no/such/dir/docker.sock" })
    fails("ECONNREFUSED", http.request{ url = "http://localhost/_ping", unix_socket = HERE .. "/support/httpd.c" })
  end)

  it("reports a socket it may not open as EACCES", function()
    local bin = sbxlua()
    local f = assert(io.open("/proc/self/status"))
    local uid = f:read("a"):match("Uid:%s+(%d+)")
    f:close()
    if uid ~= "0" then
      pending("needs root to switch to an unprivileged user")
      return
    end
    if not proc.which("setpriv") then pending("no setpriv") return end
    local code = 'local h = require "sbx.http" '
      .. 'local r, e, c = h.request{ url = "http://localhost/ok", unix_socket = ' .. string.format("%q", sock) .. ' } '
      .. 'io.write(tostring(c))'
    local r = assert(proc.spawn{ argv = { "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                          bin, "-e", code }, env = { PATH } }):wait()
    if r.exit_code ~= 0 then pending("cannot run sbxlua as nobody: " .. r.stderr) return end
    assert.equal("EACCES", r.stdout)
  end)

  it("meets its deadline on a server that never answers", function()
    local t0 = loop.now()
    local msg = fails("ETIMEDOUT", get("/hang", { timeout = 1 }))
    local dt = loop.now() - t0
    assert.is_true(dt >= 0.9 and dt < 2, "took " .. dt .. " s")
    assert.matches("/hang", msg)
    -- a body that trickles forever is cut by the same deadline
    t0 = loop.now()
    fails("ETIMEDOUT", get("/slow?n=1000000&delay=50", { timeout = 0.5 }))
    assert.is_true(loop.now() - t0 < 1.5)
  end)

  it("caps the buffered body and says truncated", function()
    local res = assert(get("/big?n=1000000", { max_body = 1000 }))
    assert.equal(200, res.status)
    assert.equal(pattern(0, 1000), res.body)
    assert.is_true(res.truncated)
    res = assert(get("/big?n=1000", { max_body = 1000 }))
    assert.equal(1000, #res.body)
    assert.is_false(res.truncated)
    res = assert(get("/big?n=10", { max_body = 0 }))
    assert.equal("", res.body)
    assert.is_true(res.truncated)
  end)

  it("caps at 64 MiB by default", function()
    local res = assert(get("/big?n=" .. (70 * MiB)))
    assert.equal(64 * MiB, #res.body)
    assert.is_true(res.truncated)
    res = nil
    collectgarbage()
  end)

  it("reports dropped connections and bad HTTP", function()
    fails("ECONNRESET", get("/reset"))          -- RST in the middle of the body
    fails("EIO", get("/short"))                 -- FIN before Content-Length
    fails("ECONNRESET", get("/drop"))           -- closed without a response
    fails("EPROTO", get("/bad"))
    local msg = fails("EPROTO", get("/bighead"))
    assert.matches("headers", msg)
  end)

  it("streams: returns at the headers, then body chunks as they arrive", function()
    -- paced at 0.2 s a byte: the headers come long before the body's end
    local t0 = loop.now()
    local resp = assert(get("/slow?n=5&chunk=1&delay=200", { stream = true }))
    local t_headers = loop.now() - t0
    assert.is_true(t_headers < 0.6, "the headers came at " .. t_headers .. " s")
    assert.equal(200, resp.status)
    assert.equal("5", resp.headers["content-length"])
    assert.equal(resp.headers, resp.headers)
    local parts = {}
    while true do
      local chunk, err, code = resp:read()
      assert.is_nil(err, code)
      if not chunk then break end
      parts[#parts + 1] = chunk
    end
    assert.equal("sssss", table.concat(parts))
    assert.is_true(#parts >= 3, "chunks were not delivered as they arrived")
    assert.is_true(loop.now() - t0 - t_headers >= 0.5, "the body was read before the headers returned")
    assert.is_nil(resp:read())                  -- stays at the end
    resp:close()
  end)

  it("streams a transport error to the reader after the data", function()
    local resp = assert(get("/reset", { stream = true }))
    local got = 0
    while true do
      local chunk, err, code = resp:read()
      if not chunk then
        assert.equal("ECONNRESET", code)
        assert.matches("^http: ", err)
        break
      end
      got = got + #chunk
    end
    assert.equal(1000, got)
    resp:close()
  end)

  it("a paused stream still meets its deadline", function()
    local resp = assert(get("/big?n=50000000", { stream = true, timeout = 0.5 }))
    loop.sleep(1)                               -- nobody reads: curl is paused
    assert.equal(0, http.in_flight())
    local got = 0
    while true do
      local chunk, err, code = resp:read()
      if not chunk then
        assert.equal("ETIMEDOUT", code, err)
        break
      end
      got = got + #chunk
    end
    assert.is_true(got > 0 and got < 4 * MiB)
    resp:close()
  end)

  it("streams with an explicit max_body: ends at the cap, truncated", function()
    local resp = assert(get("/big?n=1000000", { stream = true, max_body = 5000 }))
    local got = {}
    while true do
      local chunk = resp:read()
      if not chunk then break end
      got[#got + 1] = chunk
    end
    assert.equal(pattern(0, 5000), table.concat(got))
    assert.is_true(resp.truncated)
    resp:close()
  end)

  it("runs 200 requests at once from 200 tasks", function()
    local ts = {}
    local t0 = loop.now()
    for i = 1, 200 do
      ts[i] = loop.spawn(function()
        local o = { url = base .. "/echo?i=" .. i, body = tostring(i), timeout = 30 }
        if i % 2 == 0 then o.url, o.unix_socket = "http://localhost/slow?n=2&delay=300", sock end
        return assert(http.request(o))
      end)
    end
    for i = 1, 200 do
      local ok, res = ts[i]:join()
      assert.is_true(ok, tostring(res))
      assert.equal(200, res.status)
      assert.equal(i % 2 == 0 and "ss" or tostring(i), res.body)
    end
    assert.is_true(loop.now() - t0 < 5, "not concurrent: " .. (loop.now() - t0) .. " s")
    assert.equal(0, http.in_flight())
  end)

  it("a cancelled task's transfer is aborted: no fd, no connection left", function()
    local fds0, conns0 = S.fd_baseline{ collect = true }, server_conns()
    local t = loop.spawn(function() return http.request{ url = base .. "/hang", timeout = 30 } end)
    loop.sleep(0.2)
    assert.equal(1, http.in_flight())
    assert.equal(conns0 + 1, server_conns())
    S.expect_fds(fds0, 1)
    t:cancel()
    local ok, err = t:join()
    assert.is_false(ok)
    assert.equal("Cancelled", err.kind)
    assert.equal(0, http.in_flight())
    S.expect_fds(fds0)
    loop.sleep(0.1)
    assert.equal(conns0, server_conns())
  end)

  it("a task cancelled in read() aborts its stream", function()
    local fds0 = S.fd_baseline{ collect = true }
    local resp = assert(get("/slow?n=100&delay=1000", { stream = true, timeout = 30 }))
    local t = loop.spawn(function() return resp:read() end)
    loop.sleep(0.1)
    t:cancel()
    local ok, err = t:join()
    assert.is_false(ok)
    assert.equal("Cancelled", err.kind)
    assert.equal(0, http.in_flight())
    assert.has_error(function() resp:read() end)
    S.expect_fds(fds0)
  end)

  it("close aborts a stream; is idempotent; <close> and __gc work", function()
    local fds0 = S.fd_baseline{ collect = true }
    local resp = assert(get("/big?n=100000000", { stream = true }))
    assert.matches("sbx.HttpResponse", tostring(resp))
    assert.is_string(resp:read())
    resp:close()
    resp:close()
    assert.has_error(function() resp:read() end)
    assert.equal(0, http.in_flight())
    do
      local r <close> = assert(get("/slow?n=100&delay=1000", { stream = true }))
      assert.equal(200, r.status)
    end
    assert.equal(0, http.in_flight())
    S.expect_fds(fds0)
    -- a finished, unread stream is collectable
    local weak = setmetatable({}, { __mode = "v" })
    weak[1] = assert(get("/ok", { stream = true }))
    loop.sleep(0.1)
    collectgarbage() collectgarbage()
    assert.is_nil(weak[1])
  end)

  it("a reader woken by another task's close gets ECANCELED", function()
    local resp = assert(get("/slow?n=100&delay=1000", { stream = true }))
    local t = loop.spawn(function() return resp:read() end)
    loop.sleep(0.05)
    resp:close()
    local ok, chunk, _, code = t:join()
    assert.is_true(ok)
    assert.is_nil(chunk)
    assert.equal("ECANCELED", code)
  end)

  it("works outside a task (the loop runs inline)", function()
    local co = coroutine.wrap(function()
      local res = assert(get("/slow?n=3&delay=20"))
      local resp = assert(get("/slow?n=2&delay=20", { stream = true }))
      local a, b = resp:read(), resp:read()
      resp:close()
      return res.body, (a or "") .. (b or "")
    end)
    local body, streamed = co()
    assert.equal("sss", body)
    assert.equal("ss", streamed)
  end)

  it("opens every socket close-on-exec", function()
    local n = 0
    local t = loop.spawn(function() return get("/hang", { timeout = 30 }) end)
    loop.sleep(0.1)
    local bad = {}
    for _, fd in ipairs(assert(fs.list_host("/proc/self/fd"))) do
      local f = io.open("/proc/self/fdinfo/" .. fd)
      if f then
        local flags = tonumber(f:read("a"):match("flags:%s+(%d+)"), 8)
        f:close()
        local target = tostring(fs.readlink("/proc/self/fd/" .. fd))
        if flags & 0x80000 == 0 and target:match("^socket:") then
          bad[#bad + 1] = fd .. " -> " .. target
        end
      end
    end
    for _, fd in ipairs(assert(fs.list_host("/proc/self/fd"))) do
      if tostring(fs.readlink("/proc/self/fd/" .. fd)):match("^socket:") then n = n + 1 end
    end
    t:cancel()
    t:join()
    assert.is_true(n >= 2, "expected curl's sockets to be open")
    assert.same({}, bad)
  end)

  it("ignores proxy settings in the environment; honours the proxy option", function()
    local bin = sbxlua()
    local proxy = "http://127.0.0.1:" .. closed_port
    local code = 'local h = require "sbx.http" local r, e = h.request{ url = ' .. string.format("%q", base .. "/ok")
      .. ' } io.write(r and r.body or e)'
    local r = assert(proc.spawn{ argv = { bin, "-e", code }, env = { PATH, "http_proxy=" .. proxy,
      "HTTP_PROXY=" .. proxy, "ALL_PROXY=" .. proxy, "all_proxy=" .. proxy } }):wait()
    assert.equal('{"ok":true}', r.stdout, r.stderr)
    fails("ECONNREFUSED", get("/ok", { proxy = proxy }))
  end)

  it("raises on misuse", function()
    assert.has_error(function() http.request("http://x/") end)
    assert.has_error(function() http.request{} end)
    assert.has_error(function() http.request{ url = "ftp://x/" } end)
    assert.has_error(function() http.request{ url = "not a url" } end)
    assert.has_error(function() http.request{ url = base, method = "GE T" } end)
    assert.has_error(function() http.request{ url = base, method = "GET\r\nX: y" } end)
    assert.has_error(function() http.request{ url = base, headers = "x" } end)
    assert.has_error(function() http.request{ url = base, headers = { ["X-A"] = "a\r\nInjected: 1" } } end)
    assert.has_error(function() http.request{ url = base, headers = { ["X A"] = "a" } } end)
    assert.has_error(function() http.request{ url = base, headers = { ["X:A"] = "a" } } end)
    assert.has_error(function() http.request{ url = base, headers = { [1] = "a" } } end)
    assert.has_error(function() http.request{ url = base, headers = { ["X-A"] = {} } } end)
    assert.has_error(function() http.request{ url = base, body = {} } end)
    assert.has_error(function() http.request{ url = base, timeout = 0 } end)
    assert.has_error(function() http.request{ url = base, timeout = -1 } end)
    assert.has_error(function() http.request{ url = base, timeout = "x" } end)
    assert.has_error(function() http.request{ url = base, connect_timeout = 0 } end)
    assert.has_error(function() http.request{ url = base, max_body = -1 } end)
    assert.has_error(function() http.request{ url = base, max_body = 1.5 } end)
    assert.has_error(function() http.request{ url = base, unix_socket = 5 } end)
    assert.has_error(function() http.request{ url = base, unix_socket = "a\0b" } end)
    assert.equal(0, http.in_flight())
  end)

  it("escapes path segments and query values", function()
    assert.equal("abc-._~XYZ019", http.escape("abc-._~XYZ019"))
    assert.equal("a%20b%2Fc%3F%26%3D%25%00%FF%C3%A9", http.escape("a b/c?&=%\0\255é"))
    assert.equal("", http.escape(""))
    assert.matches("^libcurl/%d", http.version())
  end)

  -- Last: it leaves a connection in curl's cache.
  it("reuses connections", function()
    local a = assert(get("/ka"))
    local b = assert(get("/ka"))
    assert.equal("ka", b.body)
    assert.equal(a.headers["x-conn"], b.headers["x-conn"])
  end)
end)
