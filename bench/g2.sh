#!/bin/sh
# G2 (RELIABILITY.md): SIGKILL sbxlua N times at random points during
# create/exec/copy/destroy on local, bwrap and docker (those available),
# run `sbxlua gc` after each batch, count leftovers. Prints the README figure.
#   bench/g2.sh [N=200] [MAX_DELAY_S=1.5] [BATCH=3]
# env: SBX_BIN (default build/sbxlua), SBX_TEST_IMAGE (default sbxlua-test:bookworm)
set -eu
cd "$(dirname "$0")/.."
N=${1:-${N:-200}}
DELAY=${2:-1.5}
BATCH=${3:-3}
BIN=${SBX_BIN:-build/sbxlua}
export SBX_BIN="$BIN" SBX_TEST_IMAGE="${SBX_TEST_IMAGE:-sbxlua-test:bookworm}"
exec "$BIN" spec/harness/sigkill.lua "$N" "$DELAY" "$BATCH"
