#!/usr/bin/env bash
# Faults under load (tests/reliability/faults.py): three workers, two api replicas
# behind Caddy and a Redis with an append-only file, all real processes; a worker
# SIGKILLed, another SIGTERMed, Redis SIGKILLed and restarted from its AOF, an api
# replica SIGKILLed, mid-run. Prints a summary; exits 1 if any check fails.
#
#   scripts/faults.sh                          # 300 tasks, debug binaries
#   scripts/faults.sh --release --tasks 300    # docs/evidence/faults.md (release build)
#   scripts/faults.sh --tasks 40               # the size scripts/test.sh runs
#   scripts/faults.sh --faults primary-kill    # a Redis failover instead: a primary, a
#       replica and three sentinels (redis-sentinel), the primary SIGKILLed mid-run,
#       REDIS_MIN_REPLICAS_ACK=1 (--min-replicas-ack 0: measure what is lost without)
#
# Every other argument goes to faults.py (--help lists them). Needs what
# scripts/test.sh installs: Docker, redis-server (and redis-sentinel for
# primary-kill), caddy, the test image and .venv.
exec "$(dirname "$0")/reliability.sh" faults "$@"
