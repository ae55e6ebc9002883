#!/usr/bin/env bash
# Adds this Docker host as a script-runner worker of a central deployment, or removes it.
#
#   deploy/add-worker.sh --redis rediss://HOST:PORT --ca CA_FILE [options]
#   deploy/add-worker.sh --remove
#
# Run it in a checkout of the repository on the worker host (root, Docker installed:
# deploy/setup-host.sh's first step, or Docker's own instructions). It asks for the
# worker user's Redis password (REDIS_WORKER_PASSWORD in the central host's .env), or
# reads it from the environment variable REDIS_WORKER_PASSWORD or --password-file.
#
# Before anything starts it checks, in the worker image, that HOST:PORT is reachable,
# speaks TLS with a certificate from CA_FILE for HOST, and accepts the worker user's
# password; each failure gets its own message. Then it starts one worker container
# (restart: unless-stopped, so it comes back on boot), waits for its heartbeat in
# Redis, and prints how to watch it live.
#
# Options:
#   --redis URL          rediss://HOST:PORT of the central Redis (TLS only: redis:// is refused)
#   --ca FILE            the central host's deploy/tls/ca.crt
#   --name NAME          this worker's WORKER_NAME, unique and stable (default: hostname)
#   --concurrency N      tasks at once (default: CPUs)
#   --api-host HOST      the central api's public name or IP, also refused to tasks
#                        (default: HOST of --redis)
#   --password-file F    read the worker password from F
#   --check              only run the checks
#   --remove             drain (SIGTERM; running tasks get SHUTDOWN_GRACE_SECONDS) and
#                        remove this worker, its task network and firewall jumps
#   -h, --help           this text
#
# More worker settings (TASK_*, RUNTIME_IMAGES, TASKS_DIR, BASE_IMAGE, BINARIES, ...)
# are taken from the environment when set, and kept in deploy/worker-host.env.
set -euo pipefail

ORIG_PWD="$PWD"
cd "$(dirname "$0")/.."
ENV_FILE=deploy/worker-host.env
COMPOSE=(docker compose -f deploy/worker-host.yml --env-file "$ENV_FILE")
PASSTHROUGH=(REDIS_KEY_PREFIX WORKER_HEARTBEAT_SECONDS TASKS_DIR RUNTIME_IMAGES TASK_RETENTION_SECONDS
    ZIP_MAX_ENTRIES ZIP_MAX_EXPANDED_BYTES TASK_MEMORY_MB TASK_CPUS TASK_PIDS_LIMIT TASK_NOFILE
    TASK_DISK_MB TASK_TMPFS_MB POOL_SIZE POOL_MAX_AGE_SECONDS TASK_USER TASK_NETWORK TASK_BRIDGE TASK_FIREWALL
    SHUTDOWN_GRACE_SECONDS WORKER_STOP_GRACE RUST_LOG BASE_IMAGE RUST_IMAGE BINARIES PREBUILT_DIR
    IMAGE_PREFIX IMAGE_TAG COMPOSE_PROJECT_NAME)

usage() { sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; }
log() { printf 'add-worker: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

REDIS="" CA="" NAME="" CONCURRENCY="" API_HOST="" PASSWORD_FILE="" MODE=add
while (($#)); do
    case "$1" in
    --redis) REDIS="${2:?--redis needs a URL}"; shift ;;
    --ca) CA="${2:?--ca needs a file}"; shift ;;
    --name) NAME="${2:?--name needs a name}"; shift ;;
    --concurrency) CONCURRENCY="${2:?--concurrency needs a number}"; shift ;;
    --api-host) API_HOST="${2:?--api-host needs a host}"; shift ;;
    --password-file) PASSWORD_FILE="${2:?--password-file needs a file}"; shift ;;
    --check) MODE=check ;;
    --remove) MODE=remove ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done

env_get() { grep -E "^$1=" "$ENV_FILE" 2>/dev/null | tail -n1 | cut -d= -f2- || true; }

