#!/usr/bin/env bash
# Runs script-runner on this machine: Redis (started if none answers), one worker
# and the api, configured from .env. Needs Docker, cargo and redis-server.
#
# - Creates .env from .env.example if missing, and generates SCRIPT_RUNNER_TOKEN
#   (printed once) if it is empty, and the task spec key pair (TASK_SIGNING_KEY,
#   TASK_VERIFY_KEYS) with script-runner-ctl once the binaries are built.
# - Makes sure every runtime image is present: pulls it, and where that is not
#   possible (no registry, as on the CI machine) builds the local Debian image
#   (scripts/build-test-image.sh) and maps the missing runtimes to it.
# - Builds the binaries, starts the worker in the background and the api in the
#   foreground; Ctrl-C stops both (the worker kills its running tasks after
#   SHUTDOWN_GRACE_SECONDS).
set -euo pipefail
cd "$(dirname "$0")/.."

[[ -f .env ]] || cp .env.example .env
if ! grep -qE '^SCRIPT_RUNNER_TOKEN=.{32,}$' .env; then
    token="$(openssl rand -hex 32 2>/dev/null || python3 -c 'import secrets; print(secrets.token_hex(32))')"
    if grep -q '^SCRIPT_RUNNER_TOKEN=' .env; then
        sed -i "s/^SCRIPT_RUNNER_TOKEN=.*/SCRIPT_RUNNER_TOKEN=$token/" .env
    else
        echo "SCRIPT_RUNNER_TOKEN=$token" >>.env
    fi
    echo "run-local: generated SCRIPT_RUNNER_TOKEN in .env: $token"
fi
set -a
# shellcheck disable=SC1091
. ./.env
set +a
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"
export TASKS_DIR="${TASKS_DIR:-$PWD/tasks-data}"

if ! redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1; then
    case "$REDIS_URL" in
    redis://127.0.0.1:* | redis://localhost:*)
        port="${REDIS_URL##*:}"; port="${port%%/*}"
        command -v redis-server >/dev/null || { echo "run-local: install redis-server (apt-get install redis-server)" >&2; exit 1; }
        echo "run-local: starting redis-server on 127.0.0.1:$port"
        redis-server --port "$port" --bind 127.0.0.1 --daemonize yes --save 60 1 --dir "$PWD" >/dev/null
        for _ in $(seq 50); do redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1 && break; sleep 0.1; done
        ;;
    *) echo "run-local: Redis at $REDIS_URL does not answer" >&2; exit 1 ;;
    esac
fi

# Runtime images: the configured ones (or the defaults), pulled if absent.
defaults="node24=node:24-slim,python3.8=python:3.8-slim,python3.13=python:3.13-slim"
images="$defaults${RUNTIME_IMAGES:+,$RUNTIME_IMAGES}"
declare -A chosen=()
IFS=',' read -ra pairs <<<"$images"
for pair in "${pairs[@]}"; do chosen["${pair%%=*}"]="${pair#*=}"; done
mapped=""
for name in "${!chosen[@]}"; do
    image="${chosen[$name]}"
    docker image inspect "$image" >/dev/null 2>&1 && { mapped+="$name=$image,"; continue; }
    if docker pull -q "$image" >/dev/null 2>&1; then mapped+="$name=$image,"; continue; fi
    case "$name" in
    node*) local_image="${TEST_NODE_IMAGE:-script-runner-test/node:24-trixie}" ;;
    *) local_image="${TEST_RUNTIME_IMAGE:-script-runner-test/python:3.13-trixie}" ;;
    esac
    echo "run-local: cannot pull $image; runtime $name will use the local image $local_image"
    ./scripts/build-test-image.sh
    mapped+="$name=$local_image,"
done
export RUNTIME_IMAGES="${mapped%,}"

cargo build --bins
# The api signs each task's spec, the worker runs only what it signed: one pair, kept.
if [[ -z "${TASK_SIGNING_KEY:-}" ]]; then
    pair="$(./target/debug/script-runner-ctl signing-key generate | grep -E '^TASK_(SIGNING_KEY|VERIFY_KEYS)=')"
    sed -i -E '/^TASK_(SIGNING_KEY|VERIFY_KEYS)=/d' .env
    printf '%s\n' "$pair" >>.env
    set -a
    eval "$pair"
    set +a
    echo "run-local: generated the task spec key pair (TASK_SIGNING_KEY, TASK_VERIFY_KEYS) in .env"
fi
./target/debug/script-runner-worker &
worker=$!
trap 'kill -TERM $worker 2>/dev/null; wait $worker' EXIT
echo "run-local: MCP endpoint http://${LISTEN_ADDR:-0.0.0.0:8080}/mcp (Authorization: Bearer \$SCRIPT_RUNNER_TOKEN from .env)"
./target/debug/script-runner-api
