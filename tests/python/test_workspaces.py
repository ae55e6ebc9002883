"""Persistent workspaces through the official MCP Python SDK: real projects carried
from one task to the next (a Node project installed once and tested on its head, a
Python venv made once and imported later), forks, roll back and a busy workspace,
against the real api, worker, Redis and Docker engine.

Tasks reach no registry here: the Node project's one dependency travels in its zip as
an `npm pack` tarball made by the host's npm, with a lockfile the host's npm wrote.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from test_mcp_sdk import call_err_code, call_ok, make_zip, run, wait_for

pytestmark = pytest.mark.anyio


async def settled(client: Client, task_id: str) -> dict[str, Any]:
    """The task's status once it has ended and its workspace made a version (or
    said why not)."""
    return await wait_for(
        client,
        task_id,
        lambda s: s["state"] not in ("queued", "running")
        and (s.get("workspace_version") is not None or s.get("workspace_note") is not None),
    )


async def run_on(
    client: Client, workspace: Any, command: str, runtime: str = "python3.13", **extra: Any
) -> dict[str, Any]:
    queued = await run(client, runtime, command, workspace=workspace, **extra)
    return await settled(client, queued["task_id"])


def node_project() -> bytes:
    """package.json, package-lock.json and deps/shout-cli-1.0.0.tgz, zipped; `npm
    test` runs the dependency's bin from node_modules/.bin."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is needed to pack the fixture (scripts/test.sh installs it)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dep, project = root / "dep", root / "project"
        (dep / "bin").mkdir(parents=True)
        (dep / "package.json").write_text(
            json.dumps({"name": "shout-cli", "version": "1.0.0", "bin": {"shout": "bin/shout.js"}})
        )
        shout = dep / "bin" / "shout.js"
        shout.write_text("#!/usr/bin/env node\nconsole.log(process.argv.slice(2).join(' ').toUpperCase() + '!');\n")
        shout.chmod(0o755)
        (project / "deps").mkdir(parents=True)
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "npm_config_cache": str(root / "cache")}
        subprocess.run([npm, "pack", "--silent", "--pack-destination", str(project / "deps")], cwd=dep, env=env,
                       check=True, capture_output=True)  # fmt: skip
        (project / "package.json").write_text(
            json.dumps(
                {
                    "name": "app",
                    "version": "1.0.0",
                    "scripts": {"test": "shout tests pass"},
                    "dependencies": {"shout-cli": "file:deps/shout-cli-1.0.0.tgz"},
                }
            )
        )
        subprocess.run([npm, "install", "--package-lock-only", "--offline", "--no-audit", "--no-fund"], cwd=project,
                       env=env, check=True, capture_output=True)  # fmt: skip
        files = {str(p.relative_to(project)): p.read_bytes() for p in project.rglob("*") if p.is_file()}
        return make_zip(files)


async def test_a_node_project_is_installed_once_and_tested_on_its_head(client: Client) -> None:
    zip_b64 = base64.b64encode(node_project()).decode()
    first = await run_on(client, "new", "npm ci --no-audit --no-fund && npm test", "node24", zip_base64=zip_b64)
    assert first["state"] == "succeeded", first
    assert "TESTS PASS!" in first["stdout_tail"], first
    assert first["workspace_version"] == 1
    ws = first["workspace_id"]
    # Nothing reinstalled: no npm ci, and the installed tree is the one npm ci made.
    second = await run_on(client, {"id": ws}, "test -L node_modules/.bin/shout && npm test", "node24")
    assert second["state"] == "succeeded", second
    assert "TESTS PASS!" in second["stdout_tail"], second
    assert second["workspace_version"] == 2


async def test_a_venv_made_in_one_task_is_imported_in_the_next(client: Client) -> None:
    first = await run_on(
        client,
        "new",
        "python3 -m venv --without-pip .venv && "
        "echo 'ANSWER = 42' > .venv/lib/python3.13/site-packages/answer.py",
    )
    assert first["state"] == "succeeded", first
    second = await run_on(
        client,
        {"id": first["workspace_id"]},
        "test -L .venv/bin/python && .venv/bin/python -c 'import answer, sys; print(answer.ANSWER, sys.prefix)'",
    )
    assert second["state"] == "succeeded", second
    assert second["stdout_tail"] == "42 /workspace/.venv\n", second
    # The same files, read without a task: the module as text, the link as a link.
    read = await call_ok(
        client,
        "read_files",
        {"workspace_id": first["workspace_id"], "paths": [".venv/lib/*/site-packages/answer.py", ".venv/bin/python"]},
    )
    files = {f["path"]: f for f in read["files"]}
    assert files[".venv/lib/python3.13/site-packages/answer.py"]["content"] == "ANSWER = 42\n", read
    assert files[".venv/bin/python"]["kind"] == "symlink" and "content" not in files[".venv/bin/python"], read


