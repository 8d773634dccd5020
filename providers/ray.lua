-- providers/ray.lua: sandboxes on a Ray cluster (docs/providers.md; the
-- design: README.md, "Ray"). A sandbox is one Ray job submitted over the
-- Jobs REST API. Its entrypoint, a small Python bootstrap (Ray nodes always
-- have Python), dials back to this process's listener, proves itself with
-- a one-time 128-bit token, receives this build's sbx-agent unless the node
-- has it cached, and runs `sbx-agent serve` (inside bwrap unless the config
-- says `isolation: process`) with the socket as its stdin and stdout: then
-- the agent protocol runs as on every other backend. The bootstrap is a
-- subreaper and kills its whole tree and removes its directory when the
-- link ends, the job is stopped, or the job's supervisor (its node) dies.
-- One file for the whole provider: the contract is one file per provider.

local BOOT = [==[
import base64,fcntl,json,os,shutil,signal,socket,subprocess,sys,tempfile,time
c=json.loads(base64.b64decode(sys.argv[1]))
def log(m):
    sys.stderr.write("sbxlua-ray: %s\n"%m); sys.stderr.flush()
try:
    import ctypes; ctypes.CDLL(None).prctl(36,1,0,0,0)
except Exception: pass
base=os.path.join(tempfile.gettempdir(),"sbxlua-ray-%d"%os.getuid())
os.makedirs(base,0o700,exist_ok=True)
box=os.path.join(base,c["id"]); agent=os.path.join(base,"agent-"+c["hash"])
bw=shutil.which("bwrap") if c["iso"]!="process" else None
def tree():
    kids={}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                st=open("/proc/%s/stat"%d).read(); kids.setdefault(int(st[st.rindex(")")+2:].split()[1]),[]).append(int(d))
            except Exception: pass
    out=[]; todo=[os.getpid()]
    while todo:
        for k in kids.get(todo.pop(),[]): out.append(k); todo.append(k)
    return out
def finish(code):
    for _ in range(100):
        t=tree()
        if not t: break
        for p in t:
            try: os.kill(p,9)
            except Exception: pass
        try:
            while os.waitpid(-1,os.WNOHANG)[0]>0: pass
        except ChildProcessError: pass
        time.sleep(0.05)
    if not c.get("attach"):
        shutil.rmtree(box,ignore_errors=True)
        try: os.remove(box+".lock")
        except OSError: pass
    os._exit(code)
for sg,n in ((signal.SIGTERM,143),(signal.SIGINT,130),(signal.SIGHUP,129)):
    signal.signal(sg,lambda *a,n=n: finish(n))
ppid=os.getppid()
if c.get("attach"):
    if not os.path.isdir(box): log("sandbox %s is gone from this node"%c["id"]); os._exit(4)
else:
    # held for the bootstrap's life; a box whose lock is free lost its
    # bootstrap to a SIGKILL (a dead node): the next bootstrap removes it
    lk=open(box+".lock.new","w"); fcntl.flock(lk,fcntl.LOCK_EX); os.rename(box+".lock.new",box+".lock")
    os.mkdir(box,0o700)
    for n in os.listdir(base):
        if n.endswith(".lock") and n!=c["id"]+".lock":
            try:
                with open(os.path.join(base,n)) as o:
                    fcntl.flock(o,fcntl.LOCK_EX|fcntl.LOCK_NB)
                    shutil.rmtree(os.path.join(base,n[:-5]),ignore_errors=True); os.remove(os.path.join(base,n))
            except OSError: pass
try:
    s=socket.create_connection((c["host"],c["port"]),timeout=30)
    s.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)  # small frames: no Nagle delay
    have=os.access(agent,os.X_OK)
    s.sendall(("SBXRAY1 %s %s %d %d %s\n"%(c["key"],c["token"],have,bw is not None,box)).encode())
    f=s.makefile("rb"); w=f.readline().split()
    if not w or w[0]!=b"OK": log("refused: "+b" ".join(w[1:]).decode(errors="replace")); finish(3)
    n=int(w[1])
    if n:
        data=f.read(n)
        if len(data)!=n: log("the agent's transfer was cut short"); finish(3)
        tmp="%s.%d"%(agent,os.getpid())
        with open(tmp,"wb") as o: o.write(data)
        os.chmod(tmp,0o755); os.rename(tmp,agent)
    s.settimeout(None)
except Exception as e:
    log("cannot reach sbxlua at %s:%s: %s"%(c["host"],c["port"],e)); finish(3)
path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
if bw:
    argv=[bw,"--die-with-parent","--new-session","--unshare-all"]+(["--share-net"] if c["net"] else [])
    for d in ("usr","bin","sbin","lib","lib32","lib64","libx32","etc","opt"):
        p="/"+d
        if os.path.islink(p): argv+=["--symlink",os.readlink(p),p]
        elif os.path.isdir(p): argv+=["--ro-bind",p,p]
    argv+=["--proc","/proc","--dev","/dev","--tmpfs","/tmp","--tmpfs","/var/tmp","--bind",box,"/workspace",
           "--ro-bind",agent,"/.sbx/sbx-agent","--chdir","/workspace","--clearenv","--setenv","PATH",path,
           "--setenv","HOME","/workspace"]
    for h in c["hide"]:
        if os.path.isdir(h): argv+=["--tmpfs",h]
        elif os.path.exists(h): argv+=["--ro-bind","/dev/null",h]
    argv+=["/.sbx/sbx-agent","serve"]
    env=None
else:
    argv=[agent,"serve"]; env={"PATH":path,"HOME":box}
child=subprocess.Popen(argv,stdin=s.fileno(),stdout=s.fileno(),cwd=box,env=env if env is not None else {"PATH":path})
f.close(); s.close()
while True:
    try:
        r=child.wait(timeout=0.5); finish(r if r>=0 else 128-r)
    except subprocess.TimeoutExpired:
        if os.getppid()!=ppid: log("the job's supervisor is gone"); finish(137)
]==]

