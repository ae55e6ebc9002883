"""The one Python test harness: what the SDK tests (tests/python), the fault and
soak runs (tests/reliability) and the benchmark (scripts/bench) share.

    keys      the Redis key schema (checked against shared/src/keys.rs by
              tests/python/test_harness.py)
    lua       the Lua scripts of shared/src/lua, called by name with named keys
              and arguments (checked against each script's KEYS/ARGV header)
    procs     child processes, free ports, waiting on a condition, the one list
              of environment variables that reach the services
    stack     redis-server, workers, api replicas and Caddy as real processes
              under one key prefix and one temporary directory
    mcp_http  MCP as plain JSON-RPC over HTTP, one POST per call
    pytest_stack  a pytest session's stack fixture and its failure-log hook
              (tests/python, tests/compat; the one module needing pytest)

Redis is spoken through redis-py (`redis`, in tests/python/requirements.txt).
The entry points put `tests/` on sys.path and `import harness`; there is
nothing to install beyond the requirements.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
