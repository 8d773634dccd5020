-- sbxlua usage --format table|json|csv over a ledger of known lines, and
-- the chart of spend per day that only a terminal gets.
local proc = require "sbx.proc"
local fs = require "sbx.fs"
local json = require "cjson"

local BIN = os.getenv("SBX_BIN") or "build/sbxlua"
local STATE = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/usage-" .. proc.getpid()
local ENV = { "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" .. STATE, "SBX_STATE_DIR=" .. STATE }

local function sbxlua(args)
  local argv = { BIN }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  return assert(proc.spawn{ argv = argv, env = ENV, timeout = 60 }):wait()
end

local DAY = 86400
local now = os.time()
local today = now - now % DAY

-- three days: two sandboxes two days ago, none yesterday, one today
local LEDGER = {
  { v = 1, id = "a", backend = "e2b", labels = { team = "ml" }, ended = today - 2 * DAY + 100,
    seconds = 3600, cost_usd = 0.40 },
  { v = 1, id = "b", backend = "local", labels = { team = "web, \"core\"" }, ended = today - 2 * DAY + 200,
    seconds = 60, cost_usd = 0 },
  { v = 1, id = "c", backend = "e2b", labels = { team = "ml" }, ended = today + 10, seconds = 1800,
    cost_usd = 0.20 },
}

describe("sbxlua usage", function()
  setup(function()
    assert(fs.mkdir_host(STATE))
    local f = assert(io.open(STATE .. "/ledger.jsonl", "w"))
    for _, e in ipairs(LEDGER) do f:write(json.encode(e), "\n") end
    f:write('{"torn line\n')
    f:close()
  end)
  teardown(function() fs.rmtree(STATE) end)

  it("--format csv: a header and one row per group, quoted as RFC 4180 says", function()
    local r = sbxlua({ "usage", "--format", "csv", "--by", "label" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.equal('label,sandboxes,seconds,cost_usd\n'
      .. 'team=ml,2,5400.000,0.600000\n'
      .. '"team=web, ""core""",1,60.000,0.000000\n', r.stdout)
  end)

  it("--format json is --json", function()
    local a, b = sbxlua({ "usage", "--format", "json" }), sbxlua({ "usage", "--json" })
    assert.equal(0, a.exit_code, a.stderr)
    local u = json.decode(a.stdout)
    assert.equal(3, u.total.sandboxes)
    assert.near(0.6, u.total.cost_usd, 1e-9)
    assert.near(0.6, u.groups.e2b.cost_usd, 1e-9)
    assert.same(u, json.decode(b.stdout))
  end)

  it("--format table (the default): no chart when stdout is not a terminal", function()
    local r = sbxlua({ "usage" })
    assert.equal(0, r.exit_code, r.stderr)
    assert.matches("^provider%s+sandboxes%s+hours%s+cost USD\ne2b%s+2%s+1%.500%s+0%.6000\n"
                   .. "local%s+1%s+0%.017%s+0%.0000\ntotal%s+3%s+1%.517%s+0%.6000\n$", r.stdout)
    assert.equal(r.stdout, sbxlua({ "usage", "--format", "table" }).stdout)
  end)

  it("on a terminal the table is followed by a chart of spend per day", function()
    if not os.execute("command -v script >/dev/null 2>&1") then pending("util-linux script is missing") return end
    local p = assert(proc.spawn{ argv = { "script", "-qfec", "'" .. BIN .. "' usage", "/dev/null" },
                                 env = ENV, timeout = 60 })
    local r = p:wait()
    assert.equal(0, r.exit_code, r.stdout)
    local out = r.stdout:gsub("\r", "")
    local d0, d1, d2 = os.date("!%Y-%m-%d", today - 2 * DAY), os.date("!%Y-%m-%d", today - DAY),
                       os.date("!%Y-%m-%d", today)
    assert.matches("\nspend per day %(UTC%)\n", out)
    -- the biggest day is the full 40 cells; half its spend is 20; an empty day 0
    local function has(line) assert.is_truthy(out:find(line .. "\n", 1, true), line .. " in:\n" .. out) end
    has(d0 .. "  " .. string.rep("#", 40) .. "  $0.4000  (2 sandboxes)")
    has(d1 .. "  " .. string.rep(" ", 40) .. "  $0.0000  (0 sandboxes)")
    has(d2 .. "  " .. string.rep("#", 20) .. string.rep(" ", 20) .. "  $0.2000  (1 sandboxes)")
  end)

  it("bad formats and flags are usage errors", function()
    local r = sbxlua({ "usage", "--format", "xml" })
    assert.equal(2, r.exit_code)
    assert.matches("%-%-format expects table, json or csv, got 'xml'", r.stderr)
    r = sbxlua({ "usage", "--json", "--format", "csv" })
    assert.equal(2, r.exit_code)
    r = sbxlua({ "usage", "--since", "yesterday" })
    assert.equal(2, r.exit_code)
    assert.matches("%-%-since expects", r.stderr)
  end)
end)
