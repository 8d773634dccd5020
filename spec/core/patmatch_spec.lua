-- src/patmatch.c: the bounded pattern functions scripts get must behave as
-- the stock string library on every subject and pattern (results, captures,
-- errors), and stop at their step budget.
local script = require "sbx.script"

local stock = { find = string.find, match = string.match, gmatch = string.gmatch, gsub = string.gsub }
local B = script.patterns(math.maxinteger)

-- A fixed seed: a failure names its case and replays.
local seed = tonumber(os.getenv("SBX_PATMATCH_SEED")) or 15
local rng = (function()
  local x = seed
  return function(n)
    x = (x * 1103515245 + 12345) % 2147483648
    return x % n + 1
  end
end)()
local function pick(list) return list[rng(#list)] end

local SUBJECT_CHARS = { "a", "a", "b", "b", "c", "(", ")", "[", "]", " ", "1", "2", "%", ".", "-",
                        "^", "$", "\0", "A", "_", "\n", "\255" }
local function subject()
  local t = {}
  for i = 1, rng(14) - 1 do t[i] = pick(SUBJECT_CHARS) end
  return table.concat(t)
end

local ATOMS = { "a", "b", "c", ".", "%a", "%A", "%d", "%D", "%s", "%S", "%w", "%W", "%p", "%P", "%l",
                "%u", "%x", "%c", "%g", "%z", "%.", "%%", "%(", "%]", "%-", "[ab]", "[^ab]", "[a-c]",
                "[%a_]", "[]a]", "[^]a]", "[a-]", "[%d-z]", "[%]]", "\0", "^", "$", " ", "1", "(", ")" }
local QUANT = { "", "", "", "*", "+", "-", "?" }
local function item(depth)
  local r = rng(20)
  if r == 1 and depth < 3 then return "(" .. item(depth + 1) .. item(depth + 1) .. ")" end
  if r == 2 then return "()" end
  if r == 3 then return "%b" .. pick{ "()", "ab", "[]", "aa" } end
  if r == 4 then return "%f" .. pick{ "[%a]", "[%A]", "[ab]", "[^a]", "[%z]" } end
  if r == 5 then return "%" .. rng(3) end
  if r == 6 and depth < 3 then return "(" .. item(depth + 1) .. ")" .. pick(QUANT) end
  return pick(ATOMS) .. pick(QUANT)
end
local function pattern()
  local t = {}
  if rng(6) == 1 then t[1] = "^" end
  for _ = 1, rng(5) do t[#t + 1] = item(0) end
  if rng(6) == 1 then t[#t + 1] = "$" end
  return table.concat(t)
end
-- malformed on purpose: random bytes from the pattern alphabet
local RAW = { "%", "[", "]", "(", ")", "^", "$", "*", "+", "-", "?", ".", "a", "b", "%b", "%f", "%1", "%0" }
local function raw()
  local t = {}
  for i = 1, rng(7) do t[i] = pick(RAW) end
  return table.concat(t)
end

local function outcome(f, ...)
  return table.pack(pcall(f, ...))
end

local function show(v)
  if type(v) == "string" then return string.format("%q", v) end
  return tostring(v)
end
local function same(a, b, what)
  local ok = a.n == b.n
  for i = 1, math.max(a.n, b.n) do
    if a[i] ~= b[i] and not (type(a[i]) == "function" and type(b[i]) == "function") then ok = false end
    if math.type(a[i]) ~= math.type(b[i]) then ok = false end
  end
  if not ok then
    local sa, sb = {}, {}
    for i = 1, a.n do sa[i] = show(a[i]) end
    for i = 1, b.n do sb[i] = show(b[i]) end
    error(string.format("%s\n  stock:   %s\n  bounded: %s", what, table.concat(sa, ", "),
                        table.concat(sb, ", ")), 2)
  end
end

local function all_gmatch(g, s, p, init)
  local out = { n = 0 }
  local ok, err = pcall(function()
    for a, b, c in g(s, p, init) do
      out[#out + 1] = tostring(a) .. "|" .. tostring(b) .. "|" .. tostring(c)
      out.n = #out
      if #out > 40 then break end
    end
  end)
  if not ok then return { n = 1, "error: " .. tostring(err) } end
  return out
end

local REPLS = {
  "<%0>", "%1", "[%2]", "%%", "x%1y%1", "%", "%x", "%9", "", 7, 2.5,
  { a = "A", b = false, ["("] = 1, [""] = "E" },
  function(...) return select("#", ...) .. ":" .. table.concat({ ... }, ",") end,
  function(a) if a == "a" then return false end return nil end,
  function() return {} end,
}
for i = 1, #REPLS do
  if type(REPLS[i]) == "table" then
    -- positions (numbers) as keys work too
    REPLS[i][1] = "one"
  end
end

local function compare(s, p)
  local init = pick{ nil, 1, 2, -2, 0, 5, 20, -20 }
  local case = string.format("subject %q, pattern %q, init %s", s, p, tostring(init))
  same(outcome(stock.find, s, p, init), outcome(B.find, s, p, init), "find: " .. case)
  same(outcome(stock.find, s, p, init, true), outcome(B.find, s, p, init, true), "plain find: " .. case)
  same(outcome(stock.match, s, p, init), outcome(B.match, s, p, init), "match: " .. case)
  same(all_gmatch(stock.gmatch, s, p, init), all_gmatch(B.gmatch, s, p, init), "gmatch: " .. case)
  local r = pick(REPLS)
  local n = pick{ nil, nil, 0, 1, 2, -1 }
  same(outcome(stock.gsub, s, p, r, n), outcome(B.gsub, s, p, r, n),
       "gsub: " .. case .. ", repl " .. show(r) .. ", n " .. tostring(n))
end

describe("bounded Lua patterns (script.patterns)", function()
  it("match the stock string functions on 6000 generated subject/pattern pairs", function()
    for _ = 1, 4000 do compare(subject(), pattern()) end
    for _ = 1, 2000 do compare(subject(), raw()) end
  end)

  it("match stock on the manual's examples and the tricky corners", function()
    local cases = {
      { "hello world from Lua", "(%w+)" }, { "hello world", "(%w+) (%w+)" }, { "key = value", "(%w+)%s*=%s*(%w+)" },
      { "THE (quick) fox", "%((%a+)%)" }, { "f(a(b)c)d", "%b()" }, { "THE (quick) fox", "%f[%a]%a+" },
      { "  x  ", "^%s*(.-)%s*$" }, { "aaa", "a-b" }, { "aaab", "a-b" }, { "abab", "(ab)%1" },
      { "hello", "()ll()" }, { "x", "" }, { "", "" }, { "", "^$" }, { "abc", "^(a)" }, { "abc", "c$" },
      { "a$b", "a$b" }, { "a^b", "a^b" }, { "[x]", "[]x[]+" }, { "a.b", "%." }, { "a\0b", "%z" },
      { "a\0b", "[%z]" }, { "a\0b", "\0" }, { "a\0b", "a%zb" }, { "abc", "(()" }, { "abc", "(a" },
      { "abc", "a)" }, { "abc", "%" }, { "abc", "[a" }, { "abc", "%b" }, { "abc", "%ba" }, { "abc", "%f" },
      { "abc", "%fa" }, { "abc", "%1" }, { "abc", "(a)%2" }, { "abc", "b%" }, { "b", "a%" },
      { "abc", ("(a)"):rep(33) }, { ("a"):rep(40), ("(a)"):rep(32) }, { "abc", ("a?"):rep(300) },
      { "aaa", "a*?" }, { "x=1, y=2", "(%w+)=(%w+)" }, { "abc", "[^%a]" }, { "ABC", "[%u-]" },
    }
    for _, c in ipairs(cases) do
      for _, init in ipairs{ 1, 2, -1 } do
        local case = string.format("subject %q, pattern %q, init %d", c[1], c[2], init)
        same(outcome(stock.find, c[1], c[2], init), outcome(B.find, c[1], c[2], init), "find: " .. case)
        same(outcome(stock.match, c[1], c[2], init), outcome(B.match, c[1], c[2], init), "match: " .. case)
        same(all_gmatch(stock.gmatch, c[1], c[2], init), all_gmatch(B.gmatch, c[1], c[2], init), "gmatch: " .. case)
        for _, r in ipairs(REPLS) do
          same(outcome(stock.gsub, c[1], c[2], r), outcome(B.gsub, c[1], c[2], r), "gsub: " .. case .. " " .. show(r))
        end
      end
    end
  end)

  it("gsub's table replacement goes through __index, as stock", function()
    local t = setmetatable({}, { __index = function(_, k) return k:upper() end })
    assert.same({ stock.gsub("abc def", "%w+", t) }, { B.gsub("abc def", "%w+", t) })
    assert.same({ "ABC DEF", 2 }, { B.gsub("abc def", "%w+", t) })
  end)

  it("a pathological pattern stops at the step budget with a clear error", function()
    local m = script.patterns(1000000)
    local ok, err = pcall(m.find, ("a"):rep(34), ("a?"):rep(34) .. ("a"):rep(34))
    assert.is_false(ok)
    assert.matches("string.find: the pattern budget of steps is spent", err)
    for _, f in ipairs{ "match", "gsub", "gmatch" } do
      local call = f == "gmatch" and function(s, p) return m.gmatch(s, p)() end
                   or f == "gsub" and function(s, p) return m.gsub(s, p, "") end or m[f]
      local ok2, err2 = pcall(call, ("a"):rep(30), ("a*"):rep(30) .. "b")
      assert.is_false(ok2)
      assert.matches("string." .. f .. ": the pattern budget", err2)
    end
  end)

  it("plain find is linear: a 1 MB needle over 2 MB, within a small budget", function()
    local m = script.patterns(1000)
    local h = ("a"):rep(2000000)
    local t0 = os.clock()
    assert.is_nil(m.find(h, ("a"):rep(1000000) .. "b", 1, true))
    assert.same({ 1000001, 2000000 }, { m.find(h, ("a"):rep(1000000), 1000001, true) })
    assert.is_true(os.clock() - t0 < 5)
  end)
end)
