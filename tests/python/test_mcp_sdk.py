"""script-runner end to end, through the official Python MCP SDK (`mcp` 2.x) over
Streamable HTTP: real api, real worker, real Redis, real containers.

The stack and the client come from conftest.py.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import time
import uuid
import zipfile
from typing import Any

import anyio
import httpx2
import pytest
from conftest import RUNTIMES, Stack, connect, task_count
from jsonschema import Draft202012Validator
from mcp import Client, MCPError
from mcp.types import CallToolResult, TextContent

pytestmark = pytest.mark.anyio

TOOLS = {
    "run_script", "get_task_status", "kill_task", "list_tasks", "get_task_files",
    "list_workspaces", "get_workspace", "fork_workspace", "delete_workspace", "read_files", "write_files",
}
FINAL_STATES = {"succeeded", "failed", "killed", "timed-out"}
STATUS_FIELDS = {
    "task_id", "state", "exit_code", "reason", "reason_kind", "runtime", "runtime_seconds", "seconds_since_last_output",
    "stdout_tail", "stderr_tail", "stdout_truncated", "stderr_truncated", "stdout_bytes", "stderr_bytes",
    "timeout_seconds", "created_at", "started_at", "finished_at",
}  # fmt: skip
TASK_DEADLINE = 60.0  # seconds for a short task to reach a final state
POLL_INTERVAL = 0.25


# --------------------------------------------------------------------------- helpers


def b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def text_of(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


async def call_ok(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Calls a tool that must succeed; returns its structuredContent after checking it
    against the tool's outputSchema and against the text content (the same JSON)."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, f"{tool} failed: {text_of(result)}"
    sc = result.structured_content
    assert isinstance(sc, dict), f"{tool} returned no structuredContent: {result}"
    schema = await output_schema(client, tool)
    errors = sorted(Draft202012Validator(schema).iter_errors(sc), key=str)
    assert not errors, f"{tool} structuredContent does not match its outputSchema: {errors}"
    assert json.loads(text_of(result)) == sc, "the text content should be the structuredContent as JSON"
    return sc


ERROR_CODES = {
    "invalid_argument", "too_large", "unknown_runtime", "unknown_task", "not_finished", "queue_full",
    "unavailable", "internal", "missing_scope", "quota_exceeded", "unknown_workspace", "unknown_version",
    "workspace_busy", "files_not_written",
}  # fmt: skip


async def call_err_code(client: Client, tool: str, arguments: dict[str, Any]) -> tuple[str, str]:
    """Calls a tool that must answer with a tool error (isError: true, not a protocol
    error); returns its stable code and its text, which structuredContent holds too."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, f"{tool}({arguments}) should have failed but returned {result.structured_content}"
    message = text_of(result)
    assert message.strip(), "a tool error should say what is wrong"
    sc = result.structured_content
    assert isinstance(sc, dict) and sc.get("message") == message, f"no code and message: {sc}"
    assert sc.get("code") in ERROR_CODES, f"unknown error code in {sc}"
    return sc["code"], message


