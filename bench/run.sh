#!/usr/bin/env bash
# bench/run.sh — every sbxlua benchmark in one run, one table at the end.
#
#   bench/run.sh                     (from anywhere; builds build/sbxlua if needed)
#
# Environment (all optional):
#   SBXLUA=path        binary to measure (default: <repo>/build/sbxlua, built RelWithDebInfo)
#   SBX_STATE_DIR      state dir for the runs (default /tmp/bench-state)
#   PEER_DIR           extracted peer (default /tmp/peer; see bench/README.md)
#   PEER_GIT_DIR       fetched peer git dir; extracted to PEER_DIR when PEER_DIR is empty
#   PYTHON             python for the peer (default: python3 on PATH, resolved past shims)
#   N_EXEC=500 N_CODE=200 N_START=200 N_SANDBOXES=200 N_CMDS=10
#   QUICK=1            small N everywhere (smoke test of the script itself)
#   DOCKER=1           (or the argument --docker) then run bench/docker.sh too: the
#                      docker backend vs the raw Engine API vs the peer, a second table
set -uo pipefail
[ "${1:-}" = --docker ] && DOCKER=1
BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
N_EXEC=${N_EXEC:-500} N_CODE=${N_CODE:-200} N_START=${N_START:-200}
N_SANDBOXES=${N_SANDBOXES:-200} N_CMDS=${N_CMDS:-10}
if [ "${QUICK:-}" = 1 ]; then N_EXEC=50 N_CODE=20 N_START=20; fi
export SBX_STATE_DIR=${SBX_STATE_DIR:-/tmp/bench-state}
PEER_DIR=${PEER_DIR:-/tmp/peer}
PEER_GIT_DIR=${PEER_GIT_DIR:-/work/.mirror/bespokelabsai+sandbox/repo}
SYS_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin  # an sbxlua local sandbox's PATH
TMP=$(mktemp -d /tmp/sbxbench.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
log() { printf '[bench] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# ---------------------------------------------------------------- setup
if [ -z "${SBXLUA:-}" ]; then
  SBXLUA=$ROOT/build/sbxlua
  log "building $SBXLUA"
  { cmake -S "$ROOT" -B "$ROOT/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
    cmake --build "$ROOT/build" >/dev/null; } || die "build failed"
fi
[ -x "$SBXLUA" ] || die "no sbxlua at $SBXLUA"
command -v gcc >/dev/null || die "gcc missing (apt-get install -y gcc)"
gcc -O2 -std=c11 -o "$TMP/floor_spawn" "$BENCH/floor_spawn.c" || die "floor_spawn.c did not compile"
FLOOR=$TMP/floor_spawn
LUA=$(command -v lua5.4 || true)
if ! command -v hyperfine >/dev/null && [ "$(id -u)" = 0 ]; then
  log "installing hyperfine"; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hyperfine >/dev/null 2>&1
fi
PYTHON=${PYTHON:-python3}
PY=$("$PYTHON" -c 'import sys; print(sys.executable)' 2>/dev/null) || PY=""
SYS_PY=$(PATH=$SYS_PATH command -v python3)     # what execute_code runs in a local sandbox
SH=$(PATH=$SYS_PATH type -P sh) TRUE=$(PATH=$SYS_PATH type -P true)   # type -P: not the builtin

# Peer: extract if needed, then check it imports.
PEER_OK=0 PEER_WHY=""
if [ ! -d "$PEER_DIR/src/bespokelabs/sandbox" ] && [ -d "$PEER_GIT_DIR" ]; then
  "$BENCH/fetch_peer.sh" "$PEER_GIT_DIR" "$PEER_DIR" >&2
fi
if [ -z "$PY" ]; then PEER_WHY="no python3"
elif [ ! -d "$PEER_DIR/src/bespokelabs/sandbox" ]; then PEER_WHY="not fetched: see bench/README.md"
elif ! err=$(PYTHONPATH=$PEER_DIR/src "$PY" -c 'import bespokelabs.sandbox' 2>&1); then
  PEER_WHY="import failed: $(printf '%s' "$err" | tail -1 | cut -c1-60); pip install pydantic docker"
else PEER_OK=1; fi
peer() { PYTHONPATH=$PEER_DIR/src "$PY" "$BENCH/peer_bench.py" "$@"; }

R=$TMP/results   # key value lines
put() { printf '%s %s\n' "$1" "$2" >> "$R"; }
field() { awk -v k="$2" '{for(i=1;i<NF;i++) if($i==k){print $(i+1); exit}}' <<<"$1"; }
# run a measuring command; store its p50 under KEY, or "n/a" with the reason
measure() {  # KEY CMD...
  local key=$1 out; shift
  if out=$("$@" 2>"$TMP/err") && [ -n "$(field "$out" p50)" ]; then
    put "$key" "$(field "$out" p50)"; log "$key: $out"
  else
    put "$key" "n/a"; put "$key.why" "$(tail -1 "$TMP/err" | cut -c1-60)"; log "$key failed: $(tail -3 "$TMP/err")"
  fi
}
: > "$R"
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- 1. start-up
log "start-up ($N_START runs each)"
if command -v hyperfine >/dev/null; then
  cmds=("$SBXLUA -e ''")
  [ -n "$LUA" ] && cmds+=("$LUA -e ''")
  [ -n "$PY" ] && cmds+=("$PY -c pass")
  [ $PEER_OK = 1 ] && cmds+=("$PY -c 'import bespokelabs.sandbox'")
  PYTHONPATH=$PEER_DIR/src hyperfine -N --warmup 10 --runs "$N_START" --export-json "$TMP/start.json" \
    "${cmds[@]}" >/dev/null 2>"$TMP/err" || log "hyperfine failed: $(tail -2 "$TMP/err")"
  med() { jq -r --arg c "$1" '.results[] | select(.command==$c) | .median*1000' "$TMP/start.json" 2>/dev/null; }
  put start.sbx "$(med "${cmds[0]}")"
  [ -n "$LUA" ] && put start.lua "$(med "$LUA -e ''")"
  [ -n "$PY" ] && put start.py "$(med "$PY -c pass")"
  [ $PEER_OK = 1 ] && put start.peer "$(med "$PY -c 'import bespokelabs.sandbox'")"
  START_TOOL="hyperfine -N, median of $N_START"
else  # fallback: posix_spawn loop (same program as the floors)
  measure start.sbx "$FLOOR" "$N_START" "$SBXLUA" -e ''
  [ -n "$LUA" ] && measure start.lua "$FLOOR" "$N_START" "$LUA" -e ''
  [ -n "$PY" ] && measure start.py "$FLOOR" "$N_START" "$PY" -c pass
  [ $PEER_OK = 1 ] && measure start.peer env PYTHONPATH="$PEER_DIR/src" "$FLOOR" "$N_START" "$PY" -c 'import bespokelabs.sandbox'
  START_TOOL="posix_spawn loop, p50 of $N_START"
fi

# ---------------------------------------------------------------- 2. execute_command
log "execute_command ($N_EXEC runs each)"
measure floor.true "$FLOOR" "$N_EXEC" "$TRUE"
measure sbx.args "$SBXLUA" "$BENCH/exec_true.lua" "$N_EXEC" args
measure floor.sh "$FLOOR" "$N_EXEC" "$SH" -c true
measure sbx.sh "$SBXLUA" "$BENCH/exec_true.lua" "$N_EXEC" sh
if [ $PEER_OK = 1 ]; then
  measure peer.args peer exec_args "$N_EXEC"
  measure peer.sh peer exec_sh "$N_EXEC"
fi

# ---------------------------------------------------------------- 3. execute_code
log "execute_code ($N_CODE runs each)"
measure floor.py "$FLOOR" "$N_CODE" "$SYS_PY" -c 'print(1)'
measure sbx.code "$SBXLUA" "$BENCH/exec_code.lua" "$N_CODE"
[ $PEER_OK = 1 ] && measure peer.code peer exec_code "$N_CODE"

# ---------------------------------------------------------------- 4. concurrency
log "$N_SANDBOXES concurrent sandboxes x $N_CMDS commands"
CONC=$("$SBXLUA" "$BENCH/concurrent.lua" "$N_SANDBOXES" "$N_CMDS" 2>"$TMP/err") || log "concurrent failed: $(tail -3 "$TMP/err")"
log "sbxlua: ${CONC:-failed}"
PCONC=""
if [ $PEER_OK = 1 ]; then
  PCONC=$(peer concurrent "$N_SANDBOXES" 2>"$TMP/err") || log "peer concurrent failed: $(tail -3 "$TMP/err")"
  log "peer: ${PCONC:-failed}"
fi
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- table
get() { awk -v k="$1" '$1==k{ $1=""; sub(/^ /,""); print; exit }' "$R"; }
num() { local v; v=$(get "$1"); [[ "$v" =~ ^[0-9.]+$ ]] && echo "$v"; }
fmt() { local v; v=$(num "$1") && printf '%.2f' "$v" || echo "n/a"; }
# row LABEL VALUE_MS BASE_LABEL BASE_KEY RATIO_MODE TARGET
#   RATIO_MODE "over": ratio = value/base (target: <= X); "speedup": base/value (target: >= X); "info"
row() {
  local label=$1 vkey=$2 blabel=$3 bkey=$4 mode=$5 target=$6 v b ratio="-" res="-"
  v=$(num "$vkey"); b=$(num "$bkey")
  if [ -n "$v" ] && [ -n "$b" ]; then
    case $mode in
      over) ratio=$(awk -v a="$v" -v b="$b" 'BEGIN{printf "%.2fx", a/b}')
            [ "$target" != "-" ] && res=$(awk -v a="$v" -v b="$b" -v t="$target" 'BEGIN{print (a/b<=t)?"PASS":"MISS"}');;
      speedup) ratio=$(awk -v a="$v" -v b="$b" 'BEGIN{ if (b>=a) printf "%.2fx faster", b/a; else printf "%.2fx slower", a/b }')
            [ "$target" != "-" ] && res=$(awk -v a="$v" -v b="$b" -v t="$target" 'BEGIN{print (b/a>=t)?"PASS":"MISS"}');;
    esac
    case $mode in over) target="<= ${target}x";; speedup) target=">= ${target}x";; esac
    [ "$6" = "-" ] && target="-"
  elif [[ $bkey == peer.* || $bkey == start.peer ]] && [ -n "$v" ]; then
    local why=$PEER_WHY; [ -z "$why" ] && why=$(get "$bkey.why")
    printf '%-34s %9s  %-30s %s\n' "$label" "$(fmt "$vkey")" "peer: n/a ($why)" ""
    return
  fi
  printf '%-34s %9s  %-28s %9s  %-17s %-10s %s\n' "$label" "$(fmt "$vkey")" "$blabel" "$(fmt "$bkey")" "$ratio" "$target" "$res"
}
absrow() {  # LABEL VALUE UNIT TARGET_TEXT RESULT
  printf '%-34s %9s  %-28s %9s  %-17s %-10s %s\n' "$1" "$2" "$3" "" "" "$4" "$5"
}

