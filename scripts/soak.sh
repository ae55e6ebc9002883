#!/usr/bin/env bash
# Soak (tests/reliability/soak.py): a steady rate of mixed tasks (short, long,
# failing, killed, 1-5 MiB of output, zip with collected files) against real
# processes, api, worker and Redis memory sampled as it goes, then leaks checked
# once TASK_RETENTION_SECONDS has passed. Prints a CSV row per sample, then a
# summary, a text chart and a Markdown table; exits 1 if any check fails.
#
#   scripts/soak.sh --release --duration 1800 --csv soak.csv --png soak.png   # docs/evidence/soak.md
#   scripts/soak.sh --duration 150 --sample-every 15                          # a quick check
#
# Every other argument goes to soak.py (--help lists them). Needs what
# scripts/test.sh installs: Docker, redis-server, the test image and .venv
# (--png also needs matplotlib in .venv).
exec "$(dirname "$0")/reliability.sh" soak "$@"