local NAME = "ray"
local TERMINAL = { STOPPED = true, SUCCEEDED = true, FAILED = true }

-- every error names the provider, in its fields and its message
local fail = errors.raiser(NAME, NAME .. ": ")

local function address()
  local c = config()
  local a = c.address or env(c.address_env)
  return a and (a:gsub("/+$", "")) or nil
end

-- One Jobs/State API call: the decoded body (or raw text), the status.
-- Transport failures raise `kind` (default SandboxConnectionError).
local function api(method, path, body, o)
  o = o or {}
  local c = config()
  local base = address()
  if not base then fail("BackendNotInstalledError", "no cluster address: set $" .. c.address_env, { op = o.op }) end
  local headers = { ["content-type"] = "application/json" }
  local tok = env(c.token_env)
  if tok and tok ~= "" then headers.authorization = "Bearer " .. tok:gsub("%s+$", "") end
  local res, err, code = http.request{ method = method, url = base .. path, headers = headers,
    body = body and json.encode(body) or nil, timeout = o.timeout or 30, connect_timeout = math.min(5, o.timeout or 5) }
  if not res then
    fail(o.kind or "SandboxConnectionError", method .. " " .. path .. ": " .. tostring(err),
         { op = o.op, code = code, retryable = true })
  end
  if res.status == 401 or res.status == 403 then
    fail("AuthenticationError", method .. " " .. path .. ": HTTP " .. res.status
         .. (res.status == 401 and " (no token sent: set $" .. c.token_env .. ")" or " (the token was refused)"),
         { op = o.op, status = res.status })
  end
  local data = json.decode(res.body or "")
  return data == nil and res.body or data, res.status
end

local function job(sid, op)
  local j, st = api("GET", "/api/jobs/" .. http.escape(sid), nil, { op = op })
  if st == 404 then return nil end
  if st >= 400 or type(j) ~= "table" then fail("SandboxConnectionError", "job " .. sid .. ": HTTP " .. st, { op = op }) end
  return j
end

-- A finished job as a typed error, with Ray's own message.
local function job_error(j, op)
  local msg = "job " .. j.submission_id .. " " .. tostring(j.status) .. ": " .. tostring(j.message)
  if j.error_type == "JOB_SUPERVISOR_ACTOR_DIED" or tostring(j.message):find("node", 1, true)
     and tostring(j.message):find("died", 1, true) then
    fail("SandboxNotFoundError", msg .. " (its node died)", { op = op, error_type = j.error_type })
  end
  if tostring(j.message):find("low on memory", 1, true) then
    fail("SandboxExecutionError", msg .. " (Ray's memory monitor killed it)", { op = op, code = "ENOMEM" })
  end
  if j.driver_exit_code == 137 then
    fail("SandboxNotFoundError", msg .. " (the entrypoint was killed, exit 137)", { op = op, exit_code = 137 })
  end
  fail("SandboxNotFoundError", msg, { op = op, error_type = j.error_type })
end

-- ------------------------------------------------------------ the listener

-- One per process: the bootstraps of every sandbox dial it. `pending` maps
-- a sandbox id to the token it must present, and receives its stream.
local L = { pending = {} }