async def call_err(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    """`call_err_code`'s text."""
    return (await call_err_code(client, tool, arguments))[1]


_SCHEMAS: dict[str, dict[str, Any]] = {}


async def output_schema(client: Client, tool: str) -> dict[str, Any]:
    if not _SCHEMAS:
        for t in (await client.list_tools()).tools:
            assert t.output_schema is not None, f"{t.name} has no outputSchema"
            _SCHEMAS[t.name] = t.output_schema
    return _SCHEMAS[tool]


async def run(client: Client, runtime: str, command: str, **extra: Any) -> dict[str, Any]:
    queued = await call_ok(
        client, "run_script", {"runtime": runtime, "command_base64": b64(command), **extra}
    )
    assert queued["state"] == "queued"
    uuid.UUID(queued["task_id"])  # a UUID, as the tool's description promises
    return queued


async def wait_for(
    client: Client, task_id: str, done: Any = lambda s: s["state"] in FINAL_STATES, deadline: float = TASK_DEADLINE, **extra: Any
) -> dict[str, Any]:
    """Polls get_task_status until `done(status)` (by default: a final state)."""
    end = time.monotonic() + deadline
    status: dict[str, Any] = {}
    while time.monotonic() < end:
        status = await call_ok(client, "get_task_status", {"task_id": task_id, **extra})
        assert status["task_id"] == task_id
        if done(status):
            return status
        await anyio.sleep(POLL_INTERVAL)
    pytest.fail(f"task {task_id} did not get there within {deadline:.0f} s; last status: {status}")


async def run_to_end(client: Client, runtime: str, command: str, **extra: Any) -> dict[str, Any]:
    queued = await run(client, runtime, command, **extra)
    return await wait_for(client, queued["task_id"])


def make_zip(files: dict[str, bytes | str], symlinks: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.create_system = 3  # unix, so external_attr carries the mode
            info.external_attr = 0o120777 << 16  # S_IFLNK
            zf.writestr(info, target)
    return buf.getvalue()


def leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    """The exceptions in a (possibly nested) exception group."""
    found: list[BaseException] = []
    for e in group.exceptions:
        found.extend(leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return found


def left_in_tasks_dir(stack) -> list[str]:
    """What a finished task left in TASKS_DIR: any regular file, or any entry but the
    warm pool's (pool-<worker>/, whose idle containers each have an empty src/ and a
    collection pipe) and the dependency caches' (cache-<worker>/: the owners' caches
    are kept on purpose, docs/sandbox.md; e2e/tests/caches.rs checks what they hold)."""
    tasks = stack.tmp_dir / "tasks"
    # And the workspace store and blob caches, which keep what workspaces saved.
    kept = ("pool-", "cache-", "blobs-", "workspace-store")
    files = [
        str(p)
        for p in tasks.rglob("*")
        if p.is_file()
        and not p.relative_to(tasks).parts[0].startswith(("cache-", "workspace-store"))
        and not (p.relative_to(tasks).parts[0].startswith("blobs-") and p.parent.name != "tmp")
    ]
    others = [str(p) for p in tasks.iterdir() if not p.name.startswith(kept)]
    return files + others


def containers_of(task_id: str) -> list[str]:
    # By name: a warm pool container is renamed sr-<task_id> when a task claims it
    # (its labels were set before the task existed).
    found = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"name=^/sr-{task_id}$"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return found.stdout.split()


# --------------------------------------------------------------------------- tools/list


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_lists_exactly_the_nine_tools(stack: Stack, mode: str) -> None:
    async with connect(stack, mode=mode) as client:
        assert client.server_info is not None and client.server_info.name == "script-runner"
        listing = await client.list_tools()

    tools = {t.name: t for t in listing.tools}
    assert set(tools) == TOOLS
    for name, tool in tools.items():
        assert tool.description and tool.description.strip(), f"{name} has no description"
        for kind, schema in (("inputSchema", tool.input_schema), ("outputSchema", tool.output_schema)):
            assert isinstance(schema, dict), f"{name} has no {kind}"
            assert schema.get("type") == "object", f"{name} {kind} is not an object schema: {schema}"
            assert schema.get("properties"), f"{name} {kind} has no properties"
            Draft202012Validator.check_schema(schema)

    # The runtime comes under one of two names (runtime_name for LangChain's
    # adapters), so only the command is required.
    assert set(tools["run_script"].input_schema["required"]) == {"command_base64"}
    assert {"runtime", "runtime_name"} <= set(tools["run_script"].input_schema["properties"])
    assert {"zip_base64", "timeout_seconds", "stdin_base64", "env", "network"} <= set(
        tools["run_script"].input_schema["properties"]
    )
    assert tools["get_task_status"].input_schema["required"] == ["task_id"]
    assert "tail_bytes" in tools["get_task_status"].input_schema["properties"]
    assert tools["kill_task"].input_schema["required"] == ["task_id"]

    assert set(tools["run_script"].output_schema["properties"]) == {
        "task_id", "state", "timeout_seconds", "workspace_id"
    }
    assert STATUS_FIELDS <= set(tools["get_task_status"].output_schema["properties"])
    assert set(tools["kill_task"].output_schema["properties"]) == {"task_id", "state", "killed"}
    assert set(tools["list_tasks"].output_schema["properties"]) == {"tasks", "next_cursor"}
    assert tools["list_tasks"].annotations is not None and tools["list_tasks"].annotations.read_only_hint is True


# --------------------------------------------------------------------------- running scripts


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_python_one_liner_stdout_and_stderr(stack: Stack, mode: str) -> None:
    command = "python3 -c \"import sys; print('hello from sdk'); print('oops', file=sys.stderr)\""
    async with connect(stack, mode=mode) as client:
        queued = await run(client, "python3.13", command)
        assert queued["timeout_seconds"] == 300  # the default
        status = await wait_for(client, queued["task_id"])

        assert status["state"] == "succeeded", status
        assert status["exit_code"] == 0
        assert status["stdout_tail"] == "hello from sdk\n"
        assert status["stderr_tail"] == "oops\n"
        assert (status["stdout_bytes"], status["stderr_bytes"]) == (15, 5)
        assert status["stdout_truncated"] is False and status["stderr_truncated"] is False
        assert status["runtime"] == "python3.13"
        assert status["timeout_seconds"] == 300
        assert isinstance(status["reason"], str) and status["reason"]
        assert status["runtime_seconds"] is not None and status["runtime_seconds"] >= 0
        assert status["seconds_since_last_output"] is not None
        # RFC 3339 UTC with milliseconds: fixed width, so string order is time order.
        assert status["created_at"] <= status["started_at"] <= status["finished_at"]
        assert all(status[k].endswith("Z") for k in ("created_at", "started_at", "finished_at"))
        assert STATUS_FIELDS <= set(status)

        # Killing a finished task is not an error: nothing is killed, the state stays.
        kill = await call_ok(client, "kill_task", {"task_id": queued["task_id"]})
        assert kill == {"task_id": queued["task_id"], "state": "succeeded", "killed": False}


async def test_zip_with_nested_files(client: Client) -> None:
    archive = make_zip(
        {
            "dir/sub/file.txt": "nested file contents\n",
            "app/__init__.py": "",
            "app/helper.py": "def greet(who):\n    return f'hi {who} from a module'\n",
            "main.py": "import sys\nfrom app.helper import greet\nprint(greet(sys.argv[1]))\n",
        }
    )
    status = await run_to_end(
        client, "python3.13", "cat dir/sub/file.txt && python3 main.py zip && ls dir/sub", zip_base64=b64(archive)
    )
    assert status["state"] == "succeeded", status
    assert status["stdout_tail"] == "nested file contents\nhi zip from a module\nfile.txt\n"
    assert status["stderr_tail"] == ""


async def test_node_runtime(client: Client) -> None:
    status = await run_to_end(client, "node24", "node -e 'console.log(6 * 7); console.error(\"to stderr\")'")
    assert status["state"] == "succeeded", status
    assert status["runtime"] == "node24"
    assert (status["stdout_tail"], status["stderr_tail"]) == ("42\n", "to stderr\n")


async def test_nonzero_exit_is_failed(client: Client) -> None:
    status = await run_to_end(client, "python3.8", "echo before; exit 3")
    assert status["state"] == "failed", status
    assert status["exit_code"] == 3
    assert "3" in status["reason"]
    assert status["reason_kind"] == "exited"
    assert status["stdout_tail"] == "before\n"


async def test_wait_seconds_answers_a_short_task_in_one_call(client: Client) -> None:
    # The result is get_task_status's, and still valid against run_script's outputSchema
    # (call_ok checks it).
    status = await call_ok(
        client, "run_script", {"runtime": "python3.13", "command_base64": b64("echo hi"), "wait_seconds": 20}
    )
    assert status["state"] == "succeeded", status
    assert set(status) >= STATUS_FIELDS
    assert (status["exit_code"], status["stdout_tail"]) == (0, "hi\n")


async def test_tail_bytes_and_truncation(client: Client) -> None:
    queued = await run(client, "python3.13", "python3 -c \"print('a' * 9000 + 'b' * 999)\"")
    full = await wait_for(client, queued["task_id"])
    assert full["state"] == "succeeded", full
    assert full["stdout_bytes"] == 10000
    assert full["stdout_truncated"] is True  # the default tail is 4096 bytes
    assert full["stdout_tail"] == "a" * (4096 - 1000) + "b" * 999 + "\n"

    small = await call_ok(client, "get_task_status", {"task_id": queued["task_id"], "tail_bytes": 100})
    assert small["stdout_tail"] == "b" * 99 + "\n"
    assert small["stdout_truncated"] is True
    assert small["stderr_tail"] == "" and small["stderr_truncated"] is False

    none = await call_ok(client, "get_task_status", {"task_id": queued["task_id"], "tail_bytes": 0})
    assert none["stdout_tail"] == "" and none["stdout_truncated"] is True
    assert none["state"] == "succeeded"


async def test_kill_running_task(client: Client) -> None:
    queued = await run(client, "python3.13", "echo started; sleep 120")
    task_id = queued["task_id"]
    running = await wait_for(client, task_id, lambda s: s["state"] in FINAL_STATES or "started" in s["stdout_tail"])
    assert running["state"] == "running", running
    assert running["exit_code"] is None and running["reason"] is None and running["finished_at"] is None
    assert running["reason_kind"] is None

    kill = await call_ok(client, "kill_task", {"task_id": task_id})
    assert kill == {"task_id": task_id, "state": "killed", "killed": True}

    status = await wait_for(client, task_id, lambda s: s["finished_at"] is not None)
    assert status["state"] == "killed", status
    assert "kill" in status["reason"]
    assert status["reason_kind"] == "killed-by-user"

    again = await call_ok(client, "kill_task", {"task_id": task_id})
    assert again == {"task_id": task_id, "state": "killed", "killed": False}

    # The container goes away too.
    end = time.monotonic() + 30
    while containers_of(task_id):
        assert time.monotonic() < end, f"the container of killed task {task_id} is still there"
        await anyio.sleep(POLL_INTERVAL)


async def test_kill_queued_task_never_starts(client: Client) -> None:
    # WORKER_CONCURRENCY is 2: two sleepers take both slots, so a third task waits.
    sleepers = [await run(client, "python3.13", "echo started; sleep 120") for _ in range(2)]
    for s in sleepers:
        await wait_for(client, s["task_id"], lambda st: st["state"] in FINAL_STATES or "started" in st["stdout_tail"])
    waiting = await run(client, "python3.13", "echo should never run")
    assert (await call_ok(client, "get_task_status", {"task_id": waiting["task_id"]}))["state"] == "queued"

    kill = await call_ok(client, "kill_task", {"task_id": waiting["task_id"]})
    assert kill == {"task_id": waiting["task_id"], "state": "killed", "killed": True}
    for s in sleepers:
        assert (await call_ok(client, "kill_task", {"task_id": s["task_id"]}))["killed"] is True

    # The jobs stream is FIFO: once a task queued after it has run, the worker has
    # seen the killed job, and must have skipped it.
    after = await run_to_end(client, "python3.13", "echo after")
    assert after["state"] == "succeeded", after
    status = await call_ok(client, "get_task_status", {"task_id": waiting["task_id"]})
    assert status["state"] == "killed", status
    assert status["started_at"] is None and status["exit_code"] is None and status["stdout_tail"] == ""
    assert "kill" in status["reason"]
    assert containers_of(waiting["task_id"]) == []


async def test_tails_are_utf8_safe(client: Client) -> None:
    # stdout: "caf\u00e9 " + an invalid byte + " end"; stderr: "x\u20ac" (the euro sign is 3 bytes).
    queued = await run(client, "python3.13", r"printf 'caf\303\251 \377 end'; printf 'x\342\202\254' >&2")
    status = await wait_for(client, queued["task_id"])
    assert status["state"] == "succeeded", status
    assert status["stdout_tail"] == "caf\u00e9 \ufffd end"  # the invalid byte is replaced
    assert (status["stdout_bytes"], status["stderr_bytes"]) == (11, 4)
    assert status["stderr_tail"] == "x\u20ac"

    two = await call_ok(client, "get_task_status", {"task_id": queued["task_id"], "tail_bytes": 2})
    assert two["stderr_tail"] == "" and two["stderr_truncated"] is True  # never half a character
    three = await call_ok(client, "get_task_status", {"task_id": queued["task_id"], "tail_bytes": 3})
    assert three["stderr_tail"] == "\u20ac" and three["stderr_truncated"] is True


async def test_timeout(client: Client) -> None:
    queued = await run(client, "python3.13", "echo waiting; sleep 120", timeout_seconds=1)
    assert queued["timeout_seconds"] == 1
    status = await wait_for(client, queued["task_id"], deadline=30)
    assert status["state"] == "timed-out", status
    assert "timed out" in status["reason"]
    assert status["stdout_tail"] == "waiting\n"


async def test_timeout_above_the_cap_is_lowered(client: Client) -> None:
    queued = await run(client, "python3.13", "true", timeout_seconds=10**7)
    assert queued["timeout_seconds"] == 3600  # MAX_TIMEOUT_SECONDS default
    status = await wait_for(client, queued["task_id"])
    assert status["state"] == "succeeded" and status["timeout_seconds"] == 3600


# --------------------------------------------------------------------------- bad input


DROP = object()  # in an override: leave this argument out

BAD_RUN_SCRIPT = [
    pytest.param({"runtime": "ruby"}, ["unknown runtime", *RUNTIMES], id="unknown-runtime"),
    pytest.param({"command_base64": "!!! not base64 !!!"}, ["command_base64", "base64"], id="bad-base64"),
    pytest.param({"command_base64": b64("   ")}, ["empty command"], id="empty-command"),
    pytest.param({"command_base64": b64(b"\xff\xfe")}, ["UTF-8"], id="command-not-utf8"),
    pytest.param({"timeout_seconds": 0}, ["timeout_seconds", "at least 1"], id="timeout-zero"),
    pytest.param({"zip_base64": "%%%"}, ["zip_base64", "base64"], id="zip-bad-base64"),
    pytest.param({"zip_base64": b64(b"this is not a zip")}, ["not a readable zip"], id="not-a-zip"),
    pytest.param({"zip_base64": b64(make_zip({"../evil.txt": "x"}))}, ["../evil.txt", "unsafe path"], id="zip-dotdot"),
    pytest.param({"zip_base64": b64(make_zip({"/etc/evil": "x"}))}, ["unsafe path"], id="zip-absolute"),
    pytest.param({"zip_base64": b64(make_zip({"ok.txt": "x"}, {"link": "/etc/passwd"}))}, ["symbolic link"], id="zip-symlink"),
    # Arguments that do not match the inputSchema are tool errors too, not protocol errors.
    pytest.param({"command_base64": DROP}, ["command_base64"], id="missing-command"),
    pytest.param({"timeout_seconds": "soon"}, ["soon"], id="timeout-not-a-number"),
    pytest.param({"stdin_base64": "%%%"}, ["stdin_base64", "base64"], id="stdin-bad-base64"),
    pytest.param({"stdin_base64": b64(b"x" * (1024 * 1024 + 1))}, ["stdin_base64", "at most 1048576"], id="stdin-too-large"),
    pytest.param({"env": {"1ABC": "x"}}, ["env name", "1ABC"], id="env-bad-name"),
    pytest.param({"env": {"PATH": "/tmp"}}, ["PATH", "reserved"], id="env-reserved"),
    pytest.param({"env": {"SR_SECRET": "x"}}, ["SR_SECRET", "reserved"], id="env-reserved-prefix"),
    pytest.param({"env": {"A": 1}}, ["env"], id="env-not-a-string"),
    pytest.param({"network": "off"}, ["internet", "none"], id="network-unknown"),
    pytest.param({"network": {"allow": ["pypi.org", "10.0.0.1"]}}, ["10.0.0.1", "IP address"], id="network-allow-ip"),
]  # fmt: skip


@pytest.mark.parametrize(("override", "expected"), BAD_RUN_SCRIPT)
async def test_run_script_rejects_bad_input(
    stack: Stack, client: Client, override: dict[str, Any], expected: list[str]
) -> None:
    tasks_before = task_count(stack)
    arguments = {"runtime": "python3.13", "command_base64": b64("echo never"), **override}
    arguments = {k: v for k, v in arguments.items() if v is not DROP}
    message = await call_err(client, "run_script", arguments)
    for fragment in expected:
        assert fragment in message, f"{fragment!r} not in the error message {message!r}"
    assert task_count(stack) == tasks_before, "a rejected run_script must not create a task"


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        pytest.param("get_task_status", {"task_id": "not-a-uuid"}, ("invalid_argument", "not a task id"), id="status-malformed-id"),
        pytest.param("get_task_status", {"task_id": str(uuid.uuid4())}, ("unknown_task", "no task with id"), id="status-unknown-id"),
        pytest.param("kill_task", {"task_id": "not-a-uuid"}, ("invalid_argument", "not a task id"), id="kill-malformed-id"),
        pytest.param("kill_task", {"task_id": str(uuid.uuid4())}, ("unknown_task", "no task with id"), id="kill-unknown-id"),
        pytest.param(
            "get_task_status",
            {"task_id": str(uuid.uuid4()), "tail_bytes": -1},
            ("invalid_argument", "between 0 and 65536"),
            id="bad-tail",
        ),
    ],
)  # fmt: skip
async def test_task_tools_reject_bad_input(
    client: Client, tool: str, arguments: dict[str, Any], expected: tuple[str, str]
) -> None:
    code, message = await call_err_code(client, tool, arguments)
    assert (code, expected[1] in message) == (expected[0], True), (code, message)


# --------------------------------------------------------------------------- auth


async def test_wrong_token_is_rejected_by_the_sdk(stack: Stack) -> None:
    wrong = "0" * 64
    assert wrong != stack.token
    rejected: list[MCPError] = []
    statuses: list[int] = []
    # The SDK's transport runs in task groups: the 401 comes out as an MCPError
    # nested in ExceptionGroups, hence except* (see docs/STACK.md). The SDK turns
    # a 401 with a non-JSON body into a generic error (-32603), so the status is
    # read from the HTTP client's own response hook instead.
    try:
        async with connect(stack, token=wrong, statuses=statuses) as client:
            await client.list_tools()
    except* MCPError as group:
        rejected.extend(leaves(group))
    assert rejected, "connecting with a wrong bearer token should fail"
    assert statuses and all(s == 401 for s in statuses), statuses


async def test_a_foreign_origin_is_refused_by_the_sdk_and_no_origin_is_served(stack: Stack) -> None:
    """The Streamable HTTP transport's Origin rule, with ALLOWED_ORIGINS at its
    default (no browser origin trusted): the SDK sending an Origin, as a browser
    would, gets 403 however right its token; without one it is served."""
    rejected: list[MCPError] = []
    statuses: list[int] = []
    try:
        async with connect(stack, origin="https://evil.example.com", statuses=statuses) as client:
            await client.list_tools()
    except* MCPError as group:
        rejected.extend(leaves(group))
    assert rejected, "a foreign Origin should be refused"
    assert statuses and all(s == 403 for s in statuses), statuses
    async with connect(stack) as client:
        assert {t.name for t in (await client.list_tools()).tools} == TOOLS


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="no-token"),
        pytest.param({"Authorization": "Bearer " + "0" * 64}, id="wrong-token"),
        pytest.param({"Authorization": "Basic dXNlcjpwYXNz"}, id="basic-auth"),
    ],
)
async def test_plain_post_without_the_token_gets_401(stack: Stack, headers: dict[str, str]) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "pytest", "version": "0"}},
    }
    async with httpx2.AsyncClient(timeout=10) as http:
        response = await http.post(
            stack.mcp_url,
            json=body,
            headers={"Accept": "application/json, text/event-stream", **headers},
        )
    assert response.status_code == 401, response.text
    assert response.headers.get("www-authenticate", "").startswith("Bearer"), response.headers


