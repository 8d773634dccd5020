#!/bin/sh
# G2 (RELIABILITY.md): SIGKILL sbxlua N times at random points during
# create/exec/copy/destroy on local, bwrap and docker (those available),
# run `sbxlua gc` after each batch, count leftovers. Then SIGINT_RUNS jobs
# creating in parallel are stopped by SIGINT (once, twice at once as
# timeout(1) does, twice 0.5 s apart): a clean stop leaves nothing even
# before gc, `sbxlua ls` lists what a forced one left. Prints the README figure.
#   bench/g2.sh [N=200] [MAX_DELAY_S=1.5] [BATCH=3] [SIGINT_RUNS=30]
# env: SBX_BIN (default build/sbxlua), SBX_TEST_IMAGE (default sbxlua-test:bookworm)
set -eu
cd "$(dirname "$0")/.."
N=${1:-${N:-200}}
DELAY=${2:-1.5}
BATCH=${3:-3}
SIGINT_RUNS=${4:-30}
BIN=${SBX_BIN:-build/sbxlua}
export SBX_BIN="$BIN" SBX_TEST_IMAGE="${SBX_TEST_IMAGE:-sbxlua-test:bookworm}"
exec "$BIN" spec/harness/sigkill.lua "$N" "$DELAY" "$BATCH" "$SIGINT_RUNS"
