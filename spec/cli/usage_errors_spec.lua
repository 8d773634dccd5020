-- The command line's answers to the user's mistakes (API.md, "Running"):
-- every subcommand answers --help from the one table of options; a usage
-- error exits 2 with one line naming the problem; a failed operation exits
-- 1 with one line; names are checked (with "did you mean"); a job's own
-- error keeps its traceback.
local S = require "spec.support"
local cli_table = require "sbx.cli.table"

local T = S.user("usage-errors")

describe("sbxlua usage errors", function()
  teardown(T.cleanup)

  describe("--help", function()
    it("every subcommand answers COMMAND --help (and -h) with its own help, exit 0", function()
      for _, c in ipairs(cli_table.COMMANDS) do
        for _, flag in ipairs{ "--help", "-h" } do
          local r = T.run({ c.name, flag })
          assert.equal(0, r.exit_code, c.name .. " " .. flag .. ": " .. r.stderr)
          assert.equal("", r.stderr)
          assert.matches("^usage: sbxlua " .. c.name:gsub("%-", "%%-"), r.stdout)
          for _, o in ipairs(c.options) do
            assert.truthy(r.stdout:find("--" .. o.name, 1, true), c.name .. " --help lacks --" .. o.name)
          end
        end
      end
      local r = T.run({ "help", "exec" })
      assert.equal(0, r.exit_code)
      assert.matches("^usage: sbxlua exec", r.stdout)
    end)

    it("exec --help lists the options of API.md", function()
      local r = T.run({ "exec", "--help" })
      for _, flag in ipairs{ "--backend B", "--policy P", "--image I", "--need CAP", "--timeout S",
                             "--env K=V", "--file LOCAL:REMOTE", "--preset NAME", "-i, --interactive",
                             "--no-internet", "--cpu N", "--memory-mb N", "--json" } do
        assert.truthy(r.stdout:find(flag, 1, true), "exec --help lacks " .. flag)
      end
    end)

    it("sbxlua --help lists every command, every option of route and exec, and the environment", function()
      local r = T.run({ "--help" })
      assert.equal(0, r.exit_code)
      assert.equal(cli_table.help_text(), r.stdout)
      for _, c in ipairs(cli_table.COMMANDS) do
        assert.truthy(r.stdout:find("sbxlua " .. c.name, 1, true), c.name)
      end
      for _, name in ipairs{ "exec", "route" } do
        for _, o in ipairs(cli_table.by_name[name].options) do
          assert.truthy(r.stdout:find(cli_table.flag(o), 1, true), name .. ": " .. cli_table.flag(o))
        end
      end
      for _, v in ipairs{ "SBX_PRESET_PATH", "SBX_PROVIDER_PATH", "DOCKER_HOST", "SBX_POLICY_PATH",
                          "SBX_STATE_DIR", "SBX_CONFIG" } do
        assert.truthy(r.stdout:find(v, 1, true), v)
      end
    end)

    it("the help text is a function of the table (for a man page)", function()
      assert.matches("^usage: sbxlua route", require("sbx.cli").help_text("route"))
      local text, err = cli_table.help_text("nosuch")
      assert.is_nil(text)
      assert.matches("unknown command 'nosuch'", err)
    end)
  end)

  describe("exit 2 and one line for a usage error", function()
    local cases = {
      { { "exec", "--help-me" }, "exec: unknown option %-%-help%-me" },
      { { "exec", "--backend", "nosuch", "--", "true" }, "unknown backend 'nosuch'; known: .*local" },
      { { "exec", "--preset", "nosuch", "--", "true" }, "unknown preset 'nosuch'; known: .*codex" },
      { { "exec", "--file", "missing:/x", "--", "true" }, "%-%-file missing:/x: cannot read missing" },
      { { "exec", "--file", "nocolon", "--", "true" }, "%-%-file expects LOCAL:REMOTE" },
      { { "exec", "--policy", "nope", "--", "true" }, "unknown policy 'nope'" },
      { { "exec", "--backend", "local", "--policy", "nope", "--", "true" }, "unknown policy 'nope'" },
      { { "exec", "--timeout", "0", "--", "true" }, "%-%-timeout expects a number > 0" },
      { { "exec", "--cpu", "0", "--", "true" }, "%-%-cpu expects a number > 0" },
      { { "exec", "--memory-mb", "lots", "--", "true" }, "%-%-memory%-mb expects a number > 0, got 'lots'" },
      { { "exec", "--env", "1X=y", "--", "true" }, "%-%-env expects K=V or K" },
      { { "exec", "--json", "-i", "--", "true" }, "do not go together" },
      { { "exec" }, "no command given" },
      { { "exec", "--backend" }, "%-%-backend B needs a value" },
      { { "route", "--isolation", "vm" }, "unknown isolation 'vm'; known: container" },
      { { "route", "--cpu", "-1" }, "%-%-cpu expects a number > 0, got '%-1'" },
      { { "route", "--max-price", "-1" }, "%-%-max%-price expects a number >= 0" },
      { { "route", "--need", "snapshto" }, "unknown capability 'snapshto' %(did you mean 'snapshot'%?%)" },
      { { "route", "--only", "nosuch" }, "unknown backend 'nosuch'" },
      { { "route", "--ignore", "local,nosuch" }, "unknown backend 'nosuch'" },
      { { "route", "--backend", "local" }, "unknown option %-%-backend" },
      { { "route", "extra" }, "unexpected argument 'extra'" },
      { { "providers", "extra" }, "unexpected argument 'extra'" },
      { { "ls", "extra" }, "unexpected argument 'extra'" },
      { { "gc", "extra" }, "unexpected argument 'extra'" },
      { { "doctor", "extra" }, "unexpected argument 'extra'" },
      { { "ls", "--jsn" }, "unknown option %-%-jsn %(did you mean 'json'%?%)" },
      { { "ls", "--json=yes" }, "%-%-json takes no value" },
      { { "usage", "--since", "2026-13-45" }, "2026%-13%-45 is not a date" },
      { { "usage", "--by", "colour" }, "'by' must be provider, label or job" },
      { { "policy" }, "missing argument" },
      { { "policy", "check" }, "expected `check FILE` or `list`" },
      { { "policy", "frobnicate", "x" }, "expected `check FILE` or `list`" },
      { { "selftest", "--backend", "nosuch" }, "unknown backend 'nosuch'" },
      { { "provders" }, "unknown command 'provders' %(did you mean 'providers'%?%)" },
      { { "--bogus" }, "unknown option %-%-bogus" },
      { { "-e" }, "%-e needs an argument" },
    }
    for _, c in ipairs(cases) do
      it(table.concat(c[1], " "), function()
        local r = T.run(c[1])
        assert.equal(2, r.exit_code, r.stderr)
        assert.matches(c[2], r.stderr)
        assert.is_true(S.one_line(r), r.stderr)
        assert.matches("^sbxlua: ", r.stderr)
        assert.not_matches("^sbxlua: sbxlua", r.stderr)
      end)
    end

    it("--only and --ignore split on commas", function()
      local r = T.run({ "route", "--only", "local,bwrap", "--json" })
      assert.equal(0, r.exit_code, r.stderr)
      local d = require("cjson").decode(r.stdout)
      assert.same({ "local", "bwrap" }, d.request.only)
      r = T.run({ "route", "--ignore", "bwrap,docker", "--only", "local", "--only", "bwrap" })
      assert.equal(0, r.exit_code, r.stderr)
      assert.equal("order: local\n", r.stdout:match("^[^\n]*\n"))
    end)
  end)

  describe("a failed operation or a bad configuration: one line, no traceback", function()
    it("a bad sbx.yaml under providers is a ConfigError naming file:line, exit 2, for every command", function()
      local dir = T.dir .. "/badcfg"
      T.write("badcfg/sbx.yaml", "providers:\n  docker:\n    hots: x\n")
      for _, args in ipairs{ { "providers" }, { "route" }, { "exec", "--", "true" } } do
        local r = T.run(args, { cwd = dir })
        assert.equal(2, r.exit_code, r.stderr)
        assert.matches("sbx%.yaml:3:5: unknown key 'hots' in providers%.docker %(did you mean 'host'%?%)", r.stderr)
        assert.matches("fix %./sbx%.yaml, or name another file with %-%-config FILE", r.stderr)
        assert.is_true(S.one_line(r), r.stderr)
      end
    end)

    it("--need gpu: no route, one line with the reasons and where to look, exit 1", function()
      local r = T.run({ "exec", "--need", "gpu", "--", "true" })
      assert.equal(1, r.exit_code)
      assert.matches("^sbxlua: exec: NoRouteError: no backend can take this request; local: lacks capability 'gpu'",
                     r.stderr)
      assert.matches("sbxlua route %-%-explain", r.stderr)
      assert.is_true(S.one_line(r), r.stderr)
      r = T.run({ "route", "--need", "gpu" })
      assert.equal(1, r.exit_code)
      assert.matches("no route: no backend can take this request %(%-%-explain says why%)", r.stdout)
    end)

    it("exec -- nosuchcmd arg: 127 and one line, as docker does; a file that cannot run: 126", function()
      local r = T.run({ "exec", "--", "nosuchcmd", "arg" })
      assert.equal(127, r.exit_code, r.stderr)
      assert.matches("^sbxlua: exec: nosuchcmd: command not found in the sandbox", r.stderr)
      assert.is_true(S.one_line(r), r.stderr)
      T.write("data.txt", "not a program\n")
      r = T.run({ "exec", "--file", T.dir .. "/data.txt:data.txt", "--", "./data.txt", "x" })
      assert.equal(126, r.exit_code, r.stderr)
      assert.matches("^sbxlua: exec: %./data%.txt: cannot run it", r.stderr)
      assert.is_true(S.one_line(r), r.stderr)
    end)

    it("a job's own error keeps its traceback", function()
      local job = T.write("bad-option.lua", "local x = 1\nsbx.sandbox('local', { bogus = 1 })\n")
      local r = T.run({ job })
      assert.equal(1, r.exit_code)
      assert.matches("ConfigError: sandbox: unknown option 'bogus'", r.stderr)
      assert.matches("stack traceback", r.stderr)
      assert.matches("bad%-option%.lua:2", r.stderr)
    end)
  end)
end)
