"""API keys end to end: keys made with `script-runner-ctl keys`, used through the
official Python MCP SDK against real api processes, a real worker and Redis.

- isolation: key B gets for key A's task exactly what it gets for an unknown id,
  from every tool and from tasks/get and tasks/cancel; the admin key sees both;
- revocation and rotation take effect at once on a replica that never saw the key;
- scopes: a read-only key can watch but not run;
- quotas under concurrency: 24 submits at once against --max-queued 5 queue 5;
- no secret at rest: no key (nor its base64) in Redis or in the logs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import pytest
from conftest import Stack, connect, second_api
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from test_mcp_sdk import b64, call_err_code, call_ok, run_to_end, text_of
from test_tasks_extension import CancelTask, EmptyAck, GetTask, TaskIdParams, TasksExtension, get, start

pytestmark = pytest.mark.anyio

CTL_BIN = "script-runner-ctl"


def ctl(stack: Stack, *args: str, prefix: str | None = None) -> str:
    """Runs script-runner-ctl against the stack's Redis; its stdout. Its stderr
    (its log) is appended to ctl.log in the run's directory, which the secret
    scan reads."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "REDIS_URL": f"redis://127.0.0.1:{stack.redis_port}",
        "REDIS_KEY_PREFIX": prefix or stack.prefix,
    }
    done = subprocess.run([stack.binary(CTL_BIN), *args], env=env, capture_output=True, text=True, timeout=30)
    with open(stack.tmp_dir / "ctl.log", "a") as log:
        log.write(done.stderr)
    assert done.returncode == 0, f"script-runner-ctl {' '.join(args)}: {done.stderr}"
    return done.stdout


def create_key(stack: Stack, name: str, *flags: str, prefix: str | None = None) -> str:
    """A new key's text, from `keys create --json`."""
    out = json.loads(ctl(stack, "keys", "create", "--name", name, *flags, "--json", prefix=prefix))
    assert out["name"] == name and out["key"].startswith("srk_"), out
    return out["key"]


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


@asynccontextmanager
async def tasks_client(url: str, token: str) -> AsyncIterator[Client]:
    """A client that declares the tasks extension, with `token`."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=60.0)) as http:
        async with Client(streamable_http_client(url, http_client=http), extensions=[TasksExtension()]) as client:
            yield client


async def initialize_status(url: str, token: str) -> int:
    """The HTTP status of a plain `initialize` POST with `token`."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "pytest", "version": "0"}},
    }
    headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(timeout=10) as http:
        return (await http.post(url, json=body, headers=headers)).status_code


async def rpc_error(client: Client, request: Any) -> tuple[int, str, Any]:
    """A tasks/* request that must fail: its JSON-RPC code, message and data."""
    with pytest.raises(MCPError) as caught:
        await client.session.send_request(request, EmptyAck)
    e = caught.value.error
    return e.code, e.message, e.data


