-- The official Python SDK (`tensorlake` from PyPI, Python over a Rust
-- extension) against the Tensorlake stand-in: if the vendor's own client
-- creates, runs a command, writes and reads a file, lists and destroys
-- through it, the stand-in speaks the real protocol. The venv comes from
-- spec/support/pyvenv.sh; without a reachable registry the spec skips with
-- one line, except under CI=true, where that is a failure.
local S = require "spec.support"
local TL = require "spec.support.standin.tensorlake"
local json = require "cjson"

local SDK = "tensorlake==0.5.163"

local SCRIPT = [[
import json, sys
from tensorlake.sandbox import Sandbox
out = {}
sb = Sandbox.create(cpus=1.0, memory_mb=512, timeout_secs=300, allow_internet_access=False)
out["id"] = sb.sandbox_id
r = sb.run("sh", args=["-c", "echo hello; echo to-err >&2; exit 3"], env={"GREETING": "hi"})
out["run"] = [r.stdout, r.stderr, r.exit_code]
r = sb.run("sh", args=["-c", "printf '%s' \"$GREETING\""], env={"GREETING": "hi"})
out["env"] = r.stdout
sb.write_file("/tmp/sdk.bin", b"bytes\x00\x01\xff")
out["read"] = list(sb.read_file("/tmp/sdk.bin").value)
out["list"] = sorted([e.name, e.is_dir, e.size] for e in sb.list_directory("/tmp").entries)
out["listed"] = [s.sandbox_id for s in Sandbox.list()]
sb.terminate()
out["after"] = [s.sandbox_id for s in Sandbox.list()]
try:
    sb.run("true")
    out["gone"] = "no error"
except Exception as e:
    out["gone"] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
]]

local function venv()
  local out, status = S.host("spec/support/pyvenv.sh tensorlake " .. S.shq(SDK))
  local py = out:match("([^\n]*/bin/python)\n?$")
  if status == 0 and py then return py end
  return nil, (out:gsub("%s+$", ""):match("[^\n]*$"))
end

describe("the official tensorlake Python SDK against the stand-in", function()
  local py, why = venv()
  if not py then
    if os.getenv("CI") == "true" then
      it("has its venv (CI)", function() error(tostring(why)) end)
    else
      pending("skipped: " .. tostring(why))
    end
    return
  end

  local standin
  setup(function() standin = TL.start() end)
  teardown(function() standin:stop() end)

  local function python(code)
    local dir = S.tmpdir("sbxspec-tlsdk-")
    local f = assert(io.open(dir .. "/t.py", "w"))
    f:write(code)
    f:close()
    local out, status = S.host("env -i PATH=/usr/bin:/bin HOME=" .. dir .. " TENSORLAKE_API_URL=" .. standin.url
      .. " TENSORLAKE_API_KEY=" .. standin.key .. " timeout 120 " .. py .. " " .. dir .. "/t.py")
    os.execute("rm -rf " .. S.shq(dir))
    return out, status
  end

  it("creates, runs a command, writes and reads a file, lists and destroys", function()
    local out, status = python(SCRIPT)
    assert.equal(0, status, out)
    local v = json.decode(out:match("(%b{})%s*$"))
    assert.same({ "hello", "to-err", 3 }, v.run)
    assert.equal("hi", v.env)
    assert.same({ 98, 121, 116, 101, 115, 0, 1, 255 }, v.read)
    assert.same({ { "sdk.bin", false, 8 } }, v.list)
    assert.same({ v.id }, v.listed)
    assert.same({}, v.after)
    assert.matches("status 404", v.gone)
    assert.equal(0, standin:live())
    -- the SDK's own routes for a loopback API URL: the namespaced ones, and
    -- the daemon's at the sandbox_url the stand-in gave
    local seen = {}
    for _, r in ipairs(standin:requests()) do seen[r] = true end
    assert.is_true(seen["POST /v1/namespaces/default/sandboxes"])
    assert.is_true(seen["POST /api/v1/processes/run"])
    assert.is_true(seen["PUT /api/v1/files"])
    assert.is_true(seen["GET /api/v1/files/list"])
  end)

  it("streams across heartbeats, times a command out on the server, runs a background process", function()
    local out, status = python([[
import json, time
from tensorlake.sandbox import Sandbox
out = {}
sb = Sandbox.create(cpus=1.0, memory_mb=512, timeout_secs=300)
r = sb.run("sh", args=["-c", "echo early; sleep 2.5; echo late"])
out["hb"] = [r.stdout, r.exit_code]
t = time.time()
r = sb.run("sleep", args=["30"], timeout=1)
out["timeout"] = [r.exit_code, time.time() - t < 10]
p = sb.start_process("sh", args=["-c", "echo bg; echo done"])
for _ in range(100):
    if sb.get_process(p.pid).status.value != "running":
        break
    time.sleep(0.05)
out["bg"] = [sb.get_process(p.pid).exit_code, sb.get_stdout(p.pid).lines]
sb.terminate()
print(json.dumps(out))
]])
    assert.equal(0, status, out)
    local v = json.decode(out:match("(%b{})%s*$"))
    assert.same({ "early\nlate", 0 }, v.hb)
    assert.same({ -9, true }, v.timeout)
    assert.same({ 0, { "bg", "done" } }, v.bg)
    assert.equal(0, standin:live())
  end)

  it("shows the stand-in's errors as the real server's: (status N): <body>", function()
    standin:fault{ route = "POST /v1/namespaces/default/sandboxes", status = 401, body = "invalid API key" }
    local out = python([[
from tensorlake.sandbox import Sandbox
try:
    Sandbox.create(cpus=1.0, memory_mb=512)
    print("no error")
except Exception as e:
    print(type(e).__name__ + ": " + str(e))
]])
    assert.matches("invalid API key", out)
    assert.matches("401", out)
  end)
end)
