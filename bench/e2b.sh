#!/usr/bin/env bash
# bench/e2b.sh — E2B on its stand-in (spec/support/standin/e2b.lua --scale:
# sandboxes with no process behind them, so only the clients and the wire are
# measured), one run, one table: the raw HTTP exchange (sbx.http alone),
# sbxlua (providers/e2b.lua through the facade) and the official Python SDK
# (e2b, venv from spec/support/pyvenv.sh), ms per operation and ratios.
#
#   bench/e2b.sh            N=50 by default; SDK=0 leaves the SDK out
#
# sbxlua's create is POST /sandboxes, one exec (mkdir of the working
# directory) and DELETE; the raw and SDK creates are POST and DELETE only
# (a line under the table times the raw exchange of sbxlua's three calls).
# The raw exchanges run interleaved with sbxlua's operations.
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
SBXLUA=${SBXLUA:-$ROOT/build/sbxlua}
N=${N:-50}
cd "$ROOT"
state=$(mktemp -d /tmp/e2b-bench.XXXXXX)
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$state"' EXIT
KEY=e2b_bench_$$
SBX_STATE_DIR=$state/standin "$SBXLUA" spec/support/standin/e2b.lua --scale --api-key "$KEY" \
  --port-file "$state/port" 2>"$state/standin.log" &
pid=$!
for _ in $(seq 100); do [ -s "$state/port" ] && break; sleep 0.1; done
URL=http://127.0.0.1:$(cat "$state/port")
export E2B_API_KEY=$KEY E2B_API_URL=$URL E2B_SANDBOX_URL=$URL
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
SBX_STATE_DIR=$state/sbxlua "$SBXLUA" bench/e2b_bench.lua "$URL" "$KEY" "$N" > "$state/rows"
if [ "${SDK:-1}" = 1 ]; then
  if py=$(spec/support/pyvenv.sh e2b "e2b==2.63.0"); then
    "$py" bench/e2b_sdk_bench.py "$N" >> "$state/rows"
  else
    echo "bench/e2b.sh: no SDK row (the venv could not be made)" >&2
  fi
fi
awk '
  { p50[$1" "$2] = $3; mean[$1" "$2] = $4; ops[$2] = 1 }
  END {
    printf "%-16s %10s %10s %10s %14s %12s\n", "op (ms, p50)", "raw", "sbxlua", "sdk", "sbxlua-raw", "sdk/sbxlua"
    n = split("create+destroy exec write+read", order, " ")
    for (i = 1; i <= n; i++) { o = order[i]
      r = p50["raw " o]; s = p50["sbxlua " o]; d = p50["sdk " o]
      printf "%-16s %10.3f %10.3f %10s %14.3f %12s\n", o, r, s, (d == "" ? "-" : sprintf("%.3f", d)), s - r,
             (d == "" ? "-" : sprintf("%.2fx", d / s))
    }
    r3 = p50["raw3 create+destroy"]; s = p50["sbxlua create+destroy"]
    if (r3 != "") printf "raw, sbxlua'"'"'s three create calls (POST, mkdir exec, DELETE): %.3f; sbxlua - that: %.3f\n", r3, s - r3
  }' "$state/rows"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