async def test_another_keys_task_is_answered_like_an_unknown_one_and_the_admin_sees_both(stack: Stack) -> None:
    key_a, key_b = create_key(stack, unique("alice")), create_key(stack, unique("bob"))
    url = stack.mcp_url
    async with tasks_client(url, key_a) as a_tasks:
        # Long enough to still be open while B tries to kill it.
        handle = await start(a_tasks, "echo a; sleep 60", collect=["*.txt"])
    a_task, unknown = handle.task_id, str(uuid.uuid4())

    def same(for_a: str, for_unknown: str) -> None:
        assert for_a == for_unknown.replace(unknown, a_task), (for_a, for_unknown)

    async with connect(stack, token=key_b) as b:
        for tool in ("get_task_status", "get_task_files", "kill_task"):
            code_a, text_a = await call_err_code(b, tool, {"task_id": a_task})
            code_u, text_u = await call_err_code(b, tool, {"task_id": unknown})
            assert code_a == code_u == "unknown_task", (tool, code_a, text_a)
            same(text_a, text_u)
        b_task = (await call_ok(b, "run_script", {"runtime": "python3.13", "command_base64": b64("echo b")}))["task_id"]
        listed = await call_ok(b, "list_tasks", {"limit": 100})
        assert [t["task_id"] for t in listed["tasks"]] == [b_task], "B lists only its own task"
    async with tasks_client(url, key_b) as b_tasks:
        for kind in (GetTask, CancelTask):
            code_a, text_a, data_a = await rpc_error(b_tasks, kind(params=TaskIdParams(task_id=a_task)))
            code_u, text_u, data_u = await rpc_error(b_tasks, kind(params=TaskIdParams(task_id=unknown)))
            assert (code_a, data_a) == (code_u, data_u) == (-32602, {"code": "unknown_task"}), (code_a, data_a)
            same(text_a, text_u)

    # B's kill and cancel touched nothing: A's task is still open, and A sees it.
    async with tasks_client(url, key_a) as a_tasks:
        assert (await get(a_tasks, a_task)).status == "working"
    async with connect(stack, token=key_a) as a:
        code, _ = await call_err_code(a, "get_task_files", {"task_id": a_task})
        assert code == "not_finished", "A's own task is found (and still running)"
        listed = await call_ok(a, "list_tasks", {"limit": 100})
        assert [t["task_id"] for t in listed["tasks"]] == [a_task]
    # The admin key sees both, and lists both.
    async with connect(stack) as admin:
        for task in (a_task, b_task):
            await call_ok(admin, "get_task_status", {"task_id": task})
        seen = {t["task_id"] for t in (await call_ok(admin, "list_tasks", {"limit": 100}))["tasks"]}
        assert {a_task, b_task} <= seen
    async with connect(stack, token=key_a) as a:
        killed = await call_ok(a, "kill_task", {"task_id": a_task})
        assert killed["killed"] is True, killed
    assert stack.redis.hget(stack.keys.task(a_task), "owner") == key_owner(stack, key_a)


def key_owner(stack: Stack, key: str) -> str:
    """The name a key's tasks are recorded under, read from its record."""
    return stack.redis.hget(stack.keys.api_key(hashlib.sha256(key.encode()).hexdigest()), "name") or ""


async def test_a_revoked_key_is_refused_at_once_by_a_replica_that_never_saw_it(stack: Stack) -> None:
    name = unique("leaver")
    key = create_key(stack, name)
    other = second_api(stack, "api-keys-2")
    try:
        assert await initialize_status(stack.mcp_url, key) == 200
        ctl(stack, "keys", "revoke", name)
        # The second replica never saw the key used: nothing cached there either way.
        assert await initialize_status(other.mcp_url, key) == 401
        assert await initialize_status(stack.mcp_url, key) == 401

        # Rotation: the old key stops at once, the new one keeps the owner.
        name = unique("rotated")
        old = create_key(stack, name)
        async with connect(stack, token=old) as c:
            task = (await call_ok(c, "run_script", {"runtime": "python3.13", "command_base64": b64("true")}))["task_id"]
        new = json.loads(ctl(stack, "keys", "rotate", name, "--json"))["key"]
        assert new != old
        assert await initialize_status(other.mcp_url, old) == 401
        async with connect(stack, token=new) as c:
            await call_ok(c, "get_task_status", {"task_id": task})
    finally:
        other.proc.stop()
    listed = json.loads(ctl(stack, "keys", "list", "--json"))
    assert name in [k["name"] for k in listed]
    assert all("key" not in k and "hash" not in k for k in listed), listed


async def test_a_key_limited_to_no_network_is_refused_the_internet(stack: Stack) -> None:
    name = unique("offline")
    key = create_key(stack, name, "--networks", "none")
    listed = {k["name"]: k for k in json.loads(ctl(stack, "keys", "list", "--json"))}
    assert listed[name]["networks"] == ["none"], listed[name]
    async with connect(stack, token=key) as c:
        args = {"runtime": "python3.13", "command_base64": b64("true")}
        code, text = await call_err_code(c, "run_script", {**args, "network": "internet"})
        assert code == "missing_scope" and '"internet"' in text and "may use: none" in text, text
        await call_ok(c, "run_script", {**args, "network": "none"})


