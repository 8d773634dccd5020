-- G2 of RELIABILITY.md: after SIGKILL at random points (create, exec, copy,
-- destroy) on local, bwrap and docker, `sbxlua gc` leaves nothing: no tagged
-- process, no sandbox directory, no container, no cgroup of this run's
-- sessions. And a gc racing live sessions never deletes their sandboxes.
-- SIGINT (once, twice at once, twice apart) during parallel creates: a
-- clean stop leaves nothing before gc, and `ls` lists what a forced one left.
-- The long version (N=200, the README figure) is bench/g2.sh.
local loop = require "sbx.loop"
local src = os.getenv("SBX_SOURCE_DIR") or "."
local H = dofile(src .. "/spec/harness/sigkill.lua")

describe("G2: SIGKILL at random points, then gc", function()
  local run
  setup(function()
    math.randomseed(os.time())
    run = H.new_run()
    print("\nG2 backends: " .. table.concat(run.backends, ","))
  end)
  teardown(function() if run then run:cleanup() end end)

  it("leaves 0 processes, directories, containers and cgroups (15 kills)", function()
    local all = run.backends
    -- 5 batches of 3 parallel jobs; each job uses 1..3 backends, rotating
    for b = 1, 5 do
      run:batch(3, 1.5, { backends_for = function(i)
        local k = (b + i) % 3
        if k == 0 then return all end
        return { all[(b + i) % #all + 1] }
      end })
    end
    print(run:figure())
    assert.equal(15, run.runs)
    assert.same({}, run.leaks, table.concat(run.leaks, "\n"))
    assert.equal(0, run:total_leftovers())
  end)

  -- SIGINT while creates are in flight (G2 and G4): each job creates 3
  -- sandboxes of every backend at once, docker ones filling an agent volume
  -- of their own; interrupted at random points of that.
  for _, how in ipairs{ "int", "twin", "double" } do
    local what = ({ int = "one SIGINT", twin = "two SIGINTs at once (timeout -s INT)",
                    double = "a second SIGINT 0.5 s later (forced)" })[how]
    it(what .. " during parallel creates: " .. (how == "double" and "what is left is in ls, gc removes it"
       or "nothing left even before gc"), function()
      local before, unclean, unlisted, left = #run.leaks, run.unclean, run.unlisted, run:total_leftovers()
      for _ = 1, 3 do run:signal_batch(2, 2.5, how) end
      local leaks = table.move(run.leaks, before + 1, #run.leaks, 1, {})
      print(run:figure())
      assert.same({}, leaks, table.concat(leaks, "\n"))
      assert.equal(unclean, run.unclean)
      assert.equal(unlisted, run.unlisted)
      assert.equal(left, run:total_leftovers())
    end)
  end

  it("two live sbxlua processes and a gc racing killed jobs keep their sandboxes", function()
    local lives, exclude = {}, {}
    for _, b in ipairs(run.backends) do
      local p = run:start({ run.live_job, b }, { stdin = true })
      local seen = ""
      while not seen:find("ready\n") do
        local which, chunk = p:read()
        assert(which, "live " .. b .. " job ended before ready: " .. seen)
        if which == "stdout" then seen = seen .. chunk end
      end
      lives[#lives + 1] = { b = b, p = p }
      exclude[p.pid] = true
    end
    local before = #run.leaks
    for _ = 1, 2 do
      run:batch(3, 1.2, { concurrent_gc = true, exclude = exclude })
    end
    local leaks = table.move(run.leaks, before + 1, #run.leaks, 1, {})
    for _, l in ipairs(lives) do
      l.p:write("go\n")
      local rest = ""
      while true do
        local which, chunk = l.p:read()
        if not which then break end
        if which == "stdout" then rest = rest .. chunk end
      end
      local res = l.p:wait()
      assert.equal(0, res.exit_code, l.b .. ": " .. tostring(res.stderr))
      assert.equal("kept\talive\n\n", rest, l.b)
    end
    loop.sleep(0.1)
    local _, details = run:count()
    assert.same({}, details, table.concat(details, "\n"))
    assert.same({}, leaks, table.concat(leaks, "\n"))
  end)
end)
