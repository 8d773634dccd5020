#!/usr/bin/env bash
# Starts Debian's dockerd in the background when no engine answers, and waits
# until it does (CI machines have no init system running it).
set -euo pipefail
sock=/var/run/docker.sock
if curl -sf --unix-socket "$sock" http://localhost/_ping >/dev/null 2>&1; then exit 0; fi
nohup dockerd >/tmp/sbxlua-dockerd.log 2>&1 &
for _ in $(seq 60); do
  curl -sf --unix-socket "$sock" http://localhost/_ping >/dev/null 2>&1 && exit 0
  sleep 0.5
done
echo "dockerd did not start; see /tmp/sbxlua-dockerd.log" >&2
tail -20 /tmp/sbxlua-dockerd.log >&2
exit 1
