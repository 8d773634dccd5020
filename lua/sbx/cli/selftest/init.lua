--- `sbxlua selftest`: escape probes inside every available isolating
--- backend (isolation "namespace" or stronger). Each probe tries something
--- a sandbox must not be able to do and checks, from the host where it
--- can, that it did not happen:
---
---   write outside the root      a host directory, /usr, /etc, / of the host
---   read the host's secrets     another process's environment (a canary in
---                               a host process), /etc/shadow
---   reach the network when off  interfaces other than lo, a connection to
---                               any address of the host
---   see host processes          a host process with a tagged command line
---   write a host sysctl         kernel.core_pattern, fs.suid_dumpable, ...
---   reach mountinfo's host paths  /proc/self/mountinfo names the host paths
---                               of bind mounts (the sandbox's root): none
---                               of them leads inside to what it names
---   raise privileges            capabilities, no_new_privs, a new user
---                               namespace, mount
---   exhaust pids                a bounded fork storm: limited where the
---                               backend claims a pids limit, and always
---                               killed to the last process at the timeout
---   exhaust memory              a bounded allocation beyond the limit the
---                               backend claims (bwrap: its rlimit)
---
--- A probe that gets through is a FAIL and the exit status is 1; so is a
---
--- The probes themselves: selftest_probes.lua.
local sbx = require "sbx"
local proc = require "sbx.proc"
local providers = require "sbx.providers"
local probes_mod = require "sbx.cli.selftest.probes"

local M = {}

M.DANGEROUS_CAPS, M.claims, M.host_addresses = probes_mod.DANGEROUS_CAPS, probes_mod.claims,
  probes_mod.host_addresses
M.probes = probes_mod.probes
local probes = M.probes

-- ------------------------------------------------------------------ run

---Backends to probe: the available ones isolating at "namespace" or more.
function M.backends(only)
  local all, out = providers.describe(), {}
  for _, n in ipairs(providers.names) do
    local d = all[n]
    local iso = d and providers.ISOLATION[d.isolation or ""] or 0
    if (not only or only == n) and iso >= providers.ISOLATION.namespace then
      out[#out + 1] = { name = n, available = d.available, reason = d.reason, desc = d }
    end
  end
  return out
end

---Run every probe on one backend; calls report(probe, status, detail).
function M.run_backend(name, base_opts, report)
  local claims = M.claims(name)
  local made = {}
  local function new(extra)
    local o = {}
    for k, v in pairs(base_opts or {}) do o[k] = v end
    for k, v in pairs(extra or {}) do o[k] = v end
    local sb = sbx.sandbox(name, o)
    made[#made + 1] = sb
    return sb
  end
  local ctx = { backend = name, claims = claims, new = new, tag = proc.random_hex(8),
                canary = "sbx-canary-" .. proc.random_hex(16) }
  local ok, err = pcall(function()
    ctx.sb = new()
    local d = providers.describe()[name]
    if d.options and d.options.allow_internet then ctx.off = new{ allow_internet = false } end
  end)
  local failed = 0
  for _, p in ipairs(probes) do
    local status, detail
    if not ok then
      status, detail = "FAIL", "cannot create a sandbox: " .. tostring(err)
    else
      local pok, s, d = pcall(p.run, ctx)
      if pok then status, detail = s, d
      else status, detail = "FAIL", "the probe raised: " .. tostring(s) end
    end
    if status == "FAIL" then failed = failed + 1 end
    report(p.name, status, detail)
  end
  for _, sb in ipairs(made) do pcall(sb.destroy, sb) end
  return failed
end

---sbxlua selftest [--backend B] [--image I] [--json]
function M.main(o)
  if o.backend then
    local ok, e = pcall(providers.get, o.backend)
    if not ok then io.stderr:write("sbxlua: selftest: ", tostring(e), "\n") return 2 end
  end
  local results, failed, passed, skipped = {}, 0, 0, 0
  local backends = M.backends(o.backend)
  if o.backend and #backends == 0 then
    io.stderr:write("sbxlua: selftest: ", o.backend, " does not isolate (only namespace or stronger backends are probed)\n")
    return 2
  end
  local tested, any_skip = 0, false
  for _, b in ipairs(backends) do
    local rows = {}
    results[#results + 1] = { backend = b.name, available = b.available, reason = b.reason, probes = rows }
    if not o.json then
      io.stdout:write("selftest ", b.name, " (", b.desc.isolation or "?", ")",
                      b.available and "" or (": unavailable, " .. tostring(b.reason)), "\n")
    end
    -- docker without --image probes in the default image: when the engine
    -- does not have it, say so instead of failing every probe on a pull
    local skip
    if b.available and b.name == "docker" and not o.image then
      local docker = require "sbx.providers.builtin.docker"
      local image = docker.default_image()
      if docker.has_image(image) == false then
        skip = "the default image " .. image .. " is not present locally; pass --image (an image you have)"
      end
    end
    if skip then
      results[#results].skipped = skip
      any_skip = true
      if not o.json then io.stdout:write("  skipped: ", skip, "\n") end
    elseif b.available then
      tested = tested + 1
      local opts = (b.name == "docker" and o.image) and { image = o.image } or nil
      M.run_backend(b.name, opts, function(name, status, detail)
        rows[#rows + 1] = { probe = name, status = status, detail = detail }
        if status == "FAIL" then failed = failed + 1 elseif status == "ok" then passed = passed + 1
        else skipped = skipped + 1 end
        if not o.json then
          io.stdout:write(string.format("  %-5s %s: %s\n", status, name, tostring(detail)))
          io.stdout:flush()
        end
      end)
    end
  end
  if o.json then
    io.stdout:write(require("sbx.cli.request").json({ results = results, passed = passed, failed = failed,
      skipped = skipped }, { results = true, probes = true }), "\n")
  else
    io.stdout:write(string.format("selftest: %d blocked, %d FAILED, %d skipped on %d backend(s)\n",
                                  passed, failed, skipped, tested))
    if tested == 0 then
      io.stdout:write("selftest: nothing was verified (", any_skip and "every available backend was skipped"
                      or "no isolating backend is available", ")\n")
    end
  end
  if failed > 0 or tested == 0 then return 1 end
  return 0
end

return M

