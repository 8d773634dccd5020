-- Hostile commands and a starved sbxlua (RELIABILITY.md's catalogue): a
-- fork bomb under a timeout, output floods on every backend, and sbxlua
-- itself with 256 fds: clear errors, nothing hangs, nothing is left.
local sbx = require "sbx"
local proc = require "sbx.proc"
local loop = require "sbx.loop"

local BIN = os.getenv("SBX_BIN") or "build/sbxlua"
local IMAGE = os.getenv("SBX_TEST_IMAGE") or "sbxlua-test:bookworm"
local STATE = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/adv-" .. proc.getpid()

local BACKENDS = { { "local", {} } }
if require("sbx.providers.builtin.bwrap").available() then BACKENDS[#BACKENDS + 1] = { "bwrap", {} } end
if require("sbx.providers.builtin.docker").available() then BACKENDS[#BACKENDS + 1] = { "docker", { image = IMAGE } } end

local survivors = require("spec.support").pgrep

-- sbxlua's peak RSS so far, in kB
local function hwm()
  local f = io.open("/proc/self/status")
  local kb = tonumber(f:read("a"):match("VmHWM:%s+(%d+)"))
  f:close()
  return kb
end

describe("adversarial commands", function()
  for _, b in ipairs(BACKENDS) do
    it("a flood of output on " .. b[1] .. " keeps sbxlua's memory bounded", function()
      local sb <close> = sbx.sandbox(b[1], b[2])
      local before = hwm()
      local r = sb:execute_command("sh", { "-c", "head -c 200000000 /dev/urandom; yes | head -c 100000000 >&2" },
                                   { timeout = 120 })
      assert.equal(0, r.exit_code)
      assert.is_true(r.truncated)
      assert.equal(1024 * 1024, #r.stdout)
      assert.equal(1024 * 1024, #r.stderr)
      -- (AddressSanitizer keeps freed memory in quarantine: RSS says nothing there)
      if (os.getenv("SBX_PRELOAD") or "") == "" then
        assert.is_true(hwm() - before < 48 * 1024, "peak RSS grew by more than 48 MiB")
      end
    end)

    it("a slow on_stdout consumer of a flood on " .. b[1] .. " holds the command back, not sbxlua's memory",
       function()
      local sb <close> = sbx.sandbox(b[1], b[2])
      local before = hwm()
      -- another task keeps using the sandbox meanwhile: where commands share
      -- one agent stream, it reads the flood's frames too
      local done, others = false, 0
      local other = sbx.spawn(function()
        while not done do
          assert(sb:execute_command("true").exit_code == 0)
          others = others + 1
        end
      end)
      local got, mark = 0, 0
      local r = sb:execute_command("head", { "-c", "200000000", "/dev/zero" }, { timeout = 120,
        on_stdout = function(c)
          got = got + #c
          if got - mark >= 2 * 1024 * 1024 then mark = got loop.sleep(0.02) end
        end })
      done = true
      assert(other:join())
      assert.equal(0, r.exit_code)
      assert.equal(200000000, got)
      assert.is_true(others > 0)
      if (os.getenv("SBX_PRELOAD") or "") == "" then
        assert.is_true(hwm() - before < 48 * 1024, "peak RSS grew by " .. (hwm() - before) // 1024 .. " MiB")
      end
    end)

    it("stdin that is never closed and a reader that never drains it do not hang on " .. b[1], function()
      local sb <close> = sbx.sandbox(b[1], b[2])
      local t0 = loop.now()
      local r = sb:execute_command("sleep", { "30" }, { stdin = string.rep("x", 4 * 1024 * 1024), timeout = 1 })
      assert.is_true(r.timed_out)
      assert.is_true(loop.now() - t0 < 15)
    end)
  end

  -- A real fork bomb where a pids limit bounds it: docker (PidsLimit) and
  -- bwrap on a machine with a pids controller (sbx.limits).
  local function real_bomb(name, opts, after)
    local sb <close> = sbx.sandbox(name, opts)
    local tag = "sbxbomb" .. require("sbx.proc").random_hex(8)
    local t0 = loop.now()
    local r = sb:execute_command("bash", { "-c", "b() { exec -a " .. tag .. " bash -c 'b() { b & b & wait; }; b' ; }; b" },
                                 { timeout = 3 })
    assert.is_true(r.timed_out)
    assert.is_true(loop.now() - t0 < 30)
    loop.sleep(0.5)
    assert.equal(0, survivors(tag))
    assert.equal("alive\n", sb:execute_command("echo alive").stdout)
    if after then after(sb) end
  end

  local bwrap = require "sbx.providers.builtin.bwrap"
  if bwrap.available() and bwrap.descriptor.limits.pids then
    it("a fork bomb dies with its timeout, whole (bwrap: the pids controller bounds it)", function()
      local limits = require "sbx.providers.builtin.limits"
      real_bomb("bwrap", {}, function(sb)
        local how = limits.controllers().pids
        if how.v == 1 then   -- the limit was hit: forks were refused (pids.events "max N")
          local f = assert(io.open(how.dir .. "/" .. require("sbx.state.owner").session_id() .. "/" .. sb.id .. "/pids.events"))
          local refused = tonumber(f:read("a"):match("max (%d+)"))
          f:close()
          assert.is_true(refused > 0, "no fork was refused: the bomb was not bounded by pids.max")
        end
      end)
    end)
  end

  -- local has no pids limit (and bwrap none without a pids controller; root
  -- is exempt from RLIMIT_NPROC): a real fork bomb would take the host down
  -- with it. A throttled one (a generation every 0.2 s, so ~2^8 processes
  -- when the timeout strikes) still checks that a tree forking while it is
  -- killed dies whole.
  for _, b in ipairs(BACKENDS) do
    if b[1] == "local" or (b[1] == "bwrap" and not bwrap.descriptor.limits.pids) then
      it("a throttled fork bomb dies with its timeout, whole, on " .. b[1], function()
        local sb <close> = sbx.sandbox(b[1], b[2])
        local tag = "sbxslowbomb" .. require("sbx.proc").random_hex(8)
        local t0 = loop.now()
        local r = sb:execute_command("bash", { "-c",
          "b() { exec -a " .. tag .. " bash -c 'b() { sleep 0.2; b & b & wait; }; b' ; }; b" }, { timeout = 1.6 })
        assert.is_true(r.timed_out)
        assert.is_true(loop.now() - t0 < 20)
        loop.sleep(0.5)
        assert.equal(0, survivors(tag))
        assert.equal("alive\n", sb:execute_command("echo alive").stdout)
      end)
    end
  end

  if require("sbx.providers.builtin.docker").available() then
    it("a fork bomb dies with its timeout, whole (docker: PidsLimit bounds it)", function()
      real_bomb("docker", { image = IMAGE })
    end)
  end
end)

describe("sbxlua with few fds (ulimit -n 256)", function()
  it("fails creates clearly when fds run out, and recovers", function()
    os.execute("mkdir -p " .. STATE)
    local job = STATE .. "/fds.lua"
    local f = io.open(job, "w")
    f:write([[
      local ok_n, errs = 0, {}
      local held = {}
      for i = 1, 400 do
        local ok, sb = pcall(sbx.sandbox, "local")
        if ok then held[#held + 1] = sb else errs[#errs + 1] = sb; break end
      end
      -- out of fds, a command fails with a typed error too, never a crash
      local ok0, e0 = pcall(held[1].execute_command, held[1], "true", {})
      assert(ok0 or (type(e0) == "table" and e0.kind), "untyped failure: " .. tostring(e0))
      -- free some: the others work again
      for i = 1, 100 do held[i]:destroy() end
      local good = 0
      for i = 101, #held do
        local ok, r = pcall(held[i].execute_command, held[i], "true", {})
        if ok and r.exit_code == 0 then good = good + 1 end
      end
      for _, sb in ipairs(held) do sb:destroy() end
      -- and with them gone, there is room again
      local sb <close> = sbx.sandbox("local")
      print(#held, good, (sb:execute_command("echo", { "again" }).stdout:gsub("\n", "")),
            errs[1] and (errs[1].kind or tostring(errs[1])) or "none")
    ]])
    f:close()
    local p = assert(proc.spawn{ argv = { "bash", "-c", 'ulimit -n 256 && exec "$0" "$1"', BIN, job },
      env = { "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" .. STATE, "SBX_STATE_DIR=" .. STATE },
      timeout = 120 })
    local r = p:wait()
    assert.equal(0, r.exit_code, r.stderr)
    local held, good, kind = r.stdout:match("^(%d+)\t(%d+)\tagain\t(%S+)")
    assert.is_not_nil(held, r.stdout .. r.stderr)
    assert.equal(tonumber(held) - 100, tonumber(good))
    assert.is_true(tonumber(held) < 400, "the fds never ran out: the test proves nothing")
    assert.matches("Error$", kind)      -- a typed error, not a crash or a raw string
    os.execute("rm -rf " .. STATE)
  end)
end)
