--- What every part of the docker provider shares: its descriptor and
--- config schema, the paths and limits of a container, the knobs specs,
--- bench and doctor read or set through the facade (exec_mode, SERVE,
--- VOLUME_PREFIX, SPOOL_ABOVE, ...; the facade's metatable forwards them
--- here), the exec path in use and the raise helper.
local errors = require "sbx.core.errors"

local M = {}

M.WORKDIR = "/workspace"
M.AGENT = "/.sbx/bin/sbx-agent"
M.RUNDIR = "/.sbx/run"
-- The capabilities a container keeps (all others are dropped): enough for
-- package managers and ordinary tools running as root inside.
M.CAPS = { "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
           "NET_BIND_SERVICE" }
M.DEFAULTS = { pids = 1024 }

M.descriptor = {
  name = "docker",
  description = "containers on a Docker engine (Engine API over its socket)",
  isolation = "container",
  capabilities = { "exec", "files", "streaming", "background", "snapshot", "resume", "network" },
  options = { image = true, cpu = true, memory_mb = true, allow_internet = true,
              snapshot_id = true, backend_options = true },
  price = { per_hour = 0, per_vcpu_hour = 0, per_gib_hour = 0 },
  -- what a container gets when the request names no cpu/memory_mb: the
  -- create, the meter's ledger and the price displays all read this
  defaults = { cpu = 1, memory_mb = 2048 },
  regions = {},
  limits = {},
}

-- Its keys under providers.docker in sbx.yaml (read through config.provider).
M.config_schema = {
  host = { type = "string", help = "the engine: unix:///path or tcp://host:port (after $DOCKER_HOST)" },
  image = { type = "string", help = "the image of a create that names none (before $SBX_DOCKER_IMAGE)" },
}

-- providers.docker of the config; a broken config reads as none.
local function settings()
  local ok, c = pcall(require("sbx.core.config").provider, "docker")
  return ok and c or {}
end

---The image of a create that names none: sbx.yaml's docker.image, else
---$SBX_DOCKER_IMAGE, else python:3.12-slim.
function M.default_image()
  return settings().image or os.getenv("SBX_DOCKER_IMAGE") or "python:3.12-slim"
end

---providers.docker of the config (host, image).
M.settings = settings

M.fail = errors.raiser("docker")

-- "agent" (one sbx-agent stream per container) or "engine" (the fallback).
M.exec_mode = nil
function M.mode()
  return M.exec_mode or os.getenv("SBX_DOCKER_EXEC") or "agent"
end

-- Why the last sandbox whose agent did not start uses the engine's exec
-- (`sbxlua doctor` shows it); nil while every agent started.
M.fallback = nil
---@param why string
function M.note_fallback(why) M.fallback = why end

-- The agent's argv inside a container (nil: the agent's `serve`; specs set
-- a command that fails to exercise the fallback).
M.SERVE = nil

-- The agent reaches containers through a read-only volume filled once per
-- engine and agent build: uploading it into every container cost an extra
-- archive call (~50 ms: the engine re-executes itself to chroot for each).
M.AGENT_DIR = "/.sbx/bin"
M.VOLUME_PREFIX = "sbxlua-agent-"

M.SPOOL_ABOVE = 4 * 1024 * 1024   -- read_file: bigger files come through a spool file
M.MAX_TREE_BYTES = 1 << 36     -- a download_dir archive spooled to disk stops here (64 GiB)
M.MAX_ARCHIVE_UPLOAD = 1 << 30 -- upload_dir without the agent: one archive in memory

return M
