#!/usr/bin/env bash
# Adds this Docker host as a script-runner worker of a central deployment, or removes it;
# on the central host, issues and revokes each worker host's own Redis credentials.
#
# On the central host (its checkout, the stack running; as root):
#   deploy/add-worker.sh --issue NAME [--csr FILE]   a Redis user worker-NAME with a fresh
#       password (Redis keeps only its SHA-256), and with --csr a client certificate
#       signed by the deployment's CA; both go to deploy/worker-hosts/NAME/ (password,
#       client.crt, ca.crt, and verify-keys: the api's public key for task specs, from
#       TASK_VERIFY_KEYS in .env) for you to copy to that host. Run it again for a new password:
#       the connections made with the old one are closed.
#   deploy/add-worker.sh --revoke NAME   removes the user at once: its open connections
#       are closed, new ones refused, and it stays gone after a Redis restart.
#   deploy/add-worker.sh --list          the worker hosts' users
#
# On the worker host (a checkout of the repository; root, Docker installed):
#   deploy/add-worker.sh --request-cert NAME   (mutual TLS only) makes this host's key,
#       deploy/worker-tls/client.key (it never leaves the host), and a request,
#       deploy/worker-tls/client.csr, to copy to the central host for --issue --csr
#   deploy/add-worker.sh --redis rediss://HOST:PORT --ca CA_FILE --name NAME \
#       --password-file PASSWORD [--client-cert client.crt] [options]
#   deploy/add-worker.sh --remove
#
# It logs in as worker-NAME (or --user); the password comes from --password-file, the
# environment variable REDIS_WORKER_PASSWORD, or a prompt. Before anything starts it
# checks, in the worker image, that HOST:PORT is reachable, speaks TLS with a certificate
# from CA_FILE for HOST, takes the client certificate if given, and accepts the user's
# password; each failure gets its own message. Then it starts one worker container
# (restart: unless-stopped, so it comes back on boot), waits for its heartbeat in
# Redis, and prints how to watch it live.
#
# Options:
#   --redis URL          rediss://HOST:PORT of the central Redis (TLS only: redis:// is refused)
#   --ca FILE            the central host's deploy/tls/ca.crt
#   --name NAME          this worker's WORKER_NAME, unique and stable (default: hostname)
#   --user USER          the Redis user (default worker-NAME; `worker`, the shared user of
#                        the central host's own worker, still works but cannot be revoked
#                        alone, and gets a warning)
#   --client-cert FILE   this host's client certificate (--issue --csr made it), for a
#                        Redis with REDIS_TLS_CLIENT_CERTS=on
#   --client-key FILE    its key (default deploy/worker-tls/client.key)
#   --concurrency N      tasks at once (default: CPUs)
#   --api-host HOST      the central api's public name or IP, also refused to tasks
#                        (default: HOST of --redis)
#   --password-file F    read the Redis password from F
#   --verify-keys F      the api's public key(s) for task specs (TASK_VERIFY_KEYS), from F
#                        (--issue wrote it; default: verify-keys beside --password-file, or
#                        TASK_VERIFY_KEYS from the environment). Required: the worker runs
#                        only task specs the api signed (docs/security.md)
#   --csr FILE           (with --issue) the worker host's certificate request
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
    TASK_DISK_MB TASK_TMPFS_MB POOL_SIZE EGRESS_POOL_SIZE POOL_MAX_AGE_SECONDS TASK_USER TASK_NETWORK TASK_BRIDGE TASK_FIREWALL
    TASK_OCI_RUNTIME MAX_TIMEOUT_SECONDS SHUTDOWN_GRACE_SECONDS WORKER_STOP_GRACE RUST_LOG BASE_IMAGE RUST_IMAGE BINARIES PREBUILT_DIR
    IMAGE_PREFIX IMAGE_TAG COMPOSE_PROJECT_NAME)

