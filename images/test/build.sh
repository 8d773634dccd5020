#!/usr/bin/env bash
# Builds the local test image sbxlua-test:bookworm (Debian 12 minbase with
# python3, git, procps) without any container registry: debootstrap from
# Debian's mirror, then `docker import`. Idempotent: an existing image is kept
# unless --force is given.
set -euo pipefail
IMAGE=${SBX_TEST_IMAGE:-sbxlua-test:bookworm}
MIRROR=${SBX_DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ "${1:-}" != "--force" ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "image $IMAGE already present"
  exit 0
fi
root=$(mktemp -d /tmp/sbxlua-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,git,procps bookworm "$root" "$MIRROR" >/dev/null
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import \
  --change 'CMD ["/bin/sh"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  - "$IMAGE" >/dev/null
echo "built $IMAGE"
