#!/usr/bin/env bash
# bench/ray_peer.sh — sbxlua's ray provider and the peer's ray backend
# (bespokelabs-sandbox, backends/ray.py: a Ray actor per sandbox) side by
# side on ONE cluster in ONE run, interleaved rounds, p50 ms and peer/sbxlua:
# create (until a first `true` ran), destroy, exec `true` (sh -c and exact
# argv), write+read 1 KiB and 8 MiB, 4 and 10 creates at once; then what a
# command inside each one's sandbox sees of the node.
#   bench/ray_peer.sh     ROUNDS=3 NC=3 NE=60 NR=10; QUICK=1: 1 round, small N
# The cluster is spec/support/ray.sh's (token auth on; started, and stopped
# again, when none runs in $SBX_RAY_DIR). The peer is run from source in
# $PEER_DIR (default /tmp/peer; extracted by bench/fetch_peer.sh from
# $PEER_GIT_DIR when absent) with the cluster venv's python (ray 2.60.0, and
# pydantic, the peer's only other dependency, comes with ray[default]).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-3} NC=${NC:-3} NE=${NE:-60} NR=${NR:-10}
if [ "${QUICK:-}" = 1 ]; then ROUNDS=1 NC=1 NE=10 NR=2; fi
export SBX_RAY_DIR=${SBX_RAY_DIR:-$ROOT/build/ray}
PEER_DIR=${PEER_DIR:-/tmp/peer}
PEER_GIT_DIR=${PEER_GIT_DIR:-/work/.mirror/bespokelabsai+sandbox/repo}
SBXLUA=${SBXLUA:-$ROOT/build/sbxlua}
[ -x "$SBXLUA" ] || { echo "ray_peer: no $SBXLUA (build first)" >&2; exit 1; }
if [ ! -d "$PEER_DIR/src/bespokelabs" ]; then
  [ -d "$PEER_GIT_DIR" ] || { echo "ray_peer: no peer in $PEER_DIR and no $PEER_GIT_DIR (see bench/README.md)" >&2; exit 1; }
  "$ROOT/bench/fetch_peer.sh" "$PEER_GIT_DIR" "$PEER_DIR" >&2
fi

started=
[ -f "$SBX_RAY_DIR/cluster.env" ] || started=1
"$ROOT/spec/support/ray.sh" start >/dev/null
work=$(mktemp -d /tmp/ray_peer.XXXXXX)
cleanup() {
  [ -n "$started" ] && "$ROOT/spec/support/ray.sh" stop
  rm -rf "$work"
}
trap cleanup EXIT
# shellcheck disable=SC1091
. "$SBX_RAY_DIR/cluster.env"
PY=$SBX_RAY_VENV/bin/python

# sbxlua: the provider reads the dashboard address and the token's variable.
sbx_side() {
  env SBX_RAY_ADDRESS="$SBX_RAY_ADDRESS" RAY_AUTH_TOKEN="$(cat "$SBX_RAY_TOKEN_FILE")" \
      SBX_STATE_DIR="${SBX_STATE_DIR:-$work/state}" SBX_SOURCE_DIR="$ROOT" \
      "$SBXLUA" "$ROOT/bench/ray_peer.lua" "$@"
}
# The peer: ray.init(address=$RAY_ADDRESS) as a driver over GCS, with the
# client side of token auth (RAY_AUTH_MODE + RAY_AUTH_TOKEN_PATH, Ray 2.60).
# Its actor class is pickled by value but imports bespokelabs.* on the
# worker: Ray puts the driver's working directory on its workers' sys.path
# (the nodes share this filesystem), hence the cd. HOME: no ~/.ray of the
# machine is read or written.
peer_side() {
  mkdir -p "$work/home"
  (cd "$PEER_DIR/src" && env HOME="$work/home" PYTHONPATH="$PEER_DIR/src" \
      RAY_ADDRESS="$SBX_RAY_GCS" RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$SBX_RAY_TOKEN_FILE" \
      RAY_USAGE_STATS_ENABLED=0 "$PY" "$ROOT/bench/peer_ray.py" "$@")
}
run() {  # run SIDE ARGS...: samples to $work/SIDE, the rest to stderr
  local side=$1; shift
  echo "ray_peer: $side $* (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  "${side}_side" "$@" 2>>"$work/$side.log" >>"$work/$side" \
    || { echo "ray_peer: $side $* failed:" >&2; tail -30 "$work/$side.log" >&2; exit 1; }
}

load0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$ROUNDS"); do      # alternate who goes first
  if [ $((r % 2)) = 1 ]; then a=sbx b=peer; else a=peer b=sbx; fi
  run $a round "$NC" "$NE" "$NR"; run $b round "$NC" "$NE" "$NR"
  run $b par 4; run $a par 4
  run $a par 10; run $b par 10
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)