usage() { sed -n '2,57p' "$0" | sed 's/^# \{0,1\}//'; }
log() { printf 'add-worker: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

REDIS="" CA="" NAME="" CONCURRENCY="" API_HOST="" PASSWORD_FILE="" VERIFY_FILE="" MODE=add
USER_NAME="" CLIENT_CERT="" CLIENT_KEY="" CSR="" HOST_NAME=""
while (($#)); do
    case "$1" in
    --redis) REDIS="${2:?--redis needs a URL}"; shift ;;
    --ca) CA="${2:?--ca needs a file}"; shift ;;
    --name) NAME="${2:?--name needs a name}"; shift ;;
    --user) USER_NAME="${2:?--user needs a name}"; shift ;;
    --client-cert) CLIENT_CERT="${2:?--client-cert needs a file}"; shift ;;
    --client-key) CLIENT_KEY="${2:?--client-key needs a file}"; shift ;;
    --csr) CSR="${2:?--csr needs a file}"; shift ;;
    --issue) MODE=issue; HOST_NAME="${2:?--issue needs the NAME of a worker host}"; shift ;;
    --revoke) MODE=revoke; HOST_NAME="${2:?--revoke needs the NAME of a worker host}"; shift ;;
    --request-cert) MODE=request; HOST_NAME="${2:?--request-cert needs the NAME of this host}"; shift ;;
    --list) MODE=list ;;
    --concurrency) CONCURRENCY="${2:?--concurrency needs a number}"; shift ;;
    --api-host) API_HOST="${2:?--api-host needs a host}"; shift ;;
    --password-file) PASSWORD_FILE="${2:?--password-file needs a file}"; shift ;;
    --verify-keys) VERIFY_FILE="${2:?--verify-keys needs a file}"; shift ;;
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
    # What the worker installed on this host: its bridge's firewall chains, the jumps
    # into them, and the task network.
    docker run --rm --network host --cap-add NET_ADMIN --entrypoint sh "$(image)" -c "
        iptables -w -D INPUT -i '$bridge' -j 'SR-IN-$bridge' 2>/dev/null || true
        iptables -w -D FORWARD -i '$bridge' -j 'SR-FWD-$bridge' 2>/dev/null || true
        iptables -w -D DOCKER-USER -i '$bridge' -j 'SR-FWD-$bridge' 2>/dev/null || true
        for c in 'SR-IN-$bridge' 'SR-FWD-$bridge'; do
            iptables -w -F \"\$c\" 2>/dev/null && iptables -w -X \"\$c\" 2>/dev/null || true
        done" || true
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

