#!/usr/bin/env bash
# Extract the peer (bespokelabs-sandbox, github:bespokelabsai/sandbox) from a
# fetched git directory into a scratch directory, OUTSIDE this repository.
#   bench/fetch_peer.sh GIT_DIR [DEST=/tmp/peer] [REV=HEAD]
# GIT_DIR is the bare git directory the `fetch` tool returned
# (e.g. /work/.mirror/bespokelabsai+sandbox/repo), or any clone's .git.
# Nothing of the peer is ever copied into, or committed to, sbxlua.
set -euo pipefail
gitdir=${1:?usage: fetch_peer.sh GIT_DIR [DEST] [REV]}
dest=${2:-/tmp/peer}
rev=${3:-HEAD}
case "$(realpath -m "$dest")" in
  "$(realpath "$(dirname "$0")/..")"*) echo "fetch_peer: refusing to extract into the sbxlua tree" >&2; exit 2;;
esac
rm -rf "$dest"; mkdir -p "$dest"
git --git-dir="$gitdir" archive --format=tar "$rev" | tar -x -C "$dest"
git --git-dir="$gitdir" rev-parse "$rev" > "$dest/.peer-commit"
echo "peer $(cat "$dest/.peer-commit") extracted to $dest (PYTHONPATH=$dest/src)"
