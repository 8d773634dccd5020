-- What many spec files need, in one place (spec/README.md lists it):
-- the error kind a call raises, fd counting, running sbxlua as a user does,
-- availability gates with the CI rule, host commands, tags and temp dirs.
--   local S = require "spec.support"      (specs run from the source root)
local assert = require "luassert"
local proc = require "sbx.proc"
local loop = require "sbx.loop"
local fs = require "sbx.fs"

local S = {}

S.BIN = os.getenv("SBX_BIN") or "build/sbxlua"
S.SOURCE = os.getenv("SBX_SOURCE_DIR") or "."
S.IMAGE = os.getenv("SBX_TEST_IMAGE") or "sbxlua-test:bookworm"
S.PATH = "PATH=/usr/local/bin:/usr/bin:/bin"

-- ------------------------------------------------------------ errors

---kind_of(fn) -> kind, err: fn must raise; kind is the typed error's kind,
---or "string: <message>" for anything else (so it never equals a kind).
function S.kind_of(fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  return type(err) == "table" and err.kind or ("string: " .. tostring(err)), err
end

---caught(fn) -> err: fn must raise a typed error (a table).
function S.caught(fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  assert.is_table(err, tostring(err))
  return err
end

-- ------------------------------------------------------------ fds

---fd_count([{ collect = true }]) -> this process's open fds (collect: after
---two full GC cycles, so only what something still holds counts).
function S.fd_count(o)
  if o and o.collect then
    collectgarbage()
    collectgarbage()
  end
  return #assert(fs.list_host("/proc/self/fd"))
end

---fd_list() -> "fd target" lines of this process's open fds, for messages.
function S.fd_list()
  local lines = {}
  for _, fd in ipairs(assert(fs.list_host("/proc/self/fd"))) do
    lines[#lines + 1] = fd .. " " .. tostring(fs.readlink("/proc/self/fd/" .. fd))
  end
  table.sort(lines, function(a, b) return tonumber(a:match("%d+")) < tonumber(b:match("%d+")) end)
  return table.concat(lines, "\n") .. "\n"
end

---fd_baseline([o]) -> a baseline for expect_fds: the count (o as for
---fd_count) and the listing.
function S.fd_baseline(o)
  return { n = S.fd_count(o), list = S.fd_list(), o = o }
end

---expect_fds(base [, extra]): the fd count is back to base.n (+ extra).
---An fd a finished operation still closes is transient: wait up to 1 s for
---it; a leak stays, and the failure lists the fds before and after.
function S.expect_fds(base, extra)
  local want = base.n + (extra or 0)
  local n = S.fd_count(base.o)
  for _ = 1, 20 do
    if n == want then break end
    loop.sleep(0.05)
    n = S.fd_count(base.o)
  end
  assert.equal(want, n, "before:\n" .. base.list .. "after:\n" .. S.fd_list())
end

---fails(code, ok, msg, got) -> msg: a core module's `nil, msg, code`
---failure with this code (or one of a list of codes).
function S.fails(code, ok, msg, got)
  assert.is_nil(ok, "expected a failure, got " .. tostring(ok))
  assert.is_string(msg)
  if type(code) == "table" then
    local hit = false
    for _, c in ipairs(code) do hit = hit or c == got end
    assert.is_true(hit, "code " .. tostring(got) .. " (" .. msg .. ")")
  else
    assert.are.equal(code, got, msg)
  end
  return msg
end

-- ------------------------------------------------------------ host

---host(cmd) -> stdout and stderr of a shell command, its exit status.
function S.host(cmd)
  local f = io.popen(cmd .. " 2>&1")
  local out = f:read("a")
  local _, _, status = f:close()
  return out, status
end

---stdout(cmd) -> what a shell command wrote to stdout (stderr goes where
---the spec's goes; the status is not looked at: see host for that).
function S.stdout(cmd)
  local f = io.popen(cmd)
  local out = f:read("a")
  f:close()
  return out
end

---shq(s) -> s quoted for sh.
function S.shq(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

---pgrep(pattern) -> how many processes' command lines match pattern (this
---pgrep's own shell excluded).
function S.pgrep(pattern)
  -- "[s]bx..." keeps the popen shell's own command line from matching
  local f = io.popen("pgrep -f '[" .. pattern:sub(1, 1) .. "]" .. pattern:sub(2) .. "' | wc -l")
  local n = tonumber(f:read("a"))
  f:close()
  return n
end

---alive(pattern) -> whether a process matching pattern runs.
function S.alive(pattern) return S.pgrep(pattern) > 0 end

---Under AddressSanitizer (the ASan build)? Its allocator keeps freed
---memory in quarantine, so a bound on RSS says nothing there.
function S.sanitized()
  local f = assert(io.open("/proc/self/maps"))
  local asan = f:read("a"):find("libasan", 1, true) ~= nil
  f:close()
  return asan
end

---tag([prefix]) -> a name no other run uses: prefix and 8 hex digits.
function S.tag(prefix) return (prefix or "sbxspec") .. proc.random_hex(8) end

---tmpdir(prefix) -> a new private directory under /tmp.
function S.tmpdir(prefix) return assert(fs.mkdtemp("/tmp", prefix)) end

-- ------------------------------------------------------------ sbxlua

---sbxlua(args, o) -> the result of `$SBX_BIN args...` (stdout, stderr,
---exit_code, ...). o: env (a "K=V" list; default PATH only), stdin, cwd,
---timeout (default 120), max_output, preload (pass SBX_PRELOAD on as
---LD_PRELOAD); stream = true returns the running process instead (no
---timeout unless o.timeout; keep_stdin as o.keep_stdin).
function S.sbxlua(args, o)
  o = o or {}
  local argv = { S.BIN }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local env = {}
  for i, e in ipairs(o.env or { S.PATH }) do env[i] = e end
  local preload = os.getenv("SBX_PRELOAD") or ""
  if o.preload and preload ~= "" then env[#env + 1] = "LD_PRELOAD=" .. preload end
  local spec = { argv = argv, env = env, cwd = o.cwd, stdin = o.stdin, max_output = o.max_output }
  if o.stream then
    spec.stream, spec.keep_stdin, spec.timeout = true, o.keep_stdin, o.timeout
    return assert(proc.spawn(spec))
  end
  spec.timeout = o.timeout or 120
  local p = assert(proc.spawn(spec))
  local r = p:wait()
  p:close()
  return r
end

---expect_output(p, pattern) -> what a streaming process printed on stdout
---up to and including pattern; fails with both streams if it ends first.
function S.expect_output(p, pattern)
  local out, err = "", ""
  while not out:find(pattern) do
    local which, chunk = p:read()
    assert(which, "sbxlua ended before printing " .. pattern .. "; stdout: " .. out .. "; stderr: " .. err)
    if which == "stdout" then out = out .. chunk else err = err .. chunk end
  end
  return out
end

---home(name [, o]) -> h: a private HOME for running sbxlua as a user does,
---(SBX_STATE_DIR or /tmp)/<name>-<pid>, with no sbxlua variable of the
---caller's. o: state (a subdirectory for SBX_STATE_DIR; default the home
---itself), xdg (XDG_CONFIG_HOME = <home>/xdg), cwd (run in the home; default
---the caller's directory), vars (more variables: a map), timeout (h.run's
---default; 120).
---h.dir, h.state; h.env(extra) -> the "K=V" list (extra: a map, false drops
---a variable, or a "K=V" list); h.run(args, o) -> result (o as for sbxlua,
---o.env = extra); h.start(args, o) -> the streaming process (stdin kept
---open unless o.keep_stdin == false);
---h.write(rel, text) -> path; h.cleanup().
function S.home(name, o)
  o = o or {}
  local dir = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/" .. name .. "-" .. proc.getpid()
  assert(os.execute("mkdir -p " .. S.shq(dir)))
  local h = { dir = dir, state = o.state and (dir .. "/" .. o.state) or dir }
  function h.env(extra)
    local vars = { PATH = "/usr/local/bin:/usr/bin:/bin", HOME = dir, SBX_STATE_DIR = h.state }
    if o.xdg then vars.XDG_CONFIG_HOME = dir .. "/xdg" end
    for k, v in pairs(o.vars or {}) do vars[k] = v end
    for k, v in pairs(extra or {}) do
      if type(k) == "number" then k, v = v:match("^([^=]+)=(.*)$") end
      vars[k] = v
    end
    local e = {}
    for k, v in pairs(vars) do if v ~= false then e[#e + 1] = k .. "=" .. v end end
    return e
  end
  local function opts(r, stream)
    r = r or {}
    return { env = h.env(r.env), stdin = r.stdin, cwd = r.cwd or (o.cwd and dir or nil),
             timeout = r.timeout or (not stream and o.timeout or nil), max_output = r.max_output,
             stream = stream, keep_stdin = stream and r.keep_stdin ~= false }
  end
  function h.run(args, r) return S.sbxlua(args, opts(r)) end
  function h.start(args, r) return S.sbxlua(args, opts(r, true)) end
  function h.write(rel, text)
    local path = dir .. "/" .. rel
    assert(os.execute("mkdir -p " .. S.shq(path:match("^(.*)/[^/]*$"))))
    local f = assert(io.open(path, "w"))
    f:write(text)
    f:close()
    return path
  end
  function h.cleanup() fs.rmtree(dir) end
  return h
end

---user(name) -> the home the CLI specs run sbxlua in: its state in
---<home>/state, its config in <home>/xdg, commands run in the home.
function S.user(name) return S.home(name, { state = "state", xdg = true, cwd = true }) end

---one_line(r) -> whether r.stderr is one line with no traceback of sbxlua's
---own Lua.
function S.one_line(r)
  local text = r.stderr:gsub("\n$", "")
  return not text:find("\n") and not text:find("traceback", 1, true) and not text:find("%.lua:%d+:")
end

-- ------------------------------------------------------------ gates

---image_present(name) -> whether the engine has the image.
function S.image_present(name) return require("sbx.providers.builtin.docker").has_image(name) == true end

local REQUIRE = { docker = "SBX_REQUIRE_DOCKER", bwrap = "SBX_REQUIRE_BWRAP" }

---available(what [, image]) -> ok, why: "docker" (an engine answers, and
---`image` is there if given) or "bwrap" (bubblewrap works here), or "modal"
---(spec.support.modal: the bridge, the stand-in and their credentials). When
---SBX_REQUIRE_DOCKER=1 / SBX_REQUIRE_BWRAP=1 (CI sets the first), an
---unavailable one is an error, never a skip.
function S.available(what, image)
  if what == "modal" then return require("spec.support.modal").available() end   -- its own rule (SBX_REQUIRE_MODAL)
  local ok, why = require("sbx.providers.builtin." .. what).available()
  if ok and image and not S.image_present(image) then
    ok, why = false, "test image " .. image .. " is missing (images/test/build.sh)"
  end
  if not ok then
    assert(os.getenv(REQUIRE[what]) ~= "1", what .. " is required here but unavailable: " .. tostring(why))
  end
  return ok, why
end

---gate(what, title [, image]) -> ok: as available(); when unavailable, a
---describe(title) with one pending test saying why, and false (the spec
---file then returns).
function S.gate(what, title, image)
  local ok, why = S.available(what, image)
  if not ok then
    local busted = require "busted"
    busted.describe(title, function() busted.pending(what .. " unavailable: " .. tostring(why)) end)
  end
  return ok, why
end

return S
