#!/usr/bin/env bash
# Builds a stand-in for debian:trixie-slim, the base of every image in the Dockerfile,
# for machines that cannot pull from a registry (like this project's CI).
#
# debootstraps a minimal Debian trixie root filesystem and `docker import`s it as
# BASE_IMAGE (default script-runner-test/base:trixie). Build with it by setting
# BASE_IMAGE to that tag in .env (docker-compose.yml passes it to the Dockerfile).
#
# Idempotent: does nothing when the image already exists (set REBUILD=1 to force).
set -euo pipefail

TAG="${BASE_IMAGE:-script-runner-test/base:trixie}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

if [[ "${REBUILD:-0}" != 1 ]] && docker image inspect "$TAG" >/dev/null 2>&1; then
    echo "build-base-image: $TAG already present"
    exit 0
fi
command -v debootstrap >/dev/null || {
    echo "build-base-image: debootstrap is missing (apt-get install debootstrap)" >&2
    exit 1
}
root="$(mktemp -d /tmp/sr-base.XXXXXX)"
log="$(mktemp /tmp/sr-base-log.XXXXXX)"
trap 'rm -rf "$root" "$log"' EXIT
echo "build-base-image: debootstrapping trixie into $root (takes about a minute)"
debootstrap --variant=minbase trixie "$root" "$MIRROR" >"$log" 2>&1 || {
    tail -n 30 "$log" >&2
    exit 1
}
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$TAG" >/dev/null
echo "build-base-image: built $TAG"
