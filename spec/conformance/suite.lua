-- The behavioural suite every backend must pass. run.lua calls it for each
-- row of rows.lua with the backend's name, create options, the busted
-- environment and the row's traits ({ own_root = true } for backends with a
-- filesystem of their own, where absolute paths and symlinks resolve inside
-- the sandbox; host_env = "K=V " prefixes the sbxlua processes it starts,
-- e.g. with the provider path a script provider is found on):
-- suite("local", {}, require "busted"). spec/conformance/script_spec.lua
-- calls it directly for a throwaway provider script.
-- Over 400 lines: the one suite every row runs, one describe per area.
local sbx = require "sbx"
local loop = require "sbx.loop"

local S = require "spec.support"

local BIN, host, shq, kind_of = S.BIN, S.host, S.shq, S.kind_of

return function(backend, create_opts, env, traits)
  traits = traits or {}
  local BIN = (traits.host_env or "") .. BIN
  local describe, it, before_each, after_each, assert =
    env.describe, env.it, env.before_each, env.after_each, env.assert
  local function new(extra)
    local o = {}
    for k, v in pairs(create_opts or {}) do o[k] = v end
    for k, v in pairs(extra or {}) do o[k] = v end
    return sbx.sandbox(backend, o)
  end

  describe("conformance: " .. backend, function()
    local sb
    before_each(function() sb = new() end)
    after_each(function() if sb then sb:destroy() end end)

    describe("execute_code", function()
      it("prints", function()
        local r = sb:execute_code('print("hello")')
        assert.equal("hello\n", r.stdout)
        assert.equal(0, r.exit_code)
      end)
      it("computes sum(range(101))", function()
        assert.equal("5050\n", sb:execute_code("print(sum(range(101)))").stdout)
      end)
      it("runs multi-line code", function()
        local r = sb:execute_code("def f(x):\n    return x * 2\n\nfor i in range(3):\n    print(f(i))\n")
        assert.equal("0\n2\n4\n", r.stdout)
      end)
      it("reports raising code as a result, not an error", function()
        local r = sb:execute_code("raise ValueError('bad value')")
        assert.equal(1, r.exit_code)
        assert.matches("ValueError: bad value", r.stderr)
      end)
      it("runs other interpreters", function()
        assert.equal("sh works\n", sb:execute_code("echo sh works", { language = "sh" }).stdout)
        assert.equal("bash 3\n", sb:execute_code("echo bash $((1+2))", { language = "bash" }).stdout)
      end)
      it("raises SandboxExecutionError for a missing interpreter", function()
        local kind, err = kind_of(function() sb:execute_code("x", { language = "no-such-lang" }) end)
        assert.equal("SandboxExecutionError", kind)
        assert.matches("no%-such%-lang", err.message)
      end)
      it("runs large code through a file and leaves no file behind", function()
        local lines = { "total = 0" }
        for i = 1, 5000 do lines[#lines + 1] = ("total += %d  # padding to make the code large"):format(i) end
        lines[#lines + 1] = "print(total)"
        local code = table.concat(lines, "\n")
        assert.is_true(#code > 200 * 1024)
        assert.equal("12502500\n", sb:execute_code(code).stdout)
        sb:execute_code("print(1)")
        for _, e in ipairs(sb:list_files(".")) do assert.is_nil(e.name:match("^%.sbx%-code")) end
      end)
    end)

    describe("execute_command", function()
      it("exits 42", function()
        assert.equal(42, sb:execute_command("exit 42").exit_code)
      end)
      it("echoes through the shell form", function()
        assert.equal("hi there\n", sb:execute_command("echo hi there").stdout)
      end)
      it("passes argv exactly: quotes, $(), backticks, ;, newlines", function()
        local args = { "a b", "'s'", '"d"', "$(echo no)", "`echo no`", "x; echo no", "l1\nl2", "" }
        local argv = { "%s|" }
        for _, a in ipairs(args) do argv[#argv + 1] = a end
        local r = sb:execute_command("printf", argv)
        assert.equal(table.concat(args, "|") .. "|", r.stdout)
      end)
      it("closes stdin by default and feeds opts.stdin", function()
        assert.equal("", sb:execute_command("cat", {}, { timeout = 5 }).stdout)
        assert.equal("fed", sb:execute_command("cat", {}, { stdin = "fed" }).stdout)
      end)
      it("tells exit 124 from a real timeout", function()
        local r = sb:execute_command("exit 124")
        assert.equal(124, r.exit_code)
        assert.is_false(r.timed_out)
        local t0 = loop.now()
        r = sb:execute_command("sleep", { "30" }, { timeout = 0.5 })
        assert.is_true(r.timed_out)
        assert.is_nil(r.exit_code)
        assert.is_true(loop.now() - t0 < 5)
      end)
      it("a timeout kills grandchildren, setsid ones and SIGTERM-ignorers", function()
        local tag = "sbxconf" .. require("sbx.proc").random_hex(8)
        local r = sb:execute_command("bash", { "-c",
          "setsid bash -c 'exec -a " .. tag .. "a sleep 300' & (trap '' TERM; exec -a " .. tag
          .. "b sleep 300) & trap '' TERM; sleep 300" }, { timeout = 0.5 })
        assert.is_true(r.timed_out)
        loop.sleep(0.2)
        local out = host("pgrep -f '[" .. tag:sub(1, 1) .. "]" .. tag:sub(2) .. "' || true")
        assert.equal("", out)
      end)
      it("caps output per stream and says truncated", function()
        local r = sb:execute_command("head", { "-c", "5000000", "/dev/zero" }, { max_output_bytes = 4096 })
        assert.equal(4096, #r.stdout)
        assert.is_true(r.truncated)
        r = sb:execute_command("echo small")
        assert.is_false(r.truncated)
      end)
      it("streams to on_stdout/on_stderr as output arrives", function()
        local out, err, times = {}, {}, {}
        local t0 = loop.now()
        local r = sb:execute_command("sh", { "-c", "echo a; sleep 0.3; echo b >&2; echo c" }, {
          on_stdout = function(c) out[#out + 1] = c; times[#times + 1] = loop.now() - t0 end,
          on_stderr = function(c) err[#err + 1] = c end,
        })
        local total = loop.now() - t0
        assert.equal("a\nc\n", table.concat(out))
        assert.equal("b\n", table.concat(err))
        -- "a" comes out 0.3 s before the command ends, and must reach us then
        assert.is_true(times[1] < total - 0.2, "the first chunk should arrive before the sleep ends")
        assert.equal("a\nc\n", r.stdout)
      end)
      it("uses cwd and env options", function()
        sb:mkdir("sub/dir")
        local r = sb:execute_command("pwd", {}, { cwd = "sub/dir" })
        assert.matches("sub/dir\n$", r.stdout)
        r = sb:execute_command("sh", { "-c", "echo $FOO" }, { env = { FOO = "bar" } })
        assert.equal("bar\n", r.stdout)
      end)
      it("raises for a missing program and a bad cwd", function()
        assert.equal("SandboxExecutionError", kind_of(function() sb:execute_command("no-such-prog-x", {}) end))
        assert.equal("FileNotFoundError", kind_of(function() sb:execute_command("true", {}, { cwd = "nope" }) end))
        sb:write_file("afile", "x")
        assert.equal("PathError", kind_of(function() sb:execute_command("true", {}, { cwd = "afile" }) end))
        assert.equal("PathError", kind_of(function() sb:execute_command("true", {}, { cwd = "/../.." }) end))
      end)
      it("rejects bad arguments with ConfigError", function()
        assert.equal("ConfigError", kind_of(function() sb:execute_command(42) end))
        assert.equal("ConfigError", kind_of(function() sb:execute_command("echo", { {} }) end))
        assert.equal("ConfigError", kind_of(function() sb:execute_command("echo", {}, { timout = 1 }) end))
        assert.equal("ConfigError", kind_of(function() sb:execute_command("echo", {}, { env = { ["A=B"] = "x" } }) end))
        assert.equal("ConfigError", kind_of(function() sb:execute_command("echo", {}, { timeout = -1 }) end))
      end)
      it("never shows sbxlua's own environment inside (canary)", function()
        local out = host("SBX_CANARY_SECRET=canary-7731 " .. BIN .. " -e " .. shq(
          "local sb <close> = sbx.sandbox(" .. string.format("%q", backend) .. ", sbx.json.decode(arg[1]))\n"
          .. "io.write(sb:execute_command('env').stdout)\n"
          .. "io.write(sb:execute_command('cat', {'/proc/self/environ'}).stdout)") .. " "
          .. shq(sbx.json.encode(create_opts or {})))
        assert.is_nil(out:find("canary-7731", 1, true))
        assert.matches("PATH=", out)
      end)
    end)

    describe("background processes", function()
      it("write, close_stdin, wait", function()
        local p = sb:spawn("cat", {})
        assert.is_true(math.type(p.pid) == "integer")
        p:write("one ")
        p:write("two")
        p:close_stdin()
        local r = p:wait()
        assert.equal("one two", r.stdout)
        assert.equal(0, r.exit_code)
      end)
      it("streams and can be killed", function()
        local chunks = {}
        local p = sb:spawn("sh", { "-c", "echo ready; sleep 300" },
                           { on_stdout = function(c) chunks[#chunks + 1] = c end })
        loop.sleep(0.3)
        p:kill("SIGKILL")
        local r = p:wait()
        assert.equal("SIGKILL", r.signal)
        assert.equal("ready\n", table.concat(chunks))
      end)
      it("wait(timeout) kills the tree and says timed_out", function()
        local p = sb:spawn("sleep", { "300" })
        local r = p:wait(0.2)
        assert.is_true(r.timed_out)
      end)
    end)

    describe("files", function()
      it("roundtrips through the API", function()
        sb:write_file("/data/in.txt", "42")
        assert.equal("42", sb:read_file("/data/in.txt"))
        sb:write_file("rel/in.txt", "43")
        assert.equal("43", sb:read_file("rel/in.txt"))
        if traits.own_root then
          assert.equal("43", sb:read_file(sb.workdir .. "/rel/in.txt"))
        else   -- local: the file API's "/" is the sandbox directory
          assert.equal("42", sb:read_file("data/in.txt"))
        end
      end)
      it("API write, then cat", function()
        sb:write_file("note.txt", "from the api")
        assert.equal("from the api", sb:execute_command("cat", { "note.txt" }).stdout)
      end)
      it("code writes, then the API reads", function()
        sb:execute_code("open('made.txt', 'w').write('by code')")
        assert.equal("by code", sb:read_file("made.txt"))
      end)
      it("is binary-safe and handles files over 128 KiB", function()
        local bytes = {}
        for i = 0, 255 do bytes[#bytes + 1] = string.char(i) end
        local blob = string.rep(table.concat(bytes), 1024)  -- 256 KiB, every byte value
        sb:write_file("bin/blob", blob)
        assert.equal(blob, sb:read_file("bin/blob"))
        assert.equal(tostring(#blob) .. "\n", sb:execute_command("sh", { "-c", "wc -c < bin/blob" }).stdout)
      end)
      it("lists files sorted, with sizes and types", function()
        sb:write_file("d/b.txt", "bb")
        sb:write_file("d/a.txt", "a")
        sb:mkdir("d/sub")
        local list = sb:list_files("d")
        assert.equal(3, #list)
        assert.same({ "a.txt", "b.txt", "sub" }, { list[1].name, list[2].name, list[3].name })
        assert.equal(1, list[1].size)
        assert.equal(2, list[2].size)
        assert.is_false(list[1].is_dir)
        assert.is_true(list[3].is_dir)
        -- absolute in the sandbox (local: under its root "/"), whatever the input's form
        local base = traits.own_root and sb.workdir or ""
        assert.equal(base .. "/d/a.txt", list[1].path)
        for _, form in ipairs{ "d/", "./d", "d/../d", base .. "/d" } do
          assert.equal(base .. "/d/sub", sb:list_files(form)[3].path, form)
        end
        assert.is_true(math.type(list[1].mtime) == "integer")
      end)
      it("removes files and trees, and makes directories", function()
        sb:mkdir("x/y/z")
        sb:mkdir("x/y/z")
        sb:write_file("x/y/z/f", "1")
        assert.equal("PathError", kind_of(function() sb:remove("x") end))
        sb:remove("x", { recursive = true })
        assert.equal("FileNotFoundError", kind_of(function() sb:read_file("x/y/z/f") end))
      end)
      it("rejects paths that climb above the sandbox's root with PathError", function()
        assert.equal("PathError", kind_of(function() sb:read_file("/../../../etc/passwd") end))
        assert.equal("PathError", kind_of(function() sb:write_file("/a/../../x", "no") end))
        assert.equal("PathError", kind_of(function() sb:list_files("/..") end))
        assert.equal("PathError", kind_of(function() sb:remove("/../tmp", { recursive = true }) end))
      end)
      if traits.own_root then
        it("resolves absolute paths and symlinks inside its own filesystem, never the host's", function()
          local canary = "/tmp/sbx-host-canary-" .. require("sbx.proc").random_hex(8)
          local f = io.open(canary, "w") f:write("host secret") f:close()
          assert.equal("FileNotFoundError", kind_of(function() sb:read_file(canary) end))
          sb:execute_command("ln", { "-s", "/tmp", "tmplink" })
          assert.equal("FileNotFoundError", kind_of(function() sb:read_file("tmplink/" .. canary:match("[^/]+$")) end))
          sb:execute_command("ln", { "-s", "/etc", "evil" })
          assert.matches("root:", sb:read_file("evil/passwd"))
          os.remove(canary)
        end)
      else
        it("rejects .. and symlink escapes with PathError", function()
          assert.equal("PathError", kind_of(function() sb:read_file("../../../etc/passwd") end))
          assert.equal("PathError", kind_of(function() sb:write_file("a/../../x", "no") end))
          sb:execute_command("ln", { "-s", "/etc", "evil" })
          assert.equal("PathError", kind_of(function() sb:read_file("evil/passwd") end))
          assert.equal("PathError", kind_of(function() sb:write_file("evil/owned", "no") end))
          sb:execute_command("ln", { "-s", "../../../../../../..", "up" })
          assert.equal("PathError", kind_of(function() sb:list_files("up") end))
        end)
      end
      it("raises FileNotFoundError for missing files", function()
        assert.equal("FileNotFoundError", kind_of(function() sb:read_file("nope.txt") end))
        assert.equal("FileNotFoundError", kind_of(function() sb:list_files("nope") end))
      end)
      it("uploads and downloads host files", function()
        local tmp = os.tmpname()
        local f = io.open(tmp, "wb") f:write("up\0load") f:close()
        sb:upload_file(tmp, "up.bin")
        assert.equal("up\0load", sb:read_file("up.bin"))
        sb:download_file("up.bin", tmp .. ".down")
        local g = io.open(tmp .. ".down", "rb")
        assert.equal("up\0load", g:read("a"))
        g:close()
        os.remove(tmp) os.remove(tmp .. ".down")
      end)
    end)

    describe("directory transfer", function()
      local function host_tree()
        local dir = os.tmpname()
        os.remove(dir)
        assert(os.execute(table.concat({
          "mkdir -p " .. dir .. "/src/sub", "printf 'print(1)\\n' > " .. dir .. "/src/run.py",
          "chmod 755 " .. dir .. "/src/run.py", "printf 'x' > " .. dir .. "/src/sub/data.bin",
          "chmod 600 " .. dir .. "/src/sub/data.bin", "ln -s /etc/passwd " .. dir .. "/src/outlink" }, " && ")))
        return dir
      end
      it("uploads a tree with modes, without following symlinks, and downloads it back", function()
        local dir = host_tree()
        local r = sb:upload_dir(dir .. "/src", "proj")
        assert.equal(2, r.files)
        assert.same({ "outlink" }, r.skipped)
        assert.equal("1\n", sb:execute_command("python3", { "proj/run.py" }).stdout)
        local ls = sb:execute_command("sh", { "-c", "stat -c '%a %n' proj/run.py proj/sub/data.bin" }).stdout
        assert.equal("755 proj/run.py\n600 proj/sub/data.bin\n", ls)
        sb:write_file("proj/made-inside.txt", "inside")
        sb:download_dir("proj", dir .. "/back")
        local f = io.popen("cd " .. dir .. "/back && find . | sort && stat -c '%a' run.py sub/data.bin")
        local listing = f:read("a")
        f:close()
        assert.equal(".\n./made-inside.txt\n./run.py\n./sub\n./sub/data.bin\n755\n600\n", listing)
        os.execute("rm -rf " .. dir)
      end)
      it("refuses a download holding a symlink out, writing nothing", function()
        local dir = os.tmpname()
        os.remove(dir)
        sb:write_file("trap/ok.txt", "fine")
        sb:execute_command("ln", { "-s", "/etc", "trap/evil" })
        local kind = kind_of(function() sb:download_dir("trap", dir) end)
        assert.equal("PathError", kind)
        assert.is_nil(io.open(dir .. "/ok.txt"))
        os.execute("rm -rf " .. dir)
      end)
      it("reports missing directories", function()
        assert.equal("FileNotFoundError", kind_of(function() sb:upload_dir("/no/such/dir", "x") end))
        assert.equal("FileNotFoundError", kind_of(function() sb:download_dir("no-such-dir", os.tmpname()) end))
      end)
    end)

    describe("API parity", function()
      it("list_files of the working directory and of / gives absolute paths", function()
        sb:write_file("top.txt", "t")
        local base = traits.own_root and sb.workdir or ""
        local function paths_of(p)
          local out = {}
          for _, e in ipairs(sb:list_files(p)) do out[e.name] = e.path end
          return out
        end
        assert.equal(base .. "/top.txt", paths_of(".")["top.txt"])
        assert.equal(base .. "/top.txt", paths_of("")["top.txt"])
        if traits.own_root then
          assert.equal(sb.workdir, paths_of("/")[sb.workdir:match("[^/]+$")])
        else
          assert.equal("/top.txt", paths_of("/")["top.txt"])
        end
      end)

      it("upload_file keeps the mode bits: an executable stays executable", function()
        local tmp = os.tmpname()
        local f = io.open(tmp, "wb") f:write("#!/bin/sh\necho uploaded and ran\n") f:close()
        assert(os.execute("chmod 750 " .. tmp))
        sb:upload_file(tmp, "bin/run.sh")
        assert.equal("uploaded and ran\n", sb:execute_command("bin/run.sh", {}).stdout)
        assert.equal("750\n", sb:execute_command("stat", { "-c", "%a", "bin/run.sh" }).stdout)
        assert(os.execute("chmod 600 " .. tmp))
        sb:upload_file(tmp, "bin/run.sh")              -- over an existing file: its mode too
        assert.equal("600\n", sb:execute_command("stat", { "-c", "%a", "bin/run.sh" }).stdout)
        os.remove(tmp)
        assert.equal("FileNotFoundError", kind_of(function() sb:upload_file(tmp, "x") end))
      end)

      it("check = true raises CommandFailedError with the result: exit, signal, timeout", function()
        local r = sb:execute_command("echo fine", nil, { check = true })
        assert.equal("fine\n", r.stdout)
        local kind, err = kind_of(function() sb:execute_command("echo out; echo bad >&2; exit 3", nil, { check = true }) end)
        assert.equal("CommandFailedError", kind)
        assert.is_true(sbx.errors.is(err, "SandboxExecutionError"))
        assert.equal("command_failed", err.code)
        assert.equal(3, err.context.exit_code)
        assert.equal(3, err.context.result.exit_code)
        assert.equal("out\n", err.context.result.stdout)
        assert.matches("exit 3", err.message)
        assert.matches("bad", err.message)
        kind, err = kind_of(function() sb:execute_command("kill -9 $$", nil, { check = true }) end)
        assert.equal("CommandFailedError", kind)
        -- (bwrap's direct exec path reports a killed command as bwrap's exit 137)
        assert.is_true(err.context.signal == "SIGKILL" or err.context.exit_code == 137, tostring(err))
        kind, err = kind_of(function() sb:execute_command("sleep", { "30" }, { check = true, timeout = 0.3 }) end)
        assert.equal("CommandFailedError", kind)
        assert.is_true(err.context.timed_out)
        kind, err = kind_of(function() sb:execute_code("import sys; sys.exit(5)", { check = true }) end)
        assert.equal("CommandFailedError", kind)
        assert.equal(5, err.context.exit_code)
        assert.equal("ok\n", sb:execute_code("print('ok')", { check = true }).stdout)
        -- without check a failure is a result, as before
        assert.equal(3, sb:execute_command("exit 3").exit_code)
        local p = sb:spawn("exit 7", nil, { check = true })
        kind, err = kind_of(function() p:wait() end)
        assert.equal("CommandFailedError", kind)
        assert.equal(7, err.context.exit_code)
        assert.equal("ConfigError", kind_of(function() sb:execute_command("true", nil, { check = "yes" }) end))
      end)

      -- A host fixture: a git repository (tag v1 on its first commit) as a
      -- bare copy, an executable and a tree.
      local function fixture()
        local d = os.tmpname()
        os.remove(d)
        assert(os.execute(table.concat({
          "mkdir -p " .. d, "cd " .. d, "git init -q -b main src", "cd src", "git config user.email t@t",
          "git config user.name t", "echo one > f.txt", "git add f.txt", "git commit -qm one", "git tag v1",
          "echo two > f.txt", "git commit -qam two", "cd ..", "git clone -q --bare src repos/src.git",
          "git clone -q --bare src repos/other.git", "rm -rf src",
          "printf '#!/bin/sh\\necho tool\\n' > tool.sh", "chmod 755 tool.sh",
          "mkdir -p tree/sub", "echo t > tree/sub/t.txt", "chmod 600 tree/sub/t.txt" }, " && ")))
        return d
      end

      it("materializes a workspace at create, in order: dir, several repositories, file, content, custom", function()
        local d = fixture()
        local seen
        local s <close> = new{ workspace = {
          { dest = "repos", dir = d .. "/repos" },                 -- the repositories, inside first
          { dest = "a", git = "repos/src.git", ref = "v1" },
          { dest = "b", git = "repos/other.git" },
          { dest = "bin/tool.sh", file = d .. "/tool.sh" },
          { dest = "tree", dir = d .. "/tree" },
          { dest = "task.txt", content = "solve it" },
          { dest = "out", materialize = function(x, dest) seen = x:read_file("task.txt"); x:mkdir(dest) end },
        } }
        assert.equal("one\n", s:read_file("a/f.txt"))
        assert.equal("two\n", s:read_file("b/f.txt"))
        assert.equal("tool\n", s:execute_command("bin/tool.sh", {}).stdout)
        assert.equal("600\n", s:execute_command("stat", { "-c", "%a", "tree/sub/t.txt" }).stdout)
        assert.equal("solve it", s:read_file("task.txt"))
        assert.equal("solve it", seen)
        assert.is_true(s:list_files("out") ~= nil)
        -- depth over file:// (a plain path ignores --depth), on the live sandbox
        assert.equal(1, s:apply_workspace{
          { dest = "shallow", git = "file://" .. s:_command_path("repos/src.git"), depth = 1 } })
        assert.equal("1\n", s:execute_command("git", { "-C", "shallow", "rev-list", "--count", "HEAD" }).stdout)
        os.execute("rm -rf " .. d)
      end)

      it("a failing workspace entry raises WorkspaceError naming its dest, and destroys the sandbox", function()
        local before = #require("sbx.state.owner").owned()
        local kind, err = kind_of(function()
          new{ workspace = { { dest = "ok.txt", content = "x" }, { dest = "repo", git = "no/such/repo.git" } } }
        end)
        assert.equal("WorkspaceError", kind)
        assert.equal("repo", err.context.dest)
        assert.matches("git clone", err.message)
        assert.equal(before, #require("sbx.state.owner").owned())
        kind = kind_of(function() new{ files = { [""] = "x" } } end)
        assert.equal("ConfigError", kind)
        assert.equal(before, #require("sbx.state.owner").owned())
      end)

      it("an inside agent reads its prompt on stdin by default, and gets an openable path in file mode", function()
        local a = sb:agent(sbx.agent.inside{ name = "cat", command = { "cat" } })
        assert.equal("the prompt", a:run("the prompt").stdout)
        sb:mkdir("agentdir")
        local f = sb:agent(sbx.agent.inside{ name = "reader", cwd = "agentdir", input_mode = "file",
          command = { "sh", "-c", 'cd / && cat "$1"', "agent" } })   -- it moves away: the path still opens
        assert.equal("in a file", f:run("in a file").stdout)
        assert.equal("in a file", sb:read_file("agentdir/.sbx-prompt.txt"))
      end)
    end)

    describe("lifetime and state", function()
      it("destroy is idempotent and later calls raise SandboxNotFoundError", function()
        assert.is_true(sb:is_alive())
        sb:destroy()
        sb:destroy()
        assert.is_false(sb:is_alive())
        assert.equal("SandboxNotFoundError", kind_of(function() sb:execute_command("true") end))
        assert.equal("SandboxNotFoundError", kind_of(function() sb:read_file("x") end))
        sb = nil
      end)
      it("<close> destroys at the end of the scope", function()
        local inner
        do
          local s <close> = new()
          inner = s
          assert.is_true(s:is_alive())
        end
        assert.is_false(inner:is_alive())
      end)
      it("resumes from JSON state, in this process and in another one", function()
        sb:write_file("kept.txt", "still here")
        local json = sbx.json.encode(sb:session_state())
        local again = sbx.resume(sbx.json.decode(json))
        assert.equal("still here", again:read_file("kept.txt"))
        local out = host(BIN .. " -e " .. shq(
          "local sb = sbx.resume(sbx.json.decode(arg[1])); io.write(sb:read_file('kept.txt'))"
          .. "; sb:write_file('from-other.txt', 'hi')") .. " " .. shq(json))
        assert.equal("still here", out)
        assert.equal("hi", sb:read_file("from-other.txt"))
      end)
      it("has an id, a backend and a workdir", function()
        assert.is_string(sb.id)
        assert.equal(backend, sb.backend)
        assert.is_string(sb.workdir)
      end)
      it("runs sandboxes in parallel", function()
        local results = sbx.parallel({ 1, 2, 3, 4, 5, 6 }, function(n)
          local s <close> = new()
          return s:execute_code(("print(%d * %d)"):format(n, n)).stdout
        end, { concurrency = 3 })
        assert.same({ "1\n", "4\n", "9\n", "16\n", "25\n", "36\n" }, results)
      end)
    end)
  end)
end
