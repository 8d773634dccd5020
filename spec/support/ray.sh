#!/usr/bin/env bash
# A real Ray cluster on this machine for the ray provider's specs and bench:
#   spec/support/ray.sh install    a venv with ray[default]==$RAY_VERSION (once)
#   spec/support/ray.sh start      install, then a head and a second node
#                                  (label sbx.node=b) with token auth; prints
#                                  the env file; a running one is reused
#   spec/support/ray.sh add-node N one more node (label sbx.node=N, resource
#                                  "node_N": 1, no CPUs: only jobs that ask
#                                  for node_N land there)
#   spec/support/ray.sh stop       stop exactly the processes it started
#   spec/support/ray.sh use PID    start (or reuse) for spec process PID; prints the env file
#   spec/support/ray.sh unuse PID  PID is done: the last live user stops a cluster
#                                  a spec started (never the one ./dev started)
#   spec/support/ray.sh env        the env file of the running cluster
# Everything lives under $SBX_RAY_DIR (default build/ray): the venv, and the
# env file (cluster.env) naming the cluster's address, token file, temp dir
# and HOME. The cluster's own files go in a short private /tmp/sbxray.XXXXXX
# (Ray's unix socket paths must stay short), with a HOME of its own so no
# ~/.ray of the machine is read or written. Ports are free ones picked at
# start (other services listen on 127.0.0.1 here). Every process the cluster
# starts inherits SBXRAY_CLUSTER=<its id>: stop signals exactly those (never
# `ray stop`, which stops every Ray of the user on the machine).
set -euo pipefail
cd "$(dirname "$0")/../.."
RAY_VERSION=2.60.0
DIR=${SBX_RAY_DIR:-$PWD/build/ray}
VENV=$DIR/venv
ENVF=$DIR/cluster.env
PY=${SBX_RAY_PYTHON:-/usr/bin/python3}
mkdir -p "$DIR"

log() { echo "ray.sh: $*" >&2; }

install() {
  if [ -f "$VENV/.ok-$RAY_VERSION" ]; then return 0; fi
  log "installing ray[default]==$RAY_VERSION into $VENV"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "ray[default]==$RAY_VERSION" >&2
  touch "$VENV/.ok-$RAY_VERSION"
}

