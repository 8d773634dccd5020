-- The provider contract (lua/sbx/providers/contract.lua) is the one the built-in
-- backends already keep, and the parts of the script environment that are
-- sbxlua's own code (base64) are correct.
local contract = require "sbx.providers.contract"
local config = require "sbx.core.config"

describe("the provider contract", function()
  for _, name in ipairs{ "local", "bwrap", "docker" } do
    it("is met by the built-in " .. name .. " backend", function()
      local p = require("sbx.providers.builtin." .. name)
      local probs = contract.problems(p, name)
      local lines = {}
      for i, pr in ipairs(probs) do lines[i] = pr.msg end
      assert.same({}, lines)
    end)
  end

  it("reports every problem of a provider table, not only the first", function()
    local probs = contract.problems({ descriptor = { name = "x", isolation = "vm", capabilities = {} },
                                      available = function() end, destory = function() end,
                                      probe = function() end }, "x")
    local msgs = {}
    for _, pr in ipairs(probs) do msgs[#msgs + 1] = pr.msg end
    local text = table.concat(msgs, "\n")
    assert.matches("descriptor.isolation must be one of", text, 1, true)
    for _, op in ipairs(contract.REQUIRED) do
      if op ~= "available" then assert.matches("missing operation '" .. op .. "'", text, 1, true) end
    end
    assert.matches("missing operation 'destroy' ('destory' is there: a typo?)", text, 1, true)
    assert.is_nil(text:find("probe", 1, true))      -- a helper is not a problem
  end)

  it("a ProcessHandle without its methods is refused naming the provider", function()
    local ok, err = pcall(contract.check_process, { read = function() end }, "acme.lua")
    assert.is_false(ok)
    assert.equal("SandboxExecutionError", err.kind)
    assert.matches("acme.lua: spawn() returned a process handle without write, close_stdin, wait, kill, "
                   .. "running, expire, close", err.message, 1, true)
    local proc = require("sbx.proc").spawn{ argv = { "true" } }
    assert.equal(proc, contract.check_process(proc, "local"))
    proc:wait()
    proc:close()
  end)
end)

describe("docker's own config", function()
  after_each(function() config.use{} end)
  it("is read by docker itself (host, image), with $SBX_DOCKER_IMAGE and the default after it", function()
    local docker = require "sbx.providers.builtin.docker"
    config.use{}
    local default = os.getenv("SBX_DOCKER_IMAGE") or "python:3.12-slim"
    assert.equal(default, docker.default_image())
    config.use{ providers = { docker = { image = "busybox:1" } } }
    assert.equal("busybox:1", docker.default_image())
    assert.equal("busybox:1", config.provider("docker").image)
  end)
end)

describe("base64 in the script environment", function()
  local b64 = require("sbx.providers.script").base64
  it("matches RFC 4648's vectors and round-trips every byte", function()
    local vectors = { [""] = "", f = "Zg==", fo = "Zm8=", foo = "Zm9v", foob = "Zm9vYg==",
                      fooba = "Zm9vYmE=", foobar = "Zm9vYmFy" }
    for plain, coded in pairs(vectors) do
      assert.equal(coded, b64.encode(plain))
      assert.equal(plain, b64.decode(coded))
    end
    local all = {}
    for i = 0, 255 do all[#all + 1] = string.char(i) end
    all = table.concat(all)
    for n = 0, 5 do assert.equal(all:sub(1, 250 + n), b64.decode(b64.encode(all:sub(1, 250 + n)))) end
  end)
  it("refuses what is not base64", function()
    for _, bad in ipairs{ "Zg=", "Z===", "Zm9v!A==", "Zg==Zg==" } do
      local v, err = b64.decode(bad)
      assert.is_nil(v, bad)
      assert.matches("^base64: ", err)
    end
  end)
end)
