#!/usr/bin/env bash
# Turns a fresh Debian 12/13 or Ubuntu 24.04 host into a script-runner MCP endpoint at
# https://DOMAIN/mcp. Idempotent: run it again to update the checkout, fill in missing
# settings and restart; existing secrets in .env are kept.
#
#   sudo deploy/setup-host.sh --domain mcp.example.com [options]
#   curl -fsSL https://raw.githubusercontent.com/OWNER/REPO/main/deploy/setup-host.sh \
#       | sudo bash -s -- --repo https://github.com/OWNER/REPO.git --domain mcp.example.com
#
# Options:
#   --domain NAME        public DNS name pointing at this host (required the first time)
#   --email ADDRESS      contact for the ACME account (Let's Encrypt), optional
#   --repo URL           git repository to clone (default: this checkout's origin)
#   --dir PATH           where the checkout lives (default: this checkout, or
#                        /opt/script-runner when run from outside one)
#   --branch NAME        branch to deploy (default main)
#   --remote-workers     also serve Redis over TLS to worker hosts (deploy/add-worker.sh):
#                        makes a private CA and Redis certificate with openssl
#   --tls-names LIST     names and IPs in Redis's certificate, comma-separated
#                        (default: DOMAIN and this host's public IPv4 address)
#   --skip-images        do not pull the runtime images tasks run in
#   --dry-run            print what would be done, change nothing
#   -h, --help           this text
#
# Steps: install Docker Engine and the Compose plugin (Docker's apt repository), git,
# curl, openssl; clone or update the checkout; write .env (a generated
# SCRIPT_RUNNER_TOKEN, printed once, and generated Redis passwords); with
# --remote-workers create the TLS material in deploy/tls; pull the runtime images;
# start the stack with deploy/deploy.sh --no-fetch, which waits until it is healthy.
set -euo pipefail

DOMAIN="" EMAIL="" REPO="" DIR="" BRANCH=main REMOTE=0 TLS_NAMES="" SKIP_IMAGES=0 DRY=0

usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; }
log() { printf 'setup-host: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
# Runs a command, or only shows it with --dry-run.
run() {
    if ((DRY)); then printf 'would run: %s\n' "$*"; else "$@"; fi
}

while (($#)); do
    case "$1" in
    --domain) DOMAIN="${2:?--domain needs a name}"; shift ;;
    --email) EMAIL="${2:?--email needs an address}"; shift ;;
    --repo) REPO="${2:?--repo needs a URL}"; shift ;;
    --dir) DIR="${2:?--dir needs a path}"; shift ;;
    --branch) BRANCH="${2:?--branch needs a name}"; shift ;;
    --remote-workers) REMOTE=1 ;;
    --tls-names) TLS_NAMES="${2:?--tls-names needs a list}"; shift ;;
    --skip-images) SKIP_IMAGES=1 ;;
    --dry-run) DRY=1 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done

[[ $(id -u) == 0 ]] || ((DRY)) || die "run as root (sudo): it installs packages and starts Docker"

here="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" 2>/dev/null && pwd)" || here=""
if [[ -z "$DIR" ]]; then
    if [[ -n "$here" && -f "$here/../docker-compose.yml" ]]; then DIR="$(cd "$here/.." && pwd)"; else DIR=/opt/script-runner; fi
fi

