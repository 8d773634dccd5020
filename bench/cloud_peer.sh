#!/usr/bin/env bash
# bench/cloud_peer.sh — e2b, daytona and tensorlake on their stand-ins, one
# run, one table: sbxlua (bench/cloud_peer.lua, through the provider
# script), the provider's official Python SDK, and the peer
# (bespokelabs-sandbox, run from source) using that SDK
# (bench/peer_cloud.py): create+destroy, exec `true`, write+read of 1 KiB;
# p50 ms and peer/sbxlua, SDK/sbxlua. The three clients take turns in
# ROUNDS rounds per provider (sbxlua, SDK, peer, next round), so drift of
# the shared machine's load spreads over all three columns.
#
#   bench/cloud_peer.sh                 ROUNDS=6 N_CREATE=2 N_EXEC=15 N_RW=15 (per round and client; ~7 min)
#   QUICK=1 bench/cloud_peer.sh         1 round, 2/5/5
#   PROVIDERS="daytona" bench/cloud_peer.sh
#   E2B_SCALE=0 bench/cloud_peer.sh     e2b stand-in with a bwrap sandbox behind each sandbox
#                                       (default: --scale, no process behind: the wire only)
#
# The peer is looked for in PEER_DIR (default /tmp/peer), extracted there by
# bench/fetch_peer.sh from PEER_GIT_DIR when absent; its venv per provider
# (spec/support/pyvenv.sh, build/pyvenv/peer-PROVIDER) holds the SDK at the
# version bench/{e2b,daytona,tensorlake}.sh use plus what the peer imports.
# A client that cannot run gets "n/a: reason" in its cells.
set -uo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
SBXLUA=${SBXLUA:-$ROOT/build/sbxlua}
ROUNDS=${ROUNDS:-6} N_CREATE=${N_CREATE:-2} N_EXEC=${N_EXEC:-15} N_RW=${N_RW:-15}
if [ "${QUICK:-}" = 1 ]; then ROUNDS=1 N_CREATE=2 N_EXEC=5 N_RW=5; fi
PROVIDERS=${PROVIDERS:-e2b daytona tensorlake}
PEER_DIR=${PEER_DIR:-/tmp/peer}
PEER_GIT_DIR=${PEER_GIT_DIR:-/work/.mirror/bespokelabsai+sandbox/repo}
W=$(mktemp -d /tmp/sbxbench-cloudpeer.XXXXXX)
log() { printf '[cloud_peer] %s\n' "$*" >&2; }
STANDIN=
stop_standin() {
  if [ -n "$STANDIN" ]; then kill -TERM "$STANDIN" 2>/dev/null; wait "$STANDIN" 2>/dev/null; STANDIN=; fi
}
cleanup() { trap - EXIT INT TERM; stop_standin; rm -rf "$W"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
cd "$ROOT"

if [ ! -x "$SBXLUA" ]; then
  log "building $SBXLUA"
  (cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null && cmake --build build >/dev/null) \
    || { log "build failed"; exit 1; }
fi
if [ ! -d "$PEER_DIR/src/bespokelabs" ] && [ -d "$PEER_GIT_DIR" ]; then
  "$BENCH/fetch_peer.sh" "$PEER_GIT_DIR" "$PEER_DIR" >&2 || true
fi
[ -f "$PEER_DIR/.peer-commit" ] && log "peer $(cat "$PEER_DIR/.peer-commit") from $PEER_DIR"

# start_standin PROVIDER: the stand-in as its own process (its sandboxes in
# its own state directory, destroyed when it stops); sets URL, KEY, the env.
start_standin() {
  local p=$1 args
  rm -f "$W/port"
  KEY=bench-$p-$$
  case $p in
    e2b) args=(spec/support/standin/e2b.lua --api-key "$KEY")
         [ "${E2B_SCALE:-1}" = 1 ] && args+=(--scale) ;;
    daytona) args=(spec/support/standin/daytona.lua --key "$KEY" --parent $$ --max-cpu 64) ;;
    tensorlake) args=(spec/support/standin/tensorlake.lua --api-key "$KEY") ;;
  esac
  SBX_STATE_DIR=$W/standin-$p "$SBXLUA" "${args[@]}" --port-file "$W/port" 2>"$W/standin-$p.log" &
  STANDIN=$!
  for _ in $(seq 200); do [ -s "$W/port" ] && break; sleep 0.05; done
  [ -s "$W/port" ] || { log "the $p stand-in did not start: $(tail -3 "$W/standin-$p.log")"; return 1; }
  URL=http://127.0.0.1:$(cat "$W/port")
  case $p in
    e2b) ENV=(E2B_API_KEY="$KEY" E2B_API_URL="$URL" E2B_SANDBOX_URL="$URL") ;;
    daytona) ENV=(DAYTONA_API_KEY="$KEY" DAYTONA_API_URL="$URL") ;;
    tensorlake) ENV=(TENSORLAKE_API_KEY="$KEY" TENSORLAKE_API_URL="$URL") ;;
  esac
}

