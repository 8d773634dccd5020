-- examples/codex_agent.lua: the Codex CLI as an agent inside a sandbox, on
-- the codex preset (image sbxlua/codex:1 from images/build-presets.sh on
-- docker; elsewhere the preset installs the CLI with npm at create).
-- Usage: OPENAI_API_KEY=... sbxlua examples/codex_agent.lua ["a task"]
local key = os.getenv("OPENAI_API_KEY")
if not key or key == "" then
  print("This example runs the Codex CLI, which needs an OpenAI API key.\n"
     .. "Set OPENAI_API_KEY and run it again; sbxlua passes it to the sandbox\n"
     .. "explicitly (env_vars), since sandboxes never inherit sbxlua's environment.")
  return
end
local task = arg[1] or "Write fizzbuzz.py for 1..15 and run it."
local sb <close> = sbx.sandbox{ preset = "codex", env_vars = { OPENAI_API_KEY = key } }
local r = sb:agent():run(task)
io.write(r.stdout, r.stderr)
print(("codex exited %s in %.1f s"):format(tostring(r.exit_code or r.signal), r.duration_ms / 1000))
for _, f in ipairs(sb:list_files(".")) do print(f.is_dir and "dir " or "file", f.name) end
