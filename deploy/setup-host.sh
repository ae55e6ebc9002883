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
#   --client-certs       with --remote-workers: Redis's TLS port also requires a client
#                        certificate signed by the deployment's CA (mutual TLS,
#                        REDIS_TLS_CLIENT_CERTS=on); add-worker.sh --issue --csr issues them
#   --allow-workers LIST worker hosts' addresses or networks (IPv4 and IPv6, comma-
#                        separated) that may reach Redis's TLS port (required with
#                        --remote-workers unless .env keeps a list); every other source
#                        is dropped in DOCKER-USER (iptables and ip6tables), where traffic
#                        to Docker's published ports passes (ufw and INPUT never see it).
#                        Kept in .env (REDIS_TLS_ALLOW) and applied again on every run.
#                        A systemd unit, script-runner-firewall.service, applies them again
#                        at boot and whenever Docker restarts
#   --firewall-only      only apply the --allow-workers rules again (after a firewall reload;
#                        the list from .env when not given), nothing else
#   --redis-tls-port N   with --firewall-only: the TLS port for those rules (default
#                        REDIS_TLS_PORT in .env, or 6380 when .env does not set it, as
#                        Compose does; refused when there is no .env)
#   --skip-images        do not pull and pin the runtime and base images (pin-images.sh)
#   --dry-run            print what would be done, change nothing
#   -h, --help           this text
#
# Steps: install Docker Engine and the Compose plugin (Docker's apt repository), git,
# curl, openssl; clone or update the checkout; write .env (a generated
# SCRIPT_RUNNER_TOKEN, printed once, generated Redis passwords and the task spec key
# pair); with --remote-workers create the TLS material in deploy/tls; pull the runtime
# images and pin them by digest (deploy/pin-images.sh); apply the --allow-workers rules; start the stack with deploy/deploy.sh
# --no-fetch, which waits until it is healthy.
set -euo pipefail

DOMAIN="" EMAIL="" REPO="" DIR="" BRANCH=main REMOTE=0 TLS_NAMES="" SKIP_IMAGES=0 DRY=0
CLIENT_CERTS=0 ALLOW_WORKERS="" FIREWALL_ONLY=0 TLS_PORT=""

usage() { sed -n '2,46p' "$0" | sed 's/^# \{0,1\}//'; }
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
    --client-certs) CLIENT_CERTS=1 ;;
    --allow-workers) ALLOW_WORKERS="${2:?--allow-workers needs a list}"; shift ;;
    --firewall-only) FIREWALL_ONLY=1 ;;
    --redis-tls-port) TLS_PORT="${2:?--redis-tls-port needs a port}"; shift ;;
    --dry-run) DRY=1 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done

[[ $(id -u) == 0 ]] || ((DRY)) || die "run as root (sudo): it installs packages and starts Docker"

