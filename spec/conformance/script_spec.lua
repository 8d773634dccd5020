-- The conformance suite through a provider script: one file on a temporary
-- SBX_PROVIDER_PATH (the `local` backend's operations under another name),
-- one row here. That is all a new provider takes (docs/providers.md).
local config = require "sbx.config"
local fs = require "sbx.fs"

local DIR = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/provider-scripts-" .. require("sbx.proc").getpid()
assert(fs.mkdir_host(DIR))
local f = assert(io.open(DIR .. "/wrapped.lua", "w"))
f:write([[
-- a throwaway provider: local's operations under another name
local p = builtin("local")
p.descriptor.name = "wrapped"
p.descriptor.description = "the local backend, loaded as a provider script"
return p
]])
f:close()
-- this process finds it on the config's provider_path, the sbxlua
-- processes the suite starts on $SBX_PROVIDER_PATH
config.use{ provider_path = { DIR } }

require("spec.conformance.suite")("wrapped", {}, _ENV, { host_env = "SBX_PROVIDER_PATH=" .. DIR .. " " })
