-- The Tensorlake stand-in itself (spec/support/standin/tensorlake.lua), on
-- the wire: strict request checks (unknown and missing fields are a 400),
-- text errors on the control plane and {error, code} on the daemon, the
-- late sandbox_url, names, the SSE run with its exit event, and routing by
-- Host or X-Tensorlake-Sandbox-Id.
local TL = require "spec.support.standin.tensorlake"
local http = require "sbx.http"
local loop = require "sbx.loop"
local json = require "cjson"

local standin

setup(function() standin = TL.start() end)
teardown(function() standin:stop() end)

local function call(method, path, body, headers)
  local h = { authorization = "Bearer " .. standin.key }
  for k, v in pairs(headers or {}) do h[k] = v end
  local res = assert(http.request{ method = method, url = standin.url .. path, headers = h, timeout = 30,
                                   body = type(body) == "table" and json.encode(body) or body })
  return res.status, res.body, res.headers
end

local function running(id)
  for _ = 1, 400 do
    local _, body = call("GET", "/sandboxes/" .. id)
    local info = json.decode(body)
    if info.status == "running" then return info end
    loop.sleep(0.025)
  end
  error("sandbox " .. id .. " never ran")
end

describe("the tensorlake stand-in", function()
  it("checks create bodies strictly and answers in text", function()
    local status, body = call("POST", "/sandboxes", { resources = { cpus = 1, memory_mb = 512 }, colour = "blue" })
    assert.equal(400, status)
    assert.matches("unknown field `colour`", body)
    status, body = call("POST", "/sandboxes", { resources = { cpus = 1 } })
    assert.equal(400, status)
    assert.matches("missing field `memory_mb`", body)
    status, body = call("POST", "/sandboxes", { timeout_secs = 10 })
    assert.equal(400, status)
    assert.matches("missing field `resources`", body)
    status, body = call("POST", "/sandboxes", { resources = { cpus = "one", memory_mb = 512 } })
    assert.equal(400, status)
    assert.matches("invalid type", body)
    status = call("POST", "/sandboxes", "{not json")
    assert.equal(400, status)
    status, body = call("GET", "/sandboxes", nil, { authorization = "Bearer nope" })
    assert.equal(401, status)
    assert.equal("invalid API key", body)
    status, body = call("GET", "/sandboxes/nosuch")
    assert.equal(404, status)
    assert.matches("sandbox not found", body)
  end)

  it("answers pending without a sandbox_url, which comes once it runs; names are unique while live", function()
    local status, body = call("POST", "/v1/namespaces/default/sandboxes",
                              { resources = { cpus = 1, memory_mb = 512 }, name = "sbxspec-name" })
    assert.equal(200, status)
    local v = json.decode(body)
    assert.equal("pending", v.status)
    assert.is_nil(v.sandbox_url)
    local info = running(v.sandbox_id)
    assert.equal(standin.url, info.sandbox_url)
    assert.equal("default", info.namespace)
    assert.equal(409, (call("POST", "/sandboxes", { resources = { cpus = 1, memory_mb = 512 }, name = "sbxspec-name" })))
    local _, by_name = call("GET", "/sandboxes/sbxspec-name")
    assert.equal(v.sandbox_id, json.decode(by_name).sandbox_id)
    assert.equal(200, (call("DELETE", "/sandboxes/" .. v.sandbox_id)))
    local _, after = call("GET", "/sandboxes/" .. v.sandbox_id)
    assert.equal("terminated", json.decode(after).status)
    assert.equal(404, (call("GET", "/api/v1/health", nil, { ["x-tensorlake-sandbox-id"] = v.sandbox_id })))
  end)

  it("serves the daemon by Host or X-Tensorlake-Sandbox-Id, strictly, with SSE runs", function()
    local _, body = call("POST", "/sandboxes", { resources = { cpus = 1, memory_mb = 512 } })
    local id = json.decode(body).sandbox_id
    running(id)
    local by_host = { host = id .. ".local" }
    local status, health = call("GET", "/api/v1/health", nil, by_host)
    assert.same({ 200, true }, { status, json.decode(health).healthy })
    status, body = call("POST", "/api/v1/processes/run", { command = "true", colour = 1 },
                        { host = id .. ".local", accept = "text/event-stream" })
    assert.equal(400, status)
    assert.matches("unknown field `colour`", json.decode(body).error)
    status = call("POST", "/api/v1/processes/run", { command = "true" }, by_host)
    assert.equal(406, status)                      -- not asking for an event stream
    local headers
    status, body, headers = call("POST", "/api/v1/processes/run",
      { command = "sh", args = { "-c", "echo out; printf 'no newline' >&2; exit 5" } },
      { ["x-tensorlake-sandbox-id"] = id, accept = "text/event-stream" })
    assert.equal(200, status)
    assert.equal("text/event-stream", headers["content-type"])
    local events = {}
    for data in body:gmatch("data: ([^\n]*)\n\n") do events[#events + 1] = json.decode(data) end
    assert.is_number(events[1].pid)
    assert.same({ "out", "stdout" }, { events[2].line, events[2].stream })
    assert.same({ "no newline", "stderr" }, { events[3].line, events[3].stream })
    assert.same({ 5, "exited" }, { events[4].exit_code, events[4].reason })
    status, body = call("GET", "/api/v1/files?path=/workspace/../../etc/passwd", nil, by_host)
    assert.equal(403, status)
    assert.equal("FORBIDDEN", json.decode(body).code)
    status, body = call("GET", "/api/v1/files?path=/workspace/nope", nil, by_host)
    assert.equal(404, status)
    assert.equal("NOT_FOUND", json.decode(body).code)
    assert.equal(200, (call("PUT", "/api/v1/files?path=/workspace/d/f.bin", "\0\1\2", by_host)))
    local _, list = call("GET", "/api/v1/files/list?path=/workspace/d", nil, by_host)
    local entries = json.decode(list).entries
    assert.same({ "f.bin", false, 3 }, { entries[1].name, entries[1].is_dir, entries[1].size })
    local _, data = call("GET", "/api/v1/files?path=/workspace/d/f.bin", nil, by_host)
    assert.equal("\0\1\2", data)
    call("DELETE", "/sandboxes/" .. id)
    assert.equal(0, standin:live())
  end)

  it("--light: sandboxes with no process behind them answer sbxlua's commands and files", function()
    local light = TL.start{ args = { "--light", "--pending-secs", "0", "--creates-per-sec", "1000" } }
    local proc, sbx = require "sbx.proc", require "sbx"
    proc.setenv("TENSORLAKE_API_URL", light.url)
    proc.setenv("TENSORLAKE_API_KEY", light.key)
    local ok, err = pcall(function()
      local items, got = {}, {}
      for i = 1, 40 do items[i] = i end
      sbx.parallel(items, function(i)
        local sb <close> = sbx.sandbox("tensorlake")
        got[i] = sb:execute_command("echo", { "n" .. i }).stdout
        sb:write_file("f", "\0" .. i)
        got[i] = got[i] .. sb:execute_command("cat", { "f" }).stdout
      end, { concurrency = 20 })
      for i = 1, 40 do assert.equal("n" .. i .. "\n\0" .. i, got[i]) end
      assert.equal(0, light:live())
      local sb <close> = sbx.sandbox("tensorlake")
      -- only built-ins: no shell or interpreter behind it
      assert.equal("SandboxExecutionError", require("spec.support").kind_of(function() sb:execute_command("python3", {}) end))
      assert.equal(1, sb:execute_command("false", {}).exit_code)
    end)
    proc.setenv("TENSORLAKE_API_URL", nil)
    proc.setenv("TENSORLAKE_API_KEY", nil)
    light:stop()
    assert(ok, err)
  end)
end)