remove() {
    [[ -f "$ENV_FILE" ]] || die "no worker was added here ($ENV_FILE is missing)"
    local bridge network grace
    bridge="$(env_get TASK_BRIDGE)"; bridge="${bridge:-sr-tasks0}"
    network="$(env_get TASK_NETWORK)"; network="${network:-script-runner-tasks}"
    grace="$(env_get SHUTDOWN_GRACE_SECONDS)"; grace="$((${grace:-30} + 15))"
    log "draining worker $(env_get WORKER_NAME): SIGTERM, up to ${grace} s for running tasks"
    "${COMPOSE[@]}" stop -t "$grace" worker
    "${COMPOSE[@]}" down --remove-orphans
    # What the worker installed on this host: the jumps into its firewall chains and
    # the task network. (The chains stay: other workers here may use them.)
    docker run --rm --network host --cap-add NET_ADMIN --entrypoint sh "$(image)" -c "
        iptables -w -D INPUT -i '$bridge' -j SR-TASKS-IN 2>/dev/null || true
        iptables -w -D DOCKER-USER -i '$bridge' -j SR-TASKS-FWD 2>/dev/null || true" || true
    docker network rm "$network" >/dev/null 2>&1 || true
    rm -f "$ENV_FILE"
    log "removed; its queued work stays in Redis for the other workers"
}

image() {
    local prefix tag
    prefix="$(env_get IMAGE_PREFIX)"; tag="$(env_get IMAGE_TAG)"
    printf '%s/worker:%s' "${prefix:-script-runner}" "${tag:-latest}"
}

if [[ "$MODE" == remove ]]; then remove; exit 0; fi

