#!/usr/bin/env bash
# Builds the runtime image the test suite runs tasks in.
#
# This machine (and CI) has a Docker engine but no registry, so `node:24-slim` and
# `python:3.x-slim` cannot be pulled. Instead we debootstrap a minimal Debian trixie
# root filesystem with python3 (3.13) and nodejs (20) and `docker import` it. The test
# suite points every runtime at this one image through RUNTIME_IMAGES.
#
# Idempotent: does nothing when the image already exists (set REBUILD=1 to force).
set -euo pipefail

TAG="${TEST_RUNTIME_IMAGE:-script-runner-test/runtime:trixie}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

if [[ "${REBUILD:-0}" != 1 ]] && docker image inspect "$TAG" >/dev/null 2>&1; then
    echo "build-test-image: $TAG already present"
    exit 0
fi

command -v debootstrap >/dev/null || {
    echo "build-test-image: debootstrap is missing (apt-get install debootstrap)" >&2
    exit 1
}

root="$(mktemp -d /tmp/sr-rootfs.XXXXXX)"
trap 'rm -rf "$root"' EXIT
echo "build-test-image: debootstrapping trixie into $root (takes about a minute)"
debootstrap --variant=minbase --include=python3,nodejs trixie "$root" "$MIRROR" >/tmp/sr-debootstrap.log 2>&1 || {
    tail -n 30 /tmp/sr-debootstrap.log >&2
    exit 1
}
# Trim what a task never needs, to keep the image small.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc "$root"/usr/share/man
tar -C "$root" -c . | docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$TAG" >/dev/null
echo "build-test-image: built $TAG"
