#!/usr/bin/env bash
# Worker hosts' own Redis users and mutual TLS, against the real Redis image (the
# Dockerfile's redis stage, deploy/redis/entrypoint.sh) and the real worker binary.
#
#   tests/deploy/test-worker-hosts.sh     (about a minute; needs Docker, openssl,
#                                         redis-cli and target/debug/script-runner-worker,
#                                         or WORKER_BIN)
#
# 1. A user per worker host (the entrypoint's `worker-host add`, what add-worker.sh
#    --issue runs): it has the worker's rules (FLUSHALL refused, its keys allowed), the
#    file under /data keeps only SHA-256 hashes.
# 2. Mutual TLS (REDIS_TLS_CLIENT_CERTS=on): no client certificate, or one from another
#    CA, is refused on the TLS port; the certificate signed by make-redis-tls.sh
#    --sign-client works; the plain port still takes the local worker without one.
# 3. The worker binary as worker-h1 with REDIS_CLIENT_CERT/REDIS_CLIENT_KEY sends its
#    heartbeat over TLS; without the certificate it stops at start, saying why.
# 4. Revoke (`worker-host remove`, what add-worker.sh --revoke runs): the worker's open
#    connections are closed at once, a new login is refused.
# 5. Revoking w.1 leaves w-1 (names are compared, not matched). After a Redis restart
#    the other hosts' users still work and the revoked ones stay refused.
# 6. A new password for a host (`worker-host add` again) closes the connections made
#    with the old one.
# And setup-host.sh's DOCKER-USER allow-list for the TLS port: its dry run prints the
# rules (for the port in .env, refused without one; with the systemd unit that applies
# them again at boot), and applied twice in a throw-away network namespace (unshare -n, not the
# host's chains) it leaves the same rules, for iptables and ip6tables.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
BASE_IMAGE="${TEST_BASE_IMAGE:-script-runner-test/base:trixie}"
WORKER_BIN="${WORKER_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/script-runner-worker}"
CTL_BIN="${CTL_BIN:-$(dirname "$WORKER_BIN")/script-runner-ctl}"
ID="srwh$$"
IMAGE="sr-worker-hosts-test/redis:latest"
WORK="$(mktemp -d "/tmp/sr-worker-hosts.XXXXXX")"
WORKER_PID="" HOLD_PID=""

