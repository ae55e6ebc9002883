"""What the fault and soak runs share beyond the harness (tests/harness, which
starts the processes and speaks Redis and MCP): a log line, a table, and a
`docker events` recorder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
    """Counts how many times each task ran, from `docker events` running for the
    whole run: the outside counter (tasks cannot reach the host to count
    themselves: the firewall). A task runs in a container whose prelude waits
    for it: a cold one made for it (a `start` event with the task's label) or a
    warm pool container, renamed `sr-<task_id>` when the task claims it (a
    `rename` event). Neither event proves the task ran: a worker that dies
    between the start and the handoff closes its attach, and the waiting prelude
    exits at once; a pool container that died idle is renamed dead (its `die`
    came first). A prelude that took its task lives at least as long as the
    task's script, and every command here sleeps 0.3 s or more; so a container
    counts as a run of its task when its `die` comes `MIN_RUN_S` or more after
    its start or rename, and as a refused handoff when it comes sooner. Only
    containers of the given workers count."""

    MIN_RUN_S = 0.25

    def __init__(self, worker_names: list[str]) -> None:
        self.workers = set(worker_names)
        self.by_task: dict[str, list[str]] = {}  # task id -> workers that started a container for it
        self.by_run: dict[str, list[str]] = {}  # task id -> workers whose container ran it
        self.armed: dict[str, tuple[str, str, float]] = {}  # container -> (task id, worker, since), until its die
        self.refused: list[tuple[str, str]] = []  # (task id, worker): handed over, died at once
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    def runs(self, task_id: str, command: str = "") -> list[str]:
        """The workers that ran this task, once per run."""
        return self.by_run.get(task_id, [])

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            "docker", "events", "--filter", "type=container", "--filter", "event=start",
            "--filter", "event=rename", "--filter", "event=die", "--filter", f"label={LABEL_WORKER}",
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
        self.refused = [r for r in self.refused if r[0] != probe]

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
            cid = ev.get("Actor", {}).get("ID") or ev.get("id", "")
            at = ev.get("timeNano", 0) / 1e9
            name = attrs.get("name", "")
            if action == "start" and (task := attrs.get("script-runner.task")):
                self.by_task.setdefault(task, []).append(worker)
                self.armed[cid] = (task, worker, at)
            elif action == "rename" and name.startswith("sr-") and not name.startswith("sr-pool-"):
                self.armed[cid] = (name[3:], worker, at)
            elif action == "die" and (armed := self.armed.pop(cid, None)):
                task, by, since = armed
                if at - since >= self.MIN_RUN_S:
                    self.by_run.setdefault(task, []).append(by)
                else:
                    self.refused.append((task, by))

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
