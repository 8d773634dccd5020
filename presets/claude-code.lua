-- Claude Code (@anthropic-ai/claude-code). Images: images/claude-code.
return {
  name = "claude-code",
  description = "Sandbox with Claude Code (@anthropic-ai/claude-code) installed",
  image = "sbxlua/claude-code:1",
  setup_commands = { "npm install -g @anthropic-ai/claude-code" },
  memory_mb = 2048,
  timeout_secs = 1800,
  -- non-interactive: -p prints the answer and exits; the prompt comes on
  -- stdin so that large prompts never go through argv
  agent = { kind = "inside", command = { "claude", "-p", "--dangerously-skip-permissions" },
            input_mode = "stdin" },
}
