-- What the subcommands print (issue 17): JSON of one shape empty or not,
-- a failed policy not claimed as the one in use and warned about once,
-- policy check / usage / route --explain saying what they know, doctor
-- checking the config and the default image, selftest skipping instead of
-- failing, "nothing to do", and sbx.budget() reading without removing.
local S = require "spec.support"
local json = require "cjson"
local docker = require "sbx.providers.builtin.docker"

local T = S.user("outputs")

local function count(s, pat)
  local n = 0
  for _ in s:gmatch(pat) do n = n + 1 end
  return n
end

describe("sbxlua outputs", function()
  teardown(T.cleanup)

  describe("JSON has one shape", function()
    it("ls --json is [] when there is nothing", function()
      local r = T.run({ "ls", "--json" })
      assert.equal(0, r.exit_code, r.stderr)
      assert.equal("[]\n", r.stdout)
    end)

    it("providers --json: capabilities and regions are always lists", function()
      local r = T.run({ "providers", "--json" })
      assert.equal(0, r.exit_code, r.stderr)
      local n = 0
      for _ in pairs(json.decode(r.stdout)) do n = n + 1 end
      assert.equal(n, count(r.stdout, '"capabilities":%['))
      assert.equal(n, count(r.stdout, '"regions":%['))
      assert.equal(0, count(r.stdout, '"capabilities":{'))
      assert.equal(0, count(r.stdout, '"regions":{'))
    end)

    it("route --json: order and candidates are lists even when empty", function()
      local r = T.run({ "route", "--need", "gpu", "--json" })
      assert.equal(1, r.exit_code)
      assert.matches('"order":%[%]', r.stdout)
      assert.matches('"candidates":%[%]', r.stdout)
    end)
  end)

  describe("a policy that fails", function()
    local function check_fallback(dir, name)
      for _, args in ipairs{ { "route" }, { "route", "--explain" } } do
        local r = T.run(args, { cwd = dir })
        assert.equal(0, r.exit_code, r.stderr)
        assert.matches("policy: default %(.-%) instead of '" .. name:gsub("%p", "%%%0") .. "', which failed", r.stdout)
        assert.not_matches("policy: " .. name:gsub("%p", "%%%0"), r.stdout)
        assert.not_matches("warning", r.stdout)
        assert.equal(1, count(r.stderr, "failed: "), r.stderr)
      end
      -- a job routing three times hears about it once
      local job = T.write(name:gsub("%W", "") .. "-job.lua",
                          "for i = 1, 3 do local sb <close> = sbx.sandbox() end print('done')")
      local r = T.run({ job }, { cwd = dir })
      assert.equal(0, r.exit_code, r.stderr)
      assert.equal(1, count(r.stderr, "the default policy takes over"), r.stderr)
    end

    it("default_policy: nosuch in sbx.yaml: the header names the default, the warning is said once on stderr",
       function()
      T.write("nosuch/sbx.yaml", "default_policy: nosuch\n")
      check_fallback(T.dir .. "/nosuch", "nosuch")
    end)

    it("a broken policy file: the same", function()
      T.write("broken/sbx.yaml", "default_policy: ./mine.lua\n")
      T.write("broken/mine.lua", "return { name = 'mine', route = function( }\n")
      check_fallback(T.dir .. "/broken", "./mine.lua")
    end)

    it("policy check on a file without a name says so", function()
      local f = T.write("noname.lua", "return { route = function(req, c) return { order = c } end }\n")
      local r = T.run({ "policy", "check", f })
      assert.equal(0, r.exit_code, r.stderr)
      assert.matches("it has no `name`", r.stdout)
      assert.not_matches("'nil'", r.stdout)
    end)
  end)

  it("usage --since takes real dates only", function()
    local r = T.run({ "usage", "--since", "2026-13-45" })
    assert.equal(2, r.exit_code)
    assert.matches("2026%-13%-45 is not a date", r.stderr)
    r = T.run({ "usage", "--since", "2026-02-28", "--json" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal(os.time{ year = 2026, month = 2, day = 28, hour = 0 }, json.decode(r.stdout).since)
  end)

  it("route --explain in a fresh process says its stats are empty and where the decision log is", function()
    local r = T.run({ "route", "--explain" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("stats are this process's own and empty in a fresh `sbxlua route`", r.stdout)
    assert.matches("decisions%.jsonl", r.stdout)
  end)

  describe("doctor", function()
    it("reports a broken ./sbx.yaml and goes on with the defaults", function()
      T.write("doctorcfg/sbx.yaml", "providers: [\n")
      local r = T.run({ "doctor" }, { cwd = T.dir .. "/doctorcfg" })
      assert.equal(0, r.exit_code, r.stderr)
      assert.matches("warn  configuration: %./sbx%.yaml:%d+:%d+: ", r.stdout)
      assert.matches("fix: fix %./sbx%.yaml", r.stdout)
      assert.matches("ok    backend local: available", r.stdout)
      r = T.run({ "doctor" })
      assert.matches("ok    configuration: none %(built%-in defaults%)", r.stdout)
    end)

    it("says whether docker's default image is present locally", function()
      if not docker.available() then return pending("docker unavailable") end
      local r = T.run({ "doctor" }, { env = { SBX_DOCKER_IMAGE = "sbxlua-no-such-image:0" } })
      assert.matches("warn default image: sbxlua%-no%-such%-image:0 is not present locally", r.stdout)
      assert.matches("fix: docker pull sbxlua%-no%-such%-image:0", r.stdout)
      if docker.has_image(S.IMAGE) then
        r = T.run({ "doctor" }, { env = { SBX_DOCKER_IMAGE = S.IMAGE } })
        assert.matches("ok   default image: " .. S.IMAGE:gsub("%p", "%%%0") .. " is present locally", r.stdout)
      end
    end)
  end)

  it("selftest without the default image says skipped: pass --image, not FAIL", function()
    if not docker.available() then return pending("docker unavailable") end
    local r = T.run({ "selftest", "--backend", "docker" }, { env = { SBX_DOCKER_IMAGE = "sbxlua-no-such-image:0" } })
    assert.matches("skipped: the default image sbxlua%-no%-such%-image:0 is not present locally; pass %-%-image",
                   r.stdout)
    assert.not_matches("  FAIL  ", r.stdout)
    assert.matches("nothing was verified %(every available backend was skipped%)", r.stdout)
    assert.equal(1, r.exit_code)
    r = T.run({ "selftest", "--backend", "docker", "--json" }, { env = { SBX_DOCKER_IMAGE = "sbxlua-no-such-image:0" } })
    local d = json.decode(r.stdout)
    assert.equal(0, d.failed)
    assert.matches("pass %-%-image", d.results[1].skipped)
    assert.matches('"probes":%[%]', r.stdout)
  end)

  it("ls, gc and gc --dry-run say nothing to do when there is nothing", function()
    local r = T.run({ "ls" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal("no sandboxes: nothing to do\n", r.stdout)
    r = T.run({ "gc" }, { env = { DOCKER_HOST = "unix://" .. T.dir .. "/none.sock" } })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("^gc: nothing to do", r.stdout)
    r = T.run({ "gc", "--dry-run" }, { env = { DOCKER_HOST = "unix://" .. T.dir .. "/none.sock" } })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("^gc %-%-dry%-run: nothing to do", r.stdout)
  end)

  it("sbx.budget() returns what is left and keeps the cap; nil and false remove it", function()
    local r = T.run({ "-e", [[
      print(sbx.budget(5), sbx.budget(), sbx.budget())
      print(sbx.budget(nil), sbx.budget())
      sbx.budget(2)
      print(sbx.budget(false), sbx.budget())
      print(pcall(sbx.budget, -1))
    ]] })
    assert.equal(0, r.exit_code, r.stderr)
    local lines = {}
    for l in r.stdout:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal("5\t5\t5", lines[1])
    assert.equal("inf\tinf", lines[2])
    assert.equal("inf\tinf", lines[3])
    assert.matches("^false\t.*budget: expected dollars >= 0", lines[4])
  end)
end)
