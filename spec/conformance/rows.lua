-- The backends the conformance suite (suite.lua) runs on, one row each:
--   backend  the provider sbx.sandbox(backend, options) creates
--   gate     what must be available ("docker", "bwrap"; spec.support's gate:
--            a skip, or a failure when SBX_REQUIRE_DOCKER/BWRAP=1); none: always
--   mode     the backend module's exec_mode for this run ("direct", "engine")
--   options  the create options; traits: the suite's ({ own_root = true }
--            where absolute paths and symlinks resolve inside the sandbox)
--   setup    optional function(traits) -> traits, run before the suite
-- Each row has a spec file of one line, <row>_spec.lua:
--   require("spec.conformance.run")("<row>")
local S = require "spec.support"

return {
  -- always available
  ["local"] = { backend = "local" },
  -- its own root filesystem, commands through its agent
  bwrap = { backend = "bwrap", gate = "bwrap", traits = { own_root = true } },
  -- without the agent: a new bwrap (and namespaces) for every command, as for
  -- sandboxes with per-process rlimits
  bwrap_direct = { backend = "bwrap", gate = "bwrap", mode = "direct", title = "bwrap (direct)",
                   traits = { own_root = true } },
  -- a real engine through the Engine API (CI starts dockerd and builds the
  -- test image, images/test/build.sh), commands over the sbx-agent stream
  docker = { backend = "docker", gate = "docker", options = { image = S.IMAGE }, traits = { own_root = true } },
  -- the fallback path: one engine exec per command, archive calls for files
  -- a provider script: one file on a temporary SBX_PROVIDER_PATH (local's
  -- operations under another name) is all a new provider takes
  script = { backend = "wrapped", title = "a provider script", setup = function(traits)
    local fs, config = require "sbx.fs", require "sbx.config"
    local dir = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/provider-scripts-" .. require("sbx.proc").getpid()
    assert(fs.mkdir_host(dir))
    local f = assert(io.open(dir .. "/wrapped.lua", "w"))
    f:write('local p = builtin("local")\n', 'p.descriptor.name = "wrapped"\n',
            'p.descriptor.description = "the local backend, loaded as a provider script"\n', 'return p\n')
    f:close()
    -- this process finds it on the config's provider_path, the sbxlua
    -- processes the suite starts on $SBX_PROVIDER_PATH
    config.use{ provider_path = { dir } }
    traits.host_env = "SBX_PROVIDER_PATH=" .. dir .. " "
    return traits
  end },
  -- a real Ray cluster (spec/support/ray.sh: a head and a second node on this
  -- machine, token auth on): each sandbox is a Ray job whose sbx-agent, under
  -- bwrap on the node, dials back to this process
  ray = { backend = "ray", gate = "ray", title = "ray (a real cluster)", traits = { own_root = true },
          setup = function(traits)
            require "busted".teardown(require("spec.support.ray").release)
            return traits
          end },
  docker_engine = { backend = "docker", gate = "docker", mode = "engine", title = "docker (engine exec)",
                    options = { image = S.IMAGE }, traits = { own_root = true } },
}
