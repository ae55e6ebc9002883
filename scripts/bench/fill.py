"""Fills Redis with finished tasks quickly, through the real write path.

Each task goes through the same Lua scripts (shared/src/lua/*.lua, loaded from
the repository, run by EVALSHA) with the same keys and arguments as the api and
the worker use for `echo hi`: SUBMIT (as run_script), XREADGROUP (as a worker
reading the job), CLAIM, STARTED, PROGRESS (the final tails), FINISH, then XACK
and XDEL (as the worker's ack). Only Docker is skipped. So the records, the task
index, the counters and the stream are exactly what real tasks leave behind;
bench.py checks a filled record against a real one and reads one back through
get_task_status.

The key names below mirror shared/src/keys.rs (`Keys`); the argument order of
each script is in its header comment.
"""

from __future__ import annotations

import secrets
import uuid
from pathlib import Path

from stack import BenchError, Redis, RedisError

LUA_DIR = Path(__file__).resolve().parents[2] / "shared" / "src" / "lua"
WORKER_GROUP = "workers"  # shared::keys::WORKER_GROUP

# What the api writes for `run_script` of `echo hi` with no options, and what the
# worker writes when it exits 0 (shared::task::Outcome::exited).
COMMAND = "echo hi"
TIMEOUT_SECONDS = 300  # DEFAULT_TIMEOUT_SECONDS
MAX_TIMEOUT_SECONDS = 3600  # MAX_TIMEOUT_SECONDS: part of the index horizon
MAX_QUEUED = 10_000_000  # MAX_QUEUED_TASKS at its largest: SUBMIT refuses at this many jobs
RETENTION_SECONDS = 86400  # TASK_RETENTION_SECONDS
STDOUT = "hi\n"


class Keys:
    """shared::keys::Keys for one prefix."""

    def __init__(self, prefix: str) -> None:
        self.p = prefix

    def jobs(self) -> str:
        return f"{self.p}:jobs"

    def task(self, i: str) -> str:
        return f"{self.p}:task:{i}"

    def task_zip(self, i: str) -> str:
        return f"{self.p}:task:{i}:zip"

    def task_stdin(self, i: str) -> str:
        return f"{self.p}:task:{i}:stdin"

    def task_files(self, i: str) -> str:
        return f"{self.p}:task:{i}:files"

    def task_index(self) -> str:
        return f"{self.p}:tasks"

    def stats(self) -> str:
        return f"{self.p}:stats"


class Filler:
    def __init__(self, redis: Redis, prefix: str, runtime: str, image: str) -> None:
        self.r = redis
        self.keys = Keys(prefix)
        self.runtime = runtime
        self.image = image
        self.worker = f"bench-fill-{secrets.token_hex(4)}"
        self.sha = {}
        for name in ("submit", "claim", "started", "progress", "finish"):
            sha = self.r("SCRIPT", "LOAD", (LUA_DIR / f"{name}.lua").read_text())
            assert isinstance(sha, str)
            self.sha[name] = sha
        try:
            self.r("XGROUP", "CREATE", self.keys.jobs(), WORKER_GROUP, "$", "MKSTREAM")
        except RedisError as e:
            if "BUSYGROUP" not in str(e):
                raise

    def _state_script(self, name: str, task_id: str, *args: object) -> tuple[object, ...]:
        # worker/src/queue.rs `state_script`: five keys, the worker name first.
        k = self.keys
        return (
            "EVALSHA", self.sha[name], 5,
            k.task(task_id), k.task_zip(task_id), k.stats(), k.task_stdin(task_id), k.task_files(task_id),
            self.worker, *args,
        )  # fmt: skip

    def fill(self, n: int, batch: int = 500) -> list[str]:
        """Writes `n` finished tasks; returns their ids."""
        k = self.keys
        horizon_ms = (RETENTION_SECONDS + MAX_TIMEOUT_SECONDS) * 1000
        ids: list[str] = []
        while len(ids) < n:
            chunk = [str(uuid.uuid4()) for _ in range(min(batch, n - len(ids)))]
            # run_script: api/src/store.rs `submit`.
            submits = [
                (
                    "EVALSHA", self.sha["submit"], 6,
                    k.task(i), k.task_zip(i), k.task_stdin(i), k.stats(), k.jobs(), k.task_index(),
                    i, "", "", horizon_ms, MAX_QUEUED,
                    "state", "queued", "runtime", self.runtime, "image", self.image, "command", COMMAND,
                    "timeout_seconds", TIMEOUT_SECONDS, "has_zip", 0, "has_stdin", 0, "network", "internet",
                    "stdout_bytes", 0, "stderr_bytes", 0,
                )  # fmt: skip
                for i in chunk
            ]
            read = ("XREADGROUP", "GROUP", WORKER_GROUP, self.worker, "COUNT", len(chunk), "STREAMS", k.jobs(), ">")
            replies = self.r.pipeline([*submits, read])
            _raise_any(replies[:-1])
            entries = _stream_entries(replies[-1])
            if sorted(entries) != sorted(chunk):
                raise BenchError(
                    f"the fill read {len(entries)} jobs for {len(chunk)} submitted tasks: "
                    "is something else writing to the same stream?"
                )
            commands: list[tuple[object, ...]] = []
            for i in chunk:
                entry = entries[i]
                container = secrets.token_hex(32)
                commands += [
                    self._state_script("claim", i, entry),
                    self._state_script("started", i, container),
                    self._state_script("progress", i, STDOUT, "", len(STDOUT), 0, 1),
                    self._state_script(
                        "finish", i, "succeeded", "exited", "exited with code 0", 0, RETENTION_SECONDS, "", ""
                    ),
                    ("XACK", k.jobs(), WORKER_GROUP, entry),
                    ("XDEL", k.jobs(), entry),
                ]
            replies = self.r.pipeline(commands)
            _raise_any(replies)
            for reply in replies[3::6]:
                if reply != "succeeded":
                    raise BenchError(f"FINISH answered {reply!r} while filling, not 'succeeded'")
            ids += chunk
        return ids


def _raise_any(replies: list[object]) -> None:
    for r in replies:
        if isinstance(r, RedisError):
            raise BenchError(f"Redis refused a fill command: {r}")


def _stream_entries(reply: object) -> dict[str, str]:
    """XREADGROUP reply -> {task_id: entry id}."""
    out: dict[str, str] = {}
    if not reply:
        return out
    assert isinstance(reply, list)
    for _stream, entries in reply:
        for entry_id, fields in entries:
            pairs = dict(zip(fields[::2], fields[1::2], strict=True))
            out[pairs["task_id"]] = entry_id
    return out