async def test_healthz_is_open(stack: Stack) -> None:
    async with httpx2.AsyncClient(timeout=10) as http:
        response = await http.get(f"{stack.base_url}/healthz")
    assert response.status_code == 200, response.text


# --------------------------------------------------------------------------- stdin, env, network


async def test_stdin_reaches_the_script_in_full_then_eof(client: Client) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB, every byte value
    reader = "python3 -c 'import sys, hashlib; d = sys.stdin.buffer.read(); print(len(d), hashlib.sha256(d).hexdigest())'"
    status = await run_to_end(client, "python3.13", reader, stdin_base64=b64(data))
    import hashlib

    assert status["state"] == "succeeded", status
    assert status["stdout_tail"] == f"{len(data)} {hashlib.sha256(data).hexdigest()}\n"
    # Without stdin_base64 the script's stdin is empty: a reader ends at once.
    empty = await run_to_end(client, "python3.13", "wc -c")
    assert empty["stdout_tail"].strip() == "0", empty
    # A script that never reads its stdin is not held up by it.
    ignored = await run_to_end(client, "python3.13", "echo ignored", stdin_base64=b64(data))
    assert (ignored["state"], ignored["stdout_tail"]) == ("succeeded", "ignored\n"), ignored


async def test_env_vars_are_seen_by_the_script(client: Client) -> None:
    env = {"GREETING": "hello there", "_N": "42", "QUOTED": "a'b\"c $HOME"}
    status = await run_to_end(client, "python3.13", 'printf "%s|%s|%s|%s" "$GREETING" "$_N" "$QUOTED" "$HOME"', env=env)
    assert status["state"] == "succeeded", status
    # The sandbox's own HOME stays.
    assert status["stdout_tail"] == "hello there|42|a'b\"c $HOME|/tmp", status


