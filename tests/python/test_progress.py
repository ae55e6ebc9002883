"""Progress while waiting, through the official Python SDK: a waiting call made
with a progress callback (the SDK then sends a progressToken) hears
`notifications/progress` as the task runs, each with the newest line of output;
one made without hears nothing and is answered as plain JSON, as before."""

from __future__ import annotations

import re
import time

import httpx2
import pytest
from conftest import Stack
from mcp import Client
from test_mcp_sdk import b64, call_ok

pytestmark = pytest.mark.anyio

# Prints a line a second for three seconds.
TICKS = "for i in 1 2 3; do echo tick $i; sleep 1; done"


async def test_a_waiting_run_script_reports_progress_with_the_newest_line(client: Client) -> None:
    heard: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        heard.append((progress, message))

    args = {"runtime": "python3.13", "command_base64": b64(TICKS), "wait_seconds": 30}
    result = await client.call_tool("run_script", args, progress_callback=on_progress)
    assert not result.is_error, result
    assert result.structured_content["state"] == "succeeded", result.structured_content
    assert result.structured_content["stdout_tail"] == "tick 1\ntick 2\ntick 3\n"

    with_lines = [m for _, m in heard if m and "newest: tick" in m]
    assert len(with_lines) >= 3, heard
    # Each told the line printed last when it was sent, in order, and every
    # line was told before the answer came.
    ticks = [int(re.search(r"newest: tick (\d)", m).group(1)) for m in with_lines]  # type: ignore[union-attr]
    assert ticks == sorted(ticks) and set(ticks) == {1, 2, 3}, heard
    # The progress value grows with each notification, as the protocol asks.
    values = [p for p, _ in heard]
    assert values == sorted(set(values)), heard


async def test_get_task_status_with_progress_tells_where_the_task_stood_and_still_answers_on_the_change(
    client: Client,
) -> None:
    started = await call_ok(client, "run_script", {"runtime": "python3.13", "command_base64": b64(TICKS)})
    status = started
    while "tick 1" not in status.get("stdout_tail", ""):
        status = await call_ok(client, "get_task_status", {"task_id": started["task_id"], "wait_seconds": 30})
        assert status["state"] in {"queued", "running"}, status
    heard: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        heard.append(message)

    args = {"task_id": started["task_id"], "wait_seconds": 30}
    result = await client.call_tool("get_task_status", args, progress_callback=on_progress)
    # The status at the start was told; and a token does not make the wait
    # longer: the call answers on the next line, the task still running.
    assert heard and heard[0] and heard[0].startswith("running:"), heard
    told = re.search(r"newest: tick (\d)", heard[0])
    assert told, heard
    assert result.structured_content["state"] == "running", result.structured_content
    assert f"tick {int(told.group(1)) + 1}" in result.structured_content["stdout_tail"], (heard, result.structured_content)


def test_a_waiting_call_without_a_progress_token_is_answered_as_json(stack: Stack) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "run_script",
            "arguments": {"runtime": "python3.13", "command_base64": b64("echo hi; sleep 1"), "wait_seconds": 30},
        },
    }
    headers = {
        "Authorization": f"Bearer {stack.token}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-11-25",
    }
    r = httpx2.post(stack.mcp_url, json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    assert r.json()["result"]["structuredContent"]["state"] == "succeeded", r.text


async def test_a_wait_with_seen_answers_at_once_for_a_change_made_between_two_calls(client: Client) -> None:
    started = await call_ok(client, "run_script", {"runtime": "python3.13", "command_base64": b64("echo a; sleep 60")})
    task = started["task_id"]
    status = started
    while "a\n" not in status.get("stdout_tail", ""):
        status = await call_ok(client, "get_task_status", {"task_id": task, "wait_seconds": 30})
    # The caller last saw the task running with no output: "a" came since,
    # and nothing more will for a minute. Without `seen` this waits it out.
    seen = {"state": "running", "stdout_bytes": 0, "stderr_bytes": 0}
    began = time.monotonic()
    again = await call_ok(client, "get_task_status", {"task_id": task, "wait_seconds": 30, "seen": seen})
    assert again["stdout_tail"] == "a\n" and again["state"] == "running", again
    assert time.monotonic() - began < 15, "it waited instead of answering the change"
    # What it shows now is what the caller saw: the wait goes on to its end.
    now = {"state": "running", "stdout_bytes": 2, "stderr_bytes": 0}
    began = time.monotonic()
    same = await call_ok(client, "get_task_status", {"task_id": task, "wait_seconds": 2, "seen": now})
    assert same["stdout_tail"] == "a\n" and time.monotonic() - began >= 1.5, same
    await call_ok(client, "kill_task", {"task_id": task})
