"""The Lua scripts of shared/src/lua, called by name with named keys and arguments.

They run as Redis Functions (FCALL), like the api and the worker run them: the
library is this build's, loaded by `script-runner-ctl redis load-functions`
(which prints its name), so its text and version are made in one place
(shared/src/functions.rs), never here.

Each script's header comment says its KEYS and ARGV, one `KEYS[i]` / `ARGV[i]`
(or `ARGV[i..]` for a variadic tail) with a few words each. SIGNATURES below
gives every slot a Python name, in header order; `check_signature` holds each
name against its slot's words (every word of the name must appear in them) and
the counts against the header's, so a slot added, dropped or moved in a .lua
file fails at once instead of shifting every argument after it. Callers never
list positions: `Scripts.call("claim", keys={"task": ...}, args={...})`.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis import Redis
from redis.client import Pipeline

from . import REPO_ROOT
from .procs import HarnessError

LUA_DIR = REPO_ROOT / "shared" / "src" / "lua"

# script -> (key names, argument names), in header order. A trailing "..." marks
# the variadic tail (`ARGV[n..]`), passed as a mapping or a flat sequence.
SIGNATURES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "submit": (
        ("task", "zip", "stdin", "stats", "jobs", "index", "owner_active", "owner_cpu", "owner_index", "workspace",
         "owner_workspace_index", "every_workspace"),
        ("task_id", "zip", "stdin", "horizon_ms", "max_queued", "owner", "owner_max_queued", "owner_max_running",
         "owner_cpu_ms", "workspace_use", "workspace_id", "workspace_version", "must_be_head", "save_grace_ms",
         "field_pairs..."),
    ),
    "claim": (("task", "events"), ("worker", "entry")),
    "started": (("task", "events"), ("worker", "container")),
    "progress": (
        ("task", "events"),
        ("worker", "stdout_tail", "stderr_tail", "stdout_bytes", "stderr_bytes", "milliseconds_since_output",
         "egress_log"),
    ),
    "finish": (
        ("task", "zip", "stats", "stdin", "files", "owner_cpu", "owner_usage", "owners", "totals", "events"),
        (
            "worker",
            "state",
            "reason_kind",
            "reason",
            "exit_code",
            "retention_seconds",
            "files_zip",
            "listing",
            "task_id",
            "owner",
            "cpu_ms",
            "peak_memory_bytes",
            "workspace_bytes",
            "ledger_ms",
            "estimated",
            "workspace_note",
        ),
    ),
    "kill": (("task", "zip", "stats", "stdin", "events"), ("reason", "reason_kind", "retention_seconds", "owner")),
    "key_create": (("names", "record", "revoked"), ("name", "sha256", "field_pairs...")),
    "key_rotate": (("names", "record", "record_prefix"), ("name", "sha256")),
    "key_revoke": (("names", "record_prefix", "revoked"), ("name",)),
    "key_touch": (("record",), ("interval_ms",)),
    "requeue": (("jobs",), ("group", "entry", "task_id")),
    "forget_worker": (("jobs", "heartbeat", "workers"), ("group", "worker")),
    "ws_commit": (
        ("task", "workspace", "versions", "bytes_owner", "sweep"),
        ("worker", "task_id", "manifest", "bytes", "entries", "version", "versions_kept", "why", "most_bytes",
         "told_cap", "epoch"),
    ),
    "ws_fork": (("source", "new", "index", "every_workspace", "bytes_owner", "sweep"),
                ("caller", "source_version", "new_workspace_id", "source_workspace_id", "most_bytes")),
    "ws_delete": (("workspace", "versions", "owner_index", "every_workspace", "bytes_owner", "busy_task"),
                  ("caller", "workspace_id", "owner", "idle_horizon", "busy_task", "grace")),
    "ws_sweep": (("sweep",), ("what", "worker", "lease", "often")),
}

VARIADIC = "..."
_SLOT = re.compile(r"\b(KEYS|ARGV)\[(\d+)(\.\.)?\]\s*")


@dataclass(frozen=True)
class Slot:
    index: int  # 1-based, as in Lua
    words: str  # what the header says of it, lower case
    variadic: bool = False


@dataclass(frozen=True)
class Header:
    keys: tuple[Slot, ...]
    argv: tuple[Slot, ...]


def parse_header(source: str) -> Header:
    """The KEYS and ARGV slots of a script's leading comment. A comment line that
    names no slot but is indented further continues the previous slot's words."""
    slots: dict[str, list[Slot]] = {"KEYS": [], "ARGV": []}
    last: tuple[str, int] | None = None
    for line in source.splitlines():
        if not line.startswith("--"):
            break
        text = line[2:]
        # Only a line that starts with a slot names slots: prose may mention one
        # (finish.lua: "the per-minute hash `KEYS[3]:<unix minute>`").
        found = list(_SLOT.finditer(text)) if _SLOT.match(text.lstrip()) else []
        if not found:
            if last is not None and text.startswith("   ") and text.strip():
                kind, i = last
                old = slots[kind][i]
                slots[kind][i] = Slot(old.index, f"{old.words} {text.strip().lower()}", old.variadic)
            else:
                last = None
            continue
        for m, nxt in zip(found, [*found[1:], None]):
            words = text[m.end() : nxt.start() if nxt else len(text)].strip().lower()
            kind = m.group(1)
            slots[kind].append(Slot(int(m.group(2)), words, m.group(3) is not None))
            last = (kind, len(slots[kind]) - 1)
    for kind, found_slots in slots.items():
        if [s.index for s in found_slots] != list(range(1, len(found_slots) + 1)):
            raise HarnessError(f"{kind} slots out of order in a header: {[s.index for s in found_slots]}")
    return Header(tuple(slots["KEYS"]), tuple(slots["ARGV"]))


