-- The ray provider on a real cluster (spec/support/ray.sh: a head, node b
-- labelled sbx.node=b, token auth on): placement by label, capacity
-- refused at once, a wrong token, SIGKILL of sbxlua then gc (which spares
-- a live session of another state directory), and a node
-- whose raylet is killed mid-command.
local sbx = require "sbx"
local loop = require "sbx.loop"
local proc = require "sbx.proc"
local S = require "spec.support"
local R = require "spec.support.ray"

local env = R.gate("ray provider")
if not env then return end
teardown(R.release)

local HOST = require("sbx.state.owner").hostname()
local BOX = env.SBX_RAY_TMP .. "/sbxlua-ray-" .. S.host("id -u"):gsub("%s+", "")

local function sid(id) return "sbxlua-" .. HOST .. "-" .. id end
local function job(id) return (R.api("GET", "/api/jobs/" .. sid(id))) end
local function exists(path) return S.host("test -e " .. S.shq(path) .. " && echo yes"):find("yes") ~= nil end

describe("ray provider", function()
  it("pins a sandbox to node b by label (the job's driver_node_id)", function()
    local b = assert(R.node("b"), "node b is not alive")
    local sb <close> = sbx.sandbox("ray", { backend_options = { label_selector = { ["sbx.node"] = "b" } } })
    assert.equal("on b\n", sb:execute_command("echo on b").stdout)
    assert.equal(b.node_id, job(sb.id).driver_node_id)
    local head = assert(R.node("head"))
    local sh <close> = sbx.sandbox("ray", { backend_options = { label_selector = { ["sbx.node"] = "head" } } })
    assert.equal(head.node_id, job(sh.id).driver_node_id)
  end)

  it("reports the cluster's capacity and its nodes' labels as regions; a region pins", function()
    local d = require("sbx.providers").describe().ray
    assert.is_true(d.available, tostring(d.reason))
    assert.is_true(d.capacity.nodes >= 2, "nodes " .. tostring(d.capacity.nodes))
    assert.is_true(d.capacity.cpus >= 3, "cpus " .. tostring(d.capacity.cpus))
    assert.is_number(d.capacity.cpus_free)
    assert.is_true(d.capacity.memory_mb > 0)
    local has = {}
    for _, r in ipairs(d.regions) do has[r] = true end
    assert.is_true(has["sbx.node=b"] and has["sbx.node=head"], table.concat(d.regions, ", "))
    local sb <close> = sbx.sandbox("ray", { region = "sbx.node=b" })
    assert.equal(R.node("b").node_id, job(sb.id).driver_node_id)
  end)

  it("a sandbox resumed in another process: files shared, and destroy leaves no job of either", function()
    local sb = sbx.sandbox("ray")
    sb:write_file("kept.txt", "still here")
    local json = sbx.json.encode(sb:session_state())
    local out = S.host(S.BIN .. " -e " .. S.shq("local sb = sbx.resume(sbx.json.decode(arg[1])); "
      .. "io.write(sb:read_file('kept.txt'))") .. " " .. S.shq(json))
    assert.equal("still here", out)
    assert.equal(2, #R.jobs(sid(sb.id)), "the sandbox's job and the other process's")
    sb:destroy()
    require("sbx.providers").get("ray").forget_session()
    local left = R.jobs(sid(sb.id))
    assert.equal(0, #left, #left > 0 and (left[1].submission_id .. " " .. left[1].status .. " " .. tostring(left[1].message)) or "")
  end)

  -- this session's jobs: other specs on the cluster submit theirs meanwhile
  local function my_jobs()
    local n, me = 0, require("sbx.state.owner").session_id()
    for _, j in ipairs(R.jobs("sbxlua-" .. HOST .. "-")) do
      if me and type(j.metadata) == "table" and j.metadata["sbxlua.session"] == me then n = n + 1 end
    end
    return n
  end

  it("refuses at once a request no node can satisfy, submitting nothing", function()
    local probe <close> = sbx.sandbox("ray")     -- this session exists, and my_jobs() sees its job
    local before = my_jobs()
    assert.equal(1, before)
    local t0 = loop.now()
    local kind, err = S.kind_of(function() sbx.sandbox("ray", { cpu = 64 }) end)
    assert.equal("SandboxCreationError", kind)
    assert.matches("no node can take 64 CPU", err.message)
    kind, err = S.kind_of(function() sbx.sandbox("ray", { memory_mb = 1e9 }) end)
    assert.equal("SandboxCreationError", kind)
    kind = S.kind_of(function()
      sbx.sandbox("ray", { backend_options = { label_selector = { ["sbx.node"] = "nowhere" } } })
    end)
    assert.equal("SandboxCreationError", kind)
    assert.is_true(loop.now() - t0 < 10, "took " .. (loop.now() - t0) .. " s")
    assert.equal(before, my_jobs())
  end)

  it("a wrong or missing token is AuthenticationError", function()
    proc.setenv("RAY_AUTH_TOKEN", "not-the-token")
    local ok, kind, err = pcall(S.kind_of, function() sbx.sandbox("ray") end)
    proc.setenv("RAY_AUTH_TOKEN", nil)
    local kind2, err2 = S.kind_of(function() sbx.sandbox("ray") end)
    proc.setenv("RAY_AUTH_TOKEN", env.token)
    assert.is_true(ok, tostring(kind))
    assert.equal("AuthenticationError", kind, tostring(err))
    assert.matches("403", err.message)
    assert.equal("AuthenticationError", kind2, tostring(err2))
    assert.matches("401", err2.message)
  end)

  it("SIGKILL of sbxlua, then sbxlua gc, leaves no job, process or directory", function()
    local tag = S.tag("sbxray")
    local state = S.tmpdir("sbxray-state")
    local vars = { S.PATH, "SBX_STATE_DIR=" .. state, "SBX_RAY_ADDRESS=" .. env.SBX_RAY_ADDRESS,
                   "RAY_AUTH_TOKEN=" .. env.token }
    local p = S.sbxlua({ "-e", [[
      local sb = sbx.sandbox("ray")
      sb:spawn("bash", { "-c", "setsid bash -c 'exec -a ]] .. tag .. [[ sleep 300' </dev/null >/dev/null 2>&1 & exec -a ]]
                               .. tag .. [[ sleep 300" })
      assert(sb:execute_command("echo ok").stdout == "ok\n")
      io.write("id ", sb.id, "\n") io.stdout:flush()
      sbx.sleep(600)
    ]] }, { env = vars, stream = true })
    local id = S.expect_output(p, "id sbx%-%x+\n"):match("id (sbx%-%x+)")
    assert.is_true(S.alive(tag), "the sandbox's processes run")
    assert.is_true(exists(BOX .. "/" .. id))
    p:kill(9)
    p:wait()
    p:close()
    -- a live session of another state directory (this spec's) keeps its job
    local other <close> = sbx.sandbox("ray")
    local r = S.sbxlua({ "gc" }, { env = vars, timeout = 120 })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("destroyed 1 sandbox", r.stdout)
    assert.equal("RUNNING", (job(other.id) or {}).status)
    assert.equal("still\n", other:execute_command("echo still").stdout)
    assert.is_nil(job(id), "the job is gone")
    assert.equal(0, #R.jobs(sid(id)))
    assert.is_false(S.alive(tag), "no process of the sandbox is left")
    assert.is_false(exists(BOX .. "/" .. id), "its directory on the node is gone")
    S.host("rm -rf " .. S.shq(state))
  end)

  it("a node whose raylet dies mid-command gives a typed error, and leaves nothing once destroyed", function()
    local out, status = R.script("add-node c")
    assert.equal(0, status, out)
    local ok, err = pcall(function()
      local tag = S.tag("sbxray")
      local sb = sbx.sandbox("ray", { backend_options = { num_cpus = 0, resources = { node_c = 1 } } })
      assert.equal((R.node("c") or {}).node_id, job(sb.id).driver_node_id)
      local p = sb:spawn("bash", { "-c", "exec -a " .. tag .. " sleep 300" })
      assert.is_true(S.alive(tag))
      local killed = R.script("kill-node c")
      assert.matches("%d+", killed)
      local kind, e = S.kind_of(function() p:wait() end)
      assert.is_true(kind == "SandboxConnectionError" or kind == "SandboxNotFoundError", tostring(e))
      -- the next call says the node died once Ray knows
      local k2
      for _ = 1, 60 do
        k2 = S.kind_of(function() sb:execute_command("true") end)
        if k2 == "SandboxNotFoundError" then break end
        loop.sleep(1)
      end
      assert.equal("SandboxNotFoundError", k2)
      assert.is_false(sb:is_alive())
      sb:destroy()
      assert.is_false(S.alive(tag), "no process of the sandbox is left")
      -- its bootstrap was killed with the node: the next sandbox on the
      -- machine removes the directory it left
      local nxt <close> = sbx.sandbox("ray")
      nxt:execute_command("true")
      assert.is_false(exists(BOX .. "/" .. sb.id), "its directory on the node is gone")
      require("sbx.providers").get("ray").forget_session()
      assert.is_nil(job(sb.id), "the job is gone")
    end)
    -- node c's other processes (its dashboard agent, ...) go too
    local pids = R.script("pids c")
    if pids:find("%d") then S.host("kill -9 " .. pids:gsub("%s+", " ")) end
    assert(ok, err)
  end)
end)
