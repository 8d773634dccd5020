-- Option B of the spawn-throughput work, measured: a host sbx-agent per
-- local sandbox (as bwrap keeps one inside each sandbox) running its
-- commands, so spawns happen in N agent processes instead of sbxlua.
--   sbxlua bench/agent_local.lua AGENT [SANDBOXES=200] [CMDS=10]
-- AGENT: build/sbx-agent. Each "sandbox" is a directory plus a started
-- `sbx-agent serve` on pipes; its commands go through the agent link (the
-- same code bwrap uses), `true` with an exact argv.
-- Prints: ok <bool> wall_ms <ms> vmhwm_kb <kB> cmds <n>
local proc = require "sbx.proc"
local agentlink = require "sbx.daemon.link"
local agent = assert(arg[1], "usage: agent_local.lua AGENT [SANDBOXES] [CMDS]")
local nsb, ncmd = tonumber(arg[2]) or 200, tonumber(arg[3]) or 10
local ENV = { "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp" }

local function transport(p)       -- the agent's stdout is the stream; stderr: diagnostics
  local t = { diag = "" }
  function t.read()
    while true do
      local which, chunk = p:read()
      if not which then return nil, "the agent ended: " .. t.diag end
      if which == "stdout" then return chunk end
      t.diag = (t.diag .. chunk):sub(-2000)
    end
  end
  function t.write(data) return p:write(data) end
  function t.close() p:close() end
  return t
end

local function now() return require("sbx.loop").now() end
local items = {}
for i = 1, nsb do items[i] = i end
local t0 = now()
local res = sbx.parallel(items, function()
  local p = assert(proc.spawn{ argv = { agent, "serve" }, env = ENV, keep_stdin = true, stream = true,
                               max_output = 0 })
  local link = assert(agentlink.open(transport(p), 10))
  local ok = 0
  for _ = 1, ncmd do
    local c = link:spawn{ argv = { "true" }, env = ENV, cwd = "/tmp" }
    if c:wait().exit_code == 0 then ok = ok + 1 end
  end
  link:close()
  p:close()
  return ok
end, { concurrency = nsb })
local wall = (now() - t0) * 1e3
local total = 0
for _, v in ipairs(res) do total = total + v end
local f = assert(io.open("/proc/self/status"))
local hwm = tonumber(f:read("a"):match("VmHWM:%s*(%d+)"))
f:close()
print(string.format("ok %s wall_ms %.2f vmhwm_kb %d cmds %d", tostring(total == nsb * ncmd), wall, hwm, total))
