return {
  name = "python",
  description = "Python 3 with pip",
  image = "python:3.12-slim",
  setup_commands = { "python3 --version" },
  memory_mb = 1024,
}
