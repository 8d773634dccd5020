#!/usr/bin/env bash
# A Python venv for the tests that run a provider's official Python SDK
# against its stand-in (the proof that the stand-in speaks the real
# protocol; Python is allowed for exactly that). Made once per name and
# package list, reused after; prints the venv's python on stdout.
#
#   py=$(spec/support/pyvenv.sh e2b "e2b==2.3.4")      # NAME PKG...
#
# Where: $SBX_PYVENV_DIR (default: build/pyvenv under the source root).
# Fails with one line on stderr when python3 or the registry is missing.
set -euo pipefail
name=$1; shift
root=${SBX_PYVENV_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/build/pyvenv}
dir=$root/$name
want=$(printf '%s\n' "$@")
if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.sbx-packages" 2>/dev/null)" = "$want" ]; then
  echo "$dir/bin/python"; exit 0
fi
command -v python3 >/dev/null || { echo "pyvenv: python3 is not installed" >&2; exit 1; }
mkdir -p "$root"
lock=$root/.$name.lock
exec 9>"$lock"
flock 9              # two specs making the same venv at once: one makes it
if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.sbx-packages" 2>/dev/null)" = "$want" ]; then
  echo "$dir/bin/python"; exit 0
fi
rm -rf "$dir"
python3 -m venv "$dir" >&2 || { echo "pyvenv: python3 -m venv failed (apt-get install python3-venv)" >&2; exit 1; }
if ! "$dir/bin/pip" install --disable-pip-version-check -q "$@" >&2; then
  echo "pyvenv: pip install $* failed (is the package registry reachable?)" >&2
  rm -rf "$dir"; exit 1
fi
printf '%s' "$want" > "$dir/.sbx-packages"
echo "$dir/bin/python"
