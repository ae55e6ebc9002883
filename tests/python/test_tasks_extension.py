"""The MCP tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663) end to end.

The Python SDK (mcp 2.3) has no tasks client, so this file defines the small one
a client needs with the SDK's extension API: a `ResultClaim` for the
`resultType: "task"` answer to `tools/call`, and `tasks/get` / `tasks/cancel`
requests carrying the task id in the `Mcp-Name` header.
"""

from __future__ import annotations

import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Literal

import anyio
import httpx2
import pytest
from conftest import Stack, connect, second_api
from mcp import Client, MCPError
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, Request, RequestParams, Result
from pydantic import ConfigDict
from test_mcp_sdk import b64, containers_of

pytestmark = pytest.mark.anyio

TASKS = "io.modelcontextprotocol/tasks"
DEADLINE = 60.0


class TaskFields(Result):
    """A task's fields, as both `CreateTaskResult` and `tasks/get` carry them."""

    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class TaskHandle(TaskFields):
    """`CreateTaskResult`: the seed state of a task, `resultType: "task"`."""

    result_type: Literal["task"]


class DetailedTask(TaskFields):
    """`tasks/get`'s answer: the task with its result once completed."""

    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class EmptyAck(Result):
    model_config = ConfigDict(extra="allow")


class TaskIdParams(RequestParams):
    task_id: str


class GetTask(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"


class CancelTask(Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


class TasksExtension(ClientExtension):
    """Declares the extension; a claimed task handle is returned to the caller
    (who then polls it) rather than resolved behind its back."""

    identifier = TASKS

    def claims(self) -> list[ResultClaim[Any]]:
        async def unresolved(handle: TaskHandle, ctx: ClaimContext) -> CallToolResult:
            raise AssertionError("tests call with allow_claimed=True and poll themselves")

        return [ResultClaim(result_type="task", model=TaskHandle, resolve=unresolved)]


@asynccontextmanager
async def tasks_client(stack: Stack, url: str | None = None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {stack.token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=60.0)) as http:
        transport = streamable_http_client(url or stack.mcp_url, http_client=http)
        async with Client(transport, extensions=[TasksExtension()]) as client:
            yield client


async def start(client: Client, command: str, **extra: Any) -> TaskHandle:
    arguments = {"runtime": "python3.13", "command_base64": b64(command), **extra}
    handle = await client.session.call_tool("run_script", arguments, allow_claimed=True)
    assert isinstance(handle, TaskHandle), f"a task-aware client should get a task handle, got {handle!r}"
    uuid.UUID(handle.task_id)
    assert handle.status == "working", handle
    assert handle.ttl_ms and handle.poll_interval_ms, handle
    # A task just created is polled near the floor (docs/tools.md: a fifth of
    # its age, at least 100 ms): most tasks are short. A slow answer makes the
    # task a little older, hence the margin.
    assert 100 <= handle.poll_interval_ms <= 200, handle
    return handle


async def get(client: Client, task_id: str) -> DetailedTask:
    return await client.session.send_request(GetTask(params=TaskIdParams(task_id=task_id)), DetailedTask)


async def poll(client: Client, task_id: str) -> tuple[DetailedTask, list[str]]:
    """Polls tasks/get until a terminal status; returns it and every status seen."""
    seen: list[str] = []
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        task = await get(client, task_id)
        assert task.task_id == task_id
        seen.append(task.status)
        if task.status in {"completed", "failed", "cancelled"}:
            assert task.poll_interval_ms is None, f"a final task has nothing left to poll: {task}"
            return task, seen
        assert task.status_message, f"a working task says what it is doing: {task}"
        assert task.poll_interval_ms and 100 <= task.poll_interval_ms <= 10_000, task
        await anyio.sleep(0.2)
    pytest.fail(f"task {task_id} did not end within {DEADLINE:.0f} s; seen {seen}")


async def test_a_task_aware_client_gets_a_task_and_polls_it_to_its_result(stack: Stack) -> None:
    async with tasks_client(stack) as client:
        handle = await start(client, "echo started; sleep 1; echo done")
        task, seen = await poll(client, handle.task_id)
    assert seen[0] == "working" and task.status == "completed", seen
    assert task.result is not None and task.result.get("isError") is False, task
    status = task.result["structuredContent"]
    assert status["state"] == "succeeded" and status["stdout_tail"] == "started\ndone\n", status


async def test_a_failing_script_completes_with_is_error(stack: Stack) -> None:
    async with tasks_client(stack) as client:
        handle = await start(client, "echo oops >&2; exit 3")
        task, _ = await poll(client, handle.task_id)
    assert task.status == "completed", "a script that failed is a tool error, not a failed task"
    assert task.result is not None and task.result.get("isError") is True, task
    status = task.result["structuredContent"]
    assert (status["state"], status["exit_code"], status["stderr_tail"]) == ("failed", 3, "oops\n"), status


async def test_cancel_kills_the_container(stack: Stack) -> None:
    async with tasks_client(stack) as client:
        handle = await start(client, "echo up; sleep 300")
        end = time.monotonic() + DEADLINE
        while "last output" not in ((await get(client, handle.task_id)).status_message or ""):
            assert time.monotonic() < end, "the task never started"
            await anyio.sleep(0.2)
        assert containers_of(handle.task_id), "its container runs"
        await client.session.send_request(CancelTask(params=TaskIdParams(task_id=handle.task_id)), EmptyAck)
        task, _ = await poll(client, handle.task_id)
    assert task.status == "cancelled", task
    end = time.monotonic() + DEADLINE
    while containers_of(handle.task_id):
        assert time.monotonic() < end, "the cancelled task's container is still there"
        await anyio.sleep(0.2)


async def test_another_api_replica_answers_tasks_get(stack: Stack) -> None:
    second = second_api(stack, "api-2")
    try:
        async with tasks_client(stack) as client:
            handle = await start(client, "echo from-one")
        async with tasks_client(stack, url=second.mcp_url) as other:
            task, _ = await poll(other, handle.task_id)
        assert task.status == "completed" and task.result is not None, task
        assert task.result["structuredContent"]["stdout_tail"] == "from-one\n"
    finally:
        second.proc.stop()


async def test_an_unknown_task_id_is_invalid_params(stack: Stack) -> None:
    async with tasks_client(stack) as client:
        for bad in [str(uuid.uuid4()), "not-a-task"]:
            with pytest.raises(MCPError) as caught:
                await get(client, bad)
            assert caught.value.error.code == -32602, caught.value.error


async def test_a_client_without_the_extension_gets_the_plain_result(stack: Stack) -> None:
    async with connect(stack) as client:
        result = await client.call_tool("run_script", {"runtime": "python3.13", "command_base64": b64("true")})
    assert not result.is_error
    assert result.structured_content is not None and result.structured_content["state"] == "queued", result