# The probe: literal paths (the peer's prelude rewrites absolute paths after
# a redirect and in the arguments of cat/ls/grep/...: none are used so).
gport=${SBX_RAY_GCS##*:}
PROBE="echo uid \$(id -u)
[ -r '$SBX_RAY_TOKEN_FILE' ] && echo cluster_token_file readable || echo cluster_token_file hidden
[ -d '$SBX_RAY_TMP/session_latest' ] && echo ray_session_dir visible || echo ray_session_dir hidden
echo ray_auth_env_vars \$(env | command grep -c '^RAY_AUTH')
echo node_processes_visible \$(command ls /proc | command grep -c '^[0-9]')
python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", $gport), 3); print(\"gcs_port_$gport reachable\")' 2>&1 | command grep -q reachable && echo gcs_port reachable || echo gcs_port unreachable"
export PROBE
sbx_side probe >"$work/probe.sbx" 2>>"$work/sbx.log"
peer_side probe >"$work/probe.peer" 2>>"$work/peer.log"

"$PY" - "$work" "$load0" "$load1" "$ROUNDS" <<'EOF'
import sys, collections
work, load0, load1, rounds = sys.argv[1:5]
def load(side):
    d = collections.defaultdict(list)
    for line in open("%s/%s" % (work, side)):
        op, ms = line.split()
        d[op].append(float(ms))
    return d
def p50(v):
    s = sorted(v); return s[max(0, min(len(s) - 1, int(.5 * len(s) + .5) - 1))]
S, P = load("sbx"), load("peer")
rows = [("floor: raw job submit -> entrypoint runs", "floor"), ("create (-> first `true` ran)", "create"), ("destroy", "destroy"),
        ('exec "true" (sh -c / bash -c)', "exec_sh"), ("exec true, exact argv", "exec_argv"),
        ("write+read 1 KiB", "rw_1k"), ("write+read 8 MiB", "rw_8m"),
        ("4 creates at once (wall)", "par4"), ("10 creates at once (wall)", "par10")]
print("ray: sbxlua's provider vs the peer's backend, one cluster, %s interleaved rounds" % rounds)
print("sbxlua create / floor: %.2fx" % (p50(S["create"]) / p50(S["floor"])))
print("load average before: %s   after: %s" % (load0, load1))
print("| op (p50 ms) | sbxlua | peer | peer/sbxlua | n |")
print("|---|---|---|---|---|")
for name, op in rows:
    s = p50(S[op])
    if op not in P:
        print("| %s | %.2f | | | %d |" % (name, s, len(S[op]))); continue
    p = p50(P[op])
    print("| %s | %.2f | %.2f | %.2fx | %d / %d |" % (name, s, p, p / s, len(S[op]), len(P[op])))
print()
print("inside a sandbox | sbxlua | peer")
a = dict(l.split(" ", 1) for l in open(work + "/probe.sbx").read().split("\n") if " " in l)
b = dict(l.split(" ", 1) for l in open(work + "/probe.peer").read().split("\n") if " " in l)
for k in ["uid", "cluster_token_file", "ray_session_dir", "ray_auth_env_vars", "node_processes_visible", "gcs_port"]:
    print("%-24s | %s | %s" % (k, a.get(k, "?"), b.get(k, "?")))
EOF