local function same(a, b)   -- compares every byte whatever differs first
  if #a ~= #b then return false end
  local d = 0
  for i = 1, #a do d = d | (a:byte(i) ~ b:byte(i)) end
  return d == 0
end

local function listener()
  if L.sock then return L end
  local c = config()
  local s, port, code = stream.listen{ host = c.listen_host, port = c.listen_port }
  if not s then
    fail("SandboxCreationError", "cannot listen on " .. c.listen_host .. ":" .. c.listen_port .. ": " .. tostring(port),
         { op = "create", code = code })
  end
  L.sock, L.port = s, port
  return L
end

-- Read the bootstrap's hello line and hand its stream to the sandbox that
-- waits for it; anything else is closed.
local function admit(s)
  local buf = ""
  while #buf < 8192 and not buf:find("\n", 1, true) do
    local chunk = s:read(10)
    if not chunk then s:close() return end
    buf = buf .. chunk
  end
  local line = buf:match("^([^\n]*)\n")
  local id, token, have, bw, box = (line or ""):match("^SBXRAY1 (%S+) (%x+) ([01]) ([01]) (.+)$")
  local p = id and L.pending[id]
  if not (p and same(token, p.token)) then
    s:write("NO unknown sandbox or wrong token\n")
    s:close()
    return
  end
  L.pending[id] = nil               -- one time only
  if bw == "0" and p.isolation ~= "process" then
    p.err = "the node has no bwrap; install bubblewrap there, or allow `isolation: process` in "
            .. "providers.ray (commands then run as the raylet's user, unconfined)"
    s:write("NO no bwrap\n")
    s:close()
    return
  end
  local blob = ""
  if have == "0" then blob = agent_binary() end
  local ok, err = s:write("OK " .. #blob .. "\n" .. blob)
  if not ok then p.err = "sending sbx-agent: " .. tostring(err) s:close() return end
  p.conn, p.bwrap, p.box = s, bw == "1", box
end

-- Wait for sandbox `id`'s bootstrap; whoever waits accepts for everyone.
local function await(id, deadline, check)
  local p = L.pending[id]
  local last = 0
  while not p.conn and not p.err do
    if timer.now() > deadline then return nil, "timed out" end
    if not L.accepting then
      L.accepting = true
      local ok, s = pcall(L.sock.accept, L.sock, 0.25)
      L.accepting = false
      if not ok then error(s, 0) end
      if s then pcall(admit, s) end
    else
      timer.sleep(0.02)
    end
    if not p.conn and not p.err and timer.now() - last > 1 then
      last = timer.now()
      check()
    end
  end
  if p.err then return nil, p.err end
  return p.conn
end

local function transport(s)
  return { read = function() return s:read() end, write = function(d) return s:write(d) end,
           close = function() s:close() end }
end

-- ------------------------------------------------------------ jobs

local function sid_of(id) return "sbxlua-" .. hostname() .. "-" .. id end

local function wait_terminal(sid, secs)
  local deadline = timer.now() + secs
  repeat
    local j = job(sid, "destroy")
    if not j or TERMINAL[j.status] then return j end
    timer.sleep(0.2)
  until timer.now() > deadline
  return false
end

-- Jobs that ended, by the time they were seen terminal: deleted once that
-- is 2 s ago (a quicker DELETE leaves a ghost record), by a later call of
-- this process, its clean exit (forget_session) or gc.
local ended = {}

local function delete(sid)
  local _, st = api("DELETE", "/api/jobs/" .. http.escape(sid), nil, { op = "destroy" })
  if st >= 400 and st ~= 404 then fail("SandboxConnectionError", "DELETE job " .. sid .. ": HTTP " .. st, { op = "destroy" }) end
end

-- Delete the ended jobs that are due (all: every one, waiting as needed).
local function sweep(all)
  local due = {}
  for sid, t in pairs(ended) do
    if all or timer.now() - t >= 2 then due[#due + 1] = { sid, t } end
  end
  for _, d in ipairs(due) do
    if ended[d[1]] then
      ended[d[1]] = nil
      local wait = d[2] + 2 - timer.now()
      if wait > 0 then timer.sleep(wait) end
      delete(d[1])
    end
  end
end

-- Stop unless it ends on its own within `grace` s; the delete follows
-- (now, with `now`).
local function retire(sid, grace, now)
  local j = wait_terminal(sid, grace)
  if j == false then
    api("POST", "/api/jobs/" .. http.escape(sid) .. "/stop", nil, { op = "destroy" })
    j = wait_terminal(sid, 30)
    if j == false then fail("SandboxConnectionError", "job " .. sid .. " did not stop within 30 s", { op = "destroy" }) end
  end
  if not j then return end
  ended[sid] = ended[sid] or timer.now()
  if now then
    local wait = ended[sid] + 2 - timer.now()
    if wait > 0 then timer.sleep(wait) end
    ended[sid] = nil
    delete(sid)
  end
end

local function nodes(timeout)
  local d = api("GET", "/api/v0/nodes?limit=1000", nil, { op = "create", kind = "SandboxCreationError", timeout = timeout })
  local list = type(d) == "table" and d.data and d.data.result and d.data.result.result
  if type(list) ~= "table" then fail("SandboxCreationError", "cannot read the cluster's nodes", { op = "create" }) end
  local alive = {}
  for _, n in ipairs(list) do if n.state == "ALIVE" then alive[#alive + 1] = n end end
  return alive
end

-- Can any node take it at all? (A PENDING job cannot be stopped or deleted
-- and would run whenever resources appear.)
local function fits(req)
  local seen = {}
  for _, n in ipairs(nodes()) do
    local r, ok = n.resources_total or {}, true
    if (r.CPU or 0) + 1e-9 < req.cpus then ok = false end
    if req.memory and (r.memory or 0) < req.memory then ok = false end
    for k, v in pairs(req.resources) do if (r[k] or 0) < v then ok = false end end
    for k, v in pairs(req.labels) do if (n.labels or {})[k] ~= v then ok = false end end
    if ok then return true end
    seen[#seen + 1] = string.format("%s (%g CPU, %d MiB%s)", n.node_id:sub(1, 8), r.CPU or 0,
                                    (r.memory or 0) // 1048576, n.is_head_node and ", head" or "")
  end
  return false, #seen == 0 and "the cluster has no node alive" or table.concat(seen, ", ")
end

local function b64json(t) return base64.encode(json.encode(t)) end

local handles = {}   -- this process's live sandboxes by id (resume in-process)

-- Submit the job of sandbox `id` and wait for its agent: the link.
local function start(spec, o)
  local c = config()
  local l = listener()
  local token = random_hex(32)
  local iso = c.isolation
  local p = { token = token, isolation = iso }
  L.pending[o.key] = p
  local boot = { id = spec.id, key = o.key, token = token, hash = select(2, agent_binary()), iso = iso,
                 host = c.advertise_host or c.listen_host, port = c.advertise_port or l.port,
                 net = spec.allow_internet == true, hide = c.hide_paths, attach = o.attach }
  local py = c.python:gsub("[^%w%./_%-]", "")
  local body = { entrypoint = "exec " .. py .. " -c \"import base64;exec(base64.b64decode('"
                   .. base64.encode(BOOT) .. "'))\" " .. b64json(boot),
                 submission_id = o.sid, metadata = o.metadata, entrypoint_num_cpus = o.cpus,
                 entrypoint_memory = o.memory, entrypoint_resources = next(o.resources) and o.resources or nil,
                 entrypoint_label_selector = next(o.labels) and o.labels or nil }
  local res, st = api("POST", "/api/jobs/", body, { op = "create", kind = "SandboxCreationError" })
  if st >= 400 then
    L.pending[o.key] = nil
    fail("SandboxCreationError", "submitting job " .. o.sid .. ": HTTP " .. st .. ": " .. tostring(res),
         { op = "create", status = st })
  end
  local conn, why = await(o.key, timer.now() + c.start_timeout, function()
    local j = job(o.sid, "create")
    if j and TERMINAL[j.status] then
      local logs = api("GET", "/api/jobs/" .. http.escape(o.sid) .. "/logs", nil, { op = "create" })
      p.err = "job " .. o.sid .. " " .. j.status .. " before its agent dialled back: "
        .. tostring(j.message) .. " " .. (type(logs) == "table" and tostring(logs.logs):sub(-600) or "")
    end
  end)
  L.pending[o.key] = nil
  if not conn then
    pcall(retire, o.sid, 0, true)
    fail("SandboxCreationError", "the sandbox's agent did not dial back to " .. boot.host .. ":" .. boot.port
         .. ": " .. why .. " (is advertise_host reachable from the nodes?)", { op = "create", retryable = true })
  end
  local link, lerr = agentlink.open(transport(conn), 30)
  if not link then
    pcall(retire, o.sid, 0, true)
    fail("SandboxCreationError", "the agent did not start: " .. tostring(lerr), { op = "create" })
  end
  local j = job(o.sid, "create") or {}
  return { link = link, home = p.bwrap and "/workspace" or p.box, node = j.driver_node_id }
end

-- ------------------------------------------------------------ paths

local function resolve(h, path, op)
  if type(path) ~= "string" then fail("ConfigError", op .. ": path must be a string", { op = op }) end
  if path:find("\0", 1, true) then fail("PathError", op .. ": path contains a NUL byte", { op = op }) end
  local full = path:sub(1, 1) == "/" and path or (h.home .. "/" .. path)
  local parts = {}
  for seg in full:gmatch("[^/]+") do
    if seg == ".." then
      if #parts == 0 then fail("PathError", op .. ": " .. path .. " leaves the sandbox", { op = op }) end
      parts[#parts] = nil
    elseif seg ~= "." then
      parts[#parts + 1] = seg
    end
  end
  return "/" .. table.concat(parts, "/")
end

-- What the agent's errno names mean here (its replies carry names).
local NOT_A_PATH = { ENOTDIR = true, EISDIR = true, ENOTEMPTY = true, EEXIST = true, ELOOP = true }

local function link(h, op)
  if h.gone then fail("SandboxNotFoundError", "sandbox " .. h.id .. " was destroyed", { op = op }) end
  if h.link.broken then
    local ok, j = pcall(job, h.sid, op)
    if ok and j and TERMINAL[j.status] then job_error(j, op) end
    if ok and not j then fail("SandboxNotFoundError", "job " .. h.sid .. " is gone", { op = op }) end
    fail("SandboxConnectionError", op .. ": the agent's link broke: " .. tostring(h.link.broken), { op = op })
  end
  return h.link
end

local function file_error(h, op, p, errno, msg)
  if errno == "BROKEN" then link(h, op) end      -- the link broke: say why
  if errno == "ENOENT" then fail("FileNotFoundError", op .. ": " .. p .. ": No such file or directory", { op = op, errno = errno }) end
  if errno == "EFBIG" then fail("SandboxExecutionError", op .. ": " .. tostring(msg), { op = op, code = "ETOOBIG" }) end
  if NOT_A_PATH[errno] then fail("PathError", op .. ": " .. tostring(msg), { op = op, code = errno }) end
  fail("SandboxExecutionError", op .. ": " .. tostring(msg), { op = op, code = errno })
end

-- ------------------------------------------------------------ operations

local DESCRIPTOR = {
  name = NAME, description = "sandboxes as Ray jobs on a Ray cluster (sbx-agent under bwrap on the node)",
  isolation = "namespace",
  capabilities = { "exec", "files", "streaming", "background", "resume" },
  options = { cpu = true, memory_mb = true, allow_internet = true, backend_options = true },
  price = { per_vcpu_hour = 0, per_gib_hour = 0 },     -- providers.ray.price in the config sets them
  regions = {},    -- the nodes' labels as "key=value", filled from the cluster
  capacity = {},   -- nodes, cpus, cpus_free, memory_mb, memory_mb_free: from the cluster
}

-- The descriptor's capacity and regions, updated in place from the cluster
-- (the router holds the same tables).
local function refresh()
  local list = nodes(3)
  local cap, regions, seen = DESCRIPTOR.capacity, DESCRIPTOR.regions, {}
  local cpus, mem = 0, 0
  for _, n in ipairs(list) do
    cpus, mem = cpus + (n.resources_total.CPU or 0), mem + (n.resources_total.memory or 0)
    for k, v in pairs(n.labels or {}) do
      if not k:find("^ray%.io/") then seen[k .. "=" .. tostring(v)] = true end
    end
  end
  local st = api("GET", "/api/cluster_status", nil, { op = "available", timeout = 3 })
  local usage = type(st) == "table" and type(st.data) == "table" and type(st.data.clusterStatus) == "table"
                and type(st.data.clusterStatus.loadMetricsReport) == "table"
                and st.data.clusterStatus.loadMetricsReport.usage or {}
  cap.nodes, cap.cpus, cap.memory_mb = #list, cpus, mem // 1048576
  cap.cpus_free = type(usage.CPU) == "table" and (usage.CPU[2] or 0) - (usage.CPU[1] or 0) or nil
  cap.memory_mb_free = type(usage.memory) == "table"
                       and ((usage.memory[2] or 0) - (usage.memory[1] or 0)) // 1048576 or nil
  for i = #regions, 1, -1 do regions[i] = nil end
  for r in pairs(seen) do regions[#regions + 1] = r end
  table.sort(regions)
end

local function available()
  local c = config()
  if not address() then return false, "no cluster address: set $" .. c.address_env .. " or providers.ray.address" end
  local ok, err = pcall(refresh)
  -- a refused token is the create's AuthenticationError, said there
  if not ok and not errors.is(err, "AuthenticationError") then
    return false, "the cluster at " .. address() .. " does not answer: " .. tostring(type(err) == "table" and err.message or err)
  end
  return true
end

local function resources_of(spec)
  local c = config()
  local bo = type(spec.backend_options) == "table" and spec.backend_options or {}
  local labels, resources = {}, {}
  for k, v in pairs(type(bo.label_selector) == "table" and bo.label_selector or {}) do labels[k] = tostring(v) end
  for k, v in pairs(type(bo.resources) == "table" and bo.resources or {}) do resources[k] = tonumber(v) end
  if bo.node_id then labels["ray.io/node-id"] = tostring(bo.node_id) end
  if spec.region then
    local k, v = spec.region:match("^([^=]+)=(.*)$")
    if k then labels[k] = v end
  end
  return { cpus = tonumber(bo.num_cpus) or spec.cpu or c.cpu, memory = spec.memory_mb and math.floor(spec.memory_mb * 1048576) or nil,
           labels = labels, resources = resources }
end

local function create(spec)
  if spec.allow_internet == true then
    -- the node's network reaches the cluster's own ports (its dashboard, GCS)
    fail("FeatureNotSupportedError", "sandboxes on ray have no network (allow_internet = true is not offered)",
         { op = "create" })
  end
  local req = resources_of(spec)
  local ok, why = fits(req)
  if not ok then
    fail("SandboxCreationError", string.format("no node can take %g CPU%s%s (nodes: %s)", req.cpus,
         req.memory and string.format(", %d MiB", req.memory // 1048576) or "",
         next(req.labels) and ", labels " .. json.encode(req.labels) or "", why),
         { op = "create", status = 400, capacity = false })
  end
  local sid = sid_of(spec.id)
  local meta = { ["sbxlua.host"] = hostname(), ["sbxlua.session"] = spec.session, ["sbxlua.id"] = spec.id,
                 ["sbxlua.created"] = tostring(os.time()), ["sbxlua.ttl"] = tostring(spec.ttl),
                 -- a gc from another state directory asks this lock, not its own sessions
                 ["sbxlua.lock"] = owner.lock_path() }
  local h = start(spec, { key = spec.id, sid = sid, metadata = meta, cpus = req.cpus, memory = req.memory,
                          resources = req.resources, labels = req.labels })
  h.id, h.sid, h.session = spec.id, sid, spec.session
  handles[spec.id] = h
  return h
end

local function destroy(h)
  if h.gone then return end
  h.gone = true
  handles[h.id] = nil
  pcall(h.link.close, h.link)
  if h.attach_sid then pcall(retire, h.attach_sid, 3) end
  retire(h.sid, 3)
  -- the agents other processes attached when they resumed it
  local ok, list = pcall(api, "GET", "/api/jobs/", nil, { op = "destroy" })
  for _, j in ipairs(ok and type(list) == "table" and list or {}) do
    local s = type(j.submission_id) == "string" and j.submission_id or ""
    if s:sub(1, #h.sid + 2) == h.sid .. "-a" then pcall(retire, s, 3) end
  end
  sweep(false)
end

local function spawn(h, req)
  return link(h, "exec"):spawn{ argv = req.argv, env = req.env, stdin = req.stdin, keep_stdin = req.keep_stdin,
    cwd = resolve(h, req.cwd or h.home, "exec"), timeout = req.timeout, max_output = req.max_output,
    stream = req.stream, want_pid = req.want_pid }
end

local function dirname(p) return p:match("^(.*)/[^/]*$") end

local ops = {}

-- upload_dir: each host file a chunk at a time over the link.
function ops.put_tree(h, dir, entries)
  local base = resolve(h, dir, "upload_dir")
  local l = link(h, "upload_dir")
  local ok, errno, msg = l:mkdir(base)
  if not ok then file_error(h, "upload_dir", base, errno, msg) end
  for _, e in ipairs(entries) do
    local dest = base .. "/" .. e.path
    if e.type == "dir" then
      ok, errno, msg = l:mkdir(dest)
    elseif e.type == "file" then
      local off, done = 0, false
      ok, errno, msg = l:write_stream(dest, e.mode or tonumber("644", 8), function()
        if done then return nil end
        local data, err = e.src:read_at(e.path, off, 1048576)
        if not data then fail("PathError", "upload_dir: " .. tostring(err), { op = "upload_dir" }) end
        if #data < 1048576 then done = true end
        if data == "" and off > 0 then return nil end
        local at = off
        off = off + #data
        return at, data
      end)
    end
    if not ok then file_error(h, "upload_dir", dest, errno, msg) end
  end
end

-- download_dir: walk with the agent; a symlink that leaves the directory
-- is rejected (its target read with readlink in the sandbox), others are
-- left out.
function ops.get_tree(h, dir)
  local base = resolve(h, dir, "download_dir")
  local l = link(h, "download_dir")
  local entries, rejected = {}, {}
  local function walk(rel)
    local here = rel == "" and base or base .. "/" .. rel
    local list, errno, msg = l:list(here)
    if not list then file_error(h, "download_dir", here, errno, msg) end
    table.sort(list, function(a, b) return a.name < b.name end)
    for _, it in ipairs(list) do
      local r = rel == "" and it.name or rel .. "/" .. it.name
      if it.type == "dir" then
        entries[#entries + 1] = { path = r, type = "dir" }
        walk(r)
      elseif it.type == "file" then
        local data, e2, m2 = l:read_file(base .. "/" .. r, 1 << 32)
        if not data then file_error(h, "download_dir", base .. "/" .. r, e2, m2) end
        local st = l:stat(base .. "/" .. r)
        entries[#entries + 1] = { path = r, type = "file", data = data, mode = st and st.mode }
      elseif it.type == "link" then
        local res = l:spawn{ argv = { "readlink", "--", base .. "/" .. r }, env = { "PATH=/usr/bin:/bin" } }:wait()
        local target = (res.stdout or ""):gsub("\n$", "")
        local depth, out = select(2, r:gsub("/", "")), target == "" or target:sub(1, 1) == "/"
        for seg in target:gmatch("[^/]+") do
          if seg == ".." then depth = depth - 1 if depth < 0 then out = true end
          elseif seg ~= "." then depth = depth + 1 end
        end
        if out then rejected[#rejected + 1] = { path = r, reason = "symlink out of the directory" } end
      end
    end
  end
  walk("")
  return entries, rejected
end

return {
  descriptor = DESCRIPTOR,
  config_schema = {
    address = { type = "string", help = "the dashboard's URL (Jobs API), e.g. http://head:8265" },
    address_env = { type = "env", default = "SBX_RAY_ADDRESS", help = "the variable holding the address when address is not set" },
    token_env = { type = "env", default = "RAY_AUTH_TOKEN", help = "the variable holding the cluster's auth token (RAY_AUTH_MODE=token)" },
    listen_host = { type = "string", default = "127.0.0.1", help = "where this process listens for its sandboxes' agents (IPv4)" },
    listen_port = { type = "integer", default = 0, help = "0: any free port" },
    advertise_host = { type = "string", help = "the address nodes dial (default listen_host)" },
    advertise_port = { type = "integer", help = "the port nodes dial (default the listening one)" },
    isolation = { type = "string", default = "bwrap", help = "bwrap (refuse nodes without it) or process (no boundary)" },
    cpu = { type = "number", default = 0.25, help = "entrypoint_num_cpus of a sandbox that asks no cpu" },
    python = { type = "string", default = "python3", help = "the Python on the nodes that runs the bootstrap" },
    start_timeout = { type = "number", default = 120, help = "seconds for a job to start and dial back" },
    hide_paths = { type = "strings", default = {}, help = "more node paths to hide inside sandboxes" },
  },
  available = available,
  put_tree = ops.put_tree,
  get_tree = ops.get_tree,
  create = create,
  destroy = destroy,
  spawn = spawn,
  session_state = function(h) return { sid = h.sid, node = h.node, home = h.home, session = h.session } end,
  resume = function(state)
    local live = handles[state.id]
    if live and not live.gone then return live end
    local j = job(state.sid, "resume")
    if not j then fail("SandboxNotFoundError", "job " .. state.sid .. " is gone", { op = "resume" }) end
    if TERMINAL[j.status] then job_error(j, "resume") end
    -- another process: a second agent on the same node, in the same directory
    local asid = state.sid .. "-a" .. random_hex(6)
    local h = start({ id = state.id }, { key = state.id .. "/" .. asid, sid = asid, attach = true,
      metadata = { ["sbxlua.host"] = hostname(), ["sbxlua.session"] = state.session, ["sbxlua.id"] = state.id,
                   ["sbxlua.attach"] = "1", ["sbxlua.lock"] = owner.lock_path() },
      cpus = 0, resources = {}, labels = { ["ray.io/node-id"] = j.driver_node_id } })
    h.id, h.sid, h.session, h.attach_sid = state.id, state.sid, state.session, asid
    return h
  end,
  is_alive = function(h)
    if h.gone or h.link.broken then return false end
    local ok, j = pcall(job, h.sid, "is_alive")
    return not ok or (j ~= nil and not TERMINAL[j.status])
  end,
  home = function(h) return h.home end,
  read_file = function(h, path, max)
    local p = resolve(h, path, "read_file")
    local data, errno, msg = link(h, "read_file"):read_file(p, max or 256 * 1024 * 1024)
    if not data then file_error(h, "read_file", p, errno, msg) end
    return data
  end,
  write_file = function(h, path, data, mode)
    local p = resolve(h, path, "write_file")
    if p == "/" then fail("PathError", "write_file: / is a directory", { op = "write_file" }) end
    local l = link(h, "write_file")
    mode = mode or tonumber("644", 8)
    local ok, errno, msg = l:write_file(p, data, mode)
    if not ok and errno == "ENOENT" then
      local dok, derr, dmsg = l:mkdir(dirname(p) ~= "" and dirname(p) or "/")
      if not dok then file_error(h, "write_file", p, derr, dmsg) end
      ok, errno, msg = l:write_file(p, data, mode)
    end
    if not ok then file_error(h, "write_file", p, errno, msg) end
  end,
  list_files = function(h, path)
    local p = resolve(h, path, "list_files")
    local entries, errno, msg = link(h, "list_files"):list(p)
    if not entries then file_error(h, "list_files", p, errno, msg) end
    local prefix = path == "" and "" or (path:sub(-1) == "/" and path or path .. "/")
    for _, e in ipairs(entries) do
      e.path, e.is_dir = prefix .. e.name, e.type == "dir"
      e.size, e.mtime = math.tointeger(e.size), math.tointeger(e.mtime)
    end
    table.sort(entries, function(a, b) return a.name < b.name end)
    return entries
  end,
  stat = function(h, path)
    local p = resolve(h, path, "stat")
    local st, errno, msg = link(h, "stat"):stat(p)
    if not st then file_error(h, "stat", p, errno, msg) end
    return st
  end,
  mkdir = function(h, path)
    local p = resolve(h, path, "mkdir")
    local ok, errno, msg = link(h, "mkdir"):mkdir(p)
    if not ok then file_error(h, "mkdir", p, errno, msg) end
  end,
  remove = function(h, path, recursive)
    local p = resolve(h, path, "remove")
    if p == "/" then fail("PathError", "remove: refusing to remove /", { op = "remove" }) end
    local ok, errno, msg = link(h, "remove"):remove(p, recursive)
    if not ok and errno == "ENOTEMPTY" then fail("PathError", "remove: " .. p .. ": directory not empty", { op = "remove" }) end
    if not ok then file_error(h, "remove", p, errno, msg) end
  end,
  -- gc: every job of this host, found by its submission_id prefix.
  list_owned = function()
    if not address() then return {} end
    local ok, list = pcall(api, "GET", "/api/jobs/", nil, { op = "gc" })
    if not ok then
      if errors.is(list, "AuthenticationError") then error(list, 0) end
      fail("BackendNotInstalledError", "the cluster cannot be asked: " .. tostring(list), { op = "gc" })
    end
    local prefix, out = "sbxlua-" .. hostname() .. "-", {}
    for _, j in ipairs(type(list) == "table" and list or {}) do
      local sid = type(j.submission_id) == "string" and j.submission_id or ""
      if sid:sub(1, #prefix) == prefix then
        local m = type(j.metadata) == "table" and j.metadata or {}
        out[#out + 1] = { id = m["sbxlua.id"] or sid:sub(#prefix + 1), session = m["sbxlua.session"], sid = sid,
                            lock = m["sbxlua.lock"] }
      end
    end
    return out
  end,
  -- gc of a dead session's sandbox: its jobs (and attach jobs) stopped and deleted.
  reap = function(entry)
    local sid = sid_of(entry.id)
    local list = api("GET", "/api/jobs/", nil, { op = "gc" })
    for _, j in ipairs(type(list) == "table" and list or {}) do
      local s = type(j.submission_id) == "string" and j.submission_id or ""
      if s == sid or s:sub(1, #sid + 2) == sid .. "-a" then retire(s, 0, true) end
    end
  end,
  -- a clean exit (or gc): the jobs this process ended are deleted now
  forget_session = function() sweep(true) end,
  doctor = function()
    local ok, why = available()
    if not ok then return { { ok = false, what = "ray cluster", detail = why } } end
    local nok, list = pcall(nodes)
    if not nok then return { { ok = false, what = "ray cluster", detail = tostring(list) } } end
    return { { ok = true, what = "ray cluster", detail = #list .. " node(s) alive at " .. address() } }
  end,
}
