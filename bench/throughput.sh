#!/usr/bin/env bash
# bench/throughput.sh — commands per second against concurrency, one table:
# local sandboxes (1, 10, 100, 1000 at once) and docker sandboxes (1, 8, 32),
# each row with its floor and the peer measured in the same round, rounds
# interleaved, medians, ratios from this run only.
#
#   bench/throughput.sh            (from anywhere; builds build/sbxlua if needed)
#
# Environment (all optional):
#   SBXLUA=path      binary to measure (default <repo>/build/sbxlua, built RelWithDebInfo)
#   ROUNDS=3         rounds; every row runs sbxlua, floor and peer once per round
#   TOTAL=2000       commands per local row (N sandboxes x TOTAL/N commands each)
#   LOCAL_NS="1 10 100 1000"   DOCKER_NS="1 8 32"   DOCKER_CMDS=10
#   DOCKER=0         skip the docker rows (default: run them when an engine answers)
#   AGENTS=1         add the option-B row: a host sbx-agent per sandbox (slow)
#   PEER_DIR, PEER_GIT_DIR, PYTHON, SBX_STATE_DIR, SBX_BENCH_IMAGE, DOCKER_SOCK: as run.sh / docker.sh
#   QUICK=1          one round, small rows (a smoke test of the script)
#
# The floors: local rows, floor_parallel.c: min(N, cores) processes spawning
# the row's commands between them with posix_spawn, keeping as many alive
# at once as the row's N sandboxes do (FLOOR_DEPTH = N / workers: where a
# process's start and exit wait on wake-ups, as in a VM whose idle vCPU
# halts, one at a time per worker leaves the cores idle and is no floor);
# at sbxlua's loop priority, its children at the original one: FLOOR_BOOST;
# docker rows, engine_floor par: N workers with a connection each doing
# create+start at once, then DELETE at once, over the raw Engine API (the
# part of a job's lifecycle no client avoids; sbxlua's commands go over its
# agent stream, not engine execs). Progress on stderr; the table on stdout.
# The 200 x 10 row also runs floor_contained.c: the same job in C with no
# Lua, keeping what sbxlua keeps (a directory and cgroups per sandbox,
# pipes, a pidfd and epoll per command, src/spawn.c's clone): the part of
# sbxlua's ratio that is its design, not its Lua and bookkeeping.
set -uo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
ROUNDS=${ROUNDS:-3} TOTAL=${TOTAL:-2000}
LOCAL_NS=${LOCAL_NS:-"1 10 100 1000"} DOCKER_NS=${DOCKER_NS:-"1 8 32"} DOCKER_CMDS=${DOCKER_CMDS:-10}
if [ "${QUICK:-}" = 1 ]; then ROUNDS=1 TOTAL=200 LOCAL_NS="1 10 100" DOCKER_NS="1 4"; fi
export SBX_STATE_DIR=${SBX_STATE_DIR:-/tmp/bench-state}
export SBX_BENCH_RUN=$$
IMAGE=${SBX_BENCH_IMAGE:-sbxlua-test:bookworm}
DOCKER_SOCK=${DOCKER_SOCK:-/var/run/docker.sock}
PEER_DIR=${PEER_DIR:-/tmp/peer}
PEER_GIT_DIR=${PEER_GIT_DIR:-/work/.mirror/bespokelabsai+sandbox/repo}
CORES=$(nproc)
TMP=$(mktemp -d /tmp/sbxbench-tput.XXXXXX)
log() { printf '[bench tput] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
engine() { curl -s --max-time 60 --unix-socket "$DOCKER_SOCK" "$@"; }
remove_run() {      # every container labelled sbxbench=$SBX_BENCH_RUN (this run's)
  local ids id
  ids=$(engine -G http://docker/containers/json --data-urlencode all=true \
        --data-urlencode "filters={\"label\":[\"sbxbench=$SBX_BENCH_RUN\"]}" | jq -r '.[].Id' 2>/dev/null)
  for id in $ids; do engine -o /dev/null -X DELETE "http://docker/containers/$id?force=true&v=true"; done
}
cleanup() {
  trap - EXIT INT TERM
  local p; for p in $(jobs -p); do kill "$p" 2>/dev/null; done
  [ "${DOCKER_OK:-0}" = 1 ] && remove_run
  [ "${CG_FLOOR:--}" != - ] && rmdir "$CG_FLOOR"/sbx-*/c "$CG_FLOOR"/sbx-* "$CG_FLOOR" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- setup
if [ -z "${SBXLUA:-}" ]; then
  SBXLUA=$ROOT/build/sbxlua
  log "building $SBXLUA"
  { cmake -S "$ROOT" -B "$ROOT/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
    cmake --build "$ROOT/build" >/dev/null; } || die "build failed"
fi
[ -x "$SBXLUA" ] || die "no sbxlua at $SBXLUA"
AGENT_BIN=$(dirname "$SBXLUA")/sbx-agent
gcc -O2 -std=c11 -o "$TMP/floor_parallel" "$BENCH/floor_parallel.c" || die "floor_parallel.c did not compile"
gcc -O2 -std=c11 -o "$TMP/floor_spawn" "$BENCH/floor_spawn.c" || die "floor_spawn.c did not compile"
gcc -O2 -std=c11 -D_GNU_SOURCE -I"$ROOT/src" -o "$TMP/floor_contained" "$BENCH/floor_contained.c" "$ROOT/src/spawn.c" -lpthread ||
  die "floor_contained.c did not compile"
mkdir -p "$TMP/contained"
# its cgroups go beside sbxlua's (not among them: gc would take it for a
# session), in a directory of this run's ("-": none)
CG_FLOOR=$("$SBXLUA" -e 'local b = require("sbx.cgroup").base() print(b or "")' 2>/dev/null)
if [ -n "$CG_FLOOR" ] && mkdir "${CG_FLOOR%/*}/sbxlua-floor-$$" 2>/dev/null; then
  CG_FLOOR=${CG_FLOOR%/*}/sbxlua-floor-$$
else CG_FLOOR=-; fi
TRUE=$(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin type -P true)
# sbxlua runs its threads SBX_LOOP_BOOST nice steps up where it may, its
# commands at the original nice (docs/README.md, "Running jobs"); the
# local floors do the same (FLOOR_BOOST), so that other processes' load
# favours neither side
BOOST=${SBX_LOOP_BOOST:-5}
nice -n -1 true 2>/dev/null || BOOST=0
DOCKER_OK=0 DOCKER_WHY="DOCKER=0"
if [ "${DOCKER:-1}" != 0 ]; then
  if ! command -v jq >/dev/null || ! command -v curl >/dev/null; then DOCKER_WHY="needs curl and jq"
  elif ! engine -f http://docker/_ping >/dev/null; then DOCKER_WHY="no engine on $DOCKER_SOCK"
  elif ! engine -f "http://docker/images/$IMAGE/json" >/dev/null; then DOCKER_WHY="no image $IMAGE (images/test/build.sh)"
  elif ! gcc -O2 -std=c11 -o "$TMP/engine_floor" "$BENCH/engine_floor.c" -lcurl; then DOCKER_WHY="engine_floor.c did not compile"
  else DOCKER_OK=1; fi
fi
PYTHON=${PYTHON:-python3}
PY=$("$PYTHON" -c 'import sys; print(sys.executable)' 2>/dev/null) || PY=""
if [ ! -d "$PEER_DIR/src/bespokelabs/sandbox" ] && [ -d "$PEER_GIT_DIR" ]; then
  "$BENCH/fetch_peer.sh" "$PEER_GIT_DIR" "$PEER_DIR" >&2
fi
PEER_OK=0
if [ -n "$PY" ] && PYTHONPATH=$PEER_DIR/src "$PY" -c 'import bespokelabs.sandbox' 2>/dev/null; then PEER_OK=1; fi
PEER_DOCKER_OK=0
if [ $PEER_OK = 1 ] && PYTHONPATH=$PEER_DIR/src "$PY" -c 'import docker' 2>/dev/null; then PEER_DOCKER_OK=1; fi

R=$TMP/results    # lines: KEY VALUE (one per round)
: > "$R"
put() { printf '%s %s\n' "$1" "$2" >> "$R"; }
field() { awk -v k="$2" '{for(i=1;i<NF;i++) if($i==k){print $(i+1); exit}}' <<<"$1"; }
# run KEY FIELD CMD...: store FIELD of the command's output line under KEY
run() {
  local key=$1 f=$2 out; shift 2
  if out=$("$@" 2>"$TMP/err") && [ -n "$(field "$out" "$f")" ]; then
    log "$key: $out"; put "$key" "$(field "$out" "$f")"
    for x in vmhwm_kb fd_baseline fd_after ok; do [ -n "$(field "$out" $x)" ] && put "$key.$x" "$(field "$out" $x)"; done
  else
    log "$key failed: $(tail -2 "$TMP/err" | tr '\n' ' ' | cut -c1-200)"
  fi
  return 0
}
med() { awk -v k="$1" '$1==k{print $2}' "$R" | sort -g | awk '{v[NR]=$1} END{if(NR) print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
last() { awk -v k="$1" '$1==k{v=$2} END{print v}' "$R"; }
min() { a=$1 b=$2; [ "$a" -lt "$b" ] && echo "$a" || echo "$b"; }

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
sbx() { "$SBXLUA" "$@"; }
for r in $(seq 1 "$ROUNDS"); do
  log "round $r/$ROUNDS: local"
  run single.sbx p50 sbx "$BENCH/exec_true.lua" 500 args
  run single.floor p50 "$TMP/floor_spawn" 500 "$TRUE"
  for n in $LOCAL_NS 200; do
    k=$((TOTAL / n)); [ "$k" -ge 1 ] || k=1
    [ "$n" = 200 ] && k=10
    run "local.$n.sbx" wall_ms sbx "$BENCH/concurrent.lua" "$n" "$k"
    w=$(min "$n" "$CORES")
    run "local.$n.floor" wall_ms env FLOOR_BOOST="$BOOST" FLOOR_DEPTH=$(((n + w - 1) / w)) "$TMP/floor_parallel" "$w" $((n * k)) "$TRUE"
    [ $PEER_OK = 1 ] && run "local.$n.peer" wall_ms env PYTHONPATH="$PEER_DIR/src" "$PY" "$BENCH/peer_bench.py" concurrent "$n" "$k"
  done
  run local.200.inline wall_ms env SBX_SPAWNER=inline "$SBXLUA" "$BENCH/concurrent.lua" 200 10
  run local.200.contained wall_ms env FLOOR_BOOST="$BOOST" "$TMP/floor_contained" "$CORES" 200 10 "$TMP/contained" "$CG_FLOOR" "$TRUE"
  [ "${AGENTS:-}" = 1 ] && run local.200.agents wall_ms sbx "$BENCH/agent_local.lua" "$AGENT_BIN" 200 10
  if [ $DOCKER_OK = 1 ]; then
    log "round $r/$ROUNDS: docker"
    for n in $DOCKER_NS; do
      run "docker.$n.sbx" wall_ms env SBX_BENCH_IMAGE="$IMAGE" "$SBXLUA" "$BENCH/docker_bench.lua" concurrent "$n" "$DOCKER_CMDS"
      run "docker.$n.floor" wall_ms env DOCKER_SOCK="$DOCKER_SOCK" "$TMP/engine_floor" par "$n" "$IMAGE"
      [ $PEER_DOCKER_OK = 1 ] && run "docker.$n.peer" wall_ms env PYTHONPATH="$PEER_DIR/src" SBX_BENCH_IMAGE="$IMAGE" "$PY" "$BENCH/peer_docker.py" concurrent "$n" "$DOCKER_CMDS"
      remove_run
    done
  fi
done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- table
ratio() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2fx", a/b}' || echo "-"; }
cps() { [ -n "$2" ] && awk -v n="$1" -v w="$2" 'BEGIN{printf "%.0f", n/w*1000}' || echo "-"; }
ms() { [ -n "$1" ] && awk -v w="$1" 'BEGIN{printf "%.0f", w}' || echo "-"; }
verdict() { [ -n "$1" ] && awk -v a="$1" -v op="$2" -v b="$3" 'BEGIN{ok = op == "<=" ? a+0 <= b : a+0 >= b; print ok ? "PASS" : "MISS"}' || echo "n/a"; }
subrow() {   # LABEL KEY [SUFFIX]: another way to run the 200 x 10 row, against its floor
  local s f; s=$(med "$2") f=$(med local.200.floor)
  [ -n "$s" ] || return 0
  printf '%-26s %6s %9s %8s %9s %8s %9s%s\n' "$1" 2000 "$(ms "$s")" "$(cps 2000 "$s")" "$(ms "$f")" \
    "$(cps 2000 "$f")" "$(ratio "$s" "$f")" "${3:-}"
}
row() {   # LABEL CMDS KEY
  local s f p; s=$(med "$3.sbx") f=$(med "$3.floor") p=$(med "$3.peer")
  local hwm; hwm=$(last "$3.sbx.vmhwm_kb")
  printf '%-26s %6s %9s %8s %9s %8s %9s %9s %8s %12s %8s\n' "$1" "$2" "$(ms "$s")" "$(cps "$2" "$s")" \
    "$(ms "$f")" "$(cps "$2" "$f")" "$(ratio "$s" "$f")" "$(ms "$p")" "$(cps "$2" "$p")" \
    "$( [ -n "$p" ] && [ -n "$s" ] && ratio "$p" "$s" || echo -)" \
    "$( [ -n "$hwm" ] && awk -v k="$hwm" 'BEGIN{printf "%.1f", k/1024}' || echo -)"
}
{
  printf 'sbxlua throughput — %s, %d cores, loadavg %s -> %s; median of %d round(s); loop boost %s\n\n' \
    "$(date -u +%Y-%m-%dT%H:%MZ)" "$CORES" "$LOAD0" "$LOAD1" "$ROUNDS" "$BOOST"
  printf '%-26s %6s %9s %8s %9s %8s %9s %9s %8s %12s %8s\n' row cmds "sbxlua ms" "cmds/s" "floor ms" "cmds/s" \
    "vs floor" "peer ms" "cmds/s" "peer/sbxlua" "RSS MB"
  printf '%s\n' "$(printf '%.0s-' $(seq 1 130))"
  for n in $LOCAL_NS; do
    k=$((TOTAL / n)); [ "$k" -ge 1 ] || k=1
    row "local $n x $k" $((n * k)) "local.$n"
  done
  row "local 200 x 10" 2000 local.200
  subrow "  spawns inline (no threads)" local.200.inline
  s=$(med local.200.contained)
  subrow "  contained floor in C" local.200.contained "   (sbxlua/this: $(ratio "$(med local.200.sbx)" "$s"))"
  subrow "  a host agent per sandbox" local.200.agents
  if [ $DOCKER_OK = 1 ]; then
    for n in $DOCKER_NS; do row "docker $n x $DOCKER_CMDS" $((n * DOCKER_CMDS)) "docker.$n"; done
  else
    printf 'docker rows: n/a (%s)\n' "$DOCKER_WHY"
  fi
  [ $PEER_OK = 1 ] || printf 'peer: n/a (not importable from %s; see bench/README.md)\n' "$PEER_DIR"
  echo
  big=$(echo $LOCAL_NS | awk '{print $NF}')
  hb=$(last "local.$big.sbx.vmhwm_kb") h1=$(last "local.$(echo $LOCAL_NS | awk '{print $1}').sbx.vmhwm_kb")
  fb=$(last "local.$big.sbx.fd_baseline") fa=$(last "local.$big.sbx.fd_after")
  [ -n "$hb" ] && [ -n "$h1" ] && printf 'memory: %s sandboxes at once, peak RSS %.1f MB; %.1f kB per sandbox over 1 sandbox (%.1f MB); fds after %s, baseline %s\n' \
    "$big" "$(awk -v k="$hb" 'BEGIN{print k/1024}')" "$(awk -v a="$hb" -v b="$h1" -v n="$big" 'BEGIN{print (a-b)/(n-1)}')" \
    "$(awk -v k="$h1" 'BEGIN{print k/1024}')" "${fa:-?}" "${fb:-?}"
  echo "targets:"
  x=$(awk -v a="$(med single.sbx)" -v b="$(med single.floor)" 'BEGIN{if (a != "" && b > 0) printf "%.2f", a/b}')
  printf '  one command (p50 %s ms) within 1.15x of posix_spawn (%s ms): %sx %s\n' "$(med single.sbx)" "$(med single.floor)" "$x" "$(verdict "$x" "<=" 1.15)"
  x=$(awk -v a="$(med local.200.sbx)" -v b="$(med local.200.floor)" 'BEGIN{if (a != "" && b > 0) printf "%.2f", a/b}')
  printf '  local 200 x 10 within 1.2x of the %d-core floor: %sx %s\n' "$CORES" "$x" "$(verdict "$x" "<=" 1.2)"
  x=$(awk -v a="$(med local.200.contained)" -v b="$(med local.200.floor)" 'BEGIN{if (a != "" && b > 0) printf "%.2f", a/b}')
  [ -n "$x" ] && printf '  (the same job in C, floor_contained.c, is %sx the %d-core floor: what the design costs before any Lua)\n' "$x" "$CORES"
  x=$(awk -v a="$(med local.200.peer)" -v b="$(med local.200.sbx)" 'BEGIN{if (a != "" && b > 0) printf "%.2f", a/b}')
  printf '  local 200 x 10 at least 2x faster than the peer: %sx %s\n' "${x:-n/a}" "$(verdict "$x" ">=" 2)"
  if [ -n "$hb" ]; then
    printf '  local %s at once under 50 MB peak RSS: %.1f MB %s; fds back to baseline: %s\n' "$big" \
      "$(awk -v k="$hb" 'BEGIN{print k/1024}')" "$(verdict "$(awk -v k="$hb" 'BEGIN{print k/1024}')" "<=" 50)" \
      "$( [ "$fa" = "$fb" ] && echo PASS || echo "MISS ($fa vs $fb)")"
  fi
  if [ $DOCKER_OK = 1 ]; then
    big=$(echo $DOCKER_NS | awk '{print $NF}')
    x=$(awk -v a="$(med "docker.$big.sbx")" -v b="$(med "docker.$big.floor")" 'BEGIN{if (a != "" && b > 0) printf "%.2f", a/b}')
    printf '  docker %s x %s within 1.15x of the engine parallel floor: %sx %s\n' "$big" "$DOCKER_CMDS" "$x" "$(verdict "$x" "<=" 1.15)"
    x=$(awk -v a="$(med "docker.$big.peer")" -v b="$(med "docker.$big.sbx")" 'BEGIN{if (a != "" && b > 0) printf "%.2f", a/b}')
    printf '  docker %s x %s at least 2.5x faster than the peer: %sx %s\n' "$big" "$DOCKER_CMDS" "${x:-n/a}" "$(verdict "$x" ">=" 2.5)"
  fi
}
