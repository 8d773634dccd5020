--- The bwrap provider's limits: backend_options (rlimits, per process) and
--- the cgroup limits of a new sandbox (cpu, memory_mb, pids) through the
--- controllers sbx.limits finds.
local limits = require "sbx.providers.builtin.limits"
local common = require "sbx.providers.builtin.bwrap.common"

local M = {}
local fail = common.fail

---The rlimits of a create's backend_options (raises ConfigError for what
---is unknown or out of range).
local function check_options(spec)
  local bo = spec.backend_options or {}
  local lims = { core = 0 }
  for k in pairs(bo) do
    if k ~= "rlimits" then
      fail("ConfigError", "bwrap: unknown backend_options." .. tostring(k) .. " (known: rlimits)",
            { op = "create" })
    end
  end
  for k, v in pairs(bo.rlimits or {}) do
    local d = common.RLIMITS[k]
    if not d then
      local known = {}
      for n in pairs(common.RLIMITS) do known[#known + 1] = n end
      table.sort(known)
      fail("ConfigError", "bwrap: unknown rlimit '" .. tostring(k) .. "' (known: "
            .. table.concat(known, ", ") .. ")", { op = "create" })
    end
    if math.type(v) ~= "integer" or v < d[3] then
      fail("ConfigError", "bwrap: rlimits." .. k .. " must be an integer >= " .. d[3],
            { op = "create" })
    end
    lims[d[1]] = v * d[2]
  end
  return lims
end

-- The cgroup limits of a new sandbox: its cpu and memory_mb, and pids.max
-- wherever a pids controller is. Returns the v1 groups its processes join.
local function set_limits(spec, cg)
  local want = { cpu = spec.cpu, memory_mb = spec.memory_mb }   -- > 0: checked by the facade
  if want.memory_mb ~= nil and not (want.memory_mb >= 16) then
    fail("ConfigError", "memory_mb must be >= 16, got " .. tostring(want.memory_mb), { op = "create" })
  end
  if not cg then
    if want.cpu or want.memory_mb then
      fail("FeatureNotSupportedError", "cpu and memory_mb need the sandbox's cgroup, and there is none", { op = "create" })
    end
    return nil
  end
  if limits.controllers().pids then want.pids = limits.PIDS end
  local set, err = limits.apply(spec.session, spec.id, cg, want)
  if not set then return nil, err end
  return #set.join > 0 and set.join or nil
end

M.check_options, M.set_limits = check_options, set_limits

return M
