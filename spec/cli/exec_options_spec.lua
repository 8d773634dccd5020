-- sbxlua exec's options beyond the basics (API.md, "Running"): -i streams
-- sbxlua's stdin to the command, --no-internet/--cpu/--memory-mb reach the
-- sandbox, --env K takes the value from sbxlua's environment, --json prints
-- the result, and streamed output is never reported as dropped.
local S = require "spec.support"
local json = require "cjson"
local docker = require "sbx.providers.builtin.docker"
local providers = require "sbx.providers"

local T = S.user("exec-options")

local function start(args, env) return T.start(args, { env = env, timeout = 120 }) end
local expect = S.expect_output

describe("sbxlua exec options", function()
  teardown(T.cleanup)

  it("-i passes stdin to the command: echo x | sbxlua exec -i -- cat", function()
    local r = T.run({ "exec", "-i", "--", "cat" }, { stdin = "x\n" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("x\n", r.stdout)
    r = T.run({ "exec", "--interactive", "--", "wc", "-c" }, { stdin = string.rep("y", 300000) })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("300000", r.stdout:match("%d+"))
    -- without -i the command's stdin is closed, as before
    r = T.run({ "exec", "--", "cat" }, { stdin = "not passed\n" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("", r.stdout)
  end)

  it("-i streams: each line reaches the command while stdin is still open", function()
    local p = start({ "exec", "-i", "--", "sh", "-c", "while read l; do echo \"got $l\"; done" })
    for i = 1, 3 do
      p:write("line" .. i .. "\n")
      expect(p, "got line" .. i .. "\n")
    end
    p:close_stdin()
    local r = p:wait()
    assert.equal(0, r.exit_code)
    p:close()
  end)

  it("-i: SIGINT destroys the sandbox and leaves no reader of sbxlua's stdin behind", function()
    local p = start({ "exec", "-i", "--", "sh", "-c", "echo started; sleep 60" })
    expect(p, "started\n")
    local pattern = "[c]at /proc/" .. p.pid .. "/fd/0"   -- [c]: not this pgrep's own shell
    local function readers()
      local f = io.popen("pgrep -f '" .. pattern .. "' || true")
      local out = f:read("a")
      f:close()
      return out
    end
    -- the reader runs while the command does; a spawner thread may still be
    -- starting its cat when the command's first line is out
    local seen = readers()
    for _ = 1, 50 do
      if seen ~= "" then break end
      os.execute("sleep 0.1")
      seen = readers()
    end
    assert.not_equal("", seen)
    os.execute("kill -INT " .. p.pid)        -- sbxlua only, as a terminal's Ctrl-C would not spare it
    local r = p:wait()
    assert.equal(130, r.exit_code)
    assert.equal("", readers())
    p:close()
  end)

  it("-i on bwrap and docker", function()
    for _, b in ipairs{ "bwrap", "docker" } do
      local ok = providers.get(b).available()
      if ok and (b ~= "docker" or docker.has_image(S.IMAGE)) then
        local args = { "exec", "-i", "--backend", b }
        if b == "docker" then args[#args + 1] = "--image"; args[#args + 1] = S.IMAGE end
        for _, a in ipairs{ "--", "wc", "-l" } do args[#args + 1] = a end
        local r = T.run(args, { stdin = "a\nb\nc\n" })
        assert.equal(0, r.exit_code, b .. ": " .. r.stderr)
        assert.equal("3", r.stdout:match("%d+"), b)
      end
    end
  end)

  it("streams 30 MB to stdout without saying output was dropped", function()
    local r = T.run({ "exec", "--", "sh", "-c", "head -c 30000000 /dev/zero" }, { max_output = 64 << 20 })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal(30000000, #r.stdout)
    assert.equal("", r.stderr)
  end)

  it("--env K takes K's value from sbxlua's environment; K=V as before; an unset K is a usage error", function()
    local r = T.run({ "exec", "--env", "SECRET_TOKEN", "--env", "B=2", "--", "sh", "-c", "echo $SECRET_TOKEN $B" },
                    { env = { SECRET_TOKEN = "s3cr3t" } })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("s3cr3t 2\n", r.stdout)
    r = T.run({ "exec", "--env", "NOT_SET_ANYWHERE", "--", "true" })
    assert.equal(2, r.exit_code)
    assert.matches("NOT_SET_ANYWHERE is not set in sbxlua's environment", r.stderr)
  end)

  it("--json prints the result table with the command's status", function()
    local r = T.run({ "exec", "--json", "--", "sh", "-c", "echo out; echo err >&2; exit 3" })
    assert.equal(3, r.exit_code, r.stderr)
    local d = json.decode(r.stdout)
    assert.equal("out\n", d.stdout)
    assert.equal("err\n", d.stderr)
    assert.equal(3, d.exit_code)
    assert.is_false(d.timed_out)
    assert.equal("local", d.backend)
  end)

  it("--no-internet, --cpu and --memory-mb reach the sandbox (bwrap), and routing honours them", function()
    if not providers.get("bwrap").available() then return pending("bwrap unavailable") end
    local r = T.run({ "exec", "--backend", "bwrap", "--no-internet", "--", "sh", "-c",
                      "grep -c : /proc/net/dev" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("1", r.stdout:match("%d+"))   -- lo only
    -- local cannot enforce any of them: a pinned create says so
    for _, flag in ipairs{ { "--no-internet" }, { "--cpu", "1" }, { "--memory-mb", "256" } } do
      local args = { "exec", "--backend", "local" }
      for _, a in ipairs(flag) do args[#args + 1] = a end
      args[#args + 1] = "--"
      args[#args + 1] = "true"
      r = T.run(args)
      assert.equal(1, r.exit_code, table.concat(flag, " "))
      assert.matches("FeatureNotSupportedError", r.stderr)
      assert.is_true(S.one_line(r), r.stderr)
    end
    -- routed, local is skipped for them
    r = T.run({ "exec", "--no-internet", "--memory-mb", "256", "--cpu", "1", "--json", "--", "true" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.not_equal("local", json.decode(r.stdout).backend)
  end)

  it("--memory-mb and --cpu on docker", function()
    if not docker.available() or not docker.has_image(S.IMAGE) then return pending("docker or its image unavailable") end
    local r = T.run({ "exec", "--backend", "docker", "--image", S.IMAGE, "--memory-mb", "256", "--cpu", "0.5",
                      "--", "sh", "-c", "cat /sys/fs/cgroup/memory.max 2>/dev/null || "
                                        .. "cat /sys/fs/cgroup/memory/memory.limit_in_bytes" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal(tostring(256 << 20), r.stdout:match("%d+"))
  end)
end)
