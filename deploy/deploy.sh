#!/usr/bin/env bash
# Deploys one commit on this host, with a health gate and rollback.
#
#   deploy/deploy.sh [COMMIT] [--no-fetch] [--timeout SECONDS]
#   deploy/deploy.sh --rebuild [--timeout SECONDS]
#   deploy/deploy.sh --from-ssh      (the forced command of the deploy key, see docs/deploy.md)
#
# 1. git fetch origin main (DEPLOY_BRANCH), then git reset --hard COMMIT, in the checkout
#    holding this script. COMMIT must be a full 40-digit commit SHA reachable from
#    origin/main (the workflow passes the commit its tests passed); without COMMIT, the
#    tip of origin/main (by hand). .env is not tracked and stays.
# 2. docker compose build --pull (fresh base images), then up -d.
# 3. Health gate: every service running and healthy, and https://DOMAIN/healthz
#    answering 200 through Caddy, within --timeout (default 240 s).
# 4. Passed: this commit, .env and the images are recorded as the last good version
#    (.deploy/, images tagged :last-good). Failed: the failing services' logs are shown,
#    the last good commit, .env and images are put back and started, and the script
#    exits 1 (2 if even the rollback is unhealthy).
#
# --no-fetch    skips the fetch (deploy/setup-host.sh uses it for the first start).
# --rebuild     rebuilds the last good commit without the build cache from freshly pulled
#               base images, pulls the runtime images, then steps 2 to 4 (the weekly
#               workflow): security updates of Debian, Redis, Caddy and the runtimes.
# --from-ssh    takes the command from SSH_ORIGINAL_COMMAND, which must be exactly
#               `deploy COMMIT` or `rebuild`; anything else is refused.
# DEPLOY_PULL=0 (environment or .env): never pull (a host without a registry, the
#               deploy test); base and runtime images must then be there already.
# Exit 64: a refused argument or ref (nothing was changed).
# Runs from the GitHub workflows over SSH; prints no secret.
set -euo pipefail

usage() { sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; }

# Everything runs inside main: `git reset` may rewrite this very file, and bash reads a
# script as it goes, but a function is parsed whole before it runs.
main() {
    local fetch=1 timeout=240 rebuild=0 from_ssh=0 commit=""
    while (($#)); do
        case "$1" in
        --no-fetch) fetch=0 ;;
        --rebuild) rebuild=1 ;;
        --from-ssh) from_ssh=1 ;;
        --timeout) timeout="${2:?--timeout needs seconds}"; shift ;;
        -h | --help) usage; exit 0 ;;
        -*) refuse "unknown argument $1 (see --help)" ;;
        *) [[ -z "$commit" ]] || refuse "one commit only (see --help)"; commit="$1" ;;
        esac
        shift
    done
    if ((from_ssh)); then
        # The key's forced command: whatever the client asked for is only data here.
        local asked="${SSH_ORIGINAL_COMMAND:-}"
        if [[ "$asked" =~ ^deploy\ ([0-9a-f]{40})$ ]]; then
            commit="${BASH_REMATCH[1]}" rebuild=0
        elif [[ "$asked" == rebuild ]]; then
            rebuild=1
        else
            refuse "this key may only run 'deploy <full commit SHA>' or 'rebuild', not: ${asked:0:100}"
        fi
    fi
    if [[ -n "$commit" && ! "$commit" =~ ^[0-9a-f]{40}$ ]]; then
        refuse "'${commit:0:100}' is not a full commit SHA (40 lowercase hex digits)"
    fi
    cd "$(dirname "$0")/.."
    [[ -f .env ]] || die ".env is missing in $PWD: run deploy/setup-host.sh first"
    mkdir -p .deploy
    local pull="${DEPLOY_PULL:-$(env_get DEPLOY_PULL)}"
    [[ "$pull" == 0 ]] && pull=0 || pull=1

    local branch="${DEPLOY_BRANCH:-main}"
    if ((rebuild)); then
        [[ -z "$commit" ]] || refuse "--rebuild rebuilds the last good commit; give no commit"
        [[ -s .deploy/last-good-commit ]] || refuse "--rebuild: no healthy version recorded yet"
        commit="$(cat .deploy/last-good-commit)"
        log "rebuilding $(git rev-parse --short "$commit") (the last good commit) without cache"
        git reset --quiet --hard "$commit"
    elif ((fetch)); then
        log "fetching origin/$branch (now at $(git rev-parse --short HEAD))"
        git fetch --quiet origin "$branch"
    fi
    if ((!rebuild)) && [[ -n "$commit" ]]; then
        # Only a commit of the deployed branch: not one pushed to some other branch.
        git cat-file -e "$commit^{commit}" 2>/dev/null \
            || refuse "commit $commit is not in origin (fetched origin/$branch)"
        git merge-base --is-ancestor "$commit" "origin/$branch" \
            || refuse "commit $commit is not reachable from origin/$branch"
        git reset --quiet --hard "$commit"
    elif ((!rebuild && fetch)); then
        git reset --quiet --hard "origin/$branch"
    fi

    # The weekly rebuild takes upstream's updates: each tag resolved to its digest
    # again before the build (a rollback puts the last good .env, and its pins, back).
    if ((rebuild && pull)); then
        deploy/pin-images.sh --repin || die "cannot pin the images again (nothing changed); the rebuild stops"
    fi
    local build=(docker compose build) pulled=""
    if ((pull)); then build+=(--pull); else pulled=" (DEPLOY_PULL=0: nothing pulled)"; fi
    ((rebuild == 0)) || build+=(--no-cache)
    log "deploying $(git rev-parse HEAD): ${build[*]}$pulled"
    if "${build[@]}" && { ((rebuild == 0 || pull == 0)) || pull_runtime_images; } \
        && docker compose up -d --no-build --remove-orphans && wait_healthy "$timeout"; then
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
refuse() { log "refused: $*"; exit 64; }

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