PROBE_NET = """
import socket
def tcp(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "connected"
    except OSError as e:
        return type(e).__name__
def dns(name):
    try:
        socket.getaddrinfo(name, 80)
        return "resolved"
    except OSError as e:
        return type(e).__name__
import os
print("ifaces", sorted(os.listdir("/sys/class/net")))
print("default-route", any(l.split()[1] == "00000000" for l in open("/proc/net/route").readlines()[1:]))
print("tcp", tcp("1.1.1.1", 53))
print("dns", dns("example.com"))
"""


async def test_network_none_reaches_nothing_while_the_default_has_a_route(client: Client) -> None:
    cmd = "python3 -c " + "'" + PROBE_NET.replace("'", "'\\''") + "'"
    none = await run_to_end(client, "python3.13", cmd, network="none")
    assert none["state"] == "succeeded", none
    out = none["stdout_tail"]
    assert "ifaces ['lo']" in out, out
    assert "default-route False" in out, out
    assert "tcp connected" not in out, out
    assert "dns resolved" not in out, out
    # The default network has an interface besides lo and a default route (the
    # internet itself is not reachable from this machine, so only the route is shown).
    internet = await run_to_end(client, "python3.13", cmd)
    assert internet["state"] == "succeeded", internet
    assert "default-route True" in internet["stdout_tail"], internet
    assert "ifaces ['lo']" not in internet["stdout_tail"], internet


