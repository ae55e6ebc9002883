"""Fills Redis with finished tasks quickly, through the real write path.

Each task goes through the same Lua scripts (shared/src/lua/*.lua: this build's
Redis Functions library, loaded by script-runner-ctl, run by FCALL) with the same
keys and arguments as the api and the worker use for `echo hi`: SUBMIT (as
run_script), XREADGROUP (as a worker reading the job), CLAIM, STARTED, PROGRESS
(the final tails), FINISH, then XACK and XDEL (as the worker's ack). Only Docker
is skipped. So the records, the task index, the counters and the stream are
exactly what real tasks leave behind; bench.py checks a filled record against a
real one and reads one back through get_task_status.

Key names and script calls come from the shared harness (tests/harness): the
key schema is checked against shared/src/keys.rs, and each script is called by
name with named keys and arguments, checked against its KEYS/ARGV header.
"""

from __future__ import annotations

import base64
import secrets
import uuid
from typing import Any

from harness.keys import JOB_TASK_ID, WORKER_GROUP, Field, Keys
from harness.lua import Scripts
from harness.procs import HarnessError
from redis import Redis, ResponseError

# What the api writes for `run_script` of `echo hi` with no options, and what the
# worker writes when it exits 0 (shared::task::Outcome::exited).
COMMAND = "echo hi"
TIMEOUT_SECONDS = 300  # DEFAULT_TIMEOUT_SECONDS
MAX_TIMEOUT_SECONDS = 3600  # MAX_TIMEOUT_SECONDS: part of the index horizon
MAX_QUEUED = 10_000_000  # MAX_QUEUED_TASKS at its largest: SUBMIT refuses at this many jobs
RETENTION_SECONDS = 86400  # TASK_RETENTION_SECONDS
STDOUT = "hi\n"
# What the worker records for `echo hi` (its usage, as a cold container reports it).
USAGE_CPU_MS = 12
USAGE_PEAK_BYTES = 3_145_728


