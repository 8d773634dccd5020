-- sbx.loop: tasks, sleep, join, cancel, inline waits, argument errors.
local loop = require "sbx.loop"
require "sbx"  -- typed errors (Cancelled) for the core

describe("sbx.loop", function()
  it("runs tasks concurrently and joins their results in order", function()
    local order = {}
    local a = loop.spawn(function() loop.sleep(0.05) order[#order + 1] = "a" return 1, 2 end)
    local b = loop.spawn(function() order[#order + 1] = "b" return "x" end)
    assert.same({ true, 1, 2 }, { a:join() })
    assert.same({ true, "x" }, { b:join() })
    assert.same({ "b", "a" }, order)
  end)

  it("sleeps overlap: 20 tasks sleeping 0.1 s take about 0.1 s", function()
    local t0 = loop.now()
    local ts = {}
    for i = 1, 20 do ts[i] = loop.spawn(loop.sleep, 0.1) end
    for i = 1, 20 do assert.is_true((ts[i]:join())) end
    assert.is_true(loop.now() - t0 < 1.0)
  end)

  it("reports a failing task through join, with a traceback", function()
    local t = loop.spawn(function() error("boom") end)
    local ok, err = t:join()
    assert.is_false(ok)
    assert.matches("boom", err)
    assert.matches("stack traceback", t:traceback())
  end)

  it("cancels a waiting task with a Cancelled error and closes its <close> variables", function()
    local closed = false
    local t = loop.spawn(function()
      local guard <close> = setmetatable({}, { __close = function() closed = true end })
      loop.sleep(10)
    end)
    loop.sleep(0.01)
    assert.equal("waiting", t:status())
    t:cancel()
    local ok, err = t:join()
    assert.is_false(ok)
    assert.equal("Cancelled", err.kind)
    assert.is_true(closed)
  end)

  it("cancelling a task that never ran finishes it without running it", function()
    local ran = false
    local t = loop.spawn(function() ran = true end)
    t:cancel()
    local ok, err = t:join()
    assert.is_false(ok)
    assert.equal("Cancelled", err.kind)
    assert.is_false(ran)
  end)

  it("waits inline inside a user coroutine (not a task)", function()
    local co = coroutine.wrap(function() loop.sleep(0.01) return "done" end)
    assert.equal("done", co())
  end)

  it("waits inline across a non-yieldable C boundary (table.sort comparator)", function()
    local t = { 3, 1, 2 }
    table.sort(t, function(a, b) loop.sleep(0) return a < b end)
    assert.same({ 1, 2, 3 }, t)
  end)

  it("detects a deadlock instead of hanging", function()
    local t
    t = loop.spawn(function() return loop.current():join() end)
    local ok, err = t:join()
    assert.is_false(ok)
    assert.matches("cannot join itself", tostring(err))
  end)

  it("rejects bad arguments", function()
    assert.has_error(function() loop.spawn(42) end)
    assert.has_error(function() loop.sleep(-1) end)
    assert.has_error(function() loop.sleep("x") end)
    assert.has_error(function() loop.sleep(0 / 0) end)
  end)

  it("tostring and status of a task", function()
    local t = loop.spawn(function() end)
    assert.matches("^sbx.Task", tostring(t))
    t:join()
    assert.equal("done", t:status())
  end)
  it("an event wakes every task waiting on it, and times out otherwise", function()
    local ev, woken = loop.event(), {}
    local ts = {}
    for i = 1, 3 do ts[i] = loop.spawn(function() woken[i] = ev:wait() end) end
    loop.sleep(0.01)
    assert.same({}, woken)
    ev:notify()
    for i = 1, 3 do ts[i]:join() end
    assert.same({ true, true, true }, woken)
    local t0 = loop.now()
    assert.is_false(ev:wait(0.02))          -- nobody notifies: the timeout
    assert.is_true(loop.now() - t0 >= 0.015)
    ev:notify()                             -- no waiter: nothing happens
  end)

  it("a cancelled waiter leaves the event usable", function()
    local ev = loop.event()
    local a = loop.spawn(function() return ev:wait() end)
    local b = loop.spawn(function() return ev:wait(5) end)
    loop.sleep(0.01)
    a:cancel()
    local ok = a:join()
    assert.is_false(ok)
    ev:notify()
    local okb, v = b:join()
    assert.is_true(okb)
    assert.is_true(v)
  end)

  it("runs a task an fd woke within a long turn, not after it", function()
    -- a turn of 40 ready tasks (10 ms each) looks at the fds every 16 of
    -- them; the task a look wakes runs before the rest of the turn (so a
    -- sandbox's next command starts early), and every task ready at the
    -- turn's start still runs in it
    local proc = require "sbx.proc"
    local order = {}
    local p = assert(proc.spawn{ argv = { "sleep", "0.02" }, env = { "PATH=/usr/bin:/bin" } })
    local w = loop.spawn(function() p:wait() p:close() order[#order + 1] = "woken" end)
    local ts = {}
    for i = 1, 40 do
      ts[i] = loop.spawn(function()
        local t1 = os.clock()
        while os.clock() - t1 < 0.01 do end
        order[#order + 1] = i
      end)
    end
    for i = 1, 40 do assert.is_true((ts[i]:join())) end
    assert.is_true((w:join()))
    local at
    for k, v in ipairs(order) do if v == "woken" then at = k end end
    assert.equal(41, #order)
    assert.is_true(at <= 33, "the woken task ran at " .. tostring(at) .. " of 41")
    for i = 1, 40 do assert.equal(i, order[i + (i >= at and 1 or 0)]) end
  end)
end)