# --------------------------------------------------------------------------- list_tasks


async def list_all(client: Client, limit: int, **filters: Any) -> tuple[list[dict[str, Any]], int]:
    """Every task list_tasks shows, following next_cursor; and how many pages it took."""
    tasks: list[dict[str, Any]] = []
    cursor = None
    pages = 0
    while True:
        args: dict[str, Any] = {"limit": limit, **filters}
        if cursor is not None:
            args["cursor"] = cursor
        page = await call_ok(client, "list_tasks", args)
        pages += 1
        assert len(page["tasks"]) <= limit, page
        tasks.extend(page["tasks"])
        cursor = page["next_cursor"]
        if cursor is None:
            return tasks, pages
        assert pages < 1000, "list_tasks never ended"


async def test_list_tasks_newest_first_filtered_and_paged(client: Client) -> None:
    marker = uuid.uuid4().hex[:12]
    ids = []
    for i in range(5):
        command = f"echo {marker}-{i}" if i % 2 == 0 else f"exit {i}  # {marker}-{i}"
        queued = await run(client, "python3.13", command + "\n# second line is not shown")
        ids.append(queued["task_id"])
        await wait_for(client, queued["task_id"])
    everything, pages = await list_all(client, limit=2)
    mine = [t for t in everything if marker in t["command"]]
    assert pages >= 3, "five tasks at two a page span at least three pages"
    assert [t["task_id"] for t in mine] == list(reversed(ids)), "newest first, none lost or repeated"
    assert all("second line" not in t["command"] for t in mine), mine
    assert [t["state"] for t in mine] == ["succeeded", "failed", "succeeded", "failed", "succeeded"]
    assert mine[1]["exit_code"] == 3 and mine[1]["reason"] == "exited with code 3", mine[1]
    assert all(t["created_at"] and t["finished_at"] for t in mine), mine
    failed, _ = await list_all(client, limit=1, state="failed")
    assert all(t["state"] == "failed" for t in failed), failed
    assert [t["task_id"] for t in failed if marker in t["command"]] == [ids[3], ids[1]]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        pytest.param({"limit": 0}, "between 1 and 100", id="limit-zero"),
        pytest.param({"limit": 101}, "between 1 and 100", id="limit-too-big"),
        pytest.param({"cursor": "yesterday"}, "not one list_tasks returned", id="bad-cursor"),
        pytest.param({"state": "done"}, "done", id="unknown-state"),
    ],
)
async def test_list_tasks_rejects_bad_input(client: Client, arguments: dict[str, Any], expected: str) -> None:
    message = await call_err(client, "list_tasks", arguments)
    assert expected in message, message