# The runtime images tasks run in (docs/configuration.md's RUNTIME_IMAGES defaults, then
# .env's), and the images compose does not build (deploy/grafana's): pulled on --rebuild,
# so they get their security updates too. A failed pull fails the rebuild (and rolls back).
pull_runtime_images() {
    local pairs pair image
    declare -A chosen=()
    IFS=',' read -ra pairs <<<"node24=node:24-slim,python3.8=python:3.8-slim,python3.13=python:3.13-slim,$(env_get RUNTIME_IMAGES)"
    for pair in "${pairs[@]}"; do [[ "$pair" != *=* ]] || chosen["${pair%%=*}"]="${pair#*=}"; done
    for image in "${chosen[@]}"; do
        log "pulling runtime image $image"
        docker pull -q "$image" >/dev/null || { log "cannot pull $image"; return 1; }
    done
    docker compose pull --quiet --ignore-buildable
}

# True when every service is running and, where it has a health check, healthy; the
# one-shot `functions` (loads the Lua functions) has exited 0 instead.
services_healthy() {
    local states
    states="$(docker compose ps -a --format '{{.Service}} {{.State}} {{.Health}} {{.ExitCode}}')" || return 1
    [[ -n "$states" ]] || return 1
    ! grep -vqE '^([^ ]+ running (healthy)? ?[0-9]+|functions exited +0)$' <<<"$states"
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
    local service state code health shown=0
    while read -r service state code health; do
        [[ "$service" == functions && "$state" == exited && "$code" == 0 ]] && continue
        if [[ "$state" != running || ( -n "$health" && "$health" != healthy ) ]]; then
            log "--- $service ($state${health:+, $health}) ---"
            docker compose logs --no-color --tail 50 "$service" >&2 || true
            shown=1
        fi
    done < <(docker compose ps -a --format '{{.Service}} {{.State}} {{.ExitCode}} {{.Health}}' 2>/dev/null)
    # A crash-looping service can look healthy for the instant ps looks (seen once in
    # the deploy test, under load): then every service's last lines, so its reason shows.
    if ((!shown)); then
        log "--- no service is failing at this instant; the last lines of each ---"
        docker compose logs --no-color --tail 20 >&2 || true
    fi
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
