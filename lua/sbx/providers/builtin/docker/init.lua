--- The `docker` backend: containers on a Docker engine, spoken to through
--- the Engine API (no docker CLI). Every container gets sbx-agent (from a
--- read-only volume filled once per engine and agent build) as its first
--- process and as the supervisor of each command, which gives exec what the
--- Engine API lacks: timeouts that kill the whole tree, a reported timeout
--- distinct from exit 124, and commands that end when they exit even if a
--- daemon they started keeps their output open.
---
--- This file is the provider's facade: its operations, each from the part
--- that implements it. Reads and writes of anything else (descriptor,
--- config_schema, exec_mode, SERVE, VOLUME_PREFIX, fallback, ...) go to
--- common.lua, which every part reads.
---
---   common.lua       descriptor, config schema, constants, knobs, raise helper
---   engine.lua       the Engine API client (endpoint, calls, retries, errors, hijack)
---   volume.lua       the agent volume (fill, check, prune of other builds')
---   lifecycle.lua    availability, doctor, create, resume, destroy, snapshot, gc
---   link.lua         the agent link per container, spawn
---   engine_exec.lua  the engine-exec fallback (a process handle per exec)
---   files.lua        files and trees (link, or archive endpoint and agent commands)
local common = require "sbx.providers.builtin.docker.common"
local lifecycle = require "sbx.providers.builtin.docker.lifecycle"
local volume = require "sbx.providers.builtin.docker.volume"
local link = require "sbx.providers.builtin.docker.link"
local engine_exec = require "sbx.providers.builtin.docker.engine_exec"
local files = require "sbx.providers.builtin.docker.files"

local M = {
  available = lifecycle.available, home = lifecycle.home, default_image = common.default_image,
  has_image = lifecycle.has_image, doctor = lifecycle.doctor,
  create = lifecycle.create, session_state = lifecycle.session_state, resume = lifecycle.resume,
  is_alive = lifecycle.is_alive, destroy = lifecycle.destroy, snapshot = lifecycle.snapshot,
  list_owned = lifecycle.list_owned, reap = lifecycle.reap, reap_snapshots = lifecycle.reap_snapshots,
  prune = volume.prune,
  spawn = link.spawn, link_of = link.link_of, engine_spawn = engine_exec.spawn,
  write_file = files.write_file, read_file = files.read_file, list_files = files.list_files,
  put_tree = files.put_tree, get_tree = files.get_tree, mkdir = files.mkdir, remove = files.remove,
}

return setmetatable(M, { __index = common, __newindex = common })
