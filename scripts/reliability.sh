#!/usr/bin/env bash
# What scripts/faults.sh and scripts/soak.sh share: builds the binaries (debug, or
# release with --release), makes .venv if it is missing, and runs
# tests/reliability/<tool>.py on them with every other argument.
#
#   scripts/reliability.sh faults|soak [--release] [tool arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
tool="${1:?usage: scripts/reliability.sh faults|soak [--release] [arguments...]}"
shift
case "$tool" in
    faults | soak) ;;
    *) echo "reliability.sh: unknown tool '$tool': use faults or soak" >&2; exit 2 ;;
esac
profile=debug
args=()
for a in "$@"; do
    if [[ "$a" == --release ]]; then profile=release; else args+=("$a"); fi
done
if ! .venv/bin/python -c 'import httpx2, redis' 2>/dev/null; then
    [[ -x .venv/bin/python ]] || python3 -m venv .venv
    .venv/bin/pip install -q -r tests/python/requirements.txt
fi
if [[ "$profile" == release ]]; then cargo build --release --bins; else cargo build --bins; fi
export TEST_RUNTIME_IMAGE="${TEST_RUNTIME_IMAGE:-script-runner-test/python:3.13-trixie}"
exec .venv/bin/python "tests/reliability/$tool.py" --bin-dir "${CARGO_TARGET_DIR:-target}/$profile" "${args[@]}"
