--- `sbxlua usage`: spend from the ledger as a table, JSON or CSV; under the
--- table, when stdout is a terminal, a text chart of spend per day.
local sbx = require "sbx"
local errors = require "sbx.core.errors"
local meter = require "sbx.routing.meter"

local M = {}

local FORMATS = { table = true, json = true, csv = true }
M.CHART_WIDTH = 40     -- cells of the longest bar
M.CHART_DAYS = 14      -- days the chart shows at most (the latest)

local function say(...) io.stdout:write(...) end
local function complain(...) io.stderr:write("sbxlua: ", ...) io.stderr:write("\n") end

-- Group keys, most expensive first (then by name).
local function sorted_keys(u)
  local keys = {}
  for k in pairs(u.groups) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return u.groups[a].cost_usd > u.groups[b].cost_usd or
    (u.groups[a].cost_usd == u.groups[b].cost_usd and a < b) end)
  return keys
end

-- RFC 4180: a field with a comma, quote or line break is quoted, quotes doubled.
local function csv_field(v)
  v = tostring(v)
  if v:find('[,"\r\n]') then return '"' .. v:gsub('"', '""') .. '"' end
  return v
end

local function csv(u)
  say(csv_field(u.by), ",sandboxes,seconds,cost_usd\n")
  for _, k in ipairs(sorted_keys(u)) do
    local g = u.groups[k]
    say(csv_field(k), ",", g.sandboxes, ",", string.format("%.3f", g.seconds), ",",
        string.format("%.6f", g.cost_usd), "\n")
  end
end

local function table_text(u)
  say(string.format("%-32s %10s %12s %12s\n", u.by, "sandboxes", "hours", "cost USD"))
  for _, k in ipairs(sorted_keys(u)) do
    local g = u.groups[k]
    say(string.format("%-32s %10d %12.3f %12.4f\n", k, g.sandboxes, g.seconds / 3600, g.cost_usd))
  end
  say(string.format("%-32s %10d %12.3f %12.4f\n", "total", u.total.sandboxes, u.total.seconds / 3600,
                    u.total.cost_usd))
end

---Spend per UTC day of the ledger's entries: { { day = "YYYY-MM-DD", cost_usd =, sandboxes = } },
---oldest first, every day from the first to the last with an entry, at most `max` (the latest).
function M.per_day(entries, max)
  local by, first, last = {}, nil, nil
  for _, e in ipairs(entries) do
    local t = math.tointeger(math.floor(tonumber(e.ended) or 0))
    local day = t // 86400
    local d = by[day] or { cost_usd = 0, sandboxes = 0 }
    by[day] = d
    d.cost_usd = d.cost_usd + e.cost_usd
    d.sandboxes = d.sandboxes + 1
    first, last = math.min(first or day, day), math.max(last or day, day)
  end
  local out = {}
  if not first then return out end
  first = math.max(first, last - (max or M.CHART_DAYS) + 1)
  for day = first, last do
    local d = by[day] or { cost_usd = 0, sandboxes = 0 }
    out[#out + 1] = { day = os.date("!%Y-%m-%d", day * 86400), cost_usd = d.cost_usd, sandboxes = d.sandboxes }
  end
  return out
end

---The chart's lines: "YYYY-MM-DD  ######              $0.1234  (12 sandboxes)".
function M.chart(days, width)
  width = width or M.CHART_WIDTH
  local top = 0
  for _, d in ipairs(days) do top = math.max(top, d.cost_usd) end
  local lines = {}
  for _, d in ipairs(days) do
    local n = top > 0 and math.floor(d.cost_usd / top * width + 0.5) or 0
    if n == 0 and d.cost_usd > 0 then n = 1 end      -- spend, however small, shows
    lines[#lines + 1] = string.format("%s  %s%s  $%.4f  (%d sandboxes)", d.day, string.rep("#", n),
                                      string.rep(" ", width - n), d.cost_usd, d.sandboxes)
  end
  return lines
end

---sbxlua usage, with the options cli_table parsed.
function M.main(o)
  local format = o.format or (o.json and "json") or "table"
  if not FORMATS[format] then
    complain("usage: --format expects table, json or csv, got '", format, "'")
    return 2
  end
  if o.json and format ~= "json" then complain("usage: --json and --format ", format, " disagree") return 2 end
  local ok, u = pcall(sbx.usage, { by = o.by, since = o.since })
  if not ok then
    if errors.is(u, "SandboxError") then complain(tostring(u)) return 2 end
    error(u, 0)
  end
  if format == "json" then
    say(sbx.json.encode(u), "\n")
  elseif format == "csv" then
    csv(u)
  else
    table_text(u)
    if require("sbx.tty").isatty(1) then
      local days = M.per_day(meter.entries(u.since))
      if #days > 0 then
        say("\nspend per day (UTC)\n")
        for _, l in ipairs(M.chart(days)) do say(l, "\n") end
      end
    end
  end
  return 0
end

return M
