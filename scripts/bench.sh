#!/usr/bin/env bash
# The benchmark (BENCHMARKS.md): starts its own Redis, workers and api, and prints
# every figure beside a baseline measured in the same run.
#
#   ./scripts/bench.sh                  # full run, release binaries (built here)
#   ./scripts/bench.sh --quick          # tiny sizes, debug binaries: proves the tool works (CI)
#   ./scripts/bench.sh --bin-dir DIR    # binaries already built elsewhere
#   ./scripts/bench.sh --help           # every option (sections, sizes, pool size)
#   ./scripts/bench.sh --cache [--quick] # the dependency caches' effect instead
#                                        # (scripts/bench/cache.py: npm ci, pip install)
#   ./scripts/bench.sh --workspaces [--quick] # persistent workspaces instead
#                                        # (scripts/bench/workspaces.py: restore, save, dedup, S3)
#
# Sets up what it needs, idempotently: wrk and redis-server (apt), the MCP Python SDK
# and redis-py (pip, into .venv), the runtime image (scripts/build-test-image.sh). Needs a Docker
# engine and root (the workers install the task firewall, as by default).
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
bin_dir=""
program=scripts/bench/bench.py
args=()
for a in "$@"; do
    case "$a" in
        --cache) program=scripts/bench/cache.py ;;
        --workspaces) program=scripts/bench/workspaces.py ;;
        *) args+=("$a") ;;
    esac
done
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
        --quick) quick=1 ;;
        --bin-dir) bin_dir="${args[i + 1]:-}" ;;
        --bin-dir=*) bin_dir="${args[i]#*=}" ;;
        -h | --help) bin_dir="${bin_dir:-${CARGO_TARGET_DIR:-target}/release}" ;;
    esac
done

need_apt=()
command -v wrk >/dev/null || need_apt+=(wrk)
command -v redis-server >/dev/null || need_apt+=(redis-server)
if ((${#need_apt[@]})); then
    echo "bench.sh: installing ${need_apt[*]}"
    SUDO=""
    [[ $(id -u) == 0 ]] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! .venv/bin/python -c 'import mcp, httpx2, redis' 2>/dev/null; then
    echo "bench.sh: installing tests/python/requirements.txt (MCP Python SDK, redis-py) into .venv"
    [[ -x .venv/bin/python ]] || python3 -m venv .venv
    .venv/bin/pip install -q -r tests/python/requirements.txt
fi

if [[ -z "$bin_dir" ]]; then
    if ((quick)); then
        # The quick run proves the tool works; its figures mean nothing, so it uses
        # the debug binaries scripts/test.sh has built already (no release build).
        cargo build --bins
        bin_dir="${CARGO_TARGET_DIR:-target}/debug"
    else
        cargo build --release --bins
        bin_dir="${CARGO_TARGET_DIR:-target}/release"
    fi
    args+=(--bin-dir "$bin_dir")
fi

image="${TEST_RUNTIME_IMAGE:-script-runner-test/python:3.13-trixie}"
if [[ "$image" == script-runner-test/* ]] && ! docker image inspect "$image" >/dev/null 2>&1; then
    ./scripts/build-test-image.sh
fi

exec .venv/bin/python "$program" "${args[@]}"
