--- The `bwrap` backend: every command runs in fresh bubblewrap namespaces
--- over the sandbox's own root filesystem, a private host directory.
---
--- What a sandbox sees:
---   /             a private host directory (<state>/bwrap/<session>/<id>.*),
---                 read-write and kept between commands (like a container's layer)
---   /workspace    the working directory (the `workdir` option binds a host
---                 directory there instead)
---   /tmp          part of the root: private, kept between commands
---   /usr /bin /sbin /lib*   the host's, read-only (symlinks mirrored)
---   /etc          the host's, read-only, with everything that is not readable
---                 by everyone hidden (shadow, private keys: an empty file or
---                 directory in their place)
---   /run          a tmpfs of each command (plus what /etc links to there,
---                 such as resolv.conf under systemd-resolved)
---   /proc /dev    the sandbox's own (new pid namespace, minimal devices)
--- Nothing else of the host: no /home, /root, /run, /var, /sys.
---
--- Every command is `bwrap --unshare-user --unshare-pid --unshare-ipc
--- --unshare-uts --unshare-cgroup-try [--unshare-net] --disable-userns
--- --die-with-parent --new-session --cap-drop ALL --clearenv ... -- argv`
--- with a seccomp filter (src/seccomp.c) on fd 3, started by sbx.proc in
--- the sandbox's cgroup: timeouts, output caps, streaming and whole-tree
--- kills are those of every backend.
---
--- The file API resolves paths the way the sandbox does: symlinks are
--- followed inside the sandbox's tree, across its mounts, and every access
--- happens beneath the host directory of one mount (openat2
--- RESOLVE_BENEATH), so a link swapped in meanwhile cannot leave it. /proc
--- and /dev are refused; writes to the read-only parts raise PathError.
---
--- Limits: `cpu`, `memory_mb` and a pids limit (limits.PIDS) through the
--- cgroup controllers the machine has (sbx.limits: v2's when delegated, else
--- a hybrid host's v1 hierarchies); an option no controller can enforce is
--- not claimed, so routing skips bwrap for it and a pinned create raises.
--- Per-process rlimits through backend_options.rlimits; core dumps are off.
---
--- This file is the provider's facade: its operations, each from the part
--- that implements it. Reads and writes of anything else (descriptor,
--- exec_mode, fallback, slirp, WORKDIR, ...) go to common.lua, which every
--- part reads.
---
---   common.lua     descriptor, layout constants, knobs, exec path, raise helpers
---   layout.lua     the host layout, mounts, the bwrap command line, resolv.conf, the agent file
---   holder.lua     the holder per sandbox (namespaces of root and the internet), ids
---   probe.lua      what the machine offers (probe, available), doctor
---   limits.lua     backend_options.rlimits and the cgroup limits of a create
---   lifecycle.lua  create, resume, is_alive, destroy, gc
---   files.lua      sandbox paths as the sandbox resolves them, files and trees
---   exec.lua       the agent link per sandbox, spawn (or a bwrap per command)
local common = require "sbx.providers.builtin.bwrap.common"
local layout = require "sbx.providers.builtin.bwrap.layout"
local holder = require "sbx.providers.builtin.bwrap.holder"
local probe = require "sbx.providers.builtin.bwrap.probe"
local lifecycle = require "sbx.providers.builtin.bwrap.lifecycle"
local files = require "sbx.providers.builtin.bwrap.files"
local exec = require "sbx.providers.builtin.bwrap.exec"

local M = {
  layout = layout.layout, resolv_target = layout.resolv_target, resolv_data = layout.resolv_data,
  ids = holder.ids, as_root = holder.as_root,
  probe = probe.probe, available = probe.available, doctor = probe.doctor,
  create = lifecycle.create, session_state = lifecycle.session_state, resume = lifecycle.resume,
  is_alive = lifecycle.is_alive, destroy = lifecycle.destroy, reap = lifecycle.reap,
  list_owned = lifecycle.list_owned, forget_session = lifecycle.forget_session, home = lifecycle.home,
  read_file = files.read_file, write_file = files.write_file, mkdir = files.mkdir, remove = files.remove,
  list_files = files.list_files, put_tree = files.put_tree, get_tree = files.get_tree,
  link_of = exec.link_of, spawn = exec.spawn,
}

return setmetatable(M, { __index = common, __newindex = common })