# --- the allow-list for Redis's TLS port, in DOCKER-USER --------------------------------
# Published ports are DNATed in PREROUTING and then pass FORWARD, whose first stop is
# DOCKER-USER: there a packet still carries the published port as its conntrack
# original destination port (--ctorigdstport), not as its --dport. Our own chain
# SR-REDIS-TLS returns the allowed sources and drops the rest; only connections to a
# published port (ctstate DNAT), in their original direction (replies pass), are sent
# there. IPv6 also goes through INPUT when Docker's userland proxy serves the port on
# an IPv6 address for an IPv4-only container. Re-running flushes and refills our chain
# only, and adds each jump once (iptables -C before -I).
CHAIN=SR-REDIS-TLS
valid_cidr() { # valid_cidr 4|6 TEXT
    local ip="${2%/*}" len=""
    [[ "$2" == */* ]] && len="${2#*/}"
    if [[ "$1" == 4 ]]; then
        [[ "$ip" =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] || return 1
        local o; for o in "${BASH_REMATCH[@]:1}"; do ((10#$o <= 255)) || return 1; done
        [[ -z "$len" ]] || { [[ "$len" =~ ^[0-9]{1,2}$ ]] && ((10#$len <= 32)); }
    else
        [[ "$ip" == *:* && "$ip" =~ ^[0-9A-Fa-f:.]+$ ]] || return 1
        [[ -z "$len" ]] || { [[ "$len" =~ ^[0-9]{1,3}$ ]] && ((10#$len <= 128)); }
    fi
}
firewall_rules() { # prints the commands, one a line; fails on an entry that is no address
    local port="$1" list="$2" entry tool fam
    if ! [[ "$port" =~ ^[0-9]+$ ]] || ((port < 1 || port > 65535)); then
        log "--redis-tls-port $port is not a port"; return 1
    fi
    local v4=() v6=()
    IFS=',' read -ra entries <<<"$list"
    for entry in "${entries[@]}"; do
        entry="${entry// /}"
        [[ -n "$entry" ]] || continue
        if valid_cidr 4 "$entry"; then v4+=("$entry")
        elif valid_cidr 6 "$entry"; then v6+=("$entry")
        else log "--allow-workers: $entry is not an IPv4 or IPv6 address or network"; return 1
        fi
    done
    ((${#v4[@]} + ${#v6[@]})) || { log "--allow-workers: no address given"; return 1; }
    for fam in 4 6; do
        tool=iptables; [[ $fam == 6 ]] && tool=ip6tables
        echo "$tool -w -N $CHAIN"
        echo "$tool -w -F $CHAIN"
        local -n allowed="v$fam"
        for entry in "${allowed[@]}"; do echo "$tool -w -A $CHAIN -s $entry -j RETURN"; done
        echo "$tool -w -A $CHAIN -j DROP"
        # Position 1 of DOCKER-USER, ahead of the worker's own task jumps (SR-FWD-<bridge>):
        # on purpose, so no other rule can accept a connection to the port first. The
        # worker's jump-order check tolerates exactly this jump ahead of its own, as
        # SR-REDIS-TLS only RETURNs or DROPs.
        echo "$tool -w -I DOCKER-USER -p tcp -m conntrack --ctstate DNAT --ctorigdstport $port --ctdir ORIGINAL -j $CHAIN"
        [[ $fam == 6 ]] && echo "$tool -w -I INPUT ! -i lo -p tcp -m conntrack --ctorigdstport $port --ctdir ORIGINAL -j $CHAIN"
    done
    return 0
}
apply_firewall() {
    local port="$1" list="$2" rules line
    rules="$(firewall_rules "$port" "$list")" || die "no firewall rules applied"
    while read -r line; do
        if ((DRY)); then printf 'would run: %s\n' "$line"; continue; fi
        read -ra cmd <<<"$line"
        case "${cmd[2]}" in
        -N) "${cmd[@]}" 2>/dev/null || true ;;
        -I) # once: a jump already there is kept; one for another port is removed (the
            # rules are written in the order iptables -S prints them, to compare)
            local tool="${cmd[0]}" parent="${cmd[3]}" old
            while read -r old; do
                [[ "$old" == "-A $parent ${cmd[*]:4}" ]] && continue
                read -ra del <<<"${old/-A /-D }"
                "$tool" -w "${del[@]}"
            done < <("$tool" -w -S "$parent" 2>/dev/null | grep -- "-j $CHAIN\$" || true)
            if ! "$tool" -w -n -L "$parent" >/dev/null 2>&1; then
                log "$tool: no $parent chain (Docker without $tool?): skipped"
            elif ! "$tool" -w -C "$parent" "${cmd[@]:4}" 2>/dev/null; then
                "${cmd[@]}"
            fi ;;
        *) "${cmd[@]}" ;;
        esac
    done <<<"$rules"
    ((DRY)) || log "Redis's TLS port $port: only ${list} may connect (chain $CHAIN, IPv4 and IPv6)"
}
here="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" 2>/dev/null && pwd)" || here=""
if [[ -z "$DIR" ]]; then
    if [[ -n "$here" && -f "$here/../docker-compose.yml" ]]; then DIR="$(cd "$here/.." && pwd)"; else DIR=/opt/script-runner; fi
fi
# The TLS port the rules are for: --redis-tls-port, else .env's REDIS_TLS_PORT, else the
# port Compose publishes when .env does not set it (deploy/remote-workers.yml: 6380).
# Without .env it is not known, and a wrong one would leave the real port open to all.
tls_port_of_env() {
    [[ -z "$TLS_PORT" ]] || { echo "$TLS_PORT"; return; }
    # A dry run of a first setup has no .env yet: the one it would write leaves the port unset.
    if [[ ! -f "$DIR/.env" ]] && ((DRY && !FIREWALL_ONLY)); then echo 6380; return; fi
    [[ -f "$DIR/.env" ]] || { log "no $DIR/.env to read REDIS_TLS_PORT from: give --redis-tls-port N (or --dir, the checkout)"; return 1; }
    local port
    port="$(grep -E '^REDIS_TLS_PORT=' "$DIR/.env" | tail -n1 | cut -d= -f2- || true)"
    echo "${port:-6380}"
}
# After a reboot, or a restart of Docker, the rules are gone (Docker rebuilds its own
# chains, not ours): a oneshot unit runs --firewall-only again once Docker is up, and
# again whenever docker.service is restarted (PartOf). It runs this checkout's script as
# root; the deploy user who owns the checkout is in the docker group, root already.
UNIT=script-runner-firewall.service
install_firewall_unit() {
    if [[ ! -d /run/systemd/system ]] && ! ((DRY)); then
        log "no systemd here: after a reboot or a Docker restart, run $DIR/deploy/setup-host.sh --firewall-only --dir $DIR again"
        return 0
    fi
    local unit
    unit="[Unit]
Description=script-runner: Redis TLS port allow-list (REDIS_TLS_ALLOW) in DOCKER-USER
After=docker.service
PartOf=docker.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=$DIR/deploy/setup-host.sh --firewall-only --dir $DIR

[Install]
WantedBy=docker.service"
    if ((DRY)); then
        printf 'would write: /etc/systemd/system/%s\n%s\n' "$UNIT" "$unit"
        printf 'would run: systemctl daemon-reload\nwould run: systemctl enable --now %s\n' "$UNIT"
        return 0
    fi
    if [[ ! -d /run/systemd/system ]]; then
        log "WARNING: systemd does not run this host: the rules are in place now, but nothing applies them
  again after a reboot or a Docker restart; have your init run: $DIR/deploy/setup-host.sh --firewall-only --dir $DIR"
        return 0
    fi
    if [[ "$(cat "/etc/systemd/system/$UNIT" 2>/dev/null)" != "$unit" ]]; then
        printf '%s\n' "$unit" >"/etc/systemd/system/$UNIT"
        systemctl daemon-reload
    fi
    systemctl enable --now --quiet "$UNIT"
    log "installed $UNIT: the rules are applied again at boot and when Docker restarts"
}
if ((FIREWALL_ONLY)); then
    if [[ -z "$ALLOW_WORKERS" && -f "$DIR/.env" ]]; then
        ALLOW_WORKERS="$(grep -E '^REDIS_TLS_ALLOW=' "$DIR/.env" | tail -n1 | cut -d= -f2- || true)"
    fi
    [[ -n "$ALLOW_WORKERS" ]] || die "--firewall-only needs --allow-workers, or REDIS_TLS_ALLOW in $DIR/.env (--dir: the checkout)"
    port="$(tls_port_of_env)" || die "no firewall rules applied"
    apply_firewall "$port" "$ALLOW_WORKERS"
    exit 0
fi
# The unit and Compose read the port from .env: rules for another one would not last.
[[ -z "$TLS_PORT" ]] || die "--redis-tls-port goes with --firewall-only; otherwise REDIS_TLS_PORT in .env is the port"
# Redis's TLS port is never published to everyone: the allow-list comes with it, given now
# or kept in .env from an earlier run. (Every source, on purpose: 0.0.0.0/0,::/0.)
# A host set up with --remote-workers before keeps it in .env's COMPOSE_FILE.
grep -qE '^COMPOSE_FILE=.*remote-workers\.yml' "$DIR/.env" 2>/dev/null && REMOTE=1
if ((REMOTE)) && [[ -z "$ALLOW_WORKERS" ]] \
    && [[ -z "$(grep -E '^REDIS_TLS_ALLOW=.' "$DIR/.env" 2>/dev/null || true)" ]]; then
    die "--remote-workers publishes Redis's TLS port: give --allow-workers ADDRESS[,ADDRESS...] too, \
the worker hosts' addresses or networks (only they may connect; 0.0.0.0/0,::/0 for every source, if a \
firewall in front of this host does the filtering)"
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
# The task spec signing pair (docs/security.md#signed-task-specs), as
# `script-runner-ctl signing-key generate` makes it, with openssl: an Ed25519
# key's PKCS#8 DER ends with its 32-byte seed, its SubjectPublicKeyInfo DER with
# the 32-byte public key. signing_seed prints a new seed, verify_key_of (seed on
# stdin) its public key, both base64.
signing_seed() { openssl genpkey -algorithm ed25519 -outform DER | tail -c 32 | base64 -w0; }
verify_key_of() {
    { printf '\x30\x2e\x02\x01\x00\x30\x05\x06\x03\x2b\x65\x70\x04\x22\x04\x20'; base64 -d; } |
        openssl pkey -inform DER -pubout -outform DER | tail -c 32 | base64 -w0
}

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
    # The last three serve deploy/redis-sentinel.yml only (docs/redis-ha.md); harmless without it.
    for name in REDIS_API_PASSWORD REDIS_WORKER_PASSWORD REDIS_ADMIN_PASSWORD REDIS_OPS_PASSWORD \
        REDIS_REPLICA_PASSWORD REDIS_SENTINEL_PASSWORD REDIS_SENTINEL_CLIENT_PASSWORD; do
        [[ -n "$(env_get "$name")" ]] || env_set "$name" "$(secret 24)"
    done
    # Made once and kept: workers on other hosts hold the public key.
    if [[ -z "$(env_get TASK_SIGNING_KEY)" ]]; then
        local seed=""
        ((DRY)) || seed="$(signing_seed)"
        env_set TASK_SIGNING_KEY "$seed"
        ((DRY)) || env_set TASK_VERIFY_KEYS "$(printf '%s' "$seed" | verify_key_of)"
    elif [[ -z "$(env_get TASK_VERIFY_KEYS)" ]]; then
        env_set TASK_VERIFY_KEYS "$(env_get TASK_SIGNING_KEY | verify_key_of)"
    fi
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
    ((CLIENT_CERTS == 0)) || env_set REDIS_TLS_CLIENT_CERTS on
}

# The runtime images, and the base images the binaries' images are built from, pulled
# and pinned by digest in .env (deploy/pin-images.sh): every host runs the same bytes.
pull_images() {
    log "pulling the runtime and base images and pinning them by digest"
    run "$DIR/deploy/pin-images.sh" --env "$DIR/.env" \
        || die "cannot pin the images: set RUNTIME_IMAGES in .env to images this host can pull, or --skip-images"
}

install_packages
checkout
TOKEN_CREATED=""
write_env
((REMOTE == 0)) || make_tls
[[ -z "$ALLOW_WORKERS" ]] || env_set REDIS_TLS_ALLOW "$ALLOW_WORKERS"
((SKIP_IMAGES)) || pull_images
# Before the stack starts, so the TLS port is never published without its rules: Docker
# makes DOCKER-USER when its daemon starts (install_packages started it), and keeps the
# chain's rules when containers come and go.
allow="${ALLOW_WORKERS:-$(env_get REDIS_TLS_ALLOW)}"
if [[ -n "$allow" ]]; then
    port="$(tls_port_of_env)" || die "no firewall rules applied"
    apply_firewall "$port" "$allow"
    install_firewall_unit
fi
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

Worker hosts: give each its own Redis user here, deploy/add-worker.sh --issue NAME,
copy deploy/worker-hosts/NAME/ to it, and there run
  deploy/add-worker.sh --redis rediss://$DOMAIN:${tls_port:-6380} --ca ca.crt --name NAME --password-file password
(docs/deploy.md, also for client certificates). Let only the worker hosts reach port ${tls_port:-6380}/tcp:
setup-host.sh --allow-workers ADDRESS[,ADDRESS...] (DOCKER-USER, IPv4 and IPv6).
EOT
fi
