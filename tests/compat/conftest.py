"""Fixtures for the agent-framework compatibility suite: a real redis-server, the
worker and the api (the shared harness, tests/harness, from target/debug), once
per session. Each test drives the server through one framework's own MCP client,
as that framework's users do."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared harness package
from harness.procs import HarnessError  # noqa: E402
from harness.stack import Stack, one_worker_stack  # noqa: E402


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    try:
        with one_worker_stack("compat", {"WORKER_CONCURRENCY": "2", "SHUTDOWN_GRACE_SECONDS": "0"}) as stack:
            yield stack
    except (HarnessError, TimeoutError) as e:
        pytest.fail(str(e), pytrace=False)
