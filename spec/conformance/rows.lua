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
    local fs, config = require "sbx.fs", require "sbx.core.config"
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
  -- providers/safehouse.lua through spec/support/safehouse, a stand-in for
  -- Agent Safehouse on Linux (the real one runs on macOS only); this process
  -- and the sbxlua processes the suite starts read the same config file
  safehouse = { backend = "safehouse", title = "safehouse (Linux stand-in)",
                setup = function(traits)
    local fs, config = require "sbx.fs", require "sbx.core.config"
    local dir = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/safehouse-" .. require("sbx.proc").getpid()
    assert(fs.mkdir_host(dir))
    local src = S.SOURCE:sub(1, 1) == "/" and S.SOURCE or (os.getenv("PWD") .. "/" .. S.SOURCE)
    local f = assert(io.open(dir .. "/sbx.yaml", "w"))
    f:write("providers:\n  safehouse:\n    program: ", src, "/spec/support/safehouse\n",
            "    allow_non_darwin: true\n")
    f:close()
    config.use(dir .. "/sbx.yaml")
    traits.host_env = "SBX_CONFIG=" .. dir .. "/sbx.yaml "
    return traits
  end },
  -- E2B through providers/e2b.lua, against the stand-in (spec/support/standin/
  -- e2b.lua) in a process of its own whose sandboxes run on bwrap
  e2b = { backend = "e2b", gate = "bwrap", title = "e2b (stand-in)", traits = { own_root = true },
          setup = function(traits)
    local R = require "spec.support.standin.e2b_run"
    local s = R.start{ backend = "bwrap" }
    require("busted").teardown(function() s:stop() end)
    R.use(s)
    traits.host_env = s.env
    return traits
  end },
  -- Daytona's API and toolbox, spoken to by providers/daytona.lua, served by
  -- its stand-in (spec/support/standin/daytona.lua) as a process of its own,
  -- every cloud sandbox a bwrap sandbox behind it
  daytona = { backend = "daytona", gate = "bwrap", title = "daytona (stand-in)", setup = function(traits)
    local s = require("spec.support.standin.daytona_proc").start()
    -- stopped (SIGTERM: it destroys its sandboxes and its session's cgroup),
    -- not left to be killed with this process's proc objects at exit
    require "busted".teardown(function() s:stop() end)
    s:use()
    traits.host_env, traits.own_root = s.host_env, true
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
  -- a cloud provider script over HTTP: providers/tensorlake.lua against the
  -- Tensorlake stand-in (spec/support/standin/tensorlake.lua, a process of
  -- its own whose sandboxes are bwrap ones), pointed at as a user would:
  -- TENSORLAKE_API_URL and TENSORLAKE_API_KEY. Gated on bwrap: a sandbox of
  -- the stand-in on local would run commands on the host's own /
  tensorlake = { backend = "tensorlake", gate = "bwrap", title = "tensorlake (stand-in)", traits = { own_root = true },
                 setup = function(traits)
    local standin = require("spec.support.standin.tensorlake").start()
    local proc = require "sbx.proc"
    proc.setenv("TENSORLAKE_API_URL", standin.url)
    proc.setenv("TENSORLAKE_API_KEY", standin.key)
    traits.host_env = "TENSORLAKE_API_URL=" .. standin.url .. " TENSORLAKE_API_KEY=" .. standin.key .. " "
    traits.standin = standin
    return traits
  end },
  -- Modal through providers/modal.lua, sbx-modal-bridge (the official Go SDK)
  -- and the stand-in Modal server (bridge/modal/standin, bwrap sandboxes)
  modal = { backend = "modal", gate = "modal", title = "modal (bridge + stand-in server)",
            traits = { own_root = true }, setup = function(traits)
    local M = require "spec.support.modal"
    local s = M.start()
    -- this process: the config's server_url; the sbxlua processes the suite
    -- starts: the SDK's own variables
    M.configure(s)
    traits.host_env = s.host_env
    return traits
  end },
}
