#!/usr/bin/env bash
# bench/docker.sh — the docker backend on a real engine, one run, one table:
# sbxlua vs the raw Engine API (the same calls with libcurl on the socket,
# bench/engine_floor.c) vs the Python peer's docker backend (docker-py).
#
#   bench/docker.sh                  (or: DOCKER=1 bench/run.sh, after the local table)
#
# Environment (all optional):
#   SBXLUA=path          binary to measure (default: <repo>/build/sbxlua, built RelWithDebInfo)
#   SBX_BENCH_IMAGE      image (default sbxlua-test:bookworm; built by images/test/build.sh if missing)
#   DOCKER_SOCK          engine socket (default /var/run/docker.sock)
#   PEER_DIR, PEER_GIT_DIR, PYTHON   as in run.sh
#   N_CREATE=20 N_DEXEC=200 N_RW=200 N_DSB=32 N_DCMDS=10 ROUNDS=4
#   QUICK=1              small N (smoke test of the script)
# Every container is labelled sbxbench=<this script's pid> (floor and peer ones
# are also named sbxbench-*); they are removed on exit, even on failure, and a
# run first removes those of earlier runs whose script is no longer alive.
set -uo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
N_CREATE=${N_CREATE:-20} N_DEXEC=${N_DEXEC:-200} N_RW=${N_RW:-200}
N_DSB=${N_DSB:-32} N_DCMDS=${N_DCMDS:-10} ROUNDS=${ROUNDS:-4}
if [ "${QUICK:-}" = 1 ]; then N_CREATE=4 N_DEXEC=20 N_RW=20 N_DSB=4 ROUNDS=2; fi
export SBX_BENCH_IMAGE=${SBX_BENCH_IMAGE:-sbxlua-test:bookworm}
export DOCKER_SOCK=${DOCKER_SOCK:-/var/run/docker.sock}
export SBX_STATE_DIR=${SBX_STATE_DIR:-/tmp/bench-state}
export SBX_BENCH_RUN=$$
IMAGE=$SBX_BENCH_IMAGE
PEER_DIR=${PEER_DIR:-/tmp/peer}
PEER_GIT_DIR=${PEER_GIT_DIR:-/work/.mirror/bespokelabsai+sandbox/repo}
TMP=$(mktemp -d /tmp/sbxbench-docker.XXXXXX)
log() { printf '[bench docker] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
engine() { curl -s --max-time 60 --unix-socket "$DOCKER_SOCK" "$@"; }

# ---------------------------------------------------------------- cleanup
# remove_run VALUE: every container labelled sbxbench=VALUE
remove_run() {
  local filters ids id
  filters=$(jq -cn --arg l "sbxbench=$1" '{label: [$l]}')
  ids=$(engine -G "http://docker/containers/json" --data-urlencode all=true \
        --data-urlencode "filters=$filters" | jq -r '.[].Id' 2>/dev/null)
  for id in $ids; do engine -o /dev/null -X DELETE "http://docker/containers/$id?force=true&v=true"; done
  [ -z "$ids" ] || log "removed $(wc -w <<<"$ids") container(s) of run $1"
}
cleanup() {
  trap - EXIT INT TERM
  # the drivers are children of this script: stop those still running first
  local p; for p in $(jobs -p); do kill "$p" 2>/dev/null; done
  remove_run "$SBX_BENCH_RUN"
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- setup
for t in curl jq gcc; do command -v $t >/dev/null || die "$t missing (apt-get install -y $t)"; done
engine -f http://docker/_ping >/dev/null || die "no Docker engine answers on $DOCKER_SOCK (images/test/dockerd.sh starts one)"
# leftovers of earlier runs whose script died without its trap (SIGKILL)
for run in $(engine -G http://docker/containers/json --data-urlencode all=true \
             --data-urlencode 'filters={"label":["sbxbench"]}' | jq -r '.[].Labels.sbxbench' | sort -u); do
  { [[ $run =~ ^[0-9]+$ ]] && kill -0 "$run" 2>/dev/null; } || remove_run "$run"
done
if ! engine -f "http://docker/images/$IMAGE/json" >/dev/null; then
  [ "$IMAGE" = sbxlua-test:bookworm ] || die "image $IMAGE is not on the engine"
  log "image $IMAGE missing: building it (images/test/build.sh)"
  "$ROOT/images/test/build.sh" >&2 || die "images/test/build.sh failed"
fi
if [ -z "${SBXLUA:-}" ]; then
  SBXLUA=$ROOT/build/sbxlua
  log "building $SBXLUA"
  { cmake -S "$ROOT" -B "$ROOT/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
    cmake --build "$ROOT/build" >/dev/null; } || die "build failed"
fi
[ -x "$SBXLUA" ] || die "no sbxlua at $SBXLUA"
gcc -O2 -std=c11 -o "$TMP/engine_floor" "$BENCH/engine_floor.c" -lcurl ||
  die "engine_floor.c did not compile (apt-get install -y libcurl4-openssl-dev)"
FLOOR=$TMP/engine_floor
PYTHON=${PYTHON:-python3}
PY=$("$PYTHON" -c 'import sys; print(sys.executable)' 2>/dev/null) || PY=""
PEER_OK=0 PEER_WHY=""
if [ ! -d "$PEER_DIR/src/bespokelabs/sandbox" ] && [ -d "$PEER_GIT_DIR" ]; then
  "$BENCH/fetch_peer.sh" "$PEER_GIT_DIR" "$PEER_DIR" >&2
fi
if [ -z "$PY" ]; then PEER_WHY="no python3"
elif [ ! -d "$PEER_DIR/src/bespokelabs/sandbox" ]; then PEER_WHY="not fetched: see bench/README.md"
elif ! err=$(PYTHONPATH=$PEER_DIR/src "$PY" -c 'import docker, bespokelabs.sandbox' 2>&1); then
  PEER_WHY="import failed: $(printf '%s' "$err" | tail -1 | cut -c1-50); pip install docker"
else PEER_OK=1; fi
peer() { PYTHONPATH=$PEER_DIR/src "$PY" "$BENCH/peer_docker.py" "$@"; }
sbxj() { "$SBXLUA" "$BENCH/docker_bench.lua" "$@"; }

R=$TMP/results
: > "$R"
put() { printf '%s %s\n' "$1" "$2" >> "$R"; }
get() { awk -v k="$1" '$1==k{ $1=""; sub(/^ /,""); print; exit }' "$R"; }
field() { awk -v k="$2" '{for(i=1;i<NF;i++) if($i==k){print $(i+1); exit}}' <<<"$1"; }
# sample KEY CMD...: run a driver, append its "s <ms>" lines to $TMP/s.KEY
sample() {
  local key=$1 out; shift
  [ -f "$TMP/failed.$key" ] && return
  if out=$("$@" 2>"$TMP/err") && grep -q '^s ' <<<"$out"; then
    grep '^s ' <<<"$out" | cut -d' ' -f2 >> "$TMP/s.$key"
    log "$key: $(tail -1 <<<"$out")"
  else
    touch "$TMP/failed.$key"; put "$key.why" "$(tail -1 "$TMP/err" | cut -c1-60)"
    log "$key failed: $(tail -3 "$TMP/err")"
  fi
}
# p50 (nearest rank, as common.lua) of every sample of KEY
p50() {
  [ -s "$TMP/s.$1" ] && [ ! -f "$TMP/failed.$1" ] || return 1
  sort -g "$TMP/s.$1" | awk '{v[NR]=$1} END{i=int(0.5*NR+0.5); if(i<1)i=1; if(i>NR)i=NR; print v[i]}'
}
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- 1. trace
log "trace: every Engine call of sbxlua's create / exec / write / read"
TRACE=$(sbxj trace 40 "$TMP" 2>"$TMP/err") || log "trace failed: $(tail -3 "$TMP/err")"
printf '%s\n' "$TRACE" >&2
reqs() { awk -v op="$1" 'index($0, op) == 1 { for (i=1;i<NF;i++) if ($(i+1) ~ /^Engine/) { gsub(/[(,]/, "", $i); print $i; exit } }' <<<"$TRACE"; }
# floor body: sbxlua's own hardened create body (its agent comes from a
# volume, so the engine does the same work), to isolate sbxlua's overhead
HAVE_SBXBODY=0
if [ -s "$TMP/create.json" ]; then
  cp "$TMP/create.json" "$TMP/hardened.json" && HAVE_SBXBODY=1
fi

# ---------------------------------------------------------------- 2. interleaved rounds
# Each round runs every driver once with N/ROUNDS samples: the engine's speed
# drifts with the machine's load, and interleaving spreads that over all columns.
per() { local v=$(( $1 / ROUNDS )); [ $v -lt 1 ] && v=1; echo $v; }
CN=$(per "$N_CREATE") EN=$(per "$N_DEXEC") WN=$(per "$N_RW")
for r in $(seq "$ROUNDS"); do
  log "round $r/$ROUNDS: create x$CN, exec x$EN, write+read x$WN per driver"
  sample floor.create "$FLOOR" create "$CN" "$IMAGE"
  sample sbx.create sbxj create "$CN"
  if [ $HAVE_SBXBODY = 1 ]; then
    sample floor.create_hard "$FLOOR" create "$CN" "$IMAGE" "$TMP/hardened.json"
  fi
  [ $PEER_OK = 1 ] && sample peer.create peer create "$CN"
  sample floor.exec "$FLOOR" exec "$EN" "$IMAGE"
  sample sbx.exec sbxj exec "$EN"
  [ $PEER_OK = 1 ] && sample peer.exec peer exec "$EN"
  sample sbx.exec_engine env SBX_DOCKER_EXEC=engine "$SBXLUA" "$BENCH/docker_bench.lua" exec "$EN"
  sample floor.rw "$FLOOR" rw "$WN" "$IMAGE"
  sample sbx.rw sbxj rw "$WN"
  sample sbx.rw_engine env SBX_DOCKER_EXEC=engine "$SBXLUA" "$BENCH/docker_bench.lua" rw "$WN"
  [ $PEER_OK = 1 ] && sample peer.rw peer rw "$WN"
  sample sbx.round sbxj round "$WN"
  [ $PEER_OK = 1 ] && sample peer.round peer round "$WN"
done
PCOUNT=""
[ $PEER_OK = 1 ] && { PCOUNT=$(peer count 20 2>"$TMP/err") || log "peer count failed: $(tail -2 "$TMP/err")"; log "peer: $PCOUNT"; }

# ---------------------------------------------------------------- 3. concurrency
log "$N_DSB concurrent docker sandboxes x $N_DCMDS commands"
CONC=$(sbxj concurrent "$N_DSB" "$N_DCMDS" 2>"$TMP/err") || log "concurrent failed: $(tail -3 "$TMP/err")"
log "sbxlua: ${CONC:-failed}"
PCONC=""
if [ $PEER_OK = 1 ]; then
  PCONC=$(peer concurrent "$N_DSB" "$N_DCMDS" 2>"$TMP/err") || log "peer concurrent failed: $(tail -3 "$TMP/err")"
  log "peer: ${PCONC:-failed}"
fi
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- table
for k in floor.create floor.create_hard floor.create_sbx sbx.create peer.create floor.exec sbx.exec peer.exec \
         sbx.exec_engine floor.rw sbx.rw sbx.rw_engine peer.rw sbx.round peer.round; do
  v=$(p50 $k) && put "$k" "$v" && put "$k.n" "$(wc -l < "$TMP/s.$k")"
done
num() { local v; v=$(get "$1"); [[ "$v" =~ ^[0-9.]+$ ]] && echo "$v"; }
fmt() { local v; v=$(num "$1") && printf '%.1f' "$v" || echo "n/a"; }
line() { printf '%-40s %9s  %-34s %9s  %-14s %-9s %s\n' "$@"; }
# row LABEL VKEY BASE_LABEL BKEY MODE TARGET   (MODE over: v/b <= T; speedup: b/v >= T)
row() {
  local label=$1 vkey=$2 blabel=$3 bkey=$4 mode=$5 target=$6 v b ratio="-" res="-" why
  v=$(num "$vkey"); b=$(num "$bkey")
  if [ -z "$v" ] || [ -z "$b" ]; then
    why=$(get "$bkey.why"); [ -z "$why" ] && why=$(get "$vkey.why")
    [[ $bkey == peer.* ]] && [ $PEER_OK = 0 ] && why=$PEER_WHY
    line "$label" "$(fmt "$vkey")" "$blabel: n/a (${why:-failed})" "" "" "" "$([ "$target" = - ] && echo - || echo MISS)"
    return
  fi
  case $mode in
    over) ratio=$(awk -v a="$v" -v b="$b" 'BEGIN{printf "%.2fx", a/b}')
          [ "$target" != - ] && res=$(awk -v a="$v" -v b="$b" -v t="$target" 'BEGIN{print (a/b<=t)?"PASS":"MISS"}')
          [ "$target" != - ] && target="<= ${target}x";;
    speedup) ratio=$(awk -v a="$v" -v b="$b" 'BEGIN{ if (b>=a) printf "%.2fx faster", b/a; else printf "%.2fx slower", a/b }')
          [ "$target" != - ] && res=$(awk -v a="$v" -v b="$b" -v t="$target" 'BEGIN{print (b/a>=t)?"PASS":"MISS"}')
          [ "$target" != - ] && target=">= ${target}x";;
  esac
  line "$label" "$(fmt "$vkey")" "$blabel" "$(fmt "$bkey")" "$ratio" "$target" "$res"
}

