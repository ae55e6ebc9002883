#!/usr/bin/env bash
# Faults under load (tests/reliability/faults.py): three workers, two api replicas
# behind Caddy and a Redis with an append-only file, all real processes; a worker
# SIGKILLed, another SIGTERMed, Redis SIGKILLed and restarted from its AOF, an api
# replica SIGKILLed, mid-run. Prints a summary; exits 1 if any check fails.
#
#   scripts/faults.sh                          # 300 tasks, debug binaries
#   scripts/faults.sh --release --tasks 300    # the README's figures (release build)
#   scripts/faults.sh --tasks 40               # the size scripts/test.sh runs
#
# Every other argument goes to faults.py (--help lists them). Needs what
# scripts/test.sh installs: Docker, redis-server, caddy, the test image and .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=debug
args=()
for a in "$@"; do
    if [[ "$a" == --release ]]; then profile=release; else args+=("$a"); fi
done
if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
    .venv/bin/pip install -q -r tests/python/requirements.txt
fi
if [[ "$profile" == release ]]; then cargo build --release --bins; else cargo build --bins; fi
export TEST_RUNTIME_IMAGE="${TEST_RUNTIME_IMAGE:-script-runner-test/python:3.13-trixie}"
exec .venv/bin/python tests/reliability/faults.py --bin-dir "target/$profile" "${args[@]}"
