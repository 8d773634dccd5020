--- Live progress of long work on stderr (README "Progress").
---
--- On a terminal, every stage still running after DELAY seconds shows on one
--- line that is redrawn in place (as `docker pull` and `cargo` do) and, when
--- it ends, leaves one summary line. With --progress=plain (CI logs) a stage
--- prints its summary line when it ends and a status line every PLAIN_EVERY
--- seconds while it runs; off a terminal, or with SBX_PROGRESS=0, nothing.
---
--- A stage is `progress.start(label, status)`: status(secs) returns the text
--- after the label and, optionally, the fraction done (for the bar).
--- `stage:done([summary])` ends it (also `<close>`); ending twice is a no-op.
local loop = require "sbx.loop"
local tty = require "sbx.tty"

local M = {}

M.DELAY = 0.5          -- seconds a stage runs before it shows at all
M.TICK = 0.1           -- seconds between redraws on a terminal
M.PLAIN_EVERY = 30     -- seconds between status lines with --progress=plain
M.BAR = 20             -- cells of the bar

local MODES = { auto = true, tty = true, plain = true, off = true }
local ENV = { ["0"] = "off", off = "off", ["1"] = "auto", auto = "auto", plain = "plain", tty = "tty" }

local chosen           -- from --progress=MODE
local stages = {}      -- running stages, oldest first
local ticker           -- the task that redraws the line
local shown = false    -- a live line is on the terminal now
local out = io.stderr

---Set the mode from --progress=MODE: auto (a line on a terminal, else
---nothing), tty (the line even off a terminal), plain (lines, no redraws), off.
---@return boolean|nil, string? error
function M.set_mode(mode)
  if not MODES[mode] then
    return nil, "--progress expects auto, tty, plain or off, got '" .. tostring(mode) .. "'"
  end
  chosen = mode
  return true
end

---The mode in effect: "tty", "plain" or "off". --progress wins over
---$SBX_PROGRESS (0/off, 1/auto, plain, tty); auto is tty when stderr is one.
function M.mode()
  local m = chosen or ENV[os.getenv("SBX_PROGRESS") or ""] or "auto"
  if m == "auto" then return tty.isatty(2) and "tty" or "off" end
  return m
end

local function width()
  local cols = tty.size(2)
  cols = cols or tonumber(os.getenv("COLUMNS") or "")
  if not cols or cols < 20 then cols = 80 end
  return cols
end

local function secs_text(s)
  if s < 60 then return string.format("%.1fs", s) end
  return string.format("%dm%02ds", s // 60, math.floor(s % 60))
end

local function bar(frac)
  frac = math.max(0, math.min(1, frac))
  local full = math.floor(frac * M.BAR + 0.5)
  local head = (full > 0 and full < M.BAR) and ">" or ""
  local body = string.rep("=", full - #head) .. head
  return "[" .. body .. string.rep(" ", M.BAR - #body) .. "] "
end

-- One stage as text: "label: [====>   ] status, 3.2s"; its summary (`final`):
-- "label: status in 3.2s".
local function render(st, now, final)
  local secs = now - st.t0
  local ok, text, frac = pcall(st.status, secs)
  if not ok then text, frac = "?", nil end
  if final then return st.label .. ": " .. tostring(final == true and text or final) .. " in " .. secs_text(secs) end
  return st.label .. ": " .. (frac and bar(frac) or "") .. tostring(text or "") .. ", " .. secs_text(secs)
end

local function clear()
  if shown then
    out:write("\r\27[K")
    shown = false
  end
end

-- Redraw the live line: the stages past DELAY, cut to the terminal's width
-- (a wrapped line cannot be redrawn in place).
local function draw()
  local now, parts = loop.now(), {}
  for _, st in ipairs(stages) do
    if now - st.t0 >= M.DELAY or st.eager then
      st.visible = true
      parts[#parts + 1] = render(st, now)
    end
  end
  if #parts == 0 then return clear() end
  local line = table.concat(parts, "  |  ")
  local w = width() - 1
  if #line > w then line = line:sub(1, w - 3) .. "..." end
  out:write("\r", line, "\27[K")
  out:flush()
  shown = true
end

-- plain: a status line for every stage that has run PLAIN_EVERY more seconds
local function plain_tick()
  local now = loop.now()
  for _, st in ipairs(stages) do
    if now - (st.said or st.t0) >= M.PLAIN_EVERY then
      st.said, st.visible = now, true
      out:write("sbxlua: ", render(st, now), "\n")
    end
  end
  out:flush()
end

local function run_ticker()
  while #stages > 0 do
    if M.mode() == "tty" then draw() else plain_tick() end
    loop.sleep(M.TICK)
  end
  ticker = nil
end

local Stage = {}
Stage.__index = Stage

---End the stage; its summary line replaces it (when it was shown).
---@param summary? string the text after the label (default: its last status)
function Stage:done(summary)
  if self.ended then return end
  self.ended = true
  for i, st in ipairs(stages) do
    if st == self then table.remove(stages, i) break end
  end
  local now = loop.now()
  local long = now - self.t0 >= M.DELAY or self.visible
  local mode = M.mode()
  if long and mode ~= "off" then
    if mode == "tty" then clear() end
    out:write("sbxlua: ", render(self, now, summary or true), "\n")
    if mode == "tty" and #stages > 0 then draw() end
    out:flush()
  end
  if #stages == 0 and ticker and ticker ~= loop.current() then
    ticker:cancel()
    ticker = nil
  end
end

Stage.__close = function(st, err)
  if err ~= nil and not st.ended then
    local ok, text = pcall(st.status, loop.now() - st.t0)
    st:done((ok and tostring(text) .. ", " or "") .. "stopped by an error")
  end
  st:done()
end

---A quiet stage (progress off): the same methods, doing nothing.
local Quiet = { done = function() end }
Quiet.__index = Quiet
Quiet.__close = function() end

---Start a stage. `status(secs)` -> text[, fraction]; opts.enabled = false
---(or the mode off) returns a stage that shows nothing.
---@param label string
---@param status fun(secs: number): string, number?
---@param opts? table { enabled = boolean }
function M.start(label, status, opts)
  if (opts and opts.enabled == false) or M.mode() == "off" then
    return setmetatable({}, Quiet)
  end
  local st = setmetatable({ label = label, status = status, t0 = loop.now() }, Stage)
  stages[#stages + 1] = st
  if not ticker then ticker = loop.spawn(run_ticker) end
  return st
end

---Running stages (tests).
function M.running() return #stages end

return M
