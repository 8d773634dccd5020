#!/usr/bin/env bash
# Builds the local test image sbxlua-test:bookworm (Debian 12 minbase with
# python3, git, procps) without any container registry: debootstrap from
# Debian's mirror, then `docker import`. Idempotent: an existing image is
# kept unless --force is given, and the root filesystem is cached as a
# tarball ($SBX_IMAGE_CACHE, default /var/cache/sbxlua) so a machine whose
# engine lost its images re-imports in seconds instead of re-bootstrapping.
#
# Users: run `images/test/dockerd.sh && images/test/build.sh` as root, then
# `./dev test` (or SBX_TEST_IMAGE=another:image to test against your own).
set -euo pipefail
. "$(dirname "$0")/../progress.sh"
IMAGE=${SBX_TEST_IMAGE:-sbxlua-test:bookworm}
MIRROR=${SBX_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${SBX_IMAGE_CACHE:-/var/cache/sbxlua}
tarball=$CACHE/bookworm-minbase-rootfs.tar
if [ "${1:-}" != "--force" ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  step "image $IMAGE already present"
  exit 0
fi
if [ "${1:-}" = "--force" ] || [ ! -s "$tarball" ]; then
  root=$(mktemp -d /tmp/sbxlua-rootfs.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  step "bootstrapping Debian 12 minbase from $MIRROR (a few minutes; progress every ${SBX_PROGRESS_SECS:-10} s)"
  with_progress debootstrap debootstrap --variant=minbase --include=python3,git,procps bookworm "$root" "$MIRROR"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  mkdir -p "$CACHE"
  step "caching the root filesystem in $tarball"
  tar -C "$root" -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
fi
step "importing $tarball as $IMAGE"
with_progress "docker import" docker import \
  --change 'CMD ["/bin/sh"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  "$tarball" "$IMAGE"
step "built $IMAGE"
