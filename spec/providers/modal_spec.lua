-- providers/modal.lua beyond the conformance suite (spec/conformance/
-- modal_spec.lua): what reaches Modal's API, read from the stand-in's log
-- of calls (bridge/modal/standin: the SDK's own stubs), gc by tags, snapshots,
-- timeouts, refused credentials and a missing bridge.
local sbx = require "sbx"
local S = require "spec.support"
local M = require "spec.support.modal"

if not S.gate("modal", "the modal provider") then return end

local s = M.start()
M.configure(s)

-- the network interfaces a command in the sandbox sees, one a line
local IFACES = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"

local function last(method)
  local calls = M.calls_of(method)
  return calls[#calls]
end

-- `sbxlua ARGS` with the stand-in's variables (and more "K=V" in extra).
local function sbxlua(args, extra, o)
  local vars, env = {}, {}
  for _, list in ipairs{ { S.PATH, "SBX_STATE_DIR=" .. os.getenv("SBX_STATE_DIR") }, {}, extra or {} } do
    for _, kv in ipairs(list) do vars[kv:match("^[^=]+")] = kv end
    if #list == 0 then for kv in s.host_env:gmatch("%S+") do vars[kv:match("^[^=]+")] = kv end end
  end
  for _, kv in pairs(vars) do env[#env + 1] = kv end
  o = o or {}
  o.env = env
  return S.sbxlua(args, o)
end

describe("the modal provider", function()
  it("creates with cpu, memory, timeout, environment, a blocked network and its tags", function()
    local sb <close> = sbx.sandbox("modal", { cpu = 2, memory_mb = 1024, timeout_secs = 120, allow_internet = false,
                                              env_vars = { GREETING = "hi" }, labels = { team = "infra" } })
    local req = last("SandboxCreateV2").request
    local d = req.definition
    assert.equal(1000, d.resources.milliCpu)            -- 2 vCPU = 1 physical core
    assert.equal(1024, d.resources.memoryMb)
    assert.equal(120, d.timeoutSecs)
    assert.equal("/workspace", d.workdir)
    assert.equal("BLOCKED", d.networkAccess.networkAccessType)
    local tags = {}
    for _, t in ipairs(req.tags) do tags[t.tagName] = t.tagValue end
    assert.equal(sb.id, tags["sbxlua.id"])
    assert.equal("infra", tags.team)
    assert.equal("120", tags["sbxlua.ttl"])
    assert.is_string(tags["sbxlua.session"])
    assert.is_string(tags["sbxlua.host"])
    local env = {}
    for _, src in ipairs(req.secretSources or {}) do
      for k, v in pairs(src.env and src.env.contents or {}) do env[k] = v end
    end
    assert.equal("hi", env.GREETING)
    -- the network really is off in there (the stand-in: a network namespace of its own)
    assert.equal("lo\n", sb:execute_command("sh", { "-c", IFACES }).stdout)
  end)

  it("leaves the network on by default", function()
    local sb <close> = sbx.sandbox("modal")
    assert.equal("OPEN", last("SandboxCreateV2").request.definition.networkAccess.networkAccessType)
    assert.is_not.equal("lo\n", sb:execute_command("sh", { "-c", IFACES }).stdout)
  end)

  it("runs every command through one Exec of sbx-agent serve", function()
    local sb <close> = sbx.sandbox("modal")
    local before = #M.calls_of("TaskExecStart")
    for i = 1, 5 do assert.equal(i .. "\n", sb:execute_command("echo", { tostring(i) }).stdout) end
    sb:write_file("a.txt", "x")
    assert.equal("x", sb:read_file("a.txt"))
    local execs = M.calls_of("TaskExecStart")
    -- the first use installs the agent (a test, then sh reading it from stdin) and starts it
    assert.equal(before + 3, #execs)
    assert.matches("^/%.sbx/bin/sbx%-agent%-%x+$", execs[#execs].request.commandArgs[1])
    assert.equal("serve", execs[#execs].request.commandArgs[2])
  end)

  it("reports a command past its timeout as timed_out, its tree killed", function()
    local sb <close> = sbx.sandbox("modal")
    local r = sb:execute_command("sh", { "-c", "sleep 60 & sleep 60" }, { timeout = 1 })
    assert.is_true(r.timed_out)
    assert.equal("", sb:execute_command("sh", { "-c", "pgrep -x sleep || true" }).stdout)
  end)

  it("snapshots the filesystem into an image a new sandbox starts from", function()
    local sb <close> = sbx.sandbox("modal")
    sb:write_file("kept/state.txt", "from the first sandbox")
    local snap = sb:snapshot()
    assert.matches("^im%-", snap.snapshot_id)
    local again <close> = sbx.sandbox("modal", { snapshot_id = snap.snapshot_id })
    assert.equal("from the first sandbox", again:read_file("kept/state.txt"))
    assert.equal(snap.snapshot_id, last("SandboxCreateV2").request.definition.imageId)
  end)

  it("lists what this host owns by its tags, and reaps by tags without a journal's state", function()
    local p = require("sbx.providers").get("modal")
    local sb = sbx.sandbox("modal")
    local mine
    for _, e in ipairs(p.list_owned()) do if e.id == sb.id then mine = e end end
    assert.is_table(mine)
    assert.is_string(mine.session)
    assert.is_string(mine.lock)
    local tags = last("SandboxListV2").request.tags
    assert.equal("sbxlua.host", tags[1].tagName)
    p.reap({ id = sb.id, session = mine.session })
    for _, e in ipairs(p.list_owned()) do assert.is_not.equal(sb.id, e.id) end
    assert.is_false(sb:is_alive())
    sb:destroy()                                    -- gone already: still fine
  end)

  it("gc terminates what a SIGKILLed sbxlua left on Modal", function()
    local p = sbxlua({ "-e", "local sb = sbx.sandbox('modal'); print(sb.id); io.stdout:flush(); "
                             .. "require('sbx.loop').sleep(600)" }, nil, { stream = true })
    local id = S.expect_output(p, "sbx%-%x+\n"):match("(sbx%-%x+)")
    p:kill(9)
    p:wait()
    p:close()
    local owned = require("sbx.providers").get("modal").list_owned()
    local found
    for _, e in ipairs(owned) do if e.id == id then found = e end end
    assert.is_table(found, "the killed process's sandbox is listed")
    local r = sbxlua({ "gc" })
    assert.equal(0, r.exit_code, r.stdout .. r.stderr)
    for _, e in ipairs(require("sbx.providers").get("modal").list_owned()) do assert.is_not.equal(id, e.id) end
  end)

  it("refuses credentials the API refuses, with a clear error", function()
    local r = sbxlua({ "-e", "sbx.sandbox('modal')" }, { "MODAL_TOKEN_SECRET=wrong" })
    assert.is_not.equal(0, r.exit_code)
    assert.matches("SandboxCreationError", r.stderr)
    assert.matches("Token ID/Secret are invalid", r.stderr)
    assert.equal("Unauthenticated", last("AuthTokenGet").code)
  end)

  it("is a route: a request for gvisor isolation lands on modal", function()
    local sb <close> = sbx.sandbox{ isolation = "gvisor", needs = { "snapshot" } }
    assert.equal("modal", sb.backend)
    assert.equal("routed\n", sb:execute_command("echo", { "routed" }).stdout)
  end)

  it("asked the stand-in for no RPC it lacks (docs/modal.md lists the ones it has)", function()
    assert.is_true(#M.calls() > 0)
    for _, c in ipairs(M.calls()) do assert.is_not.equal("Unimplemented", c.code, c.method) end
  end)

  it("says what to do when the bridge is not built", function()
    local dir = S.tmpdir("modal-nobridge")
    local f = assert(io.open(dir .. "/sbx.yaml", "w"))
    f:write("providers:\n  modal:\n    bridge: ", dir, "/no-such-bridge\n")
    f:close()
    local r = sbxlua({ "--config", dir .. "/sbx.yaml", "providers" })
    assert.matches("modal: build the bridge", r.stdout .. r.stderr)
    r = sbxlua({ "--config", dir .. "/sbx.yaml", "doctor" })
    assert.matches("modal: build the bridge", r.stdout .. r.stderr)
    r = sbxlua({ "--config", dir .. "/sbx.yaml", "-e", "sbx.sandbox('modal')" })
    assert.matches("BackendNotInstalledError", r.stderr)
    assert.matches("modal: build the bridge", r.stderr)
    require("sbx.fs").rmtree(dir)
  end)
end)