async def test_forks_diverge_and_version_one_can_be_started_from(client: Client) -> None:
    base = await run_on(client, "new", "echo base > f")
    ws = base["workspace_id"]
    fork = await call_ok(client, "fork_workspace", {"workspace_id": ws, "version": 1})
    await run_on(client, {"id": fork["workspace_id"]}, "echo fork >> f")
    await run_on(client, {"id": ws}, "echo original >> f")
    forked = await run_on(client, {"id": fork["workspace_id"]}, "cat f")
    original = await run_on(client, {"id": ws}, "cat f")
    assert forked["stdout_tail"] == "base\nfork\n", forked
    assert original["stdout_tail"] == "base\noriginal\n", original
    back = await run_on(client, {"id": ws, "version": 1}, "cat f")
    assert back["stdout_tail"] == "base\n", back
    versions = await call_ok(client, "get_workspace", {"workspace_id": ws})
    assert [v["version"] for v in versions["versions"]] == [1, 2, 3, 4], versions


async def test_a_second_task_on_a_busy_workspace_is_refused_and_nothing_is_lost(client: Client) -> None:
    first = await run(client, "python3.13", "echo kept > f; echo ready; sleep 300", workspace="new")
    task_id = first["task_id"]
    ready = await wait_for(client, task_id, lambda s: s["stdout_tail"] == "ready\n")
    ws = ready["workspace_id"]
    code, message = await call_err_code(
        client, "run_script", {"runtime": "python3.13", "command_base64": base64.b64encode(b"true").decode(),
                               "workspace": {"id": ws}})  # fmt: skip
    assert code == "workspace_busy", message
    assert task_id in message and "fork_workspace" in message, message
    await call_ok(client, "kill_task", {"task_id": task_id})
    killed = await settled(client, task_id)
    assert killed["state"] == "killed" and killed["workspace_version"] == 1, killed
    after = await run_on(client, {"id": ws}, "cat f")
    assert after["stdout_tail"] == "kept\n", after


async def test_write_files_then_read_files_then_a_task_that_sees_them(client: Client) -> None:
    made = await run_on(client, "new", "echo draft > notes.txt && mkdir old && echo x > old/f")
    ws = made["workspace_id"]
    # Plain text and bytes, no zip: the edit is the workspace's next version.
    wrote = await call_ok(
        client,
        "write_files",
        {
            "workspace_id": ws,
            "files": [
                {"path": "app/main.py", "content": "from app.util import greet\nprint(greet('sdk'))\n"},
                {"path": "app/__init__.py", "content": ""},
                {"path": "app/util.py", "content": "def greet(who):\n    return f'hello {who}'\n"},
                {"path": "blob.bin", "content_base64": base64.b64encode(b"\x00\xff").decode()},
            ],
            "delete": ["old"],
        },
    )
    assert (wrote["state"], wrote["version"], wrote["written"], wrote["deleted"]) == ("succeeded", 2, 4, 1), wrote
    read = await call_ok(client, "read_files", {"workspace_id": ws, "paths": ["app/*.py", "blob.bin", "old/**"]})
    files = {f["path"]: f for f in read["files"]}
    assert files["app/util.py"]["content"].startswith("def greet"), read
    assert files["blob.bin"]["content_base64"] == "AP8=", read
    assert read["unmatched"] == ["old/**"], read
    ran = await run_on(client, {"id": ws}, "python3 -m app.main && cat notes.txt && test ! -e old")
    assert ran["state"] == "succeeded", ran
    assert ran["stdout_tail"] == "hello sdk\ndraft\n", ran
    assert ran["workspace_version"] == 3, ran
    # An edit that cannot be made is refused at once, naming the path.
    code, message = await call_err_code(
        client, "write_files", {"workspace_id": ws, "files": [{"path": "notes.txt/x", "content": "no"}]}
    )
    assert code == "invalid_argument" and '"notes.txt" is a file' in message, message