async def test_a_read_only_key_can_watch_but_not_run(stack: Stack) -> None:
    key = create_key(stack, unique("watcher"), "--scopes", "read")
    async with connect(stack, token=key) as c:
        code, text = await call_err_code(c, "run_script", {"runtime": "python3.13", "command_base64": b64("true")})
        assert code == "missing_scope", text
        assert "run scope" in text and "has: read" in text, text
        code, text = await call_err_code(c, "kill_task", {"task_id": str(uuid.uuid4())})
        assert code == "missing_scope" and "kill scope" in text, text
        assert (await call_ok(c, "list_tasks", {}))["tasks"] == []
        code, _ = await call_err_code(c, "get_task_status", {"task_id": str(uuid.uuid4())})
        assert code == "unknown_task", "reading is allowed"
    # And the other way round: a run-only key cannot read.
    runner = create_key(stack, unique("runner"), "--scopes", "run")
    async with connect(stack, token=runner) as c:
        await call_ok(c, "run_script", {"runtime": "python3.13", "command_base64": b64("true")})
        code, text = await call_err_code(c, "list_tasks", {})
        assert code == "missing_scope" and "read scope" in text, text


async def test_concurrent_submits_against_max_queued_queue_exactly_the_quota(stack: Stack) -> None:
    # A prefix no worker reads: every accepted task stays queued.
    prefix = f"{stack.prefix}-quota"
    key = create_key(stack, "q", "--max-queued", "5", prefix=prefix)
    stack.add_api("api-quota", prefix=prefix)
    api = stack.start_api("api-quota")
    results: list[tuple[bool, str, str]] = []
    try:
        async def submit(i: int) -> None:
            headers = {"Authorization": f"Bearer {key}"}
            async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=60.0)) as http:
                async with Client(streamable_http_client(api.mcp_url, http_client=http)) as c:
                    r = await c.call_tool("run_script", {"runtime": "python3.13", "command_base64": b64(f"echo {i}")})
            sc = r.structured_content or {}
            results.append((not r.is_error, sc.get("code", ""), text_of(r)))

        async with anyio.create_task_group() as tg:
            for i in range(24):
                tg.start_soon(submit, i)
    finally:
        api.proc.stop()
    accepted = [r for r in results if r[0]]
    refused = [r for r in results if not r[0]]
    assert len(accepted) == 5 and len(refused) == 19, results
    for _, code, text in refused:
        assert code == "quota_exceeded", text
        assert "max_queued" in text and "at most 5 tasks" in text and "frees up" in text, text
    keys = type(stack.keys)(prefix)
    assert stack.redis.xlen(keys.jobs()) == 5
    assert stack.redis.zcard(keys.owner_active("q")) == 5


def every_value(stack: Stack) -> list[str]:
    """Every key name and every value in the run's Redis, as text."""
    r, out = stack.redis, []
    for k in r.scan_iter(count=1000):
        out.append(k)
        kind = r.type(k)
        if kind == "string":
            out.append(r.get(k) or "")
        elif kind == "hash":
            out += [x for kv in r.hgetall(k).items() for x in kv]
        elif kind == "set":
            out += list(r.smembers(k))
        elif kind == "zset":
            out += list(r.zrange(k, 0, -1))
        elif kind == "list":
            out += list(r.lrange(k, 0, -1))
        elif kind == "stream":
            out += [f"{i} {fields}" for i, fields in r.xrange(k)]
        else:
            pytest.fail(f"{k} is a {kind}: teach this scan to read it")
    return out


