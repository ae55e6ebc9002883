#!/usr/bin/env bash
# Pins every image a deployment takes from a registry by its digest, in its .env: the
# runtime images tasks run in (RUNTIME_IMAGES, over docs/configuration.md's defaults) and
# the images the binaries' images are built from (BASE_IMAGE, RUST_IMAGE). Each tag is
# pulled and written back as NAME:TAG@sha256:DIGEST. Docker runs such a reference by its
# digest alone (the tag only says where it came from), so a tag moved upstream, by a new
# build or by someone who took over the repository, changes nothing a host runs until an
# operator pins again. add-worker.sh hands these settings to worker hosts, which then pull
# and run the very same bytes.
#
#   deploy/pin-images.sh [--env FILE] [--repin] [--check]
#
#   --env FILE  the .env to read and write (default: .env beside deploy/)
#   --repin     resolve the tags again, pinned ones too: what deploy.sh --rebuild does to
#               take upstream's security updates; each change is printed
#   --check     change nothing: exit 1 naming each image that is not pinned
#   -h, --help  this text
#
# setup-host.sh runs it (unless --skip-images); deploy.sh --rebuild runs it with --repin.
set -euo pipefail

DIR="$(cd "$(dirname "$0")/.." && pwd)"
ENV_FILE="$DIR/.env" REPIN=0 CHECK=0
# The defaults, as docs/configuration.md (RUNTIME_IMAGES) and docker-compose.yml
# (BASE_IMAGE, RUST_IMAGE) give them.
DEFAULT_RUNTIMES="node24=node:24-slim,python3.8=python:3.8-slim,python3.13=python:3.13-slim"
DEFAULT_BASE="debian:trixie-slim"
DEFAULT_RUST="rust:1.95-slim-trixie"

log() { printf 'pin-images: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

while (($#)); do
    case "$1" in
    --env) ENV_FILE="${2:?--env needs a file}"; shift 2 ;;
    --repin) REPIN=1; shift ;;
    --check) CHECK=1; shift ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ -f "$ENV_FILE" ]] || die "no $ENV_FILE (setup-host.sh writes it)"

# The last value of NAME, without the quotes deploy.sh's reader also drops.
env_get() {
    local line
    line="$(grep -E "^$1=" "$ENV_FILE" | tail -n1 || true)"
    line="${line#*=}"
    line="${line%\"}"; line="${line#\"}"
    printf '%s' "$line"
}
env_set() {
    local tmp
    tmp="$(mktemp "$ENV_FILE.XXXXXX")"
    grep -vE "^$1=" "$ENV_FILE" >"$tmp" || true
    printf '%s=%s\n' "$1" "$2" >>"$tmp"
    chmod 600 "$tmp"
    mv "$tmp" "$ENV_FILE"
}

# The repository part of a reference: no digest, no tag (a ':' after the last '/' is a
# tag's; one before it is a registry's port).
repository() {
    local ref="${1%%@*}"
    if [[ "${ref##*/}" == *:* ]]; then ref="${ref%:*}"; fi
    printf '%s' "$ref"
}

# Prints REF pinned: NAME:TAG@sha256:... of what the tag names now, pulled. A reference
# that is pinned already is printed as it is, unless --repin; one pinned with no tag
# (NAME@sha256:...) always is, since there is no tag to follow. An image that this host
# has but no registry serves (built or loaded here) is kept by its tag, with a warning.
pin() {
    local ref="$1" tagged repo digests d=""
    if [[ "$ref" == *@sha256:* ]] && { ((!REPIN)) || [[ "${ref%%@*}" != "$(repository "$ref"):"* ]]; }; then
        printf '%s' "$ref"
        return
    fi
    tagged="${ref%%@*}"
    if ! docker pull -q "$tagged" >/dev/null 2>&1; then
        docker image inspect "$tagged" >/dev/null 2>&1 || die "cannot pull $tagged, and this host does not have it"
        log "WARNING: $tagged cannot be pulled; kept by its tag (this host's own copy)"
        printf '%s' "$tagged"
        return
    fi
    repo="$(repository "$tagged")"
    digests="$(docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$tagged")"
    # Docker lists Docker Hub's own images without docker.io/ and library/. The
    # repository must match whole: `python` is not `mirror.local/python`.
    for candidate in "$repo" "${repo#docker.io/}" "${repo#docker.io/library/}"; do
        d="$(awk -F@ -v r="$candidate" '$1 == r { print $2; exit }' <<<"$digests")"
        [[ -z "$d" ]] || break
    done
    [[ -n "$d" ]] || die "$tagged has no digest from $repo (an image built or loaded here, not pulled, has none)"
    printf '%s@%s' "$tagged" "$d"
}

unpinned=()
# What is written to .env at the end, once every image is pinned: a failed pull changes
# nothing.
declare -A pinned=()
# One setting holding one reference.
pin_setting() {
    local name="$1" default="$2" was now
    was="$(env_get "$name")"; was="${was:-$default}"
    if ((CHECK)); then
        [[ "$was" == *@sha256:* ]] || unpinned+=("$name=$was")
        return
    fi
    now="$(pin "$was")"
    [[ "$now" == "$was" ]] || log "$name: $was -> $now"
    pinned["$name"]="$now"
}

# RUNTIME_IMAGES: the defaults with .env's entries over them, each pinned.
pin_runtimes() {
    local pairs pair name out="" was now
    declare -A chosen=()
    declare -a order=()
    IFS=',' read -ra pairs <<<"$DEFAULT_RUNTIMES,$(env_get RUNTIME_IMAGES)"
    for pair in "${pairs[@]}"; do
        [[ "$pair" == *=* ]] || continue
        name="${pair%%=*}"
        [[ -n "${chosen[$name]+x}" ]] || order+=("$name")
        chosen["$name"]="${pair#*=}"
    done
    for name in "${order[@]}"; do
        was="${chosen[$name]}"
        if ((CHECK)); then
            [[ "$was" == *@sha256:* ]] || unpinned+=("RUNTIME_IMAGES: $name=$was")
            continue
        fi
        now="$(pin "$was")"
        [[ "$now" == "$was" ]] || log "runtime $name: $was -> $now"
        out+="$name=$now,"
    done
    ((CHECK)) || pinned[RUNTIME_IMAGES]="${out%,}"
}

pin_runtimes
pin_setting BASE_IMAGE "$DEFAULT_BASE"
# The toolchain image only builds the binaries (BINARIES=build, the default).
binaries="$(env_get BINARIES)"
[[ "${binaries:-build}" != build ]] || pin_setting RUST_IMAGE "$DEFAULT_RUST"
for name in "${!pinned[@]}"; do env_set "$name" "${pinned[$name]}"; done
if ((CHECK)); then
    if ((${#unpinned[@]})); then
        log "not pinned by digest: ${unpinned[*]} (run deploy/pin-images.sh)"
        exit 1
    fi
    log "every image is pinned by digest"
fi
