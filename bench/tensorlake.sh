#!/usr/bin/env bash
# bench/tensorlake.sh — the tensorlake provider on the Tensorlake stand-in
# (spec/support/standin/tensorlake.lua, each sandbox a real bwrap one), one
# run, one table: sbxlua vs the raw HTTP exchanges of each operation
# (bench/tensorlake_bench.lua) vs the official Python SDK
# (bench/tensorlake_sdk.py, tensorlake==0.5.163 in a venv from
# spec/support/pyvenv.sh), as p50 ms and ratios.
#
#   bench/tensorlake.sh            N_CREATE=10 N_EXEC=50 N_RW=100; QUICK=1: small N
#   SBXLUA=path bench/tensorlake.sh
#   LIGHT=1 bench/tensorlake.sh    light sandboxes (no process behind them: the
#                                  stand-in answers commands), so the clients and
#                                  the wire are what is measured
set -uo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
N_CREATE=${N_CREATE:-10} N_EXEC=${N_EXEC:-50} N_RW=${N_RW:-100}
if [ "${QUICK:-}" = 1 ]; then N_CREATE=2 N_EXEC=5 N_RW=10; fi
SBXLUA=${SBXLUA:-$ROOT/build/sbxlua}
TMP=$(mktemp -d /tmp/sbxbench-tl.XXXXXX)
log() { printf '[bench tensorlake] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
STANDIN=
cleanup() {
  trap - EXIT INT TERM
  if [ -n "$STANDIN" ]; then kill -TERM "$STANDIN" 2>/dev/null; wait "$STANDIN" 2>/dev/null; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for t in jq; do command -v $t >/dev/null || die "$t missing (apt-get install -y $t)"; done
if [ ! -x "$SBXLUA" ]; then
  log "building $SBXLUA"
  (cd "$ROOT" && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null && cmake --build build >/dev/null) \
    || die "build failed"
fi
PY=$("$ROOT/spec/support/pyvenv.sh" tensorlake "tensorlake==0.5.163") || die "no venv for the SDK (see above)"

# the stand-in: its own state directory, its sandboxes destroyed when it stops
light=; [ "${LIGHT:-0}" = 1 ] && light=--light
(cd "$ROOT" && SBX_STATE_DIR=$TMP/standin exec "$SBXLUA" spec/support/standin/tensorlake.lua --port-file "$TMP/port" $light) \
  2>"$TMP/standin.log" &
STANDIN=$!
for _ in $(seq 200); do [ -s "$TMP/port" ] && break; sleep 0.05; done
[ -s "$TMP/port" ] || die "the stand-in did not start: $(cat "$TMP/standin.log")"
export TENSORLAKE_API_URL=http://127.0.0.1:$(cat "$TMP/port") TENSORLAKE_API_KEY=tl-standin-key
load0=$(cut -d' ' -f1-3 /proc/loadavg)

log "sbxlua and the raw exchanges (create x$N_CREATE, exec x$N_EXEC, write+read x$N_RW)"
SBX=$(cd "$ROOT" && SBX_STATE_DIR=$TMP/sbx "$SBXLUA" bench/tensorlake_bench.lua "$N_CREATE" "$N_EXEC" "$N_RW") \
  || die "bench/tensorlake_bench.lua failed"
log "sbxlua: $SBX"
log "the official SDK"
SDK=$(HOME=$TMP "$PY" "$BENCH/tensorlake_sdk.py" "$N_CREATE" "$N_EXEC" "$N_RW") || die "bench/tensorlake_sdk.py failed"
log "sdk: $SDK"
load1=$(cut -d' ' -f1-3 /proc/loadavg)

printf '# tensorlake on its stand-in (%s sandboxes; load %s -> %s); p50 ms\n' "$([ -n "$light" ] && echo light || echo real)" "$load0" "$load1"
printf '| op | raw HTTP | sbxlua | SDK | sbxlua - raw | SDK / sbxlua |\n|---|---|---|---|---|---|\n'
for op in create exec rw; do
  jq -rn --argjson s "$SBX" --argjson p "$SDK" --arg op "$op" '
    ($s.raw[$op]) as $r | ($s.sbx[$op]) as $x | ($p[$op]) as $k |
    "| \(if $op == "rw" then "write+read 1 KiB" elif $op == "exec" then "execute_command(\"true\", {})" else "create+destroy" end) | \($r*100|round/100) | \($x*100|round/100) | \($k*100|round/100) | \(($x-$r)*100|round/100) | \(($k/$x)*100|round/100)x |"'
done
