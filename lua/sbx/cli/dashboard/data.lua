--- What the dashboard shows, read from the state directory only (so it
--- works while jobs run in other processes): the sessions' journals (live
--- sandboxes), the ledger (spend) and the decision log (routing, and the
--- provider health derived from the creates it records).
local owner = require "sbx.state.owner"
local meter = require "sbx.routing.meter"
local health = require "sbx.routing.health"
local json = require "cjson.safe"

local M = {}

M.DECISIONS_READ = 4 * 1024 * 1024   -- bytes of the decision log's end that are read
M.HEALTH_WINDOW = 200                -- latest create attempts per provider for health

local function num(v) return type(v) == "number" and v or nil end

-- A table to encode as a JSON array even when empty (lua-cjson 2.1 writes
-- an empty table as {}): the caller encodes through M.encode.
local ARRAY = {}
local function array(t) return setmetatable(t, ARRAY) end

---JSON text where arrays made by this module stay arrays when empty.
function M.encode(v)
  local function fix(x)
    if type(x) ~= "table" then return x end
    if getmetatable(x) == ARRAY and #x == 0 then return "\0[]" end
    local out = {}
    for k, val in pairs(x) do out[k] = fix(val) end
    return out
  end
  return (json.encode(fix(v)):gsub('"\\u0000%[%]"', "[]"))
end

---Live sandboxes of this host, from the journals: id, backend, session,
---state (creating, running; orphaned when its session is dead), age, labels.
function M.sandboxes(now)
  local host, rows = owner.hostname(), array{}
  for _, s in ipairs(owner.sessions()) do
    if s.host == nil or s.host == host then
      for _, e in ipairs(s.sandboxes) do
        local created = num(e.created)
        rows[#rows + 1] = {
          id = tostring(e.id), backend = tostring(e.backend), session = s.id, pid = num(s.pid),
          state = not s.live and "orphaned" or (e.state and "running" or "creating"),
          created = created, age_secs = created and math.max(0, now - created) or nil,
          labels = type(e.labels) == "table" and e.labels or {}, ttl = num(e.ttl),
        }
      end
    end
  end
  table.sort(rows, function(a, b) return (a.created or 0) > (b.created or 0) end)
  return rows
end

