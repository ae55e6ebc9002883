"""MCP client checks for the deploy test, through Caddy over HTTPS, with the official
Python MCP SDK (the same `mcp` 2.x as tests/python).

    mcp_check.py run   URL TOKEN CAFILE        list tools, run a Python one-liner, poll to succeeded
                                               (MCP_CHECK_USAGE=1: and it has a measured usage)
    mcp_check.py probe URL TOKEN CAFILE H:P..  a task tries each host:port; all must be refused
    mcp_check.py status URL TOKEN CAFILE ID    task ID is (still) succeeded
    mcp_check.py unauthorized URL CAFILE       a wrong token gets HTTP 401

URL's host is resolved to RESOLVE_TO (default 127.0.0.1) inside this process, like
curl --resolve, so a test domain needs no DNS. CAFILE is the root of Caddy's internal CA.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import ssl
import sys
import time
from urllib.parse import urlsplit

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

DEADLINE = float(os.environ.get("MCP_CHECK_DEADLINE", "180"))


def pin_resolution(url: str) -> None:
    host = urlsplit(url).hostname
    target = os.environ.get("RESOLVE_TO", "127.0.0.1")
    real = socket.getaddrinfo

    def fake(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        # anyio passes the name idna-encoded, as bytes.
        plain = name.decode() if isinstance(name, bytes) else name
        return real(target if plain == host else name, *args, **kwargs)

    socket.getaddrinfo = fake  # type: ignore[assignment]


def http_client(token: str, cafile: str) -> httpx2.AsyncClient:
    ctx = ssl.create_default_context(cafile=cafile)
    return httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        verify=ctx,
        timeout=httpx2.Timeout(30.0, read=60.0),
    )


async def call(client: Client, tool: str, args: dict) -> dict:
    result = await client.call_tool(tool, args)
    if result.is_error:
        raise SystemExit(f"{tool} failed: {result.content}")
    sc = result.structured_content
    assert isinstance(sc, dict), f"{tool}: no structuredContent"
    return sc


async def run_task(
    client: Client, command: str, timeout: int = 60, stdin: bytes | None = None, collect: list[str] | None = None
) -> dict:
    runtime = os.environ.get("MCP_CHECK_RUNTIME", "python3.13")
    args = {
        "runtime": runtime,
        "command_base64": base64.b64encode(command.encode()).decode(),
        "timeout_seconds": timeout,
    }
    if stdin is not None:
        args["stdin_base64"] = base64.b64encode(stdin).decode()
    if collect is not None:
        args["collect"] = collect
    submitted = await call(client, "run_script", args)
    assert submitted["state"] == "queued", submitted
    task_id = submitted["task_id"]
    end = time.monotonic() + DEADLINE
    while True:
        status = await call(client, "get_task_status", {"task_id": task_id})
        if status["state"] not in ("queued", "running"):
            return status
        if time.monotonic() > end:
            raise SystemExit(f"task {task_id} still {status['state']} after {DEADLINE:.0f} s")
        await asyncio.sleep(0.5)


async def check_workspace(client: Client) -> None:
    """A workspace task: the worker saves its /workspace into the store, and the api
    reads it back from there (through its read-only mount of the worker's store); then
    write_files' edit, which a worker makes."""
    args = {
        "runtime": os.environ.get("MCP_CHECK_RUNTIME", "python3.13"),
        "command_base64": base64.b64encode(b"echo kept > notes.txt").decode(),
        "workspace": "new",
    }
    made = await call(client, "run_script", args)
    end = time.monotonic() + DEADLINE
    while not isinstance(made.get("workspace_version"), int) and not made.get("workspace_note"):
        if time.monotonic() > end:
            raise SystemExit(f"workspace task {made['task_id']} made no version: {made}")
        await asyncio.sleep(0.5)
        made = await call(client, "get_task_status", {"task_id": made["task_id"]})
    assert made["workspace_version"] == 1, made
    read = await call(
        client, "read_files", {"workspace_id": made["workspace_id"], "paths": ["notes.txt"]}
    )
    assert [(f["path"], f.get("content")) for f in read["files"]] == [("notes.txt", "kept\n")], read
    # write_files: the worker writes the store (the api's mount is read-only).
    ws = made["workspace_id"]
    edit = {"workspace_id": ws, "files": [{"path": "notes.txt", "content": "edited\n"}]}
    wrote = await call(client, "write_files", edit)
    assert (wrote["state"], wrote["version"]) == ("succeeded", 2), wrote
    read = await call(client, "read_files", {"workspace_id": ws, "paths": ["notes.txt"]})
    assert [(f["path"], f.get("content")) for f in read["files"]] == [("notes.txt", "edited\n")], read
    print(f"mcp_check: workspace {ws} saved version 1, write_files made version 2, read_files read both back")


async def main(argv: list[str]) -> None:
    mode, url = argv[0], argv[1]
    pin_resolution(url)
    if mode == "unauthorized":
        async with httpx2.AsyncClient(verify=ssl.create_default_context(cafile=argv[2])) as http:
            r = await http.post(url, headers={"Authorization": "Bearer wrong"}, json={})
            assert r.status_code == 401, f"a wrong token got HTTP {r.status_code}"
            print("mcp_check: wrong token refused with 401")
        return
    token, cafile = argv[2], argv[3]
    async with http_client(token, cafile) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            if mode == "run":
                tools = sorted(t.name for t in (await client.list_tools()).tools)
                assert {"run_script", "get_task_status", "kill_task"} <= set(tools), tools
                print(f"mcp_check: tools {tools}")
                # stdin and collect too, so the api and worker use every Redis
                # command their ACL users need (the files go through FINISH and back).
                status = await run_task(
                    client,
                    "python3 -c 'import sys; print(int(sys.stdin.read()) * 7)' | tee answer.txt",
                    stdin=b"6",
                    collect=["answer.txt"],
                )
                assert status["state"] == "succeeded", status
                assert status["stdout_tail"].strip() == "42", status
                files = await call(client, "get_task_files", {"task_id": status["task_id"]})
                assert [f["name"] for f in files["files"]] == ["answer.txt"], files
                print(f"mcp_check: task {status['task_id']} succeeded, printed 42, its file came back")
                if os.environ.get("MCP_CHECK_USAGE"):
                    # Measured from the task's cgroup by the worker in its container.
                    usage = status.get("usage")
                    assert usage and usage["cpu_seconds"] is not None, status
                    assert (usage["peak_memory_bytes"] or 0) > 0, usage
                    assert (usage["workspace_bytes"] or 0) > 0, usage
                    print(f"mcp_check: usage {usage}")
                if os.environ.get("MCP_CHECK_WORKSPACE"):
                    await check_workspace(client)
                # The other tools' Redis paths (the kill script, the task index).
                killed = await call(client, "kill_task", {"task_id": status["task_id"]})
                assert killed["killed"] is False and killed["state"] == "succeeded", killed
                listed = await call(client, "list_tasks", {"limit": 5})
                assert status["task_id"] in [t["task_id"] for t in listed["tasks"]], listed
                print("mcp_check: kill_task and list_tasks answered")
                if out := os.environ.get("MCP_CHECK_TASK_ID_FILE"):
                    with open(out, "w") as f:
                        f.write(status["task_id"])
            elif mode == "status":
                status = await call(client, "get_task_status", {"task_id": argv[4]})
                assert status["state"] == "succeeded", status
                print(f"mcp_check: task {argv[4]} is still succeeded")
            elif mode == "probe":
                targets = argv[4:]
                probe = (
                    "import json, socket\n"
                    "out = {}\n"
                    f"for t in {targets!r}:\n"
                    "    h, p = t.rsplit(':', 1)\n"
                    "    s = socket.socket(); s.settimeout(5)\n"
                    "    try:\n"
                    "        s.connect((h, int(p))); out[t] = 'connected'\n"
                    "    except Exception as e:\n"
                    "        out[t] = type(e).__name__\n"
                    "    finally:\n"
                    "        s.close()\n"
                    "print(json.dumps(out))\n"
                )
                command = "python3 -c " + "'" + probe.replace("'", "'\\''") + "'"
                status = await run_task(client, command)
                assert status["state"] == "succeeded", status
                results = json.loads(status["stdout_tail"])
                print(f"mcp_check: probe results {results}")
                reached = [t for t, r in results.items() if r == "connected"]
                assert not reached, f"a task reached {reached}"
            else:
                raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
