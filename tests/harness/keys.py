"""The Redis key schema, the Python copy of shared/src/keys.rs (`Keys`, `Field`
and its constants). tests/python/test_harness.py compares every name and format
here with the Rust source, so the two cannot drift apart silently.
"""

from __future__ import annotations

from enum import StrEnum

DEFAULT_PREFIX = "sr"
# The consumer group every worker joins on the jobs stream.
WORKER_GROUP = "workers"
# The field of a jobs-stream entry that names the task.
JOB_TASK_ID = "task_id"
# The first word of a worker's heartbeat value (`running=<n> slots=<n> ...`).
HEARTBEAT_RUNNING = "running="
# How long a per-minute finished counter (`Keys.stats_minute`) lives.
STATS_MINUTE_TTL_SECONDS = 7200
# The stats hash field counting submitted tasks, and the prefix of those
# counting finished ones (`finished:<state>:<reason_kind>`).
STAT_SUBMITTED = "submitted"
STAT_FINISHED_PREFIX = "finished:"
# A task's events stream (`Keys.task_events`): about this many entries at most, each
# with one field, naming what happened (claimed, started, output, finished, killed).
TASK_EVENTS_MAXLEN = 16
FINAL_EVENTS_TTL_SECONDS = 120
TASK_EVENT_FIELD = "e"

# The states a task's record ends in (shared::TaskState's final ones).
FINAL_STATES = frozenset({"succeeded", "failed", "killed", "timed-out"})


class Keys:
    """Key names for one prefix (`REDIS_KEY_PREFIX`)."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        self.prefix = prefix

    def jobs(self) -> str:
        return f"{self.prefix}:jobs"

    def task(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}"

    def task_zip(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}:zip"

    def task_stdin(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}:stdin"

    def task_files(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}:files"

    def task_events(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}:events"

    def task_index(self) -> str:
        return f"{self.prefix}:tasks"

    def worker(self, name: str) -> str:
        return f"{self.prefix}:worker:{name}"

    def workers(self) -> str:
        return f"{self.prefix}:workers"

    def stats(self) -> str:
        return f"{self.prefix}:stats"

    def owner_active(self, owner: str) -> str:
        return f"{self.prefix}:owner:{owner}:active"

    def owner_cpu(self, owner: str) -> str:
        return f"{self.prefix}:owner:{owner}:cpu"

    def stats_minute(self, minute: int) -> str:
        return f"{self.stats()}:{minute}"

    def owner_tasks(self, owner: str) -> str:
        return f"{self.prefix}:owner:{owner}:tasks"

    def api_key(self, sha256: str) -> str:
        return f"{self.prefix}:apikey:{sha256}"

    def api_key_names(self) -> str:
        return f"{self.prefix}:apikeys"

    def api_keys_revoked(self) -> str:
        return f"{self.prefix}:apikeys:revoked"

    def owner_usage(self, owner: str) -> str:
        return f"{self.prefix}:owner:{owner}:usage"

    def usage_owners(self) -> str:
        return f"{self.prefix}:usage:owners"

    def cache_clears(self) -> str:
        return f"{self.prefix}:cache:clears"

    def usage_totals(self) -> str:
        return f"{self.prefix}:usage:totals"

    def workspace(self, id: str) -> str:
        return f"{self.prefix}:ws:{id}"

    def workspace_versions(self, id: str) -> str:
        return f"{self.prefix}:ws:{id}:versions"

    def workspace_version(self, id: str, version: int) -> str:
        return f"{self.prefix}:ws:{id}:versions:{version}"

    def owner_workspaces(self, owner: str) -> str:
        return f"{self.prefix}:owner:{owner}:workspaces"

    def workspaces(self) -> str:
        return f"{self.prefix}:workspaces"

    def workspace_bytes(self) -> str:
        return f"{self.prefix}:ws:owner-bytes"

    def workspace_sweep(self) -> str:
        return f"{self.prefix}:ws:sweep"


class Field(StrEnum):
    """The fields of a task hash (`Field::as_str`). A member is its string, so
    `record[Field.STATE]` reads a decoded HGETALL."""

    STATE = "state"
    RUNTIME = "runtime"
    IMAGE = "image"
    COMMAND = "command"
    TIMEOUT_SECONDS = "timeout_seconds"
    HAS_ZIP = "has_zip"
    HAS_STDIN = "has_stdin"
    ENV = "env"
    NETWORK = "network"
    COLLECT = "collect"
    FILES = "files"
    CREATED_AT = "created_at"
    CLAIMED_AT = "claimed_at"
    STARTED_AT = "started_at"
    FINISHED_AT = "finished_at"
    LAST_OUTPUT_AT = "last_output_at"
    WORKER = "worker"
    ENTRY = "entry"
    CONTAINER = "container"
    EXIT_CODE = "exit_code"
    REASON = "reason"
    REASON_KIND = "reason_kind"
    STDOUT_TAIL = "stdout_tail"
    STDERR_TAIL = "stderr_tail"
    STDOUT_BYTES = "stdout_bytes"
    STDERR_BYTES = "stderr_bytes"
    OWNER = "owner"
    USAGE_CPU_MS = "usage_cpu_ms"
    USAGE_PEAK_MEMORY_BYTES = "usage_peak_memory_bytes"
    USAGE_WORKSPACE_BYTES = "usage_workspace_bytes"
    USAGE_ESTIMATED = "usage_estimated"
    CACHE = "cache"
    EGRESS_ALLOW = "egress_allow"
    EGRESS_LOG = "egress_log"
    SPEC_SIGNATURE = "spec_signature"
    WORKSPACE_ID = "workspace_id"
    WORKSPACE_BASE = "workspace_base"
    WORKSPACE_VERSION = "workspace_version"
    WORKSPACE_NOTE = "workspace_note"
    EDIT_DELETES = "edit_deletes"
