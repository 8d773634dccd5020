--- Tasks: sbx.spawn and sbx.parallel over the C loop's coroutines.
local loop = require "sbx.loop"
local errors = require "sbx.core.errors"
local check = require "sbx.core.check"
local owner = require "sbx.state.owner"
local progress = require "sbx.core.progress"

local M = {}

---Start fn(...) as a task; t:join() -> ok, results...
function M.spawn(fn, ...)
  if type(fn) ~= "function" then check.bad("spawn", "expected a function, got " .. type(fn)) end
  return loop.spawn(fn, ...)
end

---sbx.sleep(secs): finite seconds >= 0 (ConfigError otherwise).
function M.sleep(secs)
  return loop.sleep(check.seconds(secs, "sleep", "seconds", true))
end

---Run the loop until `t` is done (or until no work is left).
M.run = loop.run

-- Destroy the sandboxes a failed item created (and did not hand out).
local function destroy_created_since(task, mark)
  for _, sb in ipairs(owner.made_since(task, mark)) do pcall(sb.destroy, sb) end
end

---The progress line of sbx.parallel: text, fraction done.
function M.status(done, failed, running, n)
  local spent = require("sbx.routing.meter").spent()
  return string.format("%d/%d done, %d failed, %d running, $%.4f", done, n, failed, math.max(running, 0),
                       spent), n > 0 and (done + failed) / n or 1
end

---fn(item, index) for every item, at most opts.concurrency at once; results
---in input order. An error cancels the rest and is re-raised, unless
---opts.collect_errors: then returns results, errors (both indexed like items).
function M.parallel(items, fn, opts)
  if type(items) ~= "table" then check.bad("parallel", "items must be a list") end
  if type(fn) ~= "function" then check.bad("parallel", "fn must be a function") end
  opts = check.options(opts, { concurrency = "integer", collect_errors = "boolean",
                               progress = { "boolean", "string" } }, "parallel")
  local n = #items
  local width = opts.concurrency or math.max(n, 1)
  if width < 1 then check.bad("parallel", "concurrency must be >= 1") end
  local results, errs, nexti, failure = {}, {}, 1, nil
  local workers = {}
  local done, failed, stopped = 0, 0, 0
  local stage <close> = progress.start(type(opts.progress) == "string" and opts.progress or "parallel",
    function() return M.status(done, failed, nexti - 1 - done - failed - stopped, n) end,
    { enabled = opts.progress ~= false and n > 1 })

  local function worker()
    local me = loop.current()
    while failure == nil do
      local i = nexti
      if i > n then return end
      nexti = i + 1
      local mark = owner.seq()
      local ok, v = pcall(fn, items[i], i)
      if ok then
        results[i] = v
        done = done + 1
      else
        if errors.is(v, "Cancelled") then stopped = stopped + 1 else failed = failed + 1 end
        destroy_created_since(me, mark)
        if opts.collect_errors and not errors.is(v, "Cancelled") then
          errs[i] = v
        else
          if failure == nil then
            failure = v
            for _, w in ipairs(workers) do if w ~= me then w:cancel() end end
          end
          return
        end
      end
    end
  end

  for k = 1, math.min(width, n) do workers[k] = loop.spawn(worker) end
  local ok, err = pcall(function()
    for _, w in ipairs(workers) do w:join() end
  end)
  if not ok then             -- we were cancelled: take the workers down too
    for _, w in ipairs(workers) do w:cancel() end
    for _, w in ipairs(workers) do w:join() end
    error(err, 0)
  end
  if failure ~= nil then error(failure, 0) end
  if opts.collect_errors then return results, errs end
  return results
end

return M