class Filler:
    def __init__(self, redis: Redis, prefix: str, runtime: str, image: str, ctl: str) -> None:
        self.r = redis
        self.keys = Keys(prefix)
        self.scripts = Scripts(redis, ctl)
        self.runtime = runtime
        self.image = image
        self.worker = f"bench-fill-{secrets.token_hex(4)}"
        try:
            self.r.xgroup_create(self.keys.jobs(), WORKER_GROUP, "$", mkstream=True)
        except ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    def _record(self) -> dict[str, Any]:
        """The new record's fields, as api/src/db/submit.rs `submit` writes them."""
        return {
            Field.STATE: "queued", Field.RUNTIME: self.runtime, Field.IMAGE: self.image, Field.COMMAND: COMMAND,
            Field.TIMEOUT_SECONDS: TIMEOUT_SECONDS, Field.HAS_ZIP: 0, Field.HAS_STDIN: 0, Field.NETWORK: "internet", Field.CACHE: "owner",
            Field.STDOUT_BYTES: 0, Field.STDERR_BYTES: 0,
            # The api's signature (`<key id>:<base64 of 64 bytes>`): a filled task is never
            # run, so a stand-in of a real one's size, not one that verifies.
            Field.SPEC_SIGNATURE: secrets.token_hex(8) + ":" + base64.b64encode(secrets.token_bytes(64)).decode(),
        }  # fmt: skip

    def fill(self, n: int, batch: int = 500) -> list[str]:
        """Writes `n` finished tasks; returns their ids."""
        k, call = self.keys, self.scripts.call
        horizon_ms = (RETENTION_SECONDS + MAX_TIMEOUT_SECONDS) * 1000
        ids: list[str] = []
        while len(ids) < n:
            chunk = [str(uuid.uuid4()) for _ in range(min(batch, n - len(ids)))]
            pipe = self.r.pipeline(transaction=False)
            for i in chunk:  # run_script: api/src/db/submit.rs `submit`
                keys = {"task": k.task(i), "zip": k.task_zip(i), "stdin": k.task_stdin(i), "stats": k.stats(),
                        "jobs": k.jobs(), "index": k.task_index(), "owner_active": k.owner_active(""),
                        "owner_cpu": k.owner_cpu(""), "owner_index": k.owner_tasks(""), "workspace": k.workspace("none"),
                        "owner_workspace_index": k.owner_workspaces(""), "every_workspace": k.workspaces()}  # fmt: skip
                args = {"task_id": i, "zip": "", "stdin": "", "horizon_ms": horizon_ms, "max_queued": MAX_QUEUED,
                        "owner": "", "owner_max_queued": "", "owner_max_running": "", "owner_cpu_ms": "",
                        "workspace_use": "", "workspace_id": "", "workspace_version": "", "must_be_head": "",
                        "save_grace_ms": "", "field_pairs": self._record()}  # fmt: skip
                call("submit", keys, args, client=pipe)
            pipe.xreadgroup(WORKER_GROUP, self.worker, {k.jobs(): ">"}, count=len(chunk))
            replies = pipe.execute(raise_on_error=False)
            _raise_any(replies[:-1])
            entries = _stream_entries(replies[-1])
            if sorted(entries) != sorted(chunk):
                raise HarnessError(
                    f"the fill read {len(entries)} jobs for {len(chunk)} submitted tasks: "
                    "is something else writing to the same stream?"
                )
            # As the worker does (worker/src/queue.rs): CLAIM, STARTED, PROGRESS
            # (the final tails), FINISH, then the ack (XACK and XDEL).
            pipe = self.r.pipeline(transaction=False)
            for i in chunk:
                entry = entries[i]
                task = {"task": k.task(i), "events": k.task_events(i)}
                # The bench submits with the admin token: no owner, so the
                # owner keys are named for '' and never written.
                ended = task | {"zip": k.task_zip(i), "stats": k.stats(), "stdin": k.task_stdin(i), "files": k.task_files(i),
                                "owner_cpu": k.owner_cpu(""), "owner_usage": k.owner_usage(""),
                                "owners": k.usage_owners(), "totals": k.usage_totals()}  # fmt: skip
                call("claim", task, {"worker": self.worker, "entry": entry}, client=pipe)
                call("started", task, {"worker": self.worker, "container": secrets.token_hex(32)}, client=pipe)
                progress = {"worker": self.worker, "stdout_tail": STDOUT, "stderr_tail": "", "stdout_bytes": len(STDOUT),
                            "stderr_bytes": 0, "milliseconds_since_output": 1, "egress_log": ""}  # fmt: skip
                call("progress", task, progress, client=pipe)
                finish = {"worker": self.worker, "state": "succeeded", "reason_kind": "exited", "reason": "exited with code 0",
                          "exit_code": 0, "retention_seconds": RETENTION_SECONDS, "files_zip": "", "listing": "",
                          "task_id": i, "owner": "", "cpu_ms": USAGE_CPU_MS, "peak_memory_bytes": USAGE_PEAK_BYTES,
                          "workspace_bytes": 0, "ledger_ms": 86_400_000, "estimated": "", "workspace_note": ""}  # fmt: skip
                call("finish", ended, finish, client=pipe)
                pipe.xack(k.jobs(), WORKER_GROUP, entry)
                pipe.xdel(k.jobs(), entry)
            replies = pipe.execute(raise_on_error=False)
            _raise_any(replies)
            for reply in replies[3::6]:
                if reply != "succeeded":
                    raise HarnessError(f"FINISH answered {reply!r} while filling, not 'succeeded'")
            ids += chunk
        return ids


def _raise_any(replies: list[object]) -> None:
    for r in replies:
        if isinstance(r, Exception):
            raise HarnessError(f"Redis refused a fill command: {r}")


def _stream_entries(reply: Any) -> dict[str, str]:
    """XREADGROUP reply (redis-py's: [[stream, [(entry id, fields)]]]) -> {task_id: entry id}."""
    return {fields[JOB_TASK_ID]: entry_id for _stream, entries in reply or [] for entry_id, fields in entries}
