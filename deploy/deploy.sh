#!/usr/bin/env bash
# Deploys the newest origin/main on this host, with a health gate and rollback.
#
#   deploy/deploy.sh [--no-fetch] [--timeout SECONDS]
#
# 1. git fetch, git reset --hard origin/main (DEPLOY_BRANCH), in the checkout holding
#    this script; .env is not tracked and stays.
# 2. docker compose up -d --build
# 3. Health gate: every service running and healthy, and https://DOMAIN/healthz
#    answering 200 through Caddy, within --timeout (default 240 s).
# 4. Passed: this commit, .env and the images are recorded as the last good version
#    (.deploy/, images tagged :last-good). Failed: the failing services' logs are shown,
#    the last good commit, .env and images are put back and started, and the script
#    exits 1 (2 if even the rollback is unhealthy).
#
# --no-fetch skips step 1 (deploy/setup-host.sh uses it for the first start).
# Runs from the GitHub workflow over SSH; prints no secret.
set -euo pipefail

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }

# Everything runs inside main: `git reset` may rewrite this very file, and bash reads a
# script as it goes, but a function is parsed whole before it runs.
main() {
    local fetch=1 timeout=240
    while (($#)); do
        case "$1" in
        --no-fetch) fetch=0 ;;
        --timeout) timeout="${2:?--timeout needs seconds}"; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "deploy: unknown argument $1 (see --help)" >&2; exit 64 ;;
        esac
        shift
    done
    cd "$(dirname "$0")/.."
    [[ -f .env ]] || die ".env is missing in $PWD: run deploy/setup-host.sh first"
    mkdir -p .deploy

    if ((fetch)); then
        local branch="${DEPLOY_BRANCH:-main}"
        log "fetching origin/$branch (now at $(git rev-parse --short HEAD))"
        git fetch --quiet origin "$branch"
        git reset --quiet --hard "origin/$branch"
    fi
    log "deploying $(git rev-parse --short HEAD): docker compose up -d --build"
    if docker compose up -d --build --remove-orphans && wait_healthy "$timeout"; then
        record_good
        log "healthy: $(git rev-parse --short HEAD) is live"
        return 0
    fi

    log "the new version is not healthy; logs of the failing services:"
    show_failing_logs
    rollback "$timeout"
}

log() { printf 'deploy: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# The last value of NAME in .env (never sourced: it is data, not a script).
env_get() {
    local line
    line="$(grep -E "^$1=" .env | tail -n1 || true)"
    line="${line#*=}"
    line="${line%\"}"; line="${line#\"}"
    printf '%s' "$line"
}

images() {
    local prefix tag s
    prefix="$(env_get IMAGE_PREFIX)"; prefix="${prefix:-script-runner}"
    tag="$(env_get IMAGE_TAG)"; tag="${tag:-latest}"
    for s in api worker redis caddy; do printf '%s %s\n' "$prefix/$s:$tag" "$prefix/$s"; done
}

# True when every service is running and, where it has a health check, healthy.
services_healthy() {
    local states
    states="$(docker compose ps -a --format '{{.Service}} {{.State}} {{.Health}}')" || return 1
    [[ -n "$states" ]] || return 1
    ! grep -vqE '^[^ ]+ running ?(healthy)?$' <<<"$states"
}

healthz_through_caddy() {
    local domain port ca=()
    domain="$(env_get DOMAIN)"
    port="$(env_get HTTPS_PORT)"; port="${port:-443}"
    if [[ "$(env_get CADDY_GLOBAL_OPTIONS)" == *local_certs* ]]; then
        # A test domain signed by Caddy's internal CA: trust that root for this check.
        docker compose exec -T caddy cat /data/caddy/pki/authorities/local/root.crt \
            >.deploy/caddy-root.crt 2>/dev/null || return 1
        ca=(--cacert .deploy/caddy-root.crt)
    fi
    curl -fsS -o /dev/null --max-time 5 "${ca[@]}" \
        --resolve "$domain:$port:127.0.0.1" "https://$domain:$port/healthz" 2>/dev/null
}

wait_healthy() {
    local deadline=$((SECONDS + $1))
    log "waiting up to $1 s for every service and https://$(env_get DOMAIN)/healthz"
    while ((SECONDS < deadline)); do
        if services_healthy && healthz_through_caddy; then return 0; fi
        sleep 3
    done
    docker compose ps -a >&2 || true
    return 1
}

show_failing_logs() {
    local service state health
    while read -r service state health; do
        if [[ "$state" != running || ( -n "$health" && "$health" != healthy ) ]]; then
            log "--- $service ($state${health:+, $health}) ---"
            docker compose logs --no-color --tail 50 "$service" >&2 || true
        fi
    done < <(docker compose ps -a --format '{{.Service}} {{.State}} {{.Health}}' 2>/dev/null)
    # A service that never got a container (a build failure) shows nothing above.
}

record_good() {
    local image base _
    git rev-parse HEAD >.deploy/last-good-commit
    cp .env .deploy/last-good-env
    chmod 600 .deploy/last-good-env
    while read -r image base _; do
        docker image inspect "$image" >/dev/null 2>&1 && docker tag "$image" "$base:last-good"
    done < <(images)
}

rollback() {
    local good image base _
    if [[ ! -s .deploy/last-good-commit ]]; then
        log "no earlier healthy version recorded: nothing to roll back to"
        exit 1
    fi
    good="$(cat .deploy/last-good-commit)"
    log "rolling back to $(git rev-parse --short "$good") with its .env and images"
    cp .env .deploy/failed-env
    chmod 600 .deploy/failed-env
    git reset --quiet --hard "$good"
    cp .deploy/last-good-env .env
    log "the .env that failed is kept in .deploy/failed-env"
    while read -r image base _; do
        docker image inspect "$base:last-good" >/dev/null 2>&1 && docker tag "$base:last-good" "$image"
    done < <(images)
    if docker compose up -d --no-build --remove-orphans && wait_healthy "$1"; then
        log "rolled back: $(git rev-parse --short HEAD) is live again; the deploy FAILED"
        exit 1
    fi
    show_failing_logs
    log "the rollback is not healthy either"
    exit 2
}

main "$@"
exit