def script_path(name: str) -> Path:
    return LUA_DIR / f"{name}.lua"


def check_signature(name: str) -> Header:
    """Holds SIGNATURES[name] against the script's header; the header."""
    header = parse_header(script_path(name).read_text())
    key_names, arg_names = SIGNATURES[name]
    problems = []
    for kind, names, slots in (("KEYS", key_names, header.keys), ("ARGV", arg_names, header.argv)):
        if len(names) != len(slots):
            problems.append(f"{kind}: the header has {len(slots)} slot(s), Python names {len(names)}")
            continue
        for py, slot in zip(names, slots):
            variadic = py.endswith(VARIADIC)
            if variadic != slot.variadic:
                problems.append(f"{kind}[{slot.index}]: variadic in {'Python' if variadic else 'the header'} only")
            missing = [w for w in py.removesuffix(VARIADIC).split("_") if w not in slot.words]
            if missing:
                problems.append(f"{kind}[{slot.index}] is {slot.words!r}, not {py!r} (no {missing})")
    if problems:
        raise HarnessError(f"{script_path(name)} and harness.lua.SIGNATURES[{name!r}] disagree: " + "; ".join(problems))
    return header


def script_names() -> list[str]:
    """Every script in shared/src/lua."""
    return sorted(p.stem for p in LUA_DIR.glob("*.lua"))


def positional(name: str, keys: Mapping[str, Any], args: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
    """KEYS and ARGV of a call, in the script's order; every name required,
    no other allowed."""
    if name not in SIGNATURES:
        raise HarnessError(f"no Lua script {name!r} (known: {sorted(SIGNATURES)})")
    key_names, arg_names = SIGNATURES[name]
    complete = len(key_names) == len(keys) and len(arg_names) == len(args)
    try:
        key_list = [keys[k] for k in key_names]
        argv: list[Any] = []
        for a in arg_names:
            if a.endswith(VARIADIC):
                argv += _flatten(args[a.removesuffix(VARIADIC)])
            else:
                argv.append(args[a])
    except KeyError:
        complete = False
    if not complete:
        plain = [a.removesuffix(VARIADIC) for a in arg_names]
        raise HarnessError(
            f"{name}: keys {sorted(keys)} and args {sorted(args)} given, keys {list(key_names)} and args {plain} "
            f"expected (missing {sorted((set(key_names) - set(keys)) | (set(plain) - set(args)))}, "
            f"unknown {sorted((set(keys) - set(key_names)) | (set(args) - set(plain)))})"
        )
    return key_list, argv


def _flatten(value: Mapping[str, Any] | Iterable[Any]) -> list[Any]:
    if isinstance(value, Mapping):
        return [x for pair in value.items() for x in pair]
    return list(value)


def load_functions(redis: Redis, ctl: str | Path) -> str:
    """Loads this build's functions library into `redis` with the ctl at `ctl`
    (as the user of `redis`'s connections, which must be allowed FUNCTION LOAD)
    and returns the library's name (`sr_<hash>`)."""
    kw = redis.connection_pool.connection_kwargs
    host, port, db = kw.get("host", "127.0.0.1"), kw.get("port", 6379), kw.get("db", 0)
    auth = ""
    if kw.get("password"):
        auth = f"{kw.get('username') or 'default'}:{kw['password']}@"
    env = {"PATH": os.environ.get("PATH", ""), "REDIS_URL": f"redis://{auth}{host}:{port}/{db}"}
    out = subprocess.run([str(ctl), "redis", "load-functions"], env=env, capture_output=True, text=True, timeout=30)
    name = out.stdout.strip()
    if out.returncode != 0 or not re.fullmatch(r"sr_[0-9a-f]{8}", name):
        raise HarnessError(f"{ctl} redis load-functions failed ({out.returncode}): {out.stderr.strip() or name}")
    return name


class Scripts:
    """Every script, checked against its header, called as its function in this
    build's library (FCALL <library>_<script>)."""

    def __init__(self, redis: Redis, ctl: str | Path) -> None:
        self.redis = redis
        for name in script_names():
            if name not in SIGNATURES:
                raise HarnessError(f"{script_path(name)} has no entry in harness.lua.SIGNATURES")
            check_signature(name)
        self.library = load_functions(redis, ctl)

    def call(
        self,
        name: str,
        keys: Mapping[str, Any],
        args: Mapping[str, Any],
        client: Redis | Pipeline | None = None,
    ) -> Any:
        """Runs script `name`; on a pipeline, queues it (its reply comes with
        the pipeline's)."""
        key_list, argv = positional(name, keys, args)
        return (client or self.redis).fcall(f"{self.library}_{name}", len(key_list), *key_list, *argv)
