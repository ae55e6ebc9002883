"""What the fault and soak runs share beyond the harness (tests/harness, which
starts the processes and speaks Redis and MCP): a log line, a table, and a
`docker events` recorder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from harness.procs import HarnessError, wait_until_async
from harness.stack import IMAGE, LABEL_WORKER, bin_dir


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parser(doc: str) -> argparse.ArgumentParser:
    """A run's command line: its docstring's first paragraph, and the options
    both runs take for the stack they start."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pool-size", help="the workers' POOL_SIZE (default: theirs, a warm pool); 0 for none")
    p.add_argument("--bin-dir", type=Path, default=bin_dir(), help="where the binaries are (default $CARGO_TARGET_DIR or target/, debug)")
    p.add_argument("--keep", action="store_true", help="keep logs and Redis data even on success")
    return p


def main(run: Callable[[], Awaitable[int]]) -> int:
    """Runs a run's coroutine; its exit status (1 with the reason when the
    harness could not set the stack up)."""
    try:
        return asyncio.run(run())  # type: ignore[arg-type]
    except HarnessError as e:
        print(f"FAILED: {e}")
        return 1


# --------------------------------------------------------------------------- docker events


class ContainerStarts:
    """Counts how many times each task started, from `docker events` running for
    the whole run: the outside counter (tasks cannot reach the host to count
    themselves: the firewall). Every task runs as a process exec'd in a container
    whose first process only sleeps, a warm pool container or a cold one made
    for it (so its cgroup can be read after it ends), so a task's start is an
    `exec_start` event, whose action is the command line: the submitter puts a
    nonce in each command, `# n<hex>`, to tell them apart. A container's own
    `start` is not a run of its task. The engine reports `exec_start` before the
    runtime has started the process, and an exec that then failed to start (its
    container had just stopped; the worker falls back to a cold start) never gets
    an `exec_die`: an exec counts once its `exec_die` arrives, which every process
    that started gets, however it ended. Only containers of the given workers
    count."""

    NONCE = re.compile(r"# n([0-9a-f]{12})\b")

    def __init__(self, worker_names: list[str]) -> None:
        self.workers = set(worker_names)
        self.by_task: dict[str, list[str]] = {}  # task id -> workers that started a container for it
        self.by_nonce: dict[str, list[str]] = {}  # command nonce -> workers that exec'd it
        self.execs: dict[str, tuple[str, str]] = {}  # exec id -> (nonce, worker), until its exec_die
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    def runs(self, task_id: str, command: str) -> list[str]:
        """The workers that started this task, once per start."""
        m = self.NONCE.search(command)
        return self.by_nonce.get(m.group(1), []) if m else []

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            "docker", "events", "--filter", "type=container", "--filter", "event=start",
            "--filter", "event=exec_start", "--filter", "event=exec_die", "--filter", f"label={LABEL_WORKER}",
            "--format", "{{json .}}", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        self._reader = asyncio.create_task(self._read())
        # `docker events` subscribes asynchronously: make sure it is listening before
        # any task runs, with a container of our own whose start must be seen.
        probe = f"sr-events-probe-{uuid.uuid4().hex[:8]}"
        self.workers.add(probe)
        subprocess.run(
            ["docker", "run", "--rm", "--name", probe, "--label", f"script-runner.task={probe}",
             "--label", f"{LABEL_WORKER}={probe}", "--network", "none", IMAGE, "true"],
            capture_output=True, check=True,
        )  # fmt: skip
        await wait_until_async("docker events to report a probe container", lambda: asyncio.sleep(0, probe in self.by_task), 30)
        self.by_task.pop(probe, None)
        self.workers.discard(probe)

    async def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        async for line in self._proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            attrs = ev.get("Actor", {}).get("Attributes", {})
            worker = attrs.get(LABEL_WORKER)
            if worker not in self.workers:
                continue
            action = ev.get("Action", "")
            if action == "start" and attrs.get("script-runner.task"):
                self.by_task.setdefault(attrs["script-runner.task"], []).append(worker)
            elif action.startswith("exec_start") and (m := self.NONCE.search(action)):
                self.execs[attrs.get("execID", "")] = (m.group(1), worker)
            elif action == "exec_die" and (started := self.execs.pop(attrs.get("execID", ""), None)):
                self.by_nonce.setdefault(started[0], []).append(started[1])

    async def stop(self) -> None:
        """Stops `docker events` (idempotent)."""
        if self._proc and self._proc.returncode is None:
            self._proc.terminate()
            await self._proc.wait()
        if self._reader:
            await self._reader


def print_table(rows: list[tuple[str, Any]], out: Any = sys.stdout) -> None:
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k.ljust(width)}  {v}", file=out)