echo
echo "sbxlua docker benchmarks — $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, loadavg $LOAD0 -> $LOAD1"
echo "sbxlua: $SBXLUA ($(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null)$(cd "$ROOT" && git diff --quiet 2>/dev/null || echo '+dirty'))"
echo "engine: $(engine http://docker/version | jq -r '"Docker \(.Version), API \(.ApiVersion)"') on $DOCKER_SOCK; image $IMAGE"
if [ $PEER_OK = 1 ]; then echo "peer: bespokelabs-sandbox $(cut -c1-7 "$PEER_DIR/.peer-commit" 2>/dev/null) docker backend, docker-py $(PYTHONPATH=$PEER_DIR/src "$PY" -c 'import docker; print(docker.__version__)')"
else echo "peer: n/a ($PEER_WHY)"; fi
echo "times in ms, p50 over $ROUNDS interleaved rounds (n: create $(get sbx.create.n), exec $(get sbx.exec.n), write+read $(get sbx.rw.n)); floor: bench/engine_floor.c (libcurl, same socket)"
echo
line "benchmark" "sbxlua" "vs" "ms" "ratio" "target" "result"
printf -- '-%.0s' {1..124}; echo
row "create (sbx.sandbox; destroy excluded)" sbx.create "engine create+start" floor.create over 1.1
row "  vs peer" sbx.create "peer SandboxClient.create" peer.create speedup -
row "  vs engine, sbxlua's exact create body" sbx.create "  create+start, same body" floor.create_hard over -
# through the agent stream the engine exec is paid once per container, so
# the engine's exec is no floor any more: the target is absolute (5 ms)
line 'execute_command("true", {}), agent' "$(fmt sbx.exec)" "target" "5.0" "" "< 5 ms" \
  "$(v=$(num sbx.exec) && awk -v a="$v" 'BEGIN{print (a<5)?"PASS":"MISS"}' || echo MISS)"
