#!/usr/bin/env bash
# bench/ray.sh — the ray provider on a real cluster, one run, one table:
# create against its floor (a raw job submit until its entrypoint runs),
# exec `true`, 8 MiB write+read, 4 and 10 concurrent creates.
#   bench/ray.sh            (N_CREATE=8 N_EXEC=200 N_RW=20; QUICK=1 for a smoke run)
# Uses the cluster of spec/support/ray.sh (started, and stopped again, when
# none runs). The peer's ray backend is not measured here (see README).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
N_CREATE=${N_CREATE:-8} N_EXEC=${N_EXEC:-200} N_RW=${N_RW:-20}
if [ "${QUICK:-}" = 1 ]; then N_CREATE=2 N_EXEC=20 N_RW=3; fi
started=
[ -f "$ROOT/build/ray/cluster.env" ] || started=1
"$ROOT/spec/support/ray.sh" start >/dev/null
[ -n "$started" ] && trap '"$ROOT/spec/support/ray.sh" stop' EXIT
# shellcheck disable=SC1091
. "$ROOT/build/ray/cluster.env"
export SBX_RAY_ADDRESS RAY_AUTH_TOKEN
RAY_AUTH_TOKEN=$(cat "$SBX_RAY_TOKEN_FILE")
export SBX_STATE_DIR=${SBX_STATE_DIR:-/tmp/bench-ray-state} SBX_SOURCE_DIR=$ROOT
"${SBXLUA:-$ROOT/build/sbxlua}" "$ROOT/bench/ray_bench.lua" "$N_CREATE" "$N_EXEC" "$N_RW"
