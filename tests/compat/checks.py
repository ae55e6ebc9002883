"""What every client in the compatibility suite must do against the real server,
written once: list the tools, run a Python and a Node task to a result, and read
back a file a task wrote. Each test adapts its framework's client to `Call`."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

TOOLS = {
    "run_script", "get_task_status", "get_task_files", "kill_task", "list_tasks",
    "list_workspaces", "get_workspace", "fork_workspace", "delete_workspace", "read_files", "write_files",
}
FINAL = {"succeeded", "failed", "timed_out", "killed"}

# A tool call through the framework: the answer's structured content (the tool
# must succeed; the adapter fails the test otherwise).
Call = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def lists_every_tool(names: Iterable[str]) -> None:
    assert set(names) == TOOLS, sorted(names)


async def until_final(call: Call, answer: dict[str, Any], deadline: float = 120.0) -> dict[str, Any]:
    """`answer` (run_script's, with wait_seconds) once its task is final: a busy
    machine may take longer than one wait."""
    end = time.monotonic() + deadline
    while answer["state"] not in FINAL:
        assert time.monotonic() < end, f"task {answer['task_id']} not final after {deadline} s: {answer}"
        answer = await call("get_task_status", {"task_id": answer["task_id"], "wait_seconds": 10})
    return answer


async def runs_python_and_node_and_reads_a_file(call: Call, client: str, runtime_arg: str = "runtime") -> None:
    for runtime, command in [
        ("python3.13", "python3 -c 'print(6 * 7)'"),
        ("node24", "node -e 'console.log(6 * 7)'"),
    ]:
        ran = await call("run_script", {runtime_arg: runtime, "command_base64": b64(command), "wait_seconds": 30})
        ran = await until_final(call, ran)
        assert ran["state"] == "succeeded", ran
        assert ran["runtime"] == runtime and ran["stdout_tail"] == "42\n", ran

    line = f"hello from {client}"
    ran = await call(
        "run_script",
        {
            runtime_arg: "python3.13",
            "command_base64": b64(f"echo '{line}' > notes.txt"),
            "workspace": "new",
            "wait_seconds": 30,
        },
    )
    ran = await until_final(call, ran)
    assert ran["state"] == "succeeded" and ran["workspace_version"] == 1, ran
    read = await call("read_files", {"workspace_id": ran["workspace_id"], "paths": ["notes.txt"]})
    files = {f["path"]: f for f in read["files"]}
    assert files["notes.txt"]["content"] == f"{line}\n", read


def run(coro: Awaitable[None]) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]