install_packages() {
    local missing=()
    for cmd in git curl openssl; do command -v "$cmd" >/dev/null || missing+=("$cmd"); done
    if ((${#missing[@]})); then
        log "installing ${missing[*]}"
        run apt-get update -qq
        run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ca-certificates "${missing[@]}"
    fi
    if command -v docker >/dev/null && docker compose version >/dev/null 2>&1; then
        log "Docker and the Compose plugin are present: $(docker compose version --short 2>/dev/null)"
        return
    fi
    # Docker's own repository: the distributions' packages lack the Compose v2 plugin
    # (Debian 12) or lag behind.
    local id codename
    # shellcheck disable=SC1091
    id="$(. /etc/os-release && echo "$ID")"
    # shellcheck disable=SC1091
    codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
    case "$id" in debian | ubuntu) ;; *) die "unsupported distribution $id: install Docker and the Compose plugin by hand, then run again" ;; esac
    log "installing Docker Engine and the Compose plugin from download.docker.com ($id $codename)"
    run install -m 0755 -d /etc/apt/keyrings
    run curl -fsSL "https://download.docker.com/linux/$id/gpg" -o /etc/apt/keyrings/docker.asc
    run chmod a+r /etc/apt/keyrings/docker.asc
    if ((DRY)); then
        printf 'would write: /etc/apt/sources.list.d/docker.list\n'
    else
        echo "deb [arch=$(dpkg --print-architecture) signed-by=/etc/apt/keyrings/docker.asc] https://download.docker.com/linux/$id $codename stable" \
            >/etc/apt/sources.list.d/docker.list
    fi
    run apt-get update -qq
    run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        docker-ce docker-ce-cli containerd.io docker-buildx-plugin docker-compose-plugin
    # Docker starts on boot, and so do the services (restart: unless-stopped).
    run systemctl enable --now docker
}

checkout() {
    if [[ -d "$DIR/.git" ]]; then
        log "updating $DIR to origin/$BRANCH"
        run git -C "$DIR" fetch --quiet origin "$BRANCH"
        run git -C "$DIR" reset --quiet --hard "origin/$BRANCH"
    else
        [[ -n "$REPO" ]] || die "$DIR is not a checkout: give --repo URL"
        log "cloning $REPO into $DIR"
        run git clone --quiet --branch "$BRANCH" "$REPO" "$DIR"
    fi
}

# The current value of NAME in .env, empty if unset.
env_get() { grep -E "^$1=" "$DIR/.env" 2>/dev/null | tail -n1 | cut -d= -f2- || true; }
# Sets NAME=VALUE in .env, replacing an existing line. The value never reaches argv of
# another process, and nothing here prints it.
env_set() {
    local name="$1" value="$2" tmp
    if ((DRY)); then printf 'would set %s in %s/.env\n' "$name" "$DIR"; return; fi
    tmp="$(mktemp "$DIR/.env.XXXXXX")"
    grep -vE "^$name=" "$DIR/.env" >"$tmp" || true
    printf '%s=%s\n' "$name" "$value" >>"$tmp"
    chmod 600 "$tmp"
    mv "$tmp" "$DIR/.env"
}
secret() { openssl rand -hex "$1"; }

write_env() {
    local token_created=""
    if [[ ! -f "$DIR/.env" ]]; then
        log "writing $DIR/.env from .env.example"
        run install -m 600 "$DIR/.env.example" "$DIR/.env"
    fi
    [[ -n "$DOMAIN" ]] || DOMAIN="$(env_get DOMAIN)"
    [[ -n "$DOMAIN" ]] || die "give --domain (the DNS name clients will use)"
    env_set DOMAIN "$DOMAIN"
    [[ -z "$EMAIL" ]] || env_set CADDY_GLOBAL_OPTIONS "email $EMAIL"
    if [[ "$(env_get SCRIPT_RUNNER_TOKEN)" =~ ^.{32,}$ ]]; then
        log "SCRIPT_RUNNER_TOKEN already set in .env (kept)"
    else
        ((DRY)) || token_created="$(secret 32)"
        env_set SCRIPT_RUNNER_TOKEN "$token_created"
    fi
    local name
    for name in REDIS_API_PASSWORD REDIS_WORKER_PASSWORD REDIS_ADMIN_PASSWORD REDIS_OPS_PASSWORD; do
        [[ -n "$(env_get "$name")" ]] || env_set "$name" "$(secret 24)"
    done
    [[ -n "$(env_get TASKS_DIR)" ]] || env_set TASKS_DIR /var/lib/script-runner/tasks
    [[ -n "$(env_get WORKER_NAME)" ]] || env_set WORKER_NAME "$(hostname -s)"
    local tasks
    tasks="$(env_get TASKS_DIR)"
    run mkdir -p "${tasks:-/var/lib/script-runner/tasks}"
    TOKEN_CREATED="$token_created"
}

public_ip() {
    ip -4 -o route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p'
}

make_tls() {
    local names="${TLS_NAMES:-$DOMAIN,$(public_ip)}"
    log "Redis TLS for remote workers: certificate for $names in $DIR/deploy/tls"
    run "$DIR/deploy/make-redis-tls.sh" "$DIR/deploy/tls" "$names"
    [[ -n "$(env_get REDIS_TLS_DIR)" ]] || env_set REDIS_TLS_DIR ./deploy/tls
    env_set COMPOSE_FILE docker-compose.yml:deploy/remote-workers.yml
}

pull_images() {
    local images image
    images="$(env_get RUNTIME_IMAGES)"
    images="node24=node:24-slim,python3.8=python:3.8-slim,python3.13=python:3.13-slim${images:+,$images}"
    declare -A chosen=()
    IFS=',' read -ra pairs <<<"$images"
    for pair in "${pairs[@]}"; do chosen["${pair%%=*}"]="${pair#*=}"; done
    for image in "${chosen[@]}"; do
        if docker image inspect "$image" >/dev/null 2>&1; then continue; fi
        log "pulling runtime image $image"
        run docker pull -q "$image" >/dev/null || die "cannot pull $image: set RUNTIME_IMAGES in .env to images this host has, or --skip-images"
    done
}

install_packages
checkout
TOKEN_CREATED=""
write_env
((REMOTE == 0)) || make_tls
((SKIP_IMAGES)) || pull_images
log "starting the stack (deploy/deploy.sh --no-fetch)"
run "$DIR/deploy/deploy.sh" --no-fetch
if ((DRY)); then
    log "dry run: nothing was changed"
    exit 0
fi

port="$(env_get HTTPS_PORT)"
url="https://$DOMAIN${port:+:$port}/mcp"
[[ "$port" != 443 ]] || url="https://$DOMAIN/mcp"
cat <<EOT

script-runner is up: $url
Clients send the header  Authorization: Bearer <SCRIPT_RUNNER_TOKEN from $DIR/.env>
EOT
if [[ -n "$TOKEN_CREATED" ]]; then
    printf '\nThe generated token (shown this once; it stays in %s/.env):\n  %s\n' "$DIR" "$TOKEN_CREATED"
fi
if ((REMOTE)); then
    tls_port="$(env_get REDIS_TLS_PORT)"
    cat <<EOT

Worker hosts: copy $DIR/deploy/tls/ca.crt to the worker host, and there run
  deploy/add-worker.sh --redis rediss://$DOMAIN:${tls_port:-6380} --ca ca.crt
It asks for REDIS_WORKER_PASSWORD (in $DIR/.env). Open port ${tls_port:-6380}/tcp to
the worker hosts only, if your firewall allows that.
EOT
fi