# --- the central host: each worker host's Redis user and certificate --------------------
abs() { [[ -z "$1" || "$1" == /* ]] && printf '%s' "$1" || printf '%s/%s' "$ORIG_PWD" "$1"; }
CSR="$(abs "$CSR")" CLIENT_CERT="$(abs "$CLIENT_CERT")" CLIENT_KEY="$(abs "$CLIENT_KEY")"
case "$MODE" in issue | revoke | request)
    [[ "$HOST_NAME" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "$HOST_NAME: a worker host's NAME is letters, digits, '.', '-' and '_'" ;;
esac
central_redis() { # the central stack's Redis, through its entrypoint's worker-host helper
    [[ -f .env ]] || die "run --issue, --revoke and --list on the central host, in its checkout (no .env here)"
    docker compose exec -T -u redis redis redis-entrypoint.sh worker-host "$@"
}
# Every Redis node of the stack: with deploy/redis-sentinel.yml the replica too, so a
# host's user is there when the sentinels promote it (each node keeps its own ACL file).
redis_nodes() { docker compose config --services | grep -xE 'redis(-replica[-0-9]*)?' || true; }
on_every_node() { # on_every_node add|remove NAME [< password]: the primary's first
    local input node running
    input="$(cat)"
    # A node that is down would keep (or lack) the user, and bring it back if promoted.
    running="$(docker compose ps --services --status running)"
    for node in $(redis_nodes); do
        grep -qx "$node" <<<"$running" \
            || die "the Redis node $node is not running: start it (docker compose up -d $node) and run this again, so every node gets the change"
    done
    central_redis "$@" <<<"$input" || return 1
    for node in $(redis_nodes); do
        [[ "$node" != redis ]] || continue
        docker compose exec -T -u redis "$node" redis-entrypoint.sh worker-host "$@" <<<"$input" \
            || { log "could not $1 worker-$2 on $node (output above)"; return 1; }
    done
}
if [[ "$MODE" == list ]]; then central_redis list; exit 0; fi
if [[ "$MODE" == revoke ]]; then
    on_every_node remove "$HOST_NAME" </dev/null || die "could not remove the Redis user worker-$HOST_NAME (output above)"
    rm -rf "deploy/worker-hosts/$HOST_NAME"
    log "worker host $HOST_NAME revoked: its Redis user is gone and its connections are closed"
    exit 0
fi
if [[ "$MODE" == issue ]]; then
    out="deploy/worker-hosts/$HOST_NAME"
    tls_dir="$(grep -E '^REDIS_TLS_DIR=' .env 2>/dev/null | tail -n1 | cut -d= -f2- || true)"
    tls_dir="${tls_dir:-./deploy/tls}"
    install -d -m 700 deploy/worker-hosts "$out"
    if [[ -n "$CSR" ]]; then
        deploy/make-redis-tls.sh --sign-client "$tls_dir" "worker-$HOST_NAME" "$CSR" "$out/client.crt" \
            || die "could not sign $CSR"
    fi
    [[ ! -r "$tls_dir/ca.crt" ]] || cp "$tls_dir/ca.crt" "$out/ca.crt"
    verify="$(grep -E '^TASK_VERIFY_KEYS=' .env 2>/dev/null | tail -n1 | cut -d= -f2- || true)"
    [[ -n "$verify" ]] || die "no TASK_VERIFY_KEYS in .env: run deploy/setup-host.sh (it makes the task spec key pair)"
    printf '%s\n' "$verify" >"$out/verify-keys"
    umask 077
    openssl rand -hex 24 >"$out/password"
    # The password goes to Redis on stdin, never on a command line; Redis keeps its hash.
    on_every_node add "$HOST_NAME" <"$out/password" || die "could not create the Redis user worker-$HOST_NAME (output above)"
    cat <<EOT
add-worker: worker host $HOST_NAME has its own Redis user, worker-$HOST_NAME.
Copy $PWD/$out/ (password$([[ -n "$CSR" ]] && echo ", client.crt"), ca.crt, verify-keys) to that host, and there run
  deploy/add-worker.sh --redis rediss://THIS_HOST:PORT --ca ca.crt --name $HOST_NAME \\
      --password-file password$([[ -n "$CSR" ]] && echo " --client-cert client.crt")
then delete the copy of the password here ($out/password). Revoke: deploy/add-worker.sh --revoke $HOST_NAME
EOT
    exit 0
fi
if [[ "$MODE" == request ]]; then
    install -d -m 700 deploy/worker-tls
    if [[ ! -s deploy/worker-tls/client.key ]]; then
        (umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out deploy/worker-tls/client.key 2>/dev/null)
    fi
    openssl req -new -key deploy/worker-tls/client.key -subj "/CN=worker-$HOST_NAME" -out deploy/worker-tls/client.csr
    cat <<EOT
add-worker: this host's key is $PWD/deploy/worker-tls/client.key (it stays here).
Copy $PWD/deploy/worker-tls/client.csr to the central host, and there run
  deploy/add-worker.sh --issue $HOST_NAME --csr client.csr
EOT
    exit 0
fi

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
USER_NAME="${USER_NAME:-worker-$NAME}"
[[ "$USER_NAME" =~ ^[A-Za-z0-9._-]+$ ]] || die "--user $USER_NAME: use letters, digits, '.', '-' and '_'"
if [[ "$USER_NAME" == worker ]]; then
    log "WARNING: --user worker is the central host's shared user: this host then holds the password every
  worker host shares, and --revoke cannot cut it off alone. Give it its own user instead: on the central
  host deploy/add-worker.sh --issue $NAME, then here --password-file password (docs/deploy.md, upgrading)."
fi
if [[ -n "$CLIENT_CERT" ]]; then
    CLIENT_KEY="${CLIENT_KEY:-$PWD/deploy/worker-tls/client.key}"
    [[ -r "$CLIENT_CERT" ]] || die "--client-cert $CLIENT_CERT is not readable"
    [[ -r "$CLIENT_KEY" ]] || die "the client key $CLIENT_KEY is not readable (made by --request-cert, or give --client-key)"
    openssl x509 -in "$CLIENT_CERT" -noout 2>/dev/null || die "$CLIENT_CERT is not a PEM certificate"
    CLIENT_CERT="$(realpath "$CLIENT_CERT")" CLIENT_KEY="$(realpath "$CLIENT_KEY")"
elif [[ -n "$CLIENT_KEY" ]]; then
    die "--client-key goes with --client-cert"
fi

if [[ -n "$PASSWORD_FILE" ]]; then
    PASSWORD="$(head -n1 "$PASSWORD_FILE")"
elif [[ -n "${REDIS_WORKER_PASSWORD:-}" ]]; then
    PASSWORD="$REDIS_WORKER_PASSWORD"
elif [[ -t 0 ]]; then
    read -rsp "Redis password of $USER_NAME (deploy/worker-hosts/$NAME/password on the central host): " PASSWORD; echo >&2
else
    die "no password: set REDIS_WORKER_PASSWORD, give --password-file, or run on a terminal"
fi
[[ "$PASSWORD" =~ ^[A-Za-z0-9._~-]+$ ]] || die "the password must be URL-safe (setup-host.sh makes hex ones)"

# The api's public key(s): the worker refuses to start without, and runs only task specs
# signed by the matching private key (TASK_SIGNING_KEY, on the central host).
[[ -n "$VERIFY_FILE" || -z "$PASSWORD_FILE" || ! -r "$(dirname "$PASSWORD_FILE")/verify-keys" ]] \
    || VERIFY_FILE="$(dirname "$PASSWORD_FILE")/verify-keys"
[[ -z "$VERIFY_FILE" || "$VERIFY_FILE" == /* ]] || VERIFY_FILE="$ORIG_PWD/$VERIFY_FILE"
if [[ -n "$VERIFY_FILE" ]]; then
    [[ -r "$VERIFY_FILE" ]] || die "--verify-keys $VERIFY_FILE is not readable"
    TASK_VERIFY_KEYS="$(head -n1 "$VERIFY_FILE")"
fi
[[ -n "${TASK_VERIFY_KEYS:-}" ]] || die "no task spec key: give --verify-keys FILE (deploy/worker-hosts/$NAME/verify-keys, from --issue on the central host) or set TASK_VERIFY_KEYS"
[[ "$TASK_VERIFY_KEYS" =~ ^[A-Za-z0-9+/=]{44}(,[A-Za-z0-9+/=]{44})?$ ]] \
    || die "TASK_VERIFY_KEYS is not one or two base64 public keys (44 characters each, comma-separated)"

# The Redis host's and the api's addresses are refused to tasks on this host as well
# (the worker adds the Redis one itself; this covers an api elsewhere).
blocked="${TASK_BLOCKED_CIDRS:-}"
while read -r ip; do
    [[ -z "$ip" ]] || blocked="${blocked:+$blocked,}$ip/32"
done < <(getent ahostsv4 "${API_HOST:-$HOST}" | awk '{print $1}' | sort -u)

umask 077
{
    printf 'REDIS_URL=rediss://%s:%s@%s:%s\n' "$USER_NAME" "$PASSWORD" "$HOST" "$PORT"
    printf 'REDIS_CA_FILE=%s\n' "$CA"
    if [[ -n "$CLIENT_CERT" ]]; then
        printf 'REDIS_CLIENT_CERT_FILE=%s\nREDIS_CLIENT_KEY_FILE=%s\n' "$CLIENT_CERT" "$CLIENT_KEY"
    fi
    printf 'WORKER_NAME=%s\n' "$NAME"
    [[ -z "$CONCURRENCY" ]] || printf 'WORKER_CONCURRENCY=%s\n' "$CONCURRENCY"
    printf 'TASK_BLOCKED_CIDRS=%s\n' "$blocked"
    printf 'TASK_VERIFY_KEYS=%s\n' "$TASK_VERIFY_KEYS"
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
    local mounts=(-v "$CA:/ca.crt:ro")
    [[ -z "$CLIENT_CERT" ]] || mounts+=(-v "$CLIENT_CERT:/client.crt:ro" -v "$CLIENT_KEY:/client.key:ro")
    REDISCLI_AUTH="$PASSWORD" docker run --rm -i --network host "${mounts[@]}" \
        -e REDISCLI_AUTH --entrypoint "$1" "$(image)" "${@:2}"
}
client_tls=()
[[ -z "$CLIENT_CERT" ]] || client_tls=(--cert /client.crt --key /client.key)
client_cert_refused() {
    if [[ -z "$CLIENT_CERT" ]]; then
        die "CLIENT CERTIFICATE: Redis requires a client certificate (REDIS_TLS_CLIENT_CERTS=on): --request-cert here, --issue $NAME --csr on the central host, then --client-cert. ($1)"
    fi
    die "CLIENT CERTIFICATE: Redis refused this host's client certificate ($CLIENT_CERT): not signed by the deployment's CA? ($1)"
}
check() {
    log "checking $HOST:$PORT"
    if ! in_image timeout 5 bash -c "exec 3<>/dev/tcp/$HOST/$PORT" 2>/dev/null; then
        die "UNREACHABLE: no TCP connection to $HOST:$PORT. Is --remote-workers on at the central host (COMPOSE_FILE with deploy/remote-workers.yml), REDIS_TLS_PORT published, and the port open in the firewalls between?"
    fi
    local verify=(-verify_hostname "$HOST")
    [[ "$HOST" =~ ^[0-9.]+$ ]] && verify=(-verify_ip "$HOST")
    local tls_out
    local s_client_cert=()
    [[ -z "$CLIENT_CERT" ]] || s_client_cert=(-cert /client.crt -key /client.key)
    if ! tls_out="$(in_image timeout 10 openssl s_client -connect "$HOST:$PORT" -servername "$HOST" \
        -CAfile /ca.crt -verify_return_error "${verify[@]}" "${s_client_cert[@]}" -brief </dev/null 2>&1)"; then
        if grep -qiE "alert (certificate required|bad certificate|unknown ca)" <<<"$tls_out"; then
            client_cert_refused "$(grep -ioE 'alert [a-z ]+' <<<"$tls_out" | head -n1)"
        fi
        die "TLS FAILED with $HOST:$PORT: $(grep -iE 'error|verify' <<<"$tls_out" | head -n2 | tr '\n' ' ')
  Is it the TLS port (not the plain one), was its certificate made by this CA ($CA), and does it name $HOST (setup-host.sh --tls-names)?"
    fi
    local reply
    reply="$(in_image redis-cli --tls --cacert /ca.crt "${client_tls[@]}" --sni "$HOST" -h "$HOST" -p "$PORT" \
        --user "$USER_NAME" --no-auth-warning EXISTS "$PREFIX:workers" 2>&1 || true)"
    case "$reply" in
    0 | 1) log "ok: TLS verified, $USER_NAME is accepted" ;;
    *WRONGPASS* | *"user is disabled"*) die "WRONG PASSWORD: Redis refused $USER_NAME's password (made by deploy/add-worker.sh --issue $NAME on the central host; revoked?)" ;;
    *NOPERM*) die "PERMISSION: $USER_NAME may not read $PREFIX:* (REDIS_KEY_PREFIX differs from the central host's?)" ;;
    *"I/O error"* | *"Server closed the connection"* | *"SSL"*) client_cert_refused "$reply" ;;
    *) die "Redis answered unexpectedly: $reply" ;;
    esac
}
check
[[ "$MODE" == add ]] || exit 0

log "starting worker $NAME"
"${COMPOSE[@]}" up -d worker
deadline=$((SECONDS + 90))
until [[ "$(in_image redis-cli --tls --cacert /ca.crt "${client_tls[@]}" --sni "$HOST" -h "$HOST" -p "$PORT" \
    --user "$USER_NAME" --no-auth-warning EXISTS "$PREFIX:worker:$NAME" 2>/dev/null)" == 1 ]]; do
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
  redis-cli --tls --cacert $CA${CLIENT_CERT:+ --cert $CLIENT_CERT --key $CLIENT_KEY} -h $HOST -p $PORT --user $USER_NAME --askpass SMEMBERS $PREFIX:workers
  on the central host (API_LOCAL_PORT, the token from its .env):
    curl -s -H "Authorization: Bearer \$SCRIPT_RUNNER_TOKEN" http://127.0.0.1:8080/metrics | grep workers_alive
Remove it (drains running tasks first):  deploy/add-worker.sh --remove
Revoke its Redis user (on the central host):  deploy/add-worker.sh --revoke $NAME
EOT
