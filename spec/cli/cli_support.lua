-- Running sbxlua as a user does, for the CLI specs: a private state
-- directory and HOME, no sbxlua environment of the caller's.
-- Loaded with dofile (spec/routing has a `support` module of its own).
local proc = require "sbx.proc"
local fs = require "sbx.fs"

local S = {}

S.BIN = os.getenv("SBX_BIN") or "build/sbxlua"
S.SOURCE = os.getenv("SBX_SOURCE_DIR") or "."
S.IMAGE = os.getenv("SBX_TEST_IMAGE") or "sbxlua-test:bookworm"

function S.new(name)
  local dir = (os.getenv("SBX_STATE_DIR") or "/tmp") .. "/" .. name .. "-" .. proc.getpid()
  os.execute("mkdir -p '" .. dir .. "'")
  local self = { dir = dir }
  function self.env(extra)
    local vars = { PATH = "/usr/local/bin:/usr/bin:/bin", HOME = dir, SBX_STATE_DIR = dir .. "/state",
                   XDG_CONFIG_HOME = dir .. "/xdg" }
    for k, v in pairs(extra or {}) do vars[k] = v end
    local e = {}
    for k, v in pairs(vars) do if v ~= false then e[#e + 1] = k .. "=" .. v end end
    return e
  end
  -- sbxlua(args, {env =, cwd =, stdin =, timeout =}) -> result
  function self.run(args, opts)
    opts = opts or {}
    local argv = { S.BIN }
    for _, a in ipairs(args) do argv[#argv + 1] = a end
    local p = assert(proc.spawn{ argv = argv, env = self.env(opts.env), cwd = opts.cwd or dir,
                                 stdin = opts.stdin, timeout = opts.timeout or 120,
                                 max_output = opts.max_output })
    return p:wait()
  end
  function self.write(rel, text)
    local path = dir .. "/" .. rel
    os.execute("mkdir -p \"$(dirname '" .. path .. "')\"")
    local f = assert(io.open(path, "w"))
    f:write(text)
    f:close()
    return path
  end
  function self.cleanup() fs.rmtree(dir) end
  return self
end

-- One line on stderr, no traceback of sbxlua's own Lua.
function S.one_line(r)
  local text = r.stderr:gsub("\n$", "")
  return not text:find("\n") and not text:find("traceback", 1, true) and not text:find("%.lua:%d+:")
end

return S
