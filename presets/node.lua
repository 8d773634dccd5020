return {
  name = "node",
  description = "Node.js with npm",
  image = "node:20-slim",
  setup_commands = { "node --version" },
  memory_mb = 1024,
}