# Free TCP ports on 127.0.0.1 (bound and released; the kernel does not hand
# the same one out again right away).
free_ports() {
  "$PY" - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# The pids of processes whose environment holds SBXRAY_CLUSTER=$1 (and,
# with $2, SBXRAY_NODE=$2).
cluster_pids() {
  local files
  # one grep over every environment (NUL-separated entries)
  files=$(grep -lszx "SBXRAY_CLUSTER=$1" /proc/[0-9]*/environ 2>/dev/null || true)
  [ -n "$files" ] && [ -n "${2:-}" ] && files=$(echo "$files" | xargs grep -lszx "SBXRAY_NODE=$2" 2>/dev/null || true)
  local f
  for f in $files; do
    f=${f#/proc/}; f=${f%/environ}
    [ "$f" != $$ ] && echo "$f"
  done
  return 0
}

healthy() {
  [ -f "$ENVF" ] || return 1
  # shellcheck disable=SC1090
  . "$ENVF"
  local n
  n=$(curl -sf -H "Authorization: Bearer $(cat "$SBX_RAY_TOKEN_FILE")" \
        "$SBX_RAY_ADDRESS/api/v0/nodes?limit=100" 2>/dev/null \
      | "$PY" -c 'import json,sys; d=json.load(sys.stdin); print(sum(1 for n in d["data"]["result"]["result"] if n["state"]=="ALIVE"))' 2>/dev/null) || return 1
  [ "${n:-0}" -ge 2 ]
}

# start_node NAME ARGS...: one `ray start` with the cluster's environment.
start_node() {
  local name=$1; shift
  local ports
  read -r -a ports <<<"$(free_ports 6)"
  env SBXRAY_CLUSTER="$SBX_RAY_ID" SBXRAY_NODE="$name" HOME="$SBX_RAY_HOME" TMPDIR="$SBX_RAY_TMP" \
      RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$SBX_RAY_TOKEN_FILE" \
      "$VENV/bin/ray" start --disable-usage-stats \
      --node-manager-port="${ports[0]}" --object-manager-port="${ports[1]}" \
      --dashboard-agent-listen-port="${ports[2]}" --dashboard-agent-grpc-port="${ports[3]}" \
      --metrics-export-port="${ports[4]}" --runtime-env-agent-port="${ports[5]}" \
      --min-worker-port="$SBX_RAY_WORKER_MIN" --max-worker-port="$SBX_RAY_WORKER_MAX" \
      "$@" >"$SBX_RAY_TMP/start-$name.log" 2>&1 \
    || { log "ray start ($name) failed:"; tail -20 "$SBX_RAY_TMP/start-$name.log" >&2; return 1; }
}

wait_nodes() {  # wait until $1 nodes are alive
  local i n
  for i in $(seq 120); do
    n=$(curl -sf -H "Authorization: Bearer $(cat "$SBX_RAY_TOKEN_FILE")" \
          "$SBX_RAY_ADDRESS/api/v0/nodes?limit=100" 2>/dev/null \
        | "$PY" -c 'import json,sys; d=json.load(sys.stdin); print(sum(1 for n in d["data"]["result"]["result"] if n["state"]=="ALIVE"))' 2>/dev/null) || n=0
    [ "${n:-0}" -ge "$1" ] && return 0
    sleep 0.5
  done
  log "the cluster has ${n:-0} of $1 nodes alive after 60 s"
  return 1
}

start() {
  install
  if healthy; then cat "$ENVF"; return 0; fi
  [ -f "$ENVF" ] && stop
  rm -f "$DIR/by-spec"
  local tmp ports
  tmp=$(mktemp -d /tmp/sbxray.XXXXXX)
  SBX_RAY_TMP=$tmp SBX_RAY_HOME=$tmp/home SBX_RAY_TOKEN_FILE=$tmp/token SBX_RAY_ID=${tmp#/tmp/sbxray.}
  mkdir -p "$SBX_RAY_HOME"
  od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$SBX_RAY_TOKEN_FILE"
  chmod 600 "$SBX_RAY_TOKEN_FILE"
  read -r -a ports <<<"$(free_ports 3)"
  SBX_RAY_GCS=127.0.0.1:${ports[0]} SBX_RAY_ADDRESS=http://127.0.0.1:${ports[1]}
  # a worker port range of our own, away from the usual 10002-19999
  SBX_RAY_WORKER_MIN=$((20000 + (RANDOM % 200) * 100)) SBX_RAY_WORKER_MAX=$((SBX_RAY_WORKER_MIN + 99))
  {
    echo "SBX_RAY_ID=$SBX_RAY_ID"
    echo "SBX_RAY_ADDRESS=$SBX_RAY_ADDRESS"
    echo "SBX_RAY_GCS=$SBX_RAY_GCS"
    echo "SBX_RAY_TOKEN_FILE=$SBX_RAY_TOKEN_FILE"
    echo "SBX_RAY_TMP=$SBX_RAY_TMP"
    echo "SBX_RAY_HOME=$SBX_RAY_HOME"
    echo "SBX_RAY_VENV=$VENV"
    echo "SBX_RAY_WORKER_MIN=$SBX_RAY_WORKER_MIN"
    echo "SBX_RAY_WORKER_MAX=$SBX_RAY_WORKER_MAX"
  } >"$ENVF.new"
  mv "$ENVF.new" "$ENVF"
  log "starting a head and node b (id $SBX_RAY_ID, dashboard $SBX_RAY_ADDRESS)"
  start_node head --head --port="${ports[0]}" --dashboard-host=127.0.0.1 --dashboard-port="${ports[1]}" \
    --ray-client-server-port="${ports[2]}" --temp-dir="$SBX_RAY_TMP" --num-cpus=2 --labels=sbx.node=head \
    || { stop; return 1; }
  start_node b --address="$SBX_RAY_GCS" --num-cpus=1 --labels=sbx.node=b --resources='{"node_b": 1}' \
    || { stop; return 1; }
  wait_nodes 2 || { stop; return 1; }
  cat "$ENVF"
}

add_node() {
  [ -f "$ENVF" ] || { log "no cluster (start first)"; return 1; }
  # shellcheck disable=SC1090
  . "$ENVF"
  local have
  have=$(curl -sf -H "Authorization: Bearer $(cat "$SBX_RAY_TOKEN_FILE")" \
           "$SBX_RAY_ADDRESS/api/v0/nodes?limit=100" \
         | "$PY" -c 'import json,sys; d=json.load(sys.stdin); print(sum(1 for n in d["data"]["result"]["result"] if n["state"]=="ALIVE"))')
  start_node "$1" --address="$SBX_RAY_GCS" --num-cpus=0 --labels="sbx.node=$1" --resources="{\"node_$1\": 1}"
  wait_nodes $((have + 1))
}

stop() {
  [ -f "$ENVF" ] || return 0
  # shellcheck disable=SC1090
  . "$ENVF"
  local pids i
  pids=$(cluster_pids "$SBX_RAY_ID")
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    for i in $(seq 50); do
      pids=$(cluster_pids "$SBX_RAY_ID")
      [ -z "$pids" ] && break
      sleep 0.2
    done
    if [ -n "$pids" ]; then
      # shellcheck disable=SC2086
      kill -KILL $pids 2>/dev/null || true
      for i in $(seq 25); do [ -z "$(cluster_pids "$SBX_RAY_ID")" ] && break; sleep 0.2; done
    fi
  fi
  case "$SBX_RAY_TMP" in /tmp/sbxray.*) rm -rf "$SBX_RAY_TMP" ;; esac
  rm -f "$ENVF" "$DIR/by-spec"
  log "stopped cluster $SBX_RAY_ID"
}

# use PID / unuse PID: specs running in parallel share one cluster; the last
# of them to finish stops it when one of them started it.
use() {
  local fresh=0
  healthy || fresh=1
  start
  mkdir -p "$DIR/users"
  : >"$DIR/users/$1"
  [ "$fresh" = 1 ] && : >"$DIR/by-spec"
  return 0
}
unuse() {
  local f
  rm -f "$DIR/users/$1"
  for f in "$DIR"/users/*; do
    [ -e "$f" ] || continue
    if [ -d "/proc/${f##*/}" ]; then return 0; fi
    rm -f "$f"                   # a user that died without saying so
  done
  if [ -f "$DIR/by-spec" ]; then stop; fi
  return 0
}

# kill-node N [SIG]: signal node N's raylet (the specs' node failure).
kill_node() {
  # shellcheck disable=SC1090
  . "$ENVF"
  local p
  for p in $(cluster_pids "$SBX_RAY_ID" "$1"); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = raylet ] && kill "-${2:-KILL}" "$p" && echo "$p"
  done
}

# one start or stop at a time (specs run in parallel)
exec 9>"$DIR/lock"
flock 9
case "${1:-}" in
  install) install ;;
  start) start ;;
  add-node) add_node "$2" ;;
  kill-node) kill_node "$2" "${3:-KILL}" ;;
  pids) . "$ENVF"; cluster_pids "$SBX_RAY_ID" "${2:-}" ;;
  stop) stop ;;
  use) use "$2" ;;
  unuse) unuse "$2" ;;
  env) cat "$ENVF" ;;
  *) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
