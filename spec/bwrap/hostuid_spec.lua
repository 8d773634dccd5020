-- Issue 15, item 1: when sbxlua runs as root, no process of a bwrap
-- sandbox is host root. Seen from the host, its commands run as the
-- unprivileged uid/gid bwrap.ids() names, what they create is owned by it,
-- and a root-only host file bound into the sandbox stays out of its reach.
local sbx = require "sbx"
local fs = require "sbx.fs"
local loop = require "sbx.loop"
local bwrap = require "sbx.providers.builtin.bwrap"

local ok, why = bwrap.available()
if not ok or not bwrap.as_root() then
  describe("bwrap as root", function()
    pending(not ok and ("bwrap unavailable: " .. tostring(why)) or "sbxlua does not run as root here")
  end)
  return
end

local UID, GID = bwrap.ids()

-- Host pids whose command line is exactly `argv` (joined with NULs).
local function host_pids(argv)
  local want, found = table.concat(argv, "\0") .. "\0", {}
  for _, name in ipairs(fs.list_host("/proc") or {}) do
    if name:match("^%d+$") and fs.read_host("/proc/" .. name .. "/cmdline", 4096) == want then
      found[#found + 1] = name
    end
  end
  return found
end

local function owner_of(path)
  local f = io.popen("stat -c '%u %g' '" .. path .. "'")
  local u, g = f:read("a"):match("(%d+) (%d+)")
  f:close()
  return tonumber(u), tonumber(g)
end

local function status_ids(pid)
  local s = fs.read_host("/proc/" .. pid .. "/status", 65536) or ""
  return s:match("\nUid:%s+([^\n]+)"), s:match("\nGid:%s+([^\n]+)")
end

describe("bwrap as root", function()
  -- slirp4netns --enable-sandbox pivots into a mount namespace of its own;
  -- made from the host's, where mounts are shared, its detach of the old
  -- root unmounted the host's shared mounts (docker's container rootfs
  -- among them: new containers found no sh) until it got a private copy
  it("leaves the host's mounts alone when a sandbox has the internet", function()
    if bwrap.slirp == nil then return pending("no slirp4netns") end
    -- as docker has it: a shared bind mount (/var/lib/docker) with a mount
    -- beneath it (a container's rootfs)
    local dir = assert(fs.mkdtemp(os.getenv("SBX_STATE_DIR") or "/tmp", "hostmnt."))
    assert(os.execute("mount --bind '" .. dir .. "' '" .. dir .. "' && mount --make-shared '" .. dir
                      .. "' && mkdir '" .. dir .. "/sub' && mount -t tmpfs -o size=64k sbxhostmnt '" .. dir .. "/sub'"))
    local function mounted()
      return (fs.read_host("/proc/self/mountinfo", 1 << 22) or ""):find(" " .. dir .. "/sub ", 1, true) ~= nil
    end
    local okr, err = pcall(function()
      assert.is_true(mounted())
      for _ = 1, 3 do
        local sb <close> = sbx.sandbox("bwrap", { allow_internet = true })
        assert.equal(0, sb:execute_command("true", {}).exit_code)
        loop.sleep(0.2)     -- slirp4netns has set its sandbox up by now
        assert.is_true(mounted(), "a host mount was unmounted by the sandbox's network helper")
      end
    end)
    os.execute("umount '" .. dir .. "/sub' 2>/dev/null; umount '" .. dir .. "' 2>/dev/null; rm -rf '" .. dir .. "'")
    assert(okr, err)
  end)

  it("maps the sandbox's root onto an unprivileged host uid and gid (not 0)", function()
    assert.is_true(UID > 0 and GID > 0)
    assert.is_true(bwrap.ids() == UID)
  end)

  for _, mode in ipairs{ "agent", "direct" } do
    describe("(" .. mode .. ")", function()
      local sb
      before_each(function() bwrap.exec_mode = mode; sb = sbx.sandbox("bwrap") end)
      after_each(function() if sb then sb:destroy() end bwrap.exec_mode = nil end)

      it("runs commands as that uid seen from the host, uid 0 seen from inside", function()
        local r = sb:execute_command("id", { "-u" })
        assert.equal("0\n", r.stdout, r.stderr)
        local marker = { "sleep", "4242." .. math.random(100000, 999999) }
        local p = sb:spawn(marker[1], { marker[2] })
        local pids
        for _ = 1, 2500 do
          pids = host_pids(marker)
          if #pids > 0 then break end
          loop.sleep(0.004)
        end
        assert.equal(1, #pids, "the command is not visible from the host")
        local uid, gid = status_ids(pids[1])
        assert.equal(("%d\t%d\t%d\t%d"):format(UID, UID, UID, UID), uid)
        assert.equal(("%d\t%d\t%d\t%d"):format(GID, GID, GID, GID), gid)
        p:kill()
        p:wait()
      end)

      it("gives first commands started at once by several tasks the same namespaces", function()
        local tasks = {}
        for i = 1, 4 do
          tasks[i] = sbx.spawn(function()
            return sb:execute_command("sh", { "-c", "echo > /tmp/t" .. i .. "; readlink /proc/self/ns/net" })
          end)
        end
        local nets = {}
        for i, t in ipairs(tasks) do
          local okk, r = t:join()
          assert.is_true(okk, tostring(r))
          assert.equal(0, r.exit_code, r.stderr)
          nets[r.stdout] = true
          assert.equal(UID, owner_of(sb._h.dir .. "/tmp/t" .. i))
        end
        local n = 0
        for _ in pairs(nets) do n = n + 1 end
        if mode == "direct" then assert.equal(1, n) end     -- one network namespace per sandbox
      end)

      it("creates files owned by that uid on the host; the file API's own files are the sandbox's", function()
        sb:write_file("/workspace/given", "from the host\n")
        local r = sb:execute_command("sh", { "-c", "echo more >> /workspace/given && mkdir -p /tmp/d && echo x > /tmp/d/made && echo ok" })
        assert.equal("ok\n", r.stdout, r.stderr)
        for _, rel in ipairs{ "workspace/given", "tmp/d", "tmp/d/made" } do
          local u, g = owner_of(sb._h.dir .. "/" .. rel)
          assert.equal(UID, u, rel)
          assert.equal(GID, g, rel)
        end
        assert.equal("from the host\nmore\n", sb:read_file("/workspace/given"))
      end)

      it("cannot write a root-owned host directory bound writable into it (its workdir)", function()
        -- host uid 0 owns the directory: a sandbox of host root could write it
        local dir = os.tmpname()
        os.remove(dir)
        assert(fs.mkdir_host(dir))
        assert(os.execute("chmod 755 '" .. dir .. "'"))      -- readable by everyone, writable by root
        local s <close> = sbx.sandbox("bwrap", { workdir = dir })
        local r = s:execute_command("sh", { "-c", "touch /workspace/x 2>&1; ls -ln -d /workspace" })
        assert.matches("Permission denied", r.stdout)
        assert.is_nil(io.open(dir .. "/x"))
        s:destroy()
        fs.rmtree(dir)
      end)
    end)
  end
end)
