-- examples/external_agent.lua: an agent that runs here, outside the sandbox,
-- and works on it only through the tools it was granted (shell, files,
-- patch). A real one would ask a model what to do next; this one follows a
-- fixed plan so the example runs anywhere: write a buggy program, run its
-- test, fix it with a patch, run the test again.
local sb <close> = sbx.sandbox(arg[1])

local agent = sb:agent(sbx.agent.external{
  name = "fixer",
  capabilities = { "shell", "files", "patch" },
  runner = function(ctx, prompt)
    ctx:write_file("calc.py", "def add(a, b):\n    return a - b\n")
    ctx:write_file("test_calc.py", "from calc import add\nassert add(2, 3) == 5, 'add is broken'\nprint('ok')\n")
    -- (-B: a same-size edit within one second would otherwise reuse the stale .pyc)
    local before = ctx:shell("python3", { "-B", "test_calc.py" })
    ctx:patch(table.concat({
      "--- a/calc.py", "+++ b/calc.py", "@@ -1,2 +1,2 @@", " def add(a, b):",
      "-    return a - b", "+    return a + b", "" }, "\n"))
    local after = ctx:shell("python3", { "-B", "test_calc.py" })
    return { task = prompt, before = before.exit_code, after = after.exit_code, out = after.stdout }
  end,
})

local r = agent:run("make the tests pass")
print(("%s: test exit %d before the patch, %d after (%s)"):format(r.task, r.before, r.after,
      r.out:gsub("%s+$", "")))