# --- settings --------------------------------------------------------------------
[[ -n "$REDIS" ]] || die "give --redis rediss://HOST:PORT (the central Redis's TLS port)"
case "$REDIS" in
rediss://*) ;;
redis://*) die "refusing plain TCP ($REDIS): a remote worker reaches Redis over TLS only; use rediss://HOST:PORT (the central host's REDIS_TLS_PORT, 6380 by default)" ;;
*) die "--redis must look like rediss://HOST:PORT, not $REDIS" ;;
esac
hostport="${REDIS#rediss://}"; hostport="${hostport##*@}"; hostport="${hostport%%/*}"
HOST="${hostport%:*}"; PORT="${hostport##*:}"
[[ "$hostport" == *:* && "$PORT" =~ ^[0-9]+$ ]] || { HOST="$hostport"; PORT=6380; }
[[ -z "$CA" || "$CA" == /* ]] || CA="$ORIG_PWD/$CA"
[[ -z "$PASSWORD_FILE" || "$PASSWORD_FILE" == /* ]] || PASSWORD_FILE="$ORIG_PWD/$PASSWORD_FILE"
[[ -n "$CA" && -r "$CA" ]] || die "give --ca FILE: the central host's deploy/tls/ca.crt (not readable: ${CA:-none})"
openssl x509 -in "$CA" -noout 2>/dev/null || die "$CA is not a PEM certificate"
CA="$(realpath "$CA")"
NAME="${NAME:-$(hostname -s)}"
[[ "$NAME" =~ ^[A-Za-z0-9._-]+$ ]] || die "--name $NAME: use letters, digits, '.', '-' and '_'"

if [[ -n "$PASSWORD_FILE" ]]; then
    PASSWORD="$(head -n1 "$PASSWORD_FILE")"
elif [[ -n "${REDIS_WORKER_PASSWORD:-}" ]]; then
    PASSWORD="$REDIS_WORKER_PASSWORD"
elif [[ -t 0 ]]; then
    read -rsp "Redis password of the worker user (REDIS_WORKER_PASSWORD): " PASSWORD; echo >&2
else
    die "no password: set REDIS_WORKER_PASSWORD, give --password-file, or run on a terminal"
fi
[[ "$PASSWORD" =~ ^[A-Za-z0-9._~-]+$ ]] || die "the password must be URL-safe (setup-host.sh makes hex ones)"

# The Redis host's and the api's addresses are refused to tasks on this host as well
# (the worker adds the Redis one itself; this covers an api elsewhere).
blocked="${TASK_BLOCKED_CIDRS:-}"
while read -r ip; do
    [[ -z "$ip" ]] || blocked="${blocked:+$blocked,}$ip/32"
done < <(getent ahostsv4 "${API_HOST:-$HOST}" | awk '{print $1}' | sort -u)

umask 077
{
    printf 'REDIS_URL=rediss://worker:%s@%s:%s\n' "$PASSWORD" "$HOST" "$PORT"
    printf 'REDIS_CA_FILE=%s\n' "$CA"
    printf 'WORKER_NAME=%s\n' "$NAME"
    [[ -z "$CONCURRENCY" ]] || printf 'WORKER_CONCURRENCY=%s\n' "$CONCURRENCY"
    printf 'TASK_BLOCKED_CIDRS=%s\n' "$blocked"
    for v in "${PASSTHROUGH[@]}"; do
        [[ -z "${!v:-}" ]] || printf '%s=%s\n' "$v" "${!v}"
    done
} >"$ENV_FILE.new"
mv "$ENV_FILE.new" "$ENV_FILE"
PREFIX="$(env_get REDIS_KEY_PREFIX)"; PREFIX="${PREFIX:-sr}"
tasks="$(env_get TASKS_DIR)"; mkdir -p "${tasks:-/var/lib/script-runner/tasks}"

log "building the worker image"
"${COMPOSE[@]}" build --quiet worker || die "cannot build the worker image (output above)"
docker image inspect "$(image)" >/dev/null 2>&1 || die "the worker image $(image) is missing after the build"

# --- checks, from the worker image on the host network: the worker's own path -------
in_image() {
    # The password goes through the environment, never on a command line.
    REDISCLI_AUTH="$PASSWORD" docker run --rm -i --network host -v "$CA:/ca.crt:ro" \
        -e REDISCLI_AUTH --entrypoint "$1" "$(image)" "${@:2}"
}
check() {
    log "checking $HOST:$PORT"
    if ! in_image timeout 5 bash -c "exec 3<>/dev/tcp/$HOST/$PORT" 2>/dev/null; then
        die "UNREACHABLE: no TCP connection to $HOST:$PORT. Is --remote-workers on at the central host (COMPOSE_FILE with deploy/remote-workers.yml), REDIS_TLS_PORT published, and the port open in the firewalls between?"
    fi
    local verify=(-verify_hostname "$HOST")
    [[ "$HOST" =~ ^[0-9.]+$ ]] && verify=(-verify_ip "$HOST")
    local tls_out
    if ! tls_out="$(in_image timeout 10 openssl s_client -connect "$HOST:$PORT" -servername "$HOST" \
        -CAfile /ca.crt -verify_return_error "${verify[@]}" -brief </dev/null 2>&1)"; then
        die "TLS FAILED with $HOST:$PORT: $(grep -iE 'error|verify' <<<"$tls_out" | head -n2 | tr '\n' ' ')
  Is it the TLS port (not the plain one), was its certificate made by this CA ($CA), and does it name $HOST (setup-host.sh --tls-names)?"
    fi
    local reply
    reply="$(in_image redis-cli --tls --cacert /ca.crt --sni "$HOST" -h "$HOST" -p "$PORT" \
        --user worker --no-auth-warning EXISTS "$PREFIX:workers" 2>&1 || true)"
    case "$reply" in
    0 | 1) log "ok: TLS verified, the worker user is accepted" ;;
    *WRONGPASS* | *"user is disabled"*) die "WRONG PASSWORD: Redis refused the worker user's password (REDIS_WORKER_PASSWORD in the central host's .env)" ;;
    *NOPERM*) die "PERMISSION: the worker user may not read $PREFIX:* (REDIS_KEY_PREFIX differs from the central host's?)" ;;
    *) die "Redis answered unexpectedly: $reply" ;;
    esac
}
check
[[ "$MODE" == add ]] || exit 0

log "starting worker $NAME"
"${COMPOSE[@]}" up -d worker
deadline=$((SECONDS + 90))
until [[ "$(in_image redis-cli --tls --cacert /ca.crt --sni "$HOST" -h "$HOST" -p "$PORT" \
    --user worker --no-auth-warning EXISTS "$PREFIX:worker:$NAME" 2>/dev/null)" == 1 ]]; do
    if ((SECONDS > deadline)); then
        "${COMPOSE[@]}" logs --tail 40 worker >&2 || true
        die "worker $NAME started but sent no heartbeat within 90 s (logs above)"
    fi
    sleep 2
done
cat <<EOT
add-worker: worker $NAME is live and taking tasks.

Watch it:
  docker compose -f deploy/worker-host.yml --env-file $ENV_FILE logs -f worker
  redis-cli --tls --cacert $CA -h $HOST -p $PORT --user worker --askpass SMEMBERS $PREFIX:workers
  on the central host (API_LOCAL_PORT, the token from its .env):
    curl -s -H "Authorization: Bearer \$SCRIPT_RUNNER_TOKEN" http://127.0.0.1:8080/metrics | grep workers_alive
Remove it (drains running tasks first):  deploy/add-worker.sh --remove
EOT
