#!/usr/bin/env bash
# bench/daytona.sh — the daytona provider against its stand-in
# (spec/support/standin/daytona.lua, every cloud sandbox a bwrap sandbox),
# and Daytona's official Python SDK on the same stand-in in the same run:
# create+destroy, exec of `true`, write+read of 1 KiB, as p50 ms and the
# SDK/sbxlua ratio; the raw HTTP round trips under them for reference.
#
#   bench/daytona.sh            N_CREATE=10 N_EXEC=100 N_RW=100 (QUICK=1: 3/10/10)
#   LIGHT=1 bench/daytona.sh    light sandboxes (no process behind them: the
#                               stand-in answers commands), so the clients and
#                               the wire are what is measured
#
# SBXLUA=path (default build/sbxlua). The SDK comes from spec/support/pyvenv.sh
# (daytona==0.226.1); without it the SDK column says why.
set -uo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
SBXLUA=${SBXLUA:-$ROOT/build/sbxlua}
N_CREATE=${N_CREATE:-10} N_EXEC=${N_EXEC:-100} N_RW=${N_RW:-100}
if [ "${QUICK:-}" = 1 ]; then N_CREATE=3 N_EXEC=10 N_RW=10; fi
work=$(mktemp -d /tmp/bench-daytona-XXXXXX)
key=bench-$$
cleanup() {
  [ -n "${standin:-}" ] && kill "$standin" 2>/dev/null && wait "$standin" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
light=; [ "${LIGHT:-0}" = 1 ] && light="--backend light"
SBX_STATE_DIR=$work/standin "$SBXLUA" "$ROOT/spec/support/standin/daytona.lua" --port-file "$work/port" \
  --key "$key" --parent $$ --max-cpu 64 $light 2>"$work/standin.log" &
standin=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
[ -s "$work/port" ] || { echo "the stand-in did not start:"; cat "$work/standin.log"; exit 1; }
url=http://127.0.0.1:$(cat "$work/port")
echo "stand-in $url (${light:+light sandboxes}${light:-real sandboxes}); load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
DAYTONA_API_URL=$url DAYTONA_API_KEY=$key SBX_STATE_DIR=$work/client \
  "$SBXLUA" "$BENCH/daytona_bench.lua" "$N_CREATE" "$N_EXEC" "$N_RW" > "$work/sbxlua.txt" || exit 1
if py=$("$ROOT/spec/support/pyvenv.sh" daytona "daytona==0.226.1" 2>"$work/venv.err"); then
  "$py" "$BENCH/daytona_sdk_bench.py" "$url" "$key" "$N_CREATE" "$N_EXEC" "$N_RW" > "$work/sdk.txt" 2>"$work/sdk.err" \
    || { echo "the SDK run failed:" >&2; tail -5 "$work/sdk.err" >&2; }
else
  echo "no SDK: $(cat "$work/venv.err")" >&2
fi
cat "$work/sbxlua.txt" "$work/sdk.txt" 2>/dev/null | sed 's/^/raw: /' >&2
printf '%-32s %10s %10s %8s\n' "operation (p50 ms)" sbxlua "SDK" "SDK/sbx"
grep -v '^raw' "$work/sbxlua.txt" | while read -r line; do
  what=${line% p50 *}
  ours=$(echo "$line" | sed 's/.* p50 \([0-9.]*\) .*/\1/')
  theirs=$(grep "^$what p50" "$work/sdk.txt" 2>/dev/null | sed 's/.* p50 \([0-9.]*\) .*/\1/')
  ratio=$( [ -n "$theirs" ] && awk -v a="$theirs" -v b="$ours" 'BEGIN { printf "%.2fx", a / b }' || echo -)
  printf '%-32s %10s %10s %8s\n' "$what" "$ours" "${theirs:--}" "$ratio"
done
grep '^raw' "$work/sbxlua.txt" | while read -r line; do
  printf '%-32s %10s\n' "${line% p50 *}" "$(echo "$line" | sed 's/.* p50 \([0-9.]*\) .*/\1/')"
done
echo "load after $(cut -d' ' -f1-3 /proc/loadavg)"