row "  vs engine exec create+start+inspect" sbx.exec "engine exec (floor of that path)" floor.exec speedup -
row "  vs sbxlua's engine-exec fallback" sbx.exec "SBX_DOCKER_EXEC=engine" sbx.exec_engine speedup -
row "  vs peer" sbx.exec 'peer ("true", ["--"])' peer.exec speedup -
row "write_file+read_file (1 KiB)" sbx.rw "engine PUT+GET archive" floor.rw over -
rq_w=$(reqs write_file) rq_r=$(reqs read_file)
if [ -n "$rq_w" ] && [ -n "$rq_r" ]; then
  line "  Engine requests: write / read" "$rq_w / $rq_r" "peer: $(awk '$1=="rw"{print $2}' <<<"$PCOUNT") per write+read" "" "" "<= 1 each" \
    "$(awk -v a="$rq_w" -v b="$rq_r" 'BEGIN{print (a<=1 && b<=1)?"PASS":"MISS"}')"
else
  line "  Engine requests: write / read" "n/a" "(trace failed)" "" "" "<= 1 each" "MISS"
fi
row "  vs sbxlua's archive fallback" sbx.rw "SBX_DOCKER_EXEC=engine" sbx.rw_engine speedup -
row "  vs peer" sbx.rw "peer write_file+read_file" peer.rw speedup 2
line "exec + write + read round, agent" "$(fmt sbx.round)" "target" "10.0" "" "< 10 ms" \
  "$(v=$(num sbx.round) && awk -v a="$v" 'BEGIN{print (a<10)?"PASS":"MISS"}' || echo MISS)"