async def test_no_key_is_kept_in_clear_in_redis_or_the_logs(stack: Stack) -> None:
    name = unique("secret")
    first = create_key(stack, name, "--max-running", "3")
    async with connect(stack, token=first) as c:
        await call_ok(c, "run_script", {"runtime": "python3.13", "command_base64": b64("echo hi")})
    second = json.loads(ctl(stack, "keys", "rotate", name, "--json"))["key"]
    async with connect(stack, token=second) as c:
        await call_ok(c, "list_tasks", {})
    assert await initialize_status(stack.mcp_url, first) == 401  # a refused key is not logged either
    # Each key, its base64 and its random part alone; and the admin token.
    secrets = [first, second, stack.token]
    secrets += [base64.b64encode(s.encode()).decode() for s in secrets]
    secrets += [s.removeprefix("srk_") for s in (first, second)]
    stored = "\n".join(every_value(stack))
    logs = "\n".join(text for _, text in stack.logs()) + (stack.tmp_dir / "ctl.log").read_text()
    assert name in stored and "last_used_at" in stored, "the scan reads the key records"
    for s in secrets:
        assert s not in stored, "a secret is kept in clear in Redis"
        assert s not in logs, "a secret is in a log"


def test_the_ctl_refuses_a_bad_name_and_a_taken_one(stack: Stack) -> None:
    env = {"PATH": os.environ.get("PATH", ""), "REDIS_URL": f"redis://127.0.0.1:{stack.redis_port}",
           "REDIS_KEY_PREFIX": stack.prefix}  # fmt: skip
    bad = subprocess.run([stack.binary(CTL_BIN), "keys", "create", "--name", "Bad Name"], env=env,
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert bad.returncode != 0 and "lower-case letters" in bad.stderr, bad.stderr
    name = unique("taken")
    create_key(stack, name)
    again = subprocess.run([stack.binary(CTL_BIN), "keys", "create", "--name", name], env=env,
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    assert again.returncode != 0 and "exists already" in again.stderr, again.stderr
    assert "srk_" not in again.stdout


async def test_a_used_up_cpu_quota_refuses_with_the_time_it_frees_up(stack: Stack) -> None:
    name = unique("cruncher")
    key = create_key(stack, name, "--cpu-seconds-per-day", "4")
    # Ledger entries as FINISH writes them (`<task_id>:<cpu_ms>` by finished_at):
    # 3 s two hours ago and 2 s one hour ago. The end-to-end CPU burn is the
    # usage tests'; this checks the refusal a client sees.
    secs, micros = stack.redis.time()
    now_ms = secs * 1000 + micros // 1000
    hour, day = 3_600_000, 86_400_000
    stack.redis.zadd(stack.keys.owner_cpu(name), {"x:3000": now_ms - 2 * hour, "y:2000": now_ms - hour})
    frees_at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime((now_ms - 2 * hour + day) / 1000))
    async with connect(stack, token=key) as c:
        code, text = await call_err_code(c, "run_script", {"runtime": "python3.13", "command_base64": b64("true")})
    assert code == "quota_exceeded", text
    assert "cpu_seconds_per_day" in text and "used 5 CPU seconds" in text and "of 4 allowed" in text, text
    assert f"frees up at {frees_at}" in text, (frees_at, text)


async def test_a_cpu_burning_task_uses_up_the_cpu_quota(stack: Stack) -> None:
    """End to end: the CPU a task really used (its cgroup, read by the worker and
    written by FINISH to the owner's ledger) counts against the key's quota, and
    the next submit is refused until that use is a day old."""
    name = unique("burner")
    key = create_key(stack, name, "--cpu-seconds-per-day", "1")
    burn = "python3 -c 'import time\nwhile time.process_time() < 1.5: pass'"
    async with connect(stack, token=key) as c:
        done = await run_to_end(c, "python3.13", burn)
        assert done["state"] == "succeeded", done
        used = done["usage"]["cpu_seconds"]
        assert used >= 1.5, done
        code, text = await call_err_code(c, "run_script", {"runtime": "python3.13", "command_base64": b64("true")})
    assert code == "quota_exceeded" and "cpu_seconds_per_day" in text, text
    assert f"used {int(used)} CPU seconds" in text and "of 1 allowed" in text, (used, text)
    # It frees up when the task's use is a day old: a day after it finished.
    finished = time.strptime(done["finished_at"][:19], "%Y-%m-%dT%H:%M:%S")
    frees_at = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(time.mktime(finished) - time.timezone + 86_400))
    assert f"frees up at {frees_at}" in text, (frees_at, text)
