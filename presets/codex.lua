-- The Codex CLI (@openai/codex). Images: images/codex (build with
-- images/build-presets.sh); elsewhere the CLI is installed at create.
return {
  name = "codex",
  description = "Sandbox with the Codex CLI (@openai/codex) installed",
  image = "sbxlua/codex:1",
  setup_commands = { "npm install -g @openai/codex" },
  memory_mb = 2048,
  timeout_secs = 1800,
  -- non-interactive: `codex exec` runs one task and exits; --full-auto lets
  -- it edit files and run commands inside the sandbox without asking
  agent = { kind = "inside", command = { "codex", "exec", "--full-auto", "--skip-git-repo-check" },
            input_mode = "argv" },
}
