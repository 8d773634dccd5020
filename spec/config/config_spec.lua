-- sbx.yaml: the YAML module's limits and the config's strict schema, with
-- file:line:column in every error; the lookup order; what a config changes.
local yaml = require "sbx.yaml"
local config = require "sbx.core.config"
local errors = require "sbx.core.errors"
local proc = require "sbx.proc"
local S = require "spec.support"

local H = S.home("config")
local DIR, write = H.dir, H.write

local function config_error(text, pattern)
  local ok, e = pcall(config.parse, text, "sbx.yaml")
  assert.is_false(ok, "expected a ConfigError for:\n" .. text)
  assert.is_true(errors.is(e, "ConfigError"), tostring(e))
  assert.matches(pattern, e.message)
  return e
end

describe("sbx.yaml (the module)", function()
  it("decodes the core schema and reports positions", function()
    local v, pos = yaml.decode("a: 1\nb: [x, 2.5, true, null, '7']\nc:\n  d: \"q\"\n  e: 0x1F\nf: -3\ng: 1e3\n")
    assert.equal(1, v.a)
    assert.equal("x", v.b[1])
    assert.equal(2.5, v.b[2])
    assert.equal(true, v.b[3])
    assert.equal(yaml.null, v.b[4])
    assert.equal("7", v.b[5])
    assert.equal(31, v.c.e)
    assert.equal(-3, v.f)
    assert.equal(1000.0, v.g)
    assert.same({ 3, 1 }, pos[v].keys.c)
    assert.same({ 5, 3 }, pos[v.c].keys.e)      -- a mapping value is placed at its key
    assert.same({ 2, 8 }, pos[v.b].keys[2])
    assert.is_nil((yaml.decode("")))
  end)

  local bad = {
    { "duplicate keys", "a: 1\nb: 2\na: 3\n", "^3:1: duplicate key 'a'" },
    { "tabs", "a:\n\tb: 1\n", "^2:1: .*tabs" },
    { "unknown aliases", "a: *nope\n", "unknown alias" },
    { "several documents", "--- 1\n--- 2\n", "more than one document" },
    { "unknown tags", "a: !!python/object 1\n", "unsupported tag" },
    { "complex keys", "? [a]\n: 1\n", "keys must be scalars" },
    { "malformed YAML", "a: [1, 2\n", "did not find expected" },
    { "wrong tagged scalars", "a: !!int x\n", "unsupported tag" },
    { "aliases as keys (found by the fuzzer)", "a: &a [x, y]\n*a : 1\n", "aliases cannot be mapping keys" },
  }
  for _, case in ipairs(bad) do
    it("rejects " .. case[1], function()
      local v, msg = yaml.decode(case[2])
      assert.is_nil(v)
      assert.matches(case[3], msg)
    end)
  end

  it("stops an alias bomb by alias count and by expanded size", function()
    local lines = { 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]' }
    local prev = "a"
    for i, n in ipairs{ "b", "c", "d", "e", "f", "g", "h", "i" } do
      lines[#lines + 1] = n .. ": &" .. n .. " [" .. string.rep("*" .. prev .. ",", 8) .. "*" .. prev .. "]"
      prev = n
      if i > 8 then break end
    end
    local text = table.concat(lines, "\n") .. "\n"
    local v, msg, code = yaml.decode(text)
    assert.is_nil(v)
    assert.equal("ELIMIT", code)
    assert.matches("aliases", msg)
    v, msg = yaml.decode(text, { max_aliases = 1000 })
    assert.is_nil(v)
    assert.matches("nodes", msg)
  end)

  it("stops 10k-deep nesting and oversized input without parsing it", function()
    local v, msg, code = yaml.decode(string.rep("[", 10000) .. string.rep("]", 10000))
    assert.is_nil(v)
    assert.equal("ELIMIT", code)
    assert.matches("nesting deeper than 64", msg)
    v, msg = yaml.decode(string.rep("a", 100), { max_bytes = 10 })
    assert.is_nil(v)
    assert.matches("over the limit", msg)
    local big = string.rep("k: v\n", 300000)     -- 1.5 MB, over the 1 MiB default
    v, msg, code = yaml.decode(big)
    assert.equal("ETOOBIG", code)
  end)

  it("survives garbage", function()
    local seed = 7
    for _ = 1, 300 do
      local t = {}
      for i = 1, 64 do
        seed = (seed * 1103515245 + 12345) % 2147483648
        t[i] = string.char(seed % 256)
      end
      local ok = pcall(yaml.decode, table.concat(t))
      assert.is_true(ok)
    end
  end)
end)

describe("the config schema", function()
  it("accepts API.md's example", function()
    local c = config.parse([[
default_policy: default            # name or path
policy_path: [./policies]          # searched before the built-in policies
preset_path: [./presets]
provider_path: [./providers]
state_dir: ~/.local/state/sbxlua   # journal, ledger, decision log
providers:
  local:  { enabled: true, price: { per_hour: 0 } }
  docker: { host: unix:///var/run/docker.sock, image: python:3.12-slim,
            max_concurrent: 50, max_creates_per_sec: 20,
            price: { per_vcpu_hour: 0, per_gib_hour: 0, per_hour: 0 } }
  e2b:    { api_key_env: E2B_API_KEY, max_concurrent: 20 }
]], "/etc/sbx/sbx.yaml")
    assert.equal("default", c.default_policy)
    assert.same({ "/etc/sbx/policies" }, c.policy_path)
    assert.equal(50, c.providers.docker.max_concurrent)
    assert.equal("E2B_API_KEY", c.providers.e2b.api_key_env)
    assert.equal(0, c.providers["local"].price.per_hour)
    assert.matches("/%.local/state/sbxlua$", c.state_dir)
  end)

  it("rejects unknown keys with file:line:column and a hint", function()
    local e = config_error("providers:\n  docker:\n    hots: x\n", "^sbx.yaml:3:5: unknown key 'hots' in providers.docker %(did you mean 'host'%?%)")
    assert.equal(3, e.line)
    config_error("defualt_policy: x\n", "^sbx.yaml:1:1: unknown key 'defualt_policy' .*did you mean 'default_policy'")
    config_error("providers:\n  dokcer: {}\n", "2:3: unknown provider 'dokcer'.*docker")
  end)

  it("rejects wrong types", function()
    config_error("providers:\n  docker: { max_concurrent: many }\n", "2:13: providers.docker.max_concurrent must be an integer")
    config_error("providers:\n  docker: { max_concurrent: 1.5 }\n", "must be an integer")
    config_error("providers:\n  docker: { max_concurrent: 0 }\n", "must be >= 1")
    config_error("providers:\n  e2b: { price: { per_hour: -1 } }\n", "per_hour must be >= 0")
    config_error("providers:\n  e2b: { price: { per_hour: .nan } }\n", "must be a number")
    config_error("default_policy: [a]\n", "1:1: default_policy must be a string")
    config_error("providers:\n  local: { enabled: yes }\n", "enabled must be true or false")
    config_error("policy_path: [1, 2]\n", "policy_path%[1%] must be a string")
    config_error("- a\n- b\n", "must be a mapping")
    config_error("routing: { max_attempts: 0 }\n", "max_attempts must be >= 1")
  end)

  it("never takes a secret inline, only an environment variable's name", function()
    config_error("providers:\n  e2b: { api_key: e2b_123secret }\n", "2:10: .*credentials are never written in the config.*api_key_env")
    config_error("providers:\n  e2b: { api_key_env: 'not a name' }\n", "must name an environment variable")
  end)

  it("turns YAML problems into ConfigErrors naming the file", function()
    config_error("a: 1\na: 2\n", "^sbx.yaml:2:1: duplicate key 'a'")
    config_error("providers:\n\tdocker: {}\n", "^sbx.yaml:2:1: .*tab")
    config_error(string.rep("[", 100) .. string.rep("]", 100), "nesting deeper")
  end)

  it("reads files with a size cap", function()
    local path = write("huge.yaml", "# " .. string.rep("x", config.MAX_BYTES + 10) .. "\n")
    local ok, e = pcall(config.read, path)
    assert.is_false(ok)
    assert.matches("larger than", e.message)
  end)
end)

describe("using a config", function()
  after_each(function() config.use({}) end)

  it("is found through --config/sbx.config, $SBX_CONFIG and applies prices and limits", function()
    local path = write("a.yaml", "providers:\n  e2b: { price: { per_hour: 9 } }\n  docker: { max_concurrent: 3 }\n")
    local sbx = require "sbx"
    sbx.config(path)
    local p = sbx.providers()
    assert.equal(9, p.e2b.price.per_hour)
    assert.equal(0, p.e2b.price.per_vcpu_hour)
    assert.equal("config", p.e2b.price.source)
    assert.equal(3, p.docker.limits.max_concurrent)
  end)

  it("a disabled provider is skipped with that reason", function()
    local sbx = require "sbx"
    sbx.config(write("b.yaml", "providers:\n  docker: { enabled: false }\n"))
    local r = sbx.route{ needs = { "snapshot" } }
    assert.same({}, r.order)
    assert.equal("unavailable: disabled in the config", r.reasons.docker)
  end)

  it("the CLI takes --config and reports a bad file with file:line:column", function()
    local bad = write("bad.yaml", "providers:\n  docker:\n    colour: red\n")
    local r = H.run({ "--config", bad, "route" }, { env = { PATH = "/usr/bin:/bin" }, timeout = 30 })
    assert.equal(2, r.exit_code)        -- a ConfigError is the user's to fix: a usage error
    assert.matches("bad.yaml:3:5: unknown key 'colour'", r.stderr)
    assert.not_matches("traceback", r.stderr)
    r = H.run({ "route", "--explain" }, { env = { PATH = "/usr/bin:/bin", SBX_CONFIG = bad }, timeout = 30 })
    assert.equal(2, r.exit_code)
    assert.matches("colour", r.stderr)
  end)
end)