local function label_keys(e)
  local keys = {}
  if type(e.labels) == "table" then
    for k, v in pairs(e.labels) do keys[#keys + 1] = tostring(k) .. "=" .. tostring(v) end
  end
  if #keys == 0 then keys[1] = "(no labels)" end
  return keys
end

---Spend over time from the ledger: buckets of `bucket` seconds from `since`,
---cost per bucket per provider and per label, the totals, and what the live
---sandboxes have cost so far (their price at default resources x age: an
---estimate until their ledger line is written).
function M.spend(now, since, bucket, live)
  local first = since - since % bucket
  local n = math.max(1, math.floor((now - first) / bucket) + 1)
  local starts = array{}
  for i = 1, n do starts[i] = first + (i - 1) * bucket end
  local by_provider, by_label = {}, {}
  local function add(into, key, i, cost)
    local s = into[key]
    if not s then
      s = array{}
      for k = 1, n do s[k] = 0 end
      into[key] = s
    end
    s[i] = s[i] + cost
  end
  local total, count = 0, 0
  for _, e in ipairs(meter.entries(since)) do
    local i = math.floor(((tonumber(e.ended) or 0) - first) / bucket) + 1
    if i >= 1 and i <= n then
      total, count = total + e.cost_usd, count + 1
      add(by_provider, tostring(e.backend), i, e.cost_usd)
      for _, k in ipairs(label_keys(e)) do add(by_label, k, i, e.cost_usd) end
    end
  end
  local accruing = 0
  for _, sb in ipairs(live or {}) do
    if sb.state ~= "orphaned" and sb.age_secs then
      local ok, price = pcall(meter.price, sb.backend)
      if ok then accruing = accruing + meter.hourly(price, {}) * sb.age_secs / 3600 end
    end
  end
  return { since = since, bucket_secs = bucket, starts = starts, by_provider = by_provider,
           by_label = by_label, total_usd = total, sandboxes = count, accruing_usd = accruing }
end

-- The last `max` bytes of a file, from its first whole line.
local function tail(path, max)
  local f = io.open(path, "rb")
  if not f then return "" end
  local size = f:seek("end")
  f:seek("set", math.max(0, size - max))
  local data = f:read("a") or ""
  f:close()
  if size > max then data = data:gsub("^[^\n]*\n", "", 1) end
  return data
end

local function decision_lines()
  local list = {}
  for line in tail(owner.state_dir() .. "/decisions.jsonl", M.DECISIONS_READ):gmatch("[^\n]+") do
    local d = json.decode(line)
    if type(d) == "table" then list[#list + 1] = d end
  end
  return list
end

---The latest routing decisions, newest first: time, what was asked, the
---policy, the order and its reason, why others were skipped, the outcome.
function M.decisions(limit, lines)
  lines = lines or decision_lines()
  local out = array{}
  for i = #lines, math.max(1, #lines - limit + 1), -1 do
    local d = lines[i]
    local plan = type(d.plan) == "table" and d.plan or {}
    local skipped = {}
    for _, c in ipairs(type(d.candidates) == "table" and d.candidates or {}) do
      if type(c) == "table" and c.skipped then skipped[tostring(c.name)] = tostring(c.skipped) end
    end
    local outcome = type(d.outcome) == "table" and d.outcome or {}
    out[#out + 1] = {
      time = num(d.time), policy = d.policy and tostring(d.policy), policy_error = d.policy_error,
      order = array(type(plan.order) == "table" and plan.order or {}), reason = plan.reason,
      skipped = skipped, request = type(d.request) == "table" and d.request or {},
      backend = outcome.backend, id = outcome.id, error = outcome.error,
      warm = type(d.warm) == "table" and d.warm.pool or nil,
      attempts = array(type(d.attempts) == "table" and d.attempts or {}),
    }
  end
  return out
end

---Provider health from the decision log's create attempts (routed creates;
---a pinned create is not logged): creates, error rate and p50/p95 create
---over the latest HEALTH_WINDOW, the failures in a row at the end, and the
---breaker as the routing core would judge it (open after that many).
function M.health(now, lines, available)
  lines = lines or decision_lines()
  local per = {}
  for _, d in ipairs(lines) do
    for _, a in ipairs(type(d.attempts) == "table" and d.attempts or {}) do
      if type(a) == "table" and a.backend and not a.lost_hedge and a.class ~= "capacity" then
        local p = per[a.backend] or { list = {} }
        per[a.backend] = p
        p.list[#p.list + 1] = { ok = a.ok == true, ms = num(a.ms), t = num(d.time) }
      end
    end
  end
  local out = {}
  for name in pairs(available or {}) do per[name] = per[name] or { list = {} } end
  for name, p in pairs(per) do
    local list = p.list
    local from = math.max(1, #list - M.HEALTH_WINDOW + 1)
    local oks, fails, ms = 0, 0, {}
    for i = from, #list do
      if list[i].ok then
        oks = oks + 1
        if list[i].ms then ms[#ms + 1] = list[i].ms end
      else
        fails = fails + 1
      end
    end
    table.sort(ms)
    local streak, last_fail = 0, nil
    for i = #list, 1, -1 do
      if list[i].ok then break end
      streak = streak + 1
      last_fail = last_fail or list[i].t
    end
    local open = streak >= health.BREAKER_FAILURES and last_fail
                 and now - last_fail < health.BREAKER_COOLDOWN
    local av = (available or {})[name]
    out[name] = {
      creates = oks + fails, failed = fails, error_rate = (oks + fails) > 0 and fails / (oks + fails) or 0,
      p50_create_ms = #ms > 0 and ms[math.max(1, math.ceil(#ms * 0.5))] or nil,
      p95_create_ms = #ms > 0 and ms[math.max(1, math.ceil(#ms * 0.95))] or nil,
      failures_in_a_row = streak, breaker = open and "open" or (streak > 0 and "closed, failing" or "closed"),
      available = av and av.available, reason = av and av.reason,
    }
  end
  return out
end

---Everything the page shows, in one table.
function M.summary(o)
  local now = os.time()
  local lines = decision_lines()
  local live = M.sandboxes(now)
  return {
    now = now, host = owner.hostname(), state_dir = owner.state_dir(),
    sandboxes = live,
    spend = M.spend(now, o.since or (now - 86400), o.bucket or 3600, live),
    decisions = M.decisions(o.limit or 50, lines),
    health = M.health(now, lines, o.available),
    actions = o.actions or false,
  }
end

return M