row "  vs peer" sbx.round "peer exec+write+read" peer.round speedup 5
if [ -n "$CONC" ]; then
  okv=$(field "$CONC" ok); wall=$(field "$CONC" wall_ms)
  line "$N_DSB docker sandboxes x $N_DCMDS cmds: completes" "$(field "$CONC" cmds) ok" "" "" "" "all ok" \
    "$([ "$okv" = true ] && echo PASS || echo MISS)"
  if [ -n "$PCONC" ]; then
    pw=$(field "$PCONC" wall_ms)
    line "  wall time (one process)" "$(printf '%.0f' "$wall")" "peer ($N_DSB threads; ok=$(field "$PCONC" ok))" "$(printf '%.0f' "$pw")" \
      "$(awk -v a="$wall" -v b="$pw" 'BEGIN{ if (b>=a) printf "%.2fx faster", b/a; else printf "%.2fx slower", a/b }')" "-" "-"
  else
    line "  wall time (one process)" "$(printf '%.0f' "$wall")" "peer: n/a (${PEER_WHY:-failed})" "" "" "-" "-"
  fi
  line "  peak RSS (VmHWM, MB)" "$(awk -v k="$(field "$CONC" vmhwm_kb)" 'BEGIN{printf "%.1f", k/1024}')" \
    "peer ru_maxrss MB" "$([ -n "$PCONC" ] && awk -v k="$(field "$PCONC" vmhwm_kb)" 'BEGIN{printf "%.1f", k/1024}')" "" "-" "-"
else
  line "$N_DSB docker sandboxes x $N_DCMDS cmds" "failed" "" "" "" "completes" "MISS"
fi
echo
echo "where sbxlua's time goes (each Engine call timed inside sbxlua; p50 ms):"
printf '%s\n' "${TRACE:-  (trace failed)}" | sed 's/^/  /'