# --------------------------------------------------------------------------- collect, get_task_files


def unzip(b64_zip: str) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(b64_zip))) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


async def test_collected_files_come_back_byte_for_byte(stack: Stack, client: Client) -> None:
    script = (
        "mkdir -p out && printf 'the report\\n' > out/report.txt && "
        "python3 -c 'import os; open(\"plot.png\", \"wb\").write(bytes(range(256)) * 40)' && "
        "echo not-collected > other.txt"
    )
    status = await run_to_end(client, "python3.13", script, collect=["out/*.txt", "plot.png"])
    assert status["state"] == "succeeded", status
    files = await call_ok(client, "get_task_files", {"task_id": status["task_id"]})
    assert sorted((f["name"], f["size"]) for f in files["files"]) == [("out/report.txt", 11), ("plot.png", 10240)]
    assert files["truncated"] is False
    got = unzip(files["zip_base64"])
    assert got == {"out/report.txt": b"the report\n", "plot.png": bytes(range(256)) * 40}
    # The files expire with the task's record...
    record_ttl = stack.redis.ttl(stack.keys.task(status["task_id"]))
    files_ttl = stack.redis.ttl(stack.keys.task_files(status["task_id"]))
    assert record_ttl > 0 and abs(record_ttl - files_ttl) <= 2, (record_ttl, files_ttl)
    # ...and nothing of the collection is left on the host (it went through a pipe).
    assert left_in_tasks_dir(stack) == [], "collection left files in TASKS_DIR"


