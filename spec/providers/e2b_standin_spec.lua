-- The E2B stand-in itself (spec/support/standin/e2b.lua) as a strict server,
-- and what providers/e2b.lua does with it beyond the conformance suite:
-- requests checked against e2b-openapi.yml, E2B's default 15 s lifetime and
-- the kill at its end, Connect envelopes split across chunks, snapshot and
-- restore, pause and resume through connect.
local sbx = require "sbx"
local loop = require "sbx.loop"
local http = require "sbx.http"
local json = require "cjson"
local S = require "spec.support"
local R = require "spec.support.standin.e2b_run"

describe("e2b stand-in", function()
  local s
  setup(function() s = R.start{} end)
  teardown(function()
    require("sbx.core.config").use{}
    if s then s:stop() end
  end)
  before_each(function() R.use(s) end)

  local function api(method, path, body)
    local r = assert(http.request{ method = method, url = s.url .. path, body = body and json.encode(body),
      headers = { ["x-api-key"] = s.key, ["content-type"] = "application/json" } })
    return r.status, r.body ~= "" and json.decode(r.body) or nil
  end

  it("answers what does not fit the OpenAPI document with a 400 naming the field", function()
    local cases = {
      { { templateID = "base", bogus = 1 }, "unknown property 'bogus'" },
      { { timeout = 5 }, "required property 'templateID' is missing" },
      { { templateID = "base", timeout = "soon" }, "body.timeout: expected integer" },
      { { templateID = "base", timeout = -1 }, "below the minimum" },
      { { templateID = "base", metadata = { a = 1 } }, "body.metadata.a: expected string" },
      { { templateID = "base", network = { allowOut = "x" } }, "body.network.allowOut: expected array" },
      { { templateID = "base", network = { nope = true } }, "unknown property 'nope'" },
    }
    for _, c in ipairs(cases) do
      local status, v = api("POST", "/sandboxes", c[1])
      assert.equal(400, status)
      assert.equal(400, v.code)
      assert.matches(c[2], v.message, 1, true)
    end
    local status, v = api("GET", "/v2/sandboxes?limit=500")
    assert.equal(400, status)
    assert.matches("above the maximum", v.message, 1, true)
    assert.equal(0, s:stats().live)
  end)

  it("gives a sandbox created without a timeout E2B's 15 s, and kills it at its end", function()
    local status, sb = api("POST", "/sandboxes", { templateID = "base" })
    assert.equal(201, status)
    local _, d = api("GET", "/sandboxes/" .. sb.sandboxID)
    local function t(iso) local y, mo, da, h, mi, se = iso:match("(%d+)-(%d+)-(%d+)T(%d+):(%d+):(%d+)")
      return os.time{ year = y, month = mo, day = da, hour = h, min = mi, sec = se } end
    assert.equal(15, t(d.endAt) - t(d.startedAt))
    api("DELETE", "/sandboxes/" .. sb.sandboxID)
    status, sb = api("POST", "/sandboxes", { templateID = "base", timeout = 1 })
    assert.equal(201, status)
    local t0, gone = loop.now(), nil
    while loop.now() - t0 < 15 do
      if api("GET", "/sandboxes/" .. sb.sandboxID) == 404 then gone = loop.now() - t0 break end
      loop.sleep(0.2)
    end
    assert.is_number(gone, "the sandbox outlived its timeout")
    assert.equal(0, s:stats().live)
  end)

  it("snapshot and restore carry the working directory; pause and resume through connect", function()
    local a <close> = sbx.sandbox("e2b")
    a:write_file("kept/data.txt", "from a")
    local snap = a:snapshot()
    assert.matches("^snap_", snap.snapshot_id)
    local b <close> = sbx.sandbox("e2b", { snapshot_id = snap.snapshot_id })
    assert.equal("from a", b:read_file("kept/data.txt"))
    local sid = a:session_state().state.sandbox_id
    assert.equal(204, (api("POST", "/sandboxes/" .. sid .. "/pause")))
    assert.equal(409, (api("POST", "/sandboxes/" .. sid .. "/pause")))
    assert.equal("SandboxNotFoundError", S.kind_of(function() a:read_file("kept/data.txt") end))
    local again = sbx.resume(a:session_state())
    assert.equal("from a", again:read_file("kept/data.txt"))
    assert.equal(204, (api("DELETE", "/templates/" .. snap.snapshot_id)))
  end)
end)

if S.gate("bwrap", "e2b: create options (the stand-in's sandboxes on bwrap)") then describe("e2b: create options", function()
  it("allow_internet = false reaches E2B and the sandbox has no network but lo; env_vars and labels too", function()
    local s = R.start{ backend = "bwrap" }
    local ok, err = pcall(function()
      R.use(s)
      local sb <close> = sbx.sandbox("e2b", { allow_internet = false, env_vars = { GREETING = "hi" },
                                               labels = { team = "blue" } })
      local sid = sb:session_state().state.sandbox_id
      local r = assert(http.request{ url = s.url .. "/sandboxes/" .. sid, headers = { ["x-api-key"] = s.key } })
      local d = json.decode(r.body)
      assert.is_false(d.allowInternetAccess)
      assert.equal("blue", d.metadata.team)
      assert.equal(sb.id, d.metadata["sbxlua.id"])
      local ifaces = {}
      for name in sb:execute_command("cat", { "/proc/net/dev" }).stdout:gmatch("\n%s*([%w]+):") do ifaces[#ifaces + 1] = name end
      assert.same({ "lo" }, ifaces)
      assert.equal("hi\n", sb:execute_command("sh", { "-c", "echo $GREETING" }).stdout)
    end)
    require("sbx.core.config").use{}
    s:stop()
    if not ok then error(err, 0) end
  end)
end) end

describe("e2b: Connect envelopes split across chunks", function()
  it("are put back together: exact bytes on both streams, the exit code", function()
    local s = R.start{ split = true }
    local ok, err = pcall(function()
      R.use(s)
      local sb <close> = sbx.sandbox("e2b")
      sb:execute_command("sh", { "-c", "head -c 200000 /dev/urandom > blob" })
      local want = sb:read_file("blob")
      local r = sb:execute_command("sh", { "-c", "cat blob; printf 'e1\\n' >&2; printf e2 >&2; exit 7" })
      assert.equal(200000, #r.stdout)
      assert.is_true(r.stdout == want, "stdout differs from the file")
      assert.equal("e1\ne2", r.stderr)
      assert.equal(7, r.exit_code)
    end)
    require("sbx.core.config").use{}
    s:stop()
    if not ok then error(err, 0) end
  end)
end)
