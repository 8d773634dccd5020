-- Claude Code and the Codex CLI in one sandbox (as the peer's
-- claude-code-codex). Image: images/claude-code-codex (build with
-- images/build-presets.sh); elsewhere both CLIs are installed at create.
-- sb:agent() runs Claude Code; sb:agent("codex") runs Codex in the same sandbox.
return {
  name = "claude-code-codex",
  description = "Sandbox with Claude Code (@anthropic-ai/claude-code) and the Codex CLI (@openai/codex) installed",
  image = "sbxlua/claude-code-codex:1",
  setup_commands = { "npm install -g @anthropic-ai/claude-code", "npm install -g @openai/codex" },
  memory_mb = 2048,
  timeout_secs = 1800,
  agent = { kind = "inside", command = { "claude", "-p", "--dangerously-skip-permissions" },
            input_mode = "stdin" },
}
