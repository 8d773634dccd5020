-- The Codex CLI (@openai/codex). Images: images/codex (build with
-- images/build-presets.sh); elsewhere the CLI is installed at create.
return {
  name = "codex",
  description = "Sandbox with the Codex CLI (@openai/codex) installed",
  image = "sbxlua/codex:1",
  setup_commands = { "npm install -g @openai/codex" },
  memory_mb = 2048,
  timeout_secs = 1800,
  -- non-interactive: `codex exec` runs one task and exits, reading the
  -- prompt from stdin when none is given (so any size works); approvals and
  -- codex's own sandbox are off because sbxlua's sandbox is the boundary
  agent = { kind = "inside", command = { "codex", "exec", "--skip-git-repo-check",
                                         "--dangerously-bypass-approvals-and-sandbox" },
            input_mode = "stdin" },
}