echo
echo "sbxlua benchmarks — $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, loadavg $LOAD0 -> $LOAD1"
echo "sbxlua: $SBXLUA ($(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null)$(cd "$ROOT" && git diff --quiet 2>/dev/null || echo '+dirty'))"
if [ $PEER_OK = 1 ]; then echo "peer: bespokelabs-sandbox $(cat "$PEER_DIR/.peer-commit" 2>/dev/null | cut -c1-7) from $PEER_DIR, $("$PY" -V)"
else echo "peer: n/a ($PEER_WHY)"; fi
echo "times in ms (p50); floors: posix_spawn+waitpid (bench/floor_spawn.c); start-up: $START_TOOL"
echo
printf '%-34s %9s  %-28s %9s  %-17s %-10s %s\n' "benchmark" "sbxlua" "vs" "ms" "ratio" "target" "result"
printf -- '-%.0s' {1..115}; echo
S=$(num start.sbx)
absrow "start-up: sbxlua -e ''" "$(fmt start.sbx)" "" "< 5 ms" \
  "$([ -n "$S" ] && awk -v a="$S" 'BEGIN{print (a<5)?"PASS":"MISS"}' || echo MISS)"
row "  vs floor lua5.4 -e ''" start.sbx "lua5.4 -e ''" start.lua over -
row "  vs python3 -c pass" start.sbx "python3 -c pass" start.py speedup -
row "  vs peer import" start.sbx "import bespokelabs.sandbox" start.peer speedup -
row 'execute_command("true", {})' sbx.args "posix_spawn /bin/true" floor.true over 1.3
row "  vs peer" sbx.args 'peer ("true", ["--"])' peer.args speedup 2
row 'execute_command("true")  [sh -c]' sbx.sh "posix_spawn sh -c true" floor.sh over 1.3
row "  vs peer" sbx.sh 'peer ("true") [bash]' peer.sh speedup 2
row "execute_code('print(1)')" sbx.code "python3 -c 'print(1)'" floor.py over 1.1
row "  vs peer" sbx.code "peer execute_code" peer.code speedup -
if [ -n "$CONC" ]; then
  label="$N_SANDBOXES sandboxes x $N_CMDS cmds"
  okv=$(field "$CONC" ok); wall=$(field "$CONC" wall_ms); hwm=$(field "$CONC" vmhwm_kb)
  fb=$(field "$CONC" fd_baseline); fa=$(field "$CONC" fd_after); f0=$(field "$CONC" fd_start)
  absrow "$label: completes" "$(field "$CONC" cmds) cmds" "" "all ok" "$([ "$okv" = true ] && echo PASS || echo MISS)"
  if [ -n "$PCONC" ]; then
    pw=$(field "$PCONC" wall_ms)
    printf '%-34s %9.2f  %-28s %9.2f  %-17s %-10s %s\n' "  wall time" "$wall" "peer (200 threads)" "$pw" \
      "$(awk -v a="$wall" -v b="$pw" 'BEGIN{ if (b>=a) printf "%.2fx faster", b/a; else printf "%.2fx slower", a/b }')" "-" "-"
    printf '%-34s %9.1f  %-28s %9.1f  %-17s %-10s %s\n' "  peak RSS (VmHWM, MB)" "$(awk -v k="$hwm" 'BEGIN{print k/1024}')" \
      "peer ru_maxrss MB" "$(awk -v k="$(field "$PCONC" vmhwm_kb)" 'BEGIN{print k/1024}')" "" "< 30 MB" \
      "$(awk -v k="$hwm" 'BEGIN{print (k/1024<30)?"PASS":"MISS"}')"
  else
    absrow "  wall time" "$wall" "" "-" "-"
    absrow "  peak RSS (VmHWM, MB)" "$(awk -v k="$hwm" 'BEGIN{printf "%.1f", k/1024}')" "" "< 30 MB" \
      "$(awk -v k="$hwm" 'BEGIN{print (k/1024<30)?"PASS":"MISS"}')"
    absrow "  vs peer" "" "peer: n/a ($PEER_WHY)" "" ""
  fi
  absrow "  fds: start/baseline/after" "$f0/$fb/$fa" "" "after=base" "$([ "$fa" = "$fb" ] && echo PASS || echo MISS)"
else
  absrow "$N_SANDBOXES sandboxes x $N_CMDS cmds" "failed" "" "completes" "MISS"
fi

# ---------------------------------------------------------------- backends side by side
# local, bwrap and docker, each through sbx-agent and its fallback (bench/backends.lua)
echo
"$SBXLUA" "$BENCH/backends.lua" || log "bench/backends.lua failed"

# ---------------------------------------------------------------- docker (optional)
if [ "${DOCKER:-}" = 1 ]; then
  SBXLUA=$SBXLUA PEER_DIR=$PEER_DIR PYTHON=$PYTHON "$BENCH/docker.sh"
fi
