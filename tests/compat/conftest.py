"""Fixtures for the agent-framework compatibility suite: a real redis-server, the
worker and the api (the shared harness, tests/harness, from target/debug), once
per session. Each test drives the server through one framework's own MCP client,
as that framework's users do, and checks what `checks.py` asks of every client.

The frameworks pin different MCP SDKs, so the suite has two venvs: `sdk1/` runs
on the MCP Python SDK 1.x (`.venv-compat-sdk1`, sdk1/requirements.txt), `sdk2/`
on 2.x (`.venv-compat-sdk2`, sdk2/requirements.txt); scripts/test.sh makes both."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared harness package
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/compat: checks.py
from harness.pytest_stack import attach_logs, session_stack  # noqa: E402
from harness.stack import Stack  # noqa: E402


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    yield from session_stack("compat", {"WORKER_CONCURRENCY": "2", "SHUTDOWN_GRACE_SECONDS": "0"})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attaches the services' logs to the report of a failing test."""
    outcome = yield
    attach_logs(outcome.get_result())
