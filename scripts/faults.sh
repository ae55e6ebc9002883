#!/usr/bin/env bash
# Faults under load (tests/reliability/faults.py): three workers, two api replicas
# behind Caddy and a Redis with an append-only file, all real processes; a worker
# SIGKILLed, another SIGTERMed, Redis SIGKILLed and restarted from its AOF, an api
# replica SIGKILLed, mid-run. Prints a summary; exits 1 if any check fails.
#
#   scripts/faults.sh                          # 300 tasks, debug binaries
#   scripts/faults.sh --release --tasks 300    # docs/evidence/faults.md (release build)
#   scripts/faults.sh --tasks 40               # the size scripts/test.sh runs
#
# Every other argument goes to faults.py (--help lists them). Needs what
# scripts/test.sh installs: Docker, redis-server, caddy, the test image and .venv.
exec "$(dirname "$0")/reliability.sh" faults "$@"
