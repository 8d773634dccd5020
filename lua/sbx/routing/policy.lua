--- Routing policies: loading, hot reload, checking and running them.
---
--- A policy file returns { name =, route = function(req, candidates, stats, now) }.
--- It is compiled text-only in its own capped Lua state (sbx.script: an
--- allow-listed library, an instruction budget and a memory cap), so an
--- error, an endless loop, unbounded allocation or a garbage plan becomes a
--- message naming file:line, and the default policy takes over. Files are
--- re-read when they change (stat signature); a new version is compiled and
--- self-checked in a fresh state and swapped in only when it passes, so a
--- broken edit keeps the last good version.
local script = require "sbx.script"

local M = {}

M.LIMITS = { memory = 8 * 1024 * 1024, instructions = 1000000, millis = 250 }
M.MAX_SOURCE = 256 * 1024

local warned = {}          -- a warning is said once per process
M.warn = function(msg)
  if warned[msg] then return end
  warned[msg] = true
  io.stderr:write("sbxlua: ", msg, "\n")
end

-- -------------------------------------------------------------- plans

local function finite(x) return type(x) == "number" and x == x and x > -math.huge and x < math.huge end

---Check a plan against the candidates; returns the normalized plan or nil, why.
---With `lenient` (a set of names), those names pass too: the self-check's
---canned candidates are not the real ones, but a policy may name any provider.
function M.validate(plan, candidates, lenient)
  if type(plan) ~= "table" then return nil, "route() returned " .. type(plan) .. ", not a plan table" end
  local order = plan.order
  if type(order) ~= "table" then return nil, "plan.order is " .. type(order) .. ", not a list" end
  local known = {}          -- name -> 1 (a candidate), 2 (already in the order)
  for i = 1, #candidates do known[candidates[i].name] = 1 end
  local out = {}
  local n = #order
  if n == 0 then return nil, "plan.order is empty" end
  if n > 1000 then return nil, "plan.order is absurdly long" end
  for i = 1, n do
    local c = order[i]
    local name = type(c) == "table" and rawget(c, "name") or c
    if type(name) ~= "string" then
      return nil, string.format("plan.order[%d] is %s, not a candidate or its name", i, type(c))
    end
    local k = known[name]
    if not k and not (lenient and lenient[name]) then
      return nil, string.format("plan.order[%d] names '%s', which is not a candidate for this request",
                                i, name:sub(1, 64))
    end
    if k ~= 2 then known[name] = 2; out[#out + 1] = name end
  end
  local p = { order = out }
  if plan.max_attempts ~= nil then
    if math.type(plan.max_attempts) ~= "integer" and not (finite(plan.max_attempts)
       and plan.max_attempts == math.floor(plan.max_attempts)) or plan.max_attempts < 1 then
      return nil, "plan.max_attempts must be an integer >= 1"
    end
    p.max_attempts = math.tointeger(plan.max_attempts)
  end
  if plan.hedge_after_ms ~= nil then
    if not finite(plan.hedge_after_ms) or plan.hedge_after_ms < 0 then
      return nil, "plan.hedge_after_ms must be a finite number >= 0"
    end
    p.hedge_after_ms = plan.hedge_after_ms
  end
  if plan.reason ~= nil then
    if type(plan.reason) ~= "string" then return nil, "plan.reason must be a string" end
    p.reason = plan.reason:sub(1, 300)
  end
  return p
end

-- ----------------------------------------------------------- loading

local function compile(source, chunkname)
  local s = script.new(M.LIMITS)
  local ok, types, scalars = s:load(source, chunkname)
  if not ok then
    s:close()
    return nil, types
  end
  if types["(result)"] then
    s:close()
    return nil, chunkname:sub(2) .. ": the file returned " .. types["(result)"]
                .. ", not a table { name =, route = function(req, candidates, stats, now) }"
  end
  if types.route ~= "function" then
    s:close()
    return nil, chunkname:sub(2) .. ": 'route' is " .. (types.route or "missing") .. ", not a function"
  end
  if types.name ~= nil and types.name ~= "string" then
    s:close()
    return nil, chunkname:sub(2) .. ": 'name' must be a string"
  end
  return { script = s, name = scalars.name }
end

-- Canned requests and candidates for the self-check.
local function canned()
  local function cand(name, iso, price, caps, p50)
    return { name = name, isolation = iso, price_per_hour = price, capabilities = caps, regions = {},
             index = 0, stats = { p50_create_ms = p50, p95_create_ms = p50 and p50 * 2, p50_exec_ms = p50 and 5,
                                  error_rate = 0, rate_429 = 0, in_flight = 0, live = 0, samples = p50 and 10 or 0 } }
  end
  local all = {
    cand("local", "process", 0, { "exec", "files" }, 3),
    cand("docker", "container", 0, { "exec", "files", "snapshot" }, 300),
    cand("e2b", "microvm", 0.0666, { "exec", "files", "snapshot", "network" }, nil),
  }
  for i, c in ipairs(all) do c.index = i end
  return {
    { req = {}, candidates = all },
    { req = { needs = { "snapshot" } }, candidates = { all[2], all[3] } },
    { req = { max_price = 0.01 }, candidates = { all[1] } },
  }
end

---Run the same checks as a reload on `pol`: a few canned requests, each plan valid.
function M.self_check(pol)
  local providers = require "sbx.providers"
  local any = {}
  for _, n in ipairs(providers.names) do any[n] = true end
  for _, n in ipairs(providers.planned) do any[n] = true end
  for _, case in ipairs(canned()) do
    local stats = {}
    for _, c in ipairs(case.candidates) do stats[c.name] = c.stats end
    local plan, err = M.call(pol, case.req, case.candidates, stats, 0, any)
    if not plan then return nil, err end
  end
  return true
end

-- Built-in policies are trusted code shipped inside the binary: they run in
-- the host state (no copying across states, which is most of a decision's
-- cost) but still text-only, in a fresh allow-listed environment.
local SAFE = { "assert", "error", "ipairs", "next", "pairs", "pcall", "rawequal", "rawget", "rawlen",
               "select", "tonumber", "tostring", "type", "xpcall", "_VERSION" }
local function builtin_env()
  local env = {}
  for _, k in ipairs(SAFE) do env[k] = _G[k] end
  env.string, env.table, env.math, env.utf8 = string, table, math, utf8
  env.os = { time = os.time, clock = os.clock, date = os.date, difftime = os.difftime }
  return setmetatable(env, { __index = function(_, k) error("undefined global '" .. tostring(k) .. "'", 2) end })
end

local function compile_builtin(source, chunkname)
  local chunk, err = load(source, chunkname, "t", builtin_env())
  if not chunk then return nil, err end
  local ok, mod = pcall(chunk)
  if not ok then return nil, tostring(mod) end
  if type(mod) ~= "table" or type(mod.route) ~= "function" then
    return nil, chunkname:sub(2) .. ": not a policy table"
  end
  return { fn = mod.route, name = mod.name, builtin = true }
end

-- Policy files and built-ins through the one script loader (search path,
-- reload on change, last good version, atomic swap): a new version must
-- compile and pass the self-check; the capped state of a replaced one is
-- closed (policies run synchronously: nobody is inside it).
local loader = require("sbx.core.scripts").new{
  kind = "policy", env = "SBX_POLICY_PATH", key = "policy_path", builtin = "policies/",
  max_source = M.MAX_SOURCE,
  warn = function(msg) M.warn(msg) end,
  on_swap = function(old) if old.script then old.script:close() end end,
  compile = function(source, file, name, key)
    local pol, err
    if key:sub(1, 8) == "builtin:" then pol, err = compile_builtin(source, "@" .. file)
    else pol, err = compile(source, "@" .. file) end
    if not pol then return nil, err end
    pol.key, pol.file = key, file
    pol.name = pol.name or name
    local ok, cerr = M.self_check(pol)
    if not ok then
      if pol.script then pol.script:close() end
      return nil, "self-check failed: " .. tostring(cerr)
    end
    return pol
  end,
}

local function exists(p) return script.stat(p) ~= nil end

---The search path: $SBX_POLICY_PATH, the config's policy_path, the built-ins.
function M.path() return require("sbx.core.config").search_path("SBX_POLICY_PATH", "policy_path") end

---Resolve a policy name or file to its cache key (a path or builtin:<name>).
function M.resolve(name)
  if type(name) ~= "string" or name == "" then return nil, "a policy name must be a non-empty string" end
  if name:find("/", 1, true) or name:match("%.lua$") then
    if not exists(name) then return nil, "no policy file " .. name end
    return name
  end
  if not name:match("^[%w_%-%.]+$") then return nil, "bad policy name '" .. name .. "'" end
  for _, d in ipairs(M.path()) do
    local p = d .. "/" .. name .. ".lua"
    if exists(p) then return p end
  end
  if script.builtin("policies/" .. name) then return "builtin:" .. name end
  return nil, "unknown policy '" .. name .. "' (built-in: " .. table.concat(M.builtins(), ", ")
              .. "; searched " .. (#M.path() > 0 and table.concat(M.path(), ":") or "no policy_path") .. ")"
end

function M.builtins()
  local out = {}
  for _, n in ipairs(script.builtins("policies/")) do out[#out + 1] = n:sub(10) end
  table.sort(out)
  return out
end

---The current good version of a policy (reloading a changed file), or
---nil, why, "missing" | "broken".
function M.get(name)
  local key, err = M.resolve(name)
  if not key then return nil, err, "missing" end
  local e, lerr, why = loader:get_key(key)
  if not e then return nil, lerr, why end
  return e.value
end

---Load + self-check a file now, without caching it (sbxlua policy check).
function M.check(file)
  local src, chunkname, err = loader:source(file)
  if not src then return nil, err end
  local pol, cerr = compile(src, "@" .. chunkname)
  if not pol then return nil, cerr end
  pol.file = file
  local ok, serr = M.self_check(pol)
  pol.script:close()
  if not ok then return nil, serr end
  return true, pol.name
end

-- --------------------------------------------------------------- running

local function run_function(fn, req, candidates, stats, now)
  local co = coroutine.create(fn)
  debug.sethook(co, function()
    local info = debug.getinfo(2, "Sl")
    error((info and (info.short_src .. ":" .. (info.currentline or 0) .. ": ") or "")
          .. "instruction budget of " .. M.LIMITS.instructions .. " exceeded (an endless loop?)", 0)
  end, "", M.LIMITS.instructions)
  local ok, plan = coroutine.resume(co, req, candidates, stats, now)
  if ok and coroutine.status(co) ~= "dead" then return nil, "the policy function yielded (policies must not wait)" end
  if not ok then return nil, tostring(plan) end
  return plan
end

---Run a policy (a loaded policy or a function); returns a valid plan or nil, why.
function M.call(pol, req, candidates, stats, now, lenient)
  local plan, err
  if type(pol) == "function" then
    plan, err = run_function(pol, req, candidates, stats, now)
  elseif pol.fn then
    local ok, res = pcall(pol.fn, req, candidates, stats, now)
    if ok then plan = res else err = tostring(res) end
  else
    local ok, res, code = pol.script:call("route", req, candidates, stats, now)
    if ok then plan = res else err = res .. (code == "value" and " (in the value route() returned)" or "") end
  end
  if err then return nil, err end
  local p, why = M.validate(plan, candidates, lenient)
  if not p then
    local where = type(pol) == "table" and pol.file or "the policy function"
    return nil, where .. ": " .. why
  end
  return p
end

---Forget loaded policies (tests).
function M.reset() loader:reset() end

return M