step() { printf '\n== worker hosts test: %s\n' "$*"; }
fail() { printf 'worker hosts test FAILED: %s\n' "$*" >&2; exit 1; }
cleanup() {
    local rc=$?
    set +e
    [[ -z "$WORKER_PID" ]] || { kill "$WORKER_PID" 2>/dev/null; wait "$WORKER_PID" 2>/dev/null; }
    [[ -z "$HOLD_PID" ]] || { kill "$HOLD_PID" 2>/dev/null; wait "$HOLD_PID" 2>/dev/null; }
    if ((rc)); then docker logs --tail 30 "$ID" 2>&1; [[ -f "$WORK/worker.log" ]] && tail -n 30 "$WORK/worker.log"; fi
    docker rm -f "$ID" >/dev/null 2>&1
    docker volume rm "$ID-data" >/dev/null 2>&1
    docker network rm "$ID-tasks" >/dev/null 2>&1
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
[[ -x "$WORKER_BIN" ]] || fail "no worker binary at $WORKER_BIN (cargo build -p script-runner-worker)"

# --- the DOCKER-USER allow-list (no Docker, no Redis needed) --------------------------
step "setup-host.sh --allow-workers: the rules, printed and applied in a throw-away netns"
dry="$(deploy/setup-host.sh --dry-run --allow-workers 192.0.2.0/24,2001:db8::/32 --redis-tls-port 6380 --firewall-only 2>&1)"
grep -qF -- "iptables -w -A SR-REDIS-TLS -s 192.0.2.0/24 -j RETURN" <<<"$dry" || fail "dry run without the IPv4 allow rule: $dry"
grep -qF -- "ip6tables -w -A SR-REDIS-TLS -s 2001:db8::/32 -j RETURN" <<<"$dry" || fail "dry run without the IPv6 allow rule: $dry"
grep -qF -- "iptables -w -I DOCKER-USER -p tcp -m conntrack --ctstate DNAT --ctorigdstport 6380 --ctdir ORIGINAL -j SR-REDIS-TLS" <<<"$dry" \
    || fail "dry run without the conntrack jump: $dry"
grep -qF -- "iptables -w -A SR-REDIS-TLS -j DROP" <<<"$dry" || fail "dry run drops nothing: $dry"
if [[ -n "$(deploy/setup-host.sh --dry-run --allow-workers 300.1.2.3/8 --redis-tls-port 6380 --firewall-only 2>&1 | grep 'would run: ip' || true)" ]]; then
    fail "an invalid CIDR was turned into rules"
fi
# The port and the list come from the checkout's .env (--dir), never a guess; without
# a .env and without --redis-tls-port nothing is applied.
envdir="$WORK/checkout"
mkdir -p "$envdir" && git init -q "$envdir"
printf 'DOMAIN=example.org\nREDIS_TLS_PORT=7443\nREDIS_TLS_ALLOW=203.0.113.9,2001:db8::5\n' >"$envdir/.env"
dry="$(deploy/setup-host.sh --dry-run --firewall-only --dir "$envdir" 2>&1)"
grep -qF -- "iptables -w -I DOCKER-USER -p tcp -m conntrack --ctstate DNAT --ctorigdstport 7443 --ctdir ORIGINAL -j SR-REDIS-TLS" <<<"$dry" \
    || fail "--firewall-only did not take REDIS_TLS_PORT=7443 from .env: $dry"
grep -qF -- "iptables -w -A SR-REDIS-TLS -s 203.0.113.9 -j RETURN" <<<"$dry" || fail "--firewall-only did not take REDIS_TLS_ALLOW from .env: $dry"
! grep -q -- "--ctorigdstport 6380" <<<"$dry" || fail "--firewall-only made rules for 6380 as well: $dry"
if dry="$(deploy/setup-host.sh --dry-run --firewall-only --allow-workers 192.0.2.1 --dir "$WORK/no-checkout" 2>&1)"; then
    fail "--firewall-only without .env or --redis-tls-port guessed a port: $dry"
fi
grep -qF "give --redis-tls-port" <<<"$dry" || fail "no clear refusal without a port: $dry"
! grep -q "would run: ip" <<<"$dry" || fail "rules printed without a port: $dry"
# A full setup installs the unit that applies the rules again at boot and when Docker restarts.
dry="$(deploy/setup-host.sh --dry-run --dir "$envdir" --skip-images 2>&1)"
grep -qF -- "--ctorigdstport 7443" <<<"$dry" || fail "the full setup's rules are not for REDIS_TLS_PORT=7443: $dry"
grep -qxF "ExecStart=$envdir/deploy/setup-host.sh --firewall-only --dir $envdir" <<<"$dry" || fail "no unit re-applying the rules: $dry"
grep -qxF "After=docker.service" <<<"$dry" || fail "the unit does not wait for Docker: $dry"
grep -qF "would run: systemctl enable --now script-runner-firewall.service" <<<"$dry" || fail "the unit is not enabled: $dry"
echo "the rules follow .env's REDIS_TLS_PORT (7443) and REDIS_TLS_ALLOW; no port, no rules; the boot unit is installed"
# shellcheck disable=SC2016 # expanded by the inner bash
rules="$(unshare -n bash -c '
    set -e
    for t in iptables ip6tables; do $t -w -N DOCKER-USER; $t -w -A DOCKER-USER -j RETURN; done
    deploy/setup-host.sh --allow-workers 192.0.2.0/24,198.51.100.7,2001:db8::/32 --redis-tls-port 6380 --firewall-only >/dev/null
    first="$(iptables -w -S; ip6tables -w -S)"
    deploy/setup-host.sh --allow-workers 192.0.2.0/24,198.51.100.7,2001:db8::/32 --redis-tls-port 6380 --firewall-only >/dev/null
    second="$(iptables -w -S; ip6tables -w -S)"
    [[ "$first" == "$second" ]] || { echo "NOT IDEMPOTENT"; diff <(echo "$first") <(echo "$second"); }
    echo "$second"')"
echo "$rules"
! grep -q "NOT IDEMPOTENT" <<<"$rules" || fail "a second run changed the rules"
expected_v4='-A DOCKER-USER -p tcp -m conntrack --ctstate DNAT --ctorigdstport 6380 --ctdir ORIGINAL -j SR-REDIS-TLS
-A DOCKER-USER -j RETURN
-A SR-REDIS-TLS -s 192.0.2.0/24 -j RETURN
-A SR-REDIS-TLS -s 198.51.100.7/32 -j RETURN
-A SR-REDIS-TLS -j DROP'
grep -F -e "-A DOCKER-USER" -e "-A SR-REDIS-TLS" <<<"$rules" | head -n 5 | diff - <(echo "$expected_v4") \
    || fail "the IPv4 rules differ from the expected ones (above)"
grep -qxF -- "-A SR-REDIS-TLS -s 2001:db8::/32 -j RETURN" <<<"$rules" || fail "no IPv6 allow rule"
[[ "$(grep -c -- '-A DOCKER-USER .*--ctorigdstport 6380 --ctdir ORIGINAL -j SR-REDIS-TLS' <<<"$rules")" == 2 ]] \
    || fail "not one DOCKER-USER jump per family"
grep -qxF -- "-A INPUT ! -i lo -p tcp -m conntrack --ctorigdstport 6380 --ctdir ORIGINAL -j SR-REDIS-TLS" <<<"$rules" \
    || fail "no IPv6 INPUT jump (the userland proxy's path)"

# --- Redis with per-host users and mutual TLS -------------------------------------------
step "the Redis image (the Dockerfile's redis stage) and TLS material"
ctx="$WORK/ctx"
mkdir -p "$ctx/deploy/redis"
cp deploy/redis/entrypoint.sh "$ctx/deploy/redis/"
BASE_IMAGE="$BASE_IMAGE" ./scripts/build-base-image.sh >/dev/null
# shellcheck disable=SC2016 # a literal ${BASE_IMAGE}
{ echo 'ARG BASE_IMAGE'; sed -n '/^FROM \${BASE_IMAGE} AS redis$/,/^ENTRYPOINT/p' Dockerfile; } >"$ctx/Dockerfile"
docker build -q --build-arg BASE_IMAGE="$BASE_IMAGE" -t "$IMAGE" "$ctx" >/dev/null 2>"$WORK/build.err" \
    || { cat "$WORK/build.err"; fail "cannot build the redis image"; }
deploy/make-redis-tls.sh "$WORK/tls" 127.0.0.1,localhost
deploy/make-redis-tls.sh "$WORK/other" 127.0.0.1  # another CA, not the deployment's
csr() { # csr DIR: a key that stays in DIR and a request for it
    mkdir -p "$1"
    openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -subj "/CN=ignored" \
        -keyout "$1/client.key" -out "$1/client.csr" 2>/dev/null
}
csr "$WORK/h1" && deploy/make-redis-tls.sh --sign-client "$WORK/tls" worker-h1 "$WORK/h1/client.csr" "$WORK/h1/client.crt"
csr "$WORK/h2" && deploy/make-redis-tls.sh --sign-client "$WORK/tls" worker-h2 "$WORK/h2/client.csr" "$WORK/h2/client.crt"
csr "$WORK/x" && deploy/make-redis-tls.sh --sign-client "$WORK/other" worker-h1 "$WORK/x/client.csr" "$WORK/x/client.crt"
openssl x509 -in "$WORK/h1/client.crt" -noout -subject | grep -q "CN = worker-h1" || fail "the client certificate is not for worker-h1"

ADMIN_PW="$(openssl rand -hex 24)" WORKER_PW="$(openssl rand -hex 24)"
start_redis() {
    docker run -d --name "$ID" -e REDIS_API_PASSWORD="$(openssl rand -hex 24)" \
        -e REDIS_WORKER_PASSWORD="$WORKER_PW" -e REDIS_ADMIN_PASSWORD="$ADMIN_PW" \
        -e REDIS_TLS=on -e REDIS_TLS_CLIENT_CERTS=on -v "$WORK/tls:/tls:ro" -v "$ID-data:/data" \
        -p 127.0.0.1::6379 -p 127.0.0.1::6380 \
        --cap-drop ALL --cap-add CHOWN --cap-add SETUID --cap-add SETGID \
        --security-opt no-new-privileges:true --read-only --tmpfs /run:size=16m --tmpfs /tmp:size=16m \
        "$IMAGE" >/dev/null  # with docker-compose.yml's hardening of redis
    wait_redis
}
wait_redis() { # the published ports (new ones after a restart), then a PONG
    PLAIN="$(docker port "$ID" 6379/tcp | head -n1 | cut -d: -f2)"
    TLS="$(docker port "$ID" 6380/tcp | head -n1 | cut -d: -f2)"
    local deadline=$((SECONDS + 30))
    until [[ "$(admin PING 2>/dev/null)" == PONG ]]; do
        ((SECONDS < deadline)) || fail "Redis did not answer within 30 s"
        sleep 0.2
    done
}
admin() { REDISCLI_AUTH="$ADMIN_PW" redis-cli --no-auth-warning -h 127.0.0.1 -p "$PLAIN" --user admin "$@"; }
as_host() { # as_host USER PASSWORD CERT_DIR|none CMD...: over the TLS port
    local user="$1" pw="$2" dir="$3"; shift 3
    local cert=()
    [[ "$dir" == none ]] || cert=(--cert "$dir/client.crt" --key "$dir/client.key")
    REDISCLI_AUTH="$pw" timeout 10 redis-cli --no-auth-warning --tls --cacert "$WORK/tls/ca.crt" "${cert[@]}" \
        -h 127.0.0.1 -p "$TLS" --user "$user" "$@" 2>&1 || true
}
start_redis
H1_PW="$(openssl rand -hex 24)" H2_PW="$(openssl rand -hex 24)"
printf '%s\n' "$H1_PW" | docker exec -i -u redis "$ID" redis-entrypoint.sh worker-host add h1
printf '%s\n' "$H2_PW" | docker exec -i -u redis "$ID" redis-entrypoint.sh worker-host add h2
if printf 'short\n' | docker exec -i -u redis "$ID" redis-entrypoint.sh worker-host add h3 2>/dev/null; then fail "a short password was taken"; fi

step "each host's user: the worker's rules, only hashes on disk"
[[ "$(as_host worker-h1 "$H1_PW" "$WORK/h1" EXISTS sr:workers)" =~ ^[01]$ ]] || fail "worker-h1 cannot use its keys"
for cmd in FLUSHALL "CONFIG GET maxmemory" "KEYS sr:x" "HGET other:task:x state" "SCRIPT FLUSH"; do
    # shellcheck disable=SC2086
    grep -q NOPERM <<<"$(as_host worker-h1 "$H1_PW" "$WORK/h1" $cmd)" || fail "worker-h1 was not refused $cmd"
done
stored="$(docker exec -u redis "$ID" cat /data/worker-hosts.acl)"
for h in h1 h2; do grep -qxE "$h [0-9a-f]{64}" <<<"$stored" || fail "worker-hosts.acl: $stored"; done
! grep -qF -e "$H1_PW" -e "$H2_PW" <<<"$stored$(docker exec "$ID" cat /run/redis/users.acl)" || fail "a password is stored in clear"
[[ "$(docker exec "$ID" stat -c %a /data/worker-hosts.acl)" == 600 ]] || fail "worker-hosts.acl is not 0600"
# The host's rules are the local worker's, word for word.
[[ "$(admin ACL GETUSER worker-h1 | sed -n '/^commands$/{n;p}')" == "$(admin ACL GETUSER worker | sed -n '/^commands$/{n;p}')" ]] \
    || fail "worker-h1's commands differ from worker's"
echo "worker-h1, worker-h2: their keys allowed, FLUSHALL/CONFIG/KEYS/other keys/SCRIPT refused, hashes only"

step "mutual TLS: no certificate or another CA's is refused; the plain port is unchanged"
out="$(as_host worker-h1 "$H1_PW" none EXISTS sr:workers)"
! [[ "$out" =~ ^[01]$ ]] || fail "worker-h1 got in without a client certificate"
echo "no certificate: $out" | head -n 2
out="$(as_host worker-h1 "$H1_PW" "$WORK/x" EXISTS sr:workers)"
! [[ "$out" =~ ^[01]$ ]] || fail "worker-h1 got in with another CA's certificate"
echo "another CA's certificate: $out" | head -n 2
[[ "$(REDISCLI_AUTH="$WORKER_PW" redis-cli --no-auth-warning -h 127.0.0.1 -p "$PLAIN" --user worker EXISTS sr:workers)" =~ ^[01]$ ]] \
    || fail "the plain port refused the local worker"

step "the worker binary as worker-h1 over mutual TLS"
# Only admin may load code: the Lua functions first, as a deployment's one-shot does.
env -i PATH="$PATH" REDIS_URL="redis://admin:$ADMIN_PW@127.0.0.1:$PLAIN" "$CTL_BIN" redis load-functions \
    || fail "the ctl could not load the Lua functions as admin"
run_worker() { # run_worker CERT_DIR|none: the worker as worker-h1, in the background
    local cert=()
    [[ "$1" == none ]] || cert=(REDIS_CLIENT_CERT="$1/client.crt" REDIS_CLIENT_KEY="$1/client.key")
    env -i PATH="$PATH" RUST_LOG=info REDIS_URL="rediss://worker-h1:$H1_PW@127.0.0.1:$TLS" \
        SSL_CERT_FILE="$WORK/tls/ca.crt" "${cert[@]}" WORKER_NAME="$ID-h1" TASKS_DIR="$WORK/tasks" \
        TASK_VERIFY_KEYS=iojj3XQJ8ZX9UtstPLpdcspnCb8dlBIb83SIAbQPb1w= \
        TASK_NETWORK="$ID-tasks" TASK_BRIDGE="${ID}b" TASK_FIREWALL=off POOL_SIZE=python3.13=0,node24=0 \
        WORKER_HEARTBEAT_SECONDS=2 "$WORKER_BIN" >"$WORK/worker.log" 2>&1 &
    WORKER_PID=$!
}
run_worker none
deadline=$((SECONDS + 30))
while kill -0 "$WORKER_PID" 2>/dev/null; do
    ((SECONDS < deadline)) || fail "the worker without a client certificate kept running"
    sleep 0.2
done
wait "$WORKER_PID" && fail "the worker without a client certificate exited 0"
WORKER_PID=""
cp "$WORK/worker.log" "$WORK/worker-nocert.log"
grep -q "REDIS_CLIENT_CERT and REDIS_CLIENT_KEY" "$WORK/worker.log" \
    || fail "the worker did not say it needs a client certificate: $(tail -n 5 "$WORK/worker.log")"
echo "without a certificate the worker stops: $(grep -o 'Redis refused this worker.s TLS client certificate.\{0,60\}' "$WORK/worker.log" | head -n1)"
run_worker "$WORK/h1"
deadline=$((SECONDS + 60))
until [[ "$(admin EXISTS "sr:worker:$ID-h1")" == 1 ]]; do
    kill -0 "$WORKER_PID" 2>/dev/null || fail "the worker stopped: $(tail -n 5 "$WORK/worker.log")"
    ((SECONDS < deadline)) || fail "no heartbeat from the worker as worker-h1 within 60 s"
    sleep 0.5
done
conns="$(admin CLIENT LIST | grep -c "laddr=[^ ]*:6380 .*user=worker-h1 " || true)"
((conns > 0)) || fail "no worker-h1 connection on the TLS port"
echo "heartbeat as worker-h1; $conns connection(s) on the TLS port"

step "revoke: the open connections close at once, new logins are refused"
docker exec -u redis "$ID" redis-entrypoint.sh worker-host remove h1
conns="$(admin CLIENT LIST | grep -c "user=worker-h1 " || true)"
[[ "$conns" == 0 ]] || fail "$conns worker-h1 connection(s) still open right after the revoke"
grep -q WRONGPASS <<<"$(as_host worker-h1 "$H1_PW" "$WORK/h1" EXISTS sr:workers)" || fail "worker-h1 can still log in"
# The worker keeps trying and keeps being refused.
sleep 3
conns="$(admin CLIENT LIST | grep -c "user=worker-h1 " || true)"
[[ "$conns" == 0 ]] || fail "the revoked worker got back in"
kill "$WORKER_PID"; wait "$WORKER_PID" || true; WORKER_PID=""
grep -q "AuthenticationFailed" "$WORK/worker.log" || fail "the worker's log does not show the refusal"
echo "worker-h1 closed and refused; the worker logs: $(grep -o 'Password authentication failed.\{0,30\}' "$WORK/worker.log" | head -n1)"

step "revoking w.1 leaves w-1 (the name is no pattern)"
W1_PW="$(openssl rand -hex 24)"
for h in w-1 w.1; do printf '%s\n' "$W1_PW" | docker exec -i -u redis "$ID" redis-entrypoint.sh worker-host add "$h"; done
docker exec -u redis "$ID" redis-entrypoint.sh worker-host remove w.1
[[ "$(docker exec -u redis "$ID" redis-entrypoint.sh worker-host list | sort | tr '\n' ' ')" == "h2 w-1 " ]] \
    || fail "after revoking w.1 the list is not h2 w-1: $(docker exec -u redis "$ID" redis-entrypoint.sh worker-host list)"
plain_as() { REDISCLI_AUTH="$2" redis-cli --no-auth-warning -h 127.0.0.1 -p "$PLAIN" --user "$1" "${@:3}" 2>&1 || true; }
echo "w-1 kept in the list"

step "a Redis restart keeps worker-h2 and worker-w-1, and the revokes of worker-h1 and worker-w.1"
docker restart "$ID" >/dev/null
wait_redis
[[ "$(plain_as worker-w-1 "$W1_PW" EXISTS sr:workers)" =~ ^[01]$ ]] || fail "worker-w-1 is gone after a restart"
grep -q WRONGPASS <<<"$(plain_as worker-w.1 "$W1_PW" EXISTS sr:workers)" || fail "worker-w.1 came back after a restart"
[[ "$(as_host worker-h2 "$H2_PW" "$WORK/h2" EXISTS sr:workers)" =~ ^[01]$ ]] || fail "worker-h2 is gone after a restart"
grep -q WRONGPASS <<<"$(as_host worker-h1 "$H1_PW" "$WORK/h1" EXISTS sr:workers)" || fail "worker-h1 came back after a restart"
grep -q NOPERM <<<"$(as_host worker-h2 "$H2_PW" "$WORK/h2" FLUSHALL)" || fail "worker-h2's rules changed at restart"
[[ "$(docker exec -u redis "$ID" redis-entrypoint.sh worker-host list | sort | tr '\n' ' ')" == "h2 w-1 " ]] \
    || fail "worker-host list is not h2 w-1"
echo "after the restart: worker-h2 and worker-w-1 in, worker-h1 and worker-w.1 refused"

step "a new password for h2 closes the connections made with the old one"
# A connection that stays open: a blocking read, as a worker's claim loop does.
as_host worker-h2 "$H2_PW" "$WORK/h2" XGROUP CREATE sr:jobs holdgroup '$' MKSTREAM >/dev/null
REDISCLI_AUTH="$H2_PW" timeout 60 redis-cli --no-auth-warning --tls --cacert "$WORK/tls/ca.crt" \
    --cert "$WORK/h2/client.crt" --key "$WORK/h2/client.key" -h 127.0.0.1 -p "$TLS" --user worker-h2 \
    XREADGROUP GROUP holdgroup holder BLOCK 60000 STREAMS sr:jobs '>' >"$WORK/held.out" 2>&1 &
HOLD_PID=$!
deadline=$((SECONDS + 10))
until admin CLIENT LIST | grep "user=worker-h2 " | grep -q "cmd=xreadgroup"; do
    ((SECONDS < deadline)) || fail "the blocking connection as worker-h2 did not show up"
    sleep 0.2
done
H2_NEW_PW="$(openssl rand -hex 24)"
printf '%s\n' "$H2_NEW_PW" | docker exec -i -u redis "$ID" redis-entrypoint.sh worker-host add h2
conns="$(admin CLIENT LIST | grep -c "user=worker-h2 " || true)"
[[ "$conns" == 0 ]] || fail "$conns worker-h2 connection(s) made with the old password still open after the re-issue"
deadline=$((SECONDS + 10))
while kill -0 "$HOLD_PID" 2>/dev/null; do
    ((SECONDS < deadline)) || fail "the client holding the old password was not cut off"
    sleep 0.2
done
wait "$HOLD_PID" || true; HOLD_PID=""
grep -q WRONGPASS <<<"$(as_host worker-h2 "$H2_PW" "$WORK/h2" EXISTS sr:workers)" || fail "the old password of worker-h2 still logs in"
[[ "$(as_host worker-h2 "$H2_NEW_PW" "$WORK/h2" EXISTS sr:workers)" =~ ^[01]$ ]] || fail "the new password of worker-h2 is refused"
echo "the held connection was closed ($(tr '\n' ' ' <"$WORK/held.out")); old password refused, new one in"

step "passed"
