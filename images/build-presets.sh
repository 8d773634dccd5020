#!/usr/bin/env bash
# Builds the preset images (images/<preset>/Dockerfile) locally, tagged as
# the presets name them (presets/<preset>.lua): sbxlua/codex:1,
# sbxlua/claude-code:1 and sbxlua/claude-code-codex:1. Needs the test image
# (images/test/build.sh) as the base, Debian's mirror and the npm registry. Usage: build-presets.sh [NAME...]
set -euo pipefail
cd "$(dirname "$0")"
. ./progress.sh
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(codex claude-code claude-code-codex)
ca=/etc/ssl/certs/ca-certificates.crt
for n in "${names[@]}"; do
  ctx=$(mktemp -d)
  cp "$n/Dockerfile" "$ctx/"
  if [ -s "$ca" ]; then cp "$ca" "$ctx/extra-ca.crt"; else : > "$ctx/extra-ca.crt"; fi
  step "building sbxlua/$n:1 (Debian's Node.js, the CLI from npm; minutes)"
  status=0
  with_progress "docker build sbxlua/$n:1" docker build -t "sbxlua/$n:1" "$ctx" || status=$?
  rm -rf "$ctx"
  [ "$status" -eq 0 ] || exit "$status"
done