# count_left PROVIDER: how many sandboxes the SDK lists on the stand-in
count_left() {
  [ -n "$PY" ] || return 0
  env "${ENV[@]}" HOME="$W" "$PY" "$BENCH/peer_cloud.py" left "$1" 2>"$W/left.err" | sed -n 's/^left //p'
}

venv_pkgs() {
  case $1 in
    e2b) echo "e2b==2.63.0 e2b-code-interpreter==2.11.5 pydantic" ;;   # the peer imports e2b_code_interpreter
    daytona) echo "daytona==0.226.1 pydantic" ;;
    tensorlake) echo "tensorlake==0.5.163 pydantic" ;;
  esac
}

ROWS=$W/rows
: > "$ROWS"
LOADS=()
for p in $PROVIDERS; do
  echo "provider $p" >> "$ROWS"
  # shellcheck disable=SC2046
  if ! PY=$("$ROOT/spec/support/pyvenv.sh" "peer-$p" $(venv_pkgs "$p") 2>"$W/venv.err"); then
    PY=; reason=$(tail -1 "$W/venv.err")
    echo "na $p sdk no venv: $reason" >> "$ROWS"; echo "na $p peer no venv: $reason" >> "$ROWS"
  fi
  start_standin "$p" || { echo "na $p sbxlua the stand-in did not start" >> "$ROWS"; continue; }
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  log "$p: stand-in $URL; load $load0; $ROUNDS rounds of create x$N_CREATE, exec x$N_EXEC, write+read x$N_RW"
  skip=" "
  if [ -n "$PY" ] && ! env "${ENV[@]}" PYTHONPATH="$PEER_DIR/src" "$PY" -c \
       "from bespokelabs.sandbox import SandboxClient; SandboxClient('$p')" 2>"$W/peer.err"; then
    echo "na $p peer cannot load: $(tail -1 "$W/peer.err")" >> "$ROWS"; skip+="peer "
  fi
  declare -A LEFT=([sbxlua]=0 [sdk]=0 [peer]=0)
  before=$(count_left "$p")
  for r in $(seq "$ROUNDS"); do
    for who in sbxlua sdk peer; do
      case "$skip" in *" $who "*) continue ;; esac
      [ -z "$PY" ] && [ "$who" != sbxlua ] && continue
      if [ "$who" = sbxlua ]; then
        cmd=("$SBXLUA" "$BENCH/cloud_peer.lua" "$p")
      else
        cmd=("$PY" "$BENCH/peer_cloud.py" "$who" "$p")
      fi
      if ! env "${ENV[@]}" SBX_STATE_DIR="$W/sbx" HOME="$W" PYTHONPATH="$PEER_DIR/src" \
           "${cmd[@]}" "$N_CREATE" "$N_EXEC" "$N_RW" >> "$ROWS" 2>"$W/err"; then
        why=$(grep -v '^\s*$' "$W/err" | tail -1)
        log "$p $who round $r failed: $why"
        echo "na $p $who failed: ${why:-exit status}" >> "$ROWS"; skip+="$who "
      fi
      after=$(count_left "$p")
      if [ -n "$before" ] && [ -n "$after" ]; then LEFT[$who]=$((LEFT[$who] + after - before)); fi
      before=$after
      log "$p round $r $who done (sandboxes listed on the stand-in: ${after:-?})"
    done
  done
  left="sandboxes left running after destroy (listed by the SDK): sbxlua ${LEFT[sbxlua]}, SDK ${LEFT[sdk]}, peer ${LEFT[peer]}"
  [ -z "$PY" ] && left="no SDK to list what is left"
  log "$p: $left"
  LOADS+=("$p: load $load0 -> $(cut -d' ' -f1-3 /proc/loadavg); $left")
  stop_standin
done
[ "${KEEP_ROWS:-}" ] && cp "$ROWS" "$KEEP_ROWS"
mode=$([ "${E2B_SCALE:-1}" = 1 ] && echo "--scale: no process behind a sandbox" || echo "a bwrap sandbox behind each")
printf '# on the stand-ins (e2b %s; daytona, tensorlake: a bwrap sandbox behind each); %s rounds x %s/%s/%s per client\n' \
  "$mode" "$ROUNDS" "$N_CREATE" "$N_EXEC" "$N_RW"
for l in "${LOADS[@]}"; do printf '# %s\n' "$l"; done
python3 "$BENCH/peer_cloud.py" table "$ROWS"