async def test_links_out_of_the_workspace_are_not_followed(client: Client) -> None:
    script = "ln -s /etc/passwd passwd && ln -s /etc etc && mkdir real && echo x > real/f"
    status = await run_to_end(client, "python3.13", script, collect=["passwd", "etc/*", "etc", "real"])
    assert status["state"] == "succeeded", status
    files = await call_ok(client, "get_task_files", {"task_id": status["task_id"]})
    assert [f["name"] for f in files["files"]] == ["real/f"], files["files"]


async def test_a_big_file_is_cut_with_truncation_stated(stack: Stack, client: Client) -> None:
    # 400 MiB: as large as the default 512 MiB workspace comfortably holds (1 GiB
    # could not be written at all); the worker reads 16 MiB of it and stops.
    script = "head -c 419430400 /dev/zero > big.bin && echo small > small.txt"
    status = await run_to_end(client, "python3.13", script, collect=["small.txt", "big.bin"])
    assert status["state"] == "succeeded", status
    files = await call_ok(client, "get_task_files", {"task_id": status["task_id"]})
    assert files["truncated"] is True, files["files"]
    assert [f["name"] for f in files["files"]] == ["small.txt"], "a file past the 16 MiB cap is not kept"
    assert unzip(files["zip_base64"]) == {"small.txt": b"small\n"}
    assert left_in_tasks_dir(stack) == [], "the collection went through the host's disk"


async def test_get_task_files_answers_plainly_without_collect_and_refuses_bad_patterns(client: Client) -> None:
    status = await run_to_end(client, "python3.13", "true")
    files = await call_ok(client, "get_task_files", {"task_id": status["task_id"]})
    assert (files["files"], files["zip_base64"], files["truncated"]) == ([], None, False)
    message = await call_err(client, "run_script", {"runtime": "python3.13", "command_base64": b64("true"), "collect": ["../x"]})
    assert "collect pattern" in message, message
    running = await run(client, "python3.13", "sleep 30", collect=["x"])
    message = await call_err(client, "get_task_files", {"task_id": running["task_id"]})
    assert "still" in message, message
    await call_ok(client, "kill_task", {"task_id": running["task_id"]})
