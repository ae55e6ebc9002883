"""Fixtures for the end-to-end suite: a real redis-server, the worker and the api,
started once per session (by the shared harness, tests/harness) from target/debug
(or $CARGO_TARGET_DIR/debug), and an MCP client (the official Python
SDK, `mcp` 2.x) connected to the api over Streamable HTTP with the bearer token.

Nothing here sleeps and hopes: every wait polls a condition against a deadline and
fails at once, with the process's log, if the process it waits for has exited.

Environment:
  TEST_RUNTIME_IMAGE        image for python3.13 and python3.8 (default
                            script-runner-test/python:3.13-trixie, built by scripts/build-test-image.sh)
  TEST_NODE_IMAGE           image for node24 (default script-runner-test/node:24-trixie, same script)
  SCRIPT_RUNNER_KEEP_LOGS=1 keep the temporary directory (logs, task dirs) after the run
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared harness package
from harness.pytest_stack import attach_logs, session_stack  # noqa: E402
from harness.stack import RUNTIMES, Api, Stack  # noqa: E402

__all__ = ["RUNTIMES", "Stack", "connect", "second_api", "task_count"]

# The warm pool the workers keep: TEST_POOL_SIZE (e.g. 0 for none) or the worker's
# default. scripts/test.sh runs the suites both ways.
POOL_SIZE = os.environ.get("TEST_POOL_SIZE")


def task_count(stack: Stack) -> int:
    """How many task records exist under the run's prefix. A record stays after
    its task has run (until the retention TTL), unlike its stream entry, so this
    counts every task ever created in the run."""
    head = stack.keys.task("")
    return sum(1 for k in stack.redis.scan_iter(match=f"{head}*", count=1000) if ":" not in k[len(head) :])


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    """redis-server + script-runner-worker + script-runner-api, for the whole session."""
    pool = {"POOL_SIZE": POOL_SIZE} if POOL_SIZE is not None else {}
    if POOL_SIZE == "0":
        pool["EGRESS_POOL_SIZE"] = "0"  # no pool at all: allow-list tasks' too
    yield from session_stack("pytest", {"WORKER_CONCURRENCY": "2", "SHUTDOWN_GRACE_SECONDS": "0"} | pool)


def second_api(stack: Stack, short: str) -> Api:
    """Another api process against the stack's Redis (a second replica: any
    replica must answer for any task); stop it with `.proc.stop()`."""
    stack.add_api(short)
    return stack.start_api(short)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attaches the services' logs to the report of a failing test."""
    outcome = yield
    attach_logs(outcome.get_result())


# --------------------------------------------------------------------------- the client


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@contextlib.asynccontextmanager
async def connect(
    stack: Stack,
    *,
    token: str | None = None,
    mode: str = "auto",
    statuses: list[int] | None = None,
    origin: str | None = None,
) -> AsyncIterator[Client]:
    """An SDK client on the api's /mcp with `Authorization: Bearer <token>`
    (the stack's token unless another is given), and `Origin: <origin>` if given,
    as a browser would send. `statuses`, if given, collects the HTTP status of
    every response the SDK's transport received."""
    headers = {"Authorization": f"Bearer {stack.token if token is None else token}"}
    if origin is not None:
        headers["Origin"] = origin
    timeout = httpx2.Timeout(30.0, read=60.0)

    async def record(response: httpx2.Response) -> None:
        if statuses is not None:
            statuses.append(response.status_code)

    hooks = {"response": [record]}
    async with httpx2.AsyncClient(headers=headers, timeout=timeout, event_hooks=hooks) as http:
        async with Client(streamable_http_client(stack.mcp_url, http_client=http), mode=mode) as client:
            yield client


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[Client]:
    async with connect(stack) as c:
        yield c
