"""Faults under load: real processes, one command, a bounded run.

    scripts/faults.sh [--tasks 300] [--release] [...]      (or: .venv/bin/python tests/reliability/faults.py)

A redis-server with an append-only file (appendfsync everysec, as deployed), three
workers on this host (distinct WORKER_NAME, one prefix, WORKER_HEARTBEAT_SECONDS=3
so a lost worker is settled in seconds rather than the default 15 s's half minute),
two api replicas behind one address (Caddy, round robin, retrying a refused
connection on the other replica), and clients submitting short tasks as fast as
the api takes them: the api's MAX_QUEUED_TASKS is small (twice the slots), so the
queue stays short, clients are told "at capacity" and retry, and submissions go on
for the whole run, through every fault. Meanwhile, in order, each at a fixed share
of the tasks (clients wait at that point until the fault is injected, so every
fault lands mid-run at any size):

  1. worker w1 is SIGKILLed while it runs tasks, just after a job was read under its
     name but not claimed (as if it died between XREADGROUP and CLAIM); another
     worker's reaper settles its jobs; then w1 is started again under its name;
  2. worker w2 is SIGTERMed while it runs tasks (SHUTDOWN_GRACE_SECONDS=10) and
     started again once it has exited;
  3. redis-server is SIGKILLed, left down for --redis-outage seconds, and started
     again from its append-only file;
  4. (only with --faults primary-kill, not by default) Redis is a primary with one
     replica (--replicas) and three sentinels (--sentinel, implied), the binaries
     find the primary through the sentinels, and REDIS_MIN_REPLICAS_ACK=1 unless
     --min-replicas-ack says otherwise: the primary is SIGKILLed, the sentinels
     promote a replica, and once every worker and api writes to the new primary
     the old one is started again from its append-only file (as a host that
     reboots; --old-primary-back at-once: as soon as the sentinels name the new
     one, as a restart policy would) and the sentinels make it a replica. With one replica and acks, the new primary
     has no replica to acknowledge anything until then: submits are told to try
     again meanwhile (--replicas 2 shows the failover alone). Not with redis-kill
     in one run: that one restarts the one Redis in place, this one fails over;
  5. api replica api1 is SIGKILLed and left dead: clients go on through the proxy.

Beside them, --workspaces chains (default 2) each run tasks one after the other on
one persistent workspace for the whole run, each adding 1 to a counter file there:
version v of a chain's workspace must hold v. At the end every version a task was
told it made must still be listed (none lost), and every listed version must read
back whole through read_files, its counter equal to its number (none half-written).
A task whose worker was killed makes none (reported, not a failure).

Then every task is waited for, and checked (exit status 1 if any check fails):
every task_id handed out ends terminal; none is unknown afterwards (lost) or goes
back to an earlier state; no task's container started twice (`docker events`);
w1's running tasks end "worker lost" and its read-but-unclaimed job runs once
elsewhere; w2 exits 0 and its running tasks succeed; submits during the Redis
outage or the failover get the store's "try again shortly" error; /healthz says 503
during the failover and 200 after; api and workers recover by
themselves; no container or stream entry is left. A summary with the figures is
printed (and written as JSON with --json). With primary-kill and
--min-replicas-ack 0, task_ids handed out and unknown after the failover are the
loss window: counted and printed (with how long before the kill each was
acknowledged), not a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import signal
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # common.py, and tests/: the shared harness package
from common import ContainerStarts, log, parser, print_table  # noqa: E402
from common import main as run_main  # noqa: E402
from harness.keys import FINAL_STATES, JOB_TASK_ID, WORKER_GROUP  # noqa: E402
from harness.mcp_http import Mcp, ProtocolError, Unreachable  # noqa: E402
from harness.procs import DEFAULT_RUST_LOG  # noqa: E402
from harness.procs import wait_until_async as wait_for  # noqa: E402
from harness.stack import IMAGE, Stack, containers_of, preflight  # noqa: E402
from redis.asyncio import Redis as AsyncRedis  # noqa: E402

STATE_RANK = {"queued": 0, "running": 1} | {s: 2 for s in FINAL_STATES}
FAULTS = ("worker-kill", "worker-term", "redis-kill", "primary-kill", "api-kill")
# What runs without --faults: primary-kill needs the sentinels, and replaces redis-kill.
DEFAULT_FAULTS = ("worker-kill", "worker-term", "redis-kill", "api-kill")
# Where each fault lands, as a share of the tasks submitted.
FAULT_AT = {"worker-kill": 0.15, "worker-term": 0.35, "redis-kill": 0.55, "primary-kill": 0.65, "api-kill": 0.75}
# The phases of a failover: from the SIGKILL until the sentinels name another
# primary, then until api, workers and a submit work again on it.
FAILOVER_PHASES = ("failover", "failover-recovery")


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def command_for(index: int, nonce: str = "") -> tuple[str, str]:
    """A short task and the stdout it must produce. The index in the output ties
    a task record back to the submission that made it; the nonce (new for every
    attempt, in a shell comment) makes every attempt's command its own."""
    pause = ("0.3", "0.8", "1.5", "2.5")[index % 4]
    return f"echo start {index}; sleep {pause}; echo end {index} # n{nonce}", f"start {index}\nend {index}\n"


@dataclass
class Task:
    index: int
    task_id: str
    states: list[str] = field(default_factory=list)  # distinct states seen, in order
    final: dict[str, Any] | None = None
    regressions: list[str] = field(default_factory=list)
    vanished: int = 0  # "no task with id" after it had been seen
    acked_at: float = 0.0  # time.monotonic() when its submit answered with the task_id


@dataclass
class Errors:
    """Client-side failures, by phase of the run and kind."""

    counts: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (phase, call, kind)
    samples: dict[str, list[str]] = field(default_factory=dict)
    max_store_error_latency: float = 0.0
    unreachable: list[str] = field(default_factory=list)  # when and what, for the proxy's log

    def add(self, phase: str, call: str, kind: str, text: str) -> None:
        self.counts[(phase, call, kind)] += 1
        if kind == "unreachable" and len(self.unreachable) < 50:
            self.unreachable.append(f"{time.strftime('%H:%M:%S')} {phase} {call}: {text[:200]}")
        s = self.samples.setdefault(kind, [])
        if len(s) < 3 and text not in s:
            s.append(text[:300])

    def total(self, kind: str | None = None, phase: str | None = None, call: str | None = None) -> int:
        return sum(
            n
            for (p, c, k), n in self.counts.items()
            if (kind is None or k == kind) and (phase is None or p == phase) and (call is None or c == call)
        )


def classify_tool_error(text: str) -> str:
    if "at capacity" in text:
        return "at-capacity"
    if text.startswith("workspace ") and " is busy: " in text:
        return "workspace-busy"
    if text.startswith("the task store (Redis)") and text.rstrip().endswith("try again shortly"):
        return "store-unavailable"
    if text.startswith("no task with id"):
        return "unknown-task"
    return "unexpected-tool-error"


class FaultRun:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.n = args.tasks
        self.stack = Stack(bin_dir=args.bin_dir, label="rel", rust_log=os.environ.get("RELIABILITY_RUST_LOG", DEFAULT_RUST_LOG), sentinel=args.sentinel, replicas=args.replicas)
        if args.min_replicas_ack:
            self.stack.common_env["REDIS_MIN_REPLICAS_ACK"] = str(args.min_replicas_ack)
        self.tasks: dict[str, Task] = {}
        self.by_index: dict[int, Task] = {}
        self.next_index = 0
        self.done_indices: set[int] = set()
        self.failed_submits: list[str] = []
        self.errors = Errors()
        self.phase = "normal"
        self.faults = [f for f in FAULTS if f in args.faults]
        self.gates = {f: int(FAULT_AT[f] * self.n) for f in self.faults}
        self.injected = {f: asyncio.Event() for f in self.faults}
        # Clients hold this far past a fault's point until it is injected: enough
        # work for every worker meanwhile, and the fault still lands mid-run.
        self.window = args.workers * args.concurrency
        # How far past that a fault still waiting for its moment lets them go
        # (see `wait_with_work`).
        self.extra = {f: 0 for f in self.faults}
        self.submissions_done = asyncio.Event()
        self.figures: dict[str, Any] = {}
        self.failures: list[str] = []
        self.mcp: Mcp | None = None
        self.starts: ContainerStarts | None = None
        self.t0 = time.monotonic()
        # When the first submit succeeded once Redis was being restarted: it can
        # answer before `start_redis` returns, so this is not measured from there.
        self.first_ok_in_redis_recovery: float | None = None
        # The same for a submit sent once the primary was SIGKILLed.
        self.first_ok_in_failover: float | None = None
        self.t_primary_kill: float | None = None
        # The workspace chains: their tasks (kept out of the main checks that go
        # by submission index), and per chain its workspace and each task's end.
        self.chain_ids: set[str] = set()
        self.chains: list[dict[str, Any]] = [{"workspace": None, "ends": []} for _ in range(args.workspaces)]

    # ------------------------------------------------------------------ set-up

    async def start(self) -> None:
        a, st = self.args, self.stack
        tools = ["redis-server", "docker"] + (["caddy"] if "api-kill" in self.faults else []) + (["redis-sentinel"] if a.sentinel else [])
        preflight(st.bin_dir, tools, [IMAGE])  # every task here is python3.13's (a shell in that image)
        log(f"run {st.run_id}: logs in {st.tmp_dir}")
        await asyncio.to_thread(st.start_redis, a.appendfsync)
        worker_env = {
            "WORKER_CONCURRENCY": str(a.concurrency),
            "WORKER_HEARTBEAT_SECONDS": str(a.heartbeat),
            "SHUTDOWN_GRACE_SECONDS": str(a.grace),
            # Every version a chain makes stays listed, so "lost" means lost.
            "WORKSPACE_VERSIONS_KEPT": "10000",
        } | ({"POOL_SIZE": a.pool_size} if a.pool_size is not None else {})
        if a.pool_size == "0":
            worker_env["EGRESS_POOL_SIZE"] = "0"  # no pool at all: allow-list tasks' too
        for i in range(1, a.workers + 1):
            st.add_worker(f"w{i}", worker_env)
        self.starts = ContainerStarts(st.worker_names())
        await self.starts.start()
        await asyncio.gather(*(asyncio.to_thread(st.start_worker, s) for s in st.workers))
        api_env = {"MAX_QUEUED_TASKS": str(a.max_queued)}
        for name in ("api1", "api2") if "api-kill" in self.faults else ("api1",):
            st.add_api(name, api_env)
            await asyncio.to_thread(st.start_api, name)
        if "api-kill" in self.faults:
            await asyncio.to_thread(st.start_proxy)
        self.mcp = Mcp(st.base_url, st.token, timeout=20.0, connections=a.clients + a.pollers + 4)
        redis = f"redis :{st.redis_port}"
        if a.sentinel:
            redis = (f"redis primary :{st.redis_port}, replicas {st.replica_ports}, sentinels {st.sentinel_ports}, "
                     f"REDIS_MIN_REPLICAS_ACK {a.min_replicas_ack}")  # fmt: skip
        log(
            f"stack up: {redis} (appendfsync {a.appendfsync}), {a.workers} workers x {a.concurrency} slots, "
            f"apis {({s: a.port for s, a in st.apis.items()})}, clients via {st.base_url}"
        )

    # ------------------------------------------------------------------ clients

    async def submitter(self) -> None:
        assert self.mcp is not None
        while self.next_index < self.n:
            index = self.next_index
            self.next_index += 1
            for f in self.faults:
                while index >= self.gates[f] + self.window + self.extra[f] and not self.injected[f].is_set():
                    await asyncio.sleep(0.05)
            while True:
                command, _ = command_for(index, uuid.uuid4().hex[:12])
                args = {"runtime": "python3.13", "command_base64": b64(command), "timeout_seconds": 60}
                phase = self.phase
                t = time.monotonic()
                try:
                    res = await self.mcp.call("run_script", args)
                except Unreachable as e:
                    self.errors.add(phase, "submit", "unreachable", str(e))
                    await asyncio.sleep(0.2)
                    continue
                except ProtocolError as e:
                    self.errors.add(phase, "submit", "protocol-error", str(e))
                    self.failed_submits.append(f"#{index}: {e}")
                    break
                if res.is_error:
                    kind = classify_tool_error(res.text)
                    self.errors.add(phase, "submit", kind, res.text)
                    if kind == "store-unavailable":
                        self.errors.max_store_error_latency = max(self.errors.max_store_error_latency, time.monotonic() - t)
                    if kind in ("at-capacity", "store-unavailable"):
                        await asyncio.sleep(0.25)
                        continue
                    self.failed_submits.append(f"#{index}: {res.text}")
                    break
                assert res.structured is not None
                task = Task(index, res.structured["task_id"], states=[res.structured["state"]], acked_at=time.monotonic())
                self.tasks[task.task_id] = task
                self.by_index[index] = task
                if self.phase == "redis-recovery" and self.first_ok_in_redis_recovery is None:
                    self.first_ok_in_redis_recovery = time.monotonic()
                if phase in FAILOVER_PHASES and self.first_ok_in_failover is None:
                    self.first_ok_in_failover = time.monotonic()
                break
            self.done_indices.add(index)
            if len(self.done_indices) == self.n:
                self.submissions_done.set()

    async def workspace_chain(self, c: int) -> None:
        """Tasks one after the other on one workspace until the submissions are
        done: each adds 1 to `count` there."""
        assert self.mcp is not None
        chain = self.chains[c]
        command = "n=$(cat count 2>/dev/null || echo 0); n=$((n + 1)); echo $n > count; sleep 0.5; echo $n"
        while not self.submissions_done.is_set():
            ws = chain["workspace"]
            args = {"runtime": "python3.13", "command_base64": b64(command), "timeout_seconds": 60,
                    "workspace": {"id": ws} if ws else "new"}  # fmt: skip
            phase = self.phase
            try:
                res = await self.mcp.call("run_script", args)
            except (Unreachable, ProtocolError) as e:
                self.errors.add(phase, "workspace-submit", "unreachable", str(e))
                await asyncio.sleep(0.2)
                continue
            if res.is_error:
                kind = classify_tool_error(res.text)
                self.errors.add(phase, "workspace-submit", kind, res.text)
                if kind in ("at-capacity", "store-unavailable", "workspace-busy"):
                    await asyncio.sleep(0.25)
                    continue
                self.failures.append(f"workspace chain {c}: run_script refused: {res.text}")
                return
            assert res.structured is not None
            task_id = res.structured["task_id"]
            chain["workspace"] = chain["workspace"] or res.structured.get("workspace_id")
            self.chain_ids.add(task_id)
            chain["ends"].append((task_id, await self.workspace_end(task_id)))

    async def workspace_end(self, task_id: str) -> dict[str, Any] | None:
        """A chain task's status once it has ended and its workspace outcome is
        recorded (a version, or a note), or None if that never comes."""
        assert self.mcp is not None
        end = time.monotonic() + 180
        while time.monotonic() < end:
            try:
                res = await self.mcp.call("get_task_status", {"task_id": task_id})
            except (Unreachable, ProtocolError):
                await asyncio.sleep(0.3)
                continue
            s = res.structured
            if not res.is_error and s and s["state"] in FINAL_STATES and (
                isinstance(s.get("workspace_version"), int) or s.get("workspace_note")
            ):
                return s
            await asyncio.sleep(0.3)
        return None

    async def workspace_checks(self) -> None:
        """Every version a chain task was told it made is still listed, and every
        listed one reads back whole with its counter equal to its number."""
        assert self.mcp is not None
        made = lost = half = none = 0
        notes: Counter[str] = Counter()
        for c, chain in enumerate(self.chains):
            ws = chain["workspace"]
            if not ws:
                self.failures.append(f"workspace chain {c} made no workspace")
                continue
            told = set()
            for task_id, s in chain["ends"]:
                if s is None:
                    self.failures.append(f"workspace task {task_id} never recorded a version or a note")
                elif isinstance(s.get("workspace_version"), int):
                    told.add(s["workspace_version"])
                else:
                    none += 1
                    notes[f"{s.get('reason_kind')}: {s.get('workspace_note')}"] += 1
            got = await self.mcp.call("get_workspace", {"workspace_id": ws})
            if got.is_error or not got.structured:
                self.failures.append(f"workspace chain {c}: get_workspace failed: {got.text}")
                continue
            listed = [v["version"] for v in got.structured["versions"]]
            made += len(listed)
            gone = told - set(listed)
            lost += len(gone)
            if gone:
                self.failures.append(f"workspace chain {c}: version(s) {sorted(gone)} told to their tasks are not listed")
            for v in listed:
                read = await self.mcp.call("read_files", {"workspace_id": ws, "version": v, "paths": ["count"]})
                files = (read.structured or {}).get("files") or []
                content = files[0].get("content") if files else None
                if read.is_error or content != f"{v}\n":
                    half += 1
                    self.failures.append(f"workspace chain {c}: version {v} reads {content!r}{' ' + read.text if read.is_error else ''}, not {v}")
            if listed and got.structured["head"] != max(listed):
                self.failures.append(f"workspace chain {c}: head {got.structured['head']} is not the newest version {max(listed)}")
        self.figures["workspaces"] = {"chains": len(self.chains), "tasks": len(self.chain_ids), "versions_made": made,
                                      "versions_lost": lost, "versions_half_written": half, "tasks_without_version": none,
                                      "why_none": dict(notes)}  # fmt: skip

    def observe(self, task: Task, status: dict[str, Any]) -> None:
        state = status["state"]
        if task.states and STATE_RANK[state] < STATE_RANK[task.states[-1]]:
            task.regressions.append(f"{task.states[-1]} -> {state}")
        if not task.states or task.states[-1] != state:
            task.states.append(state)
        if state in FINAL_STATES:
            if task.final is not None and task.final["state"] != state:
                task.regressions.append(f"final {task.final['state']} -> {state}")
            task.final = status

    async def poller(self, k: int, p: int) -> None:
        assert self.mcp is not None
        def followed(t: Task) -> bool:
            # A task unknown 10 times running is lost: the final checks say so.
            return t.final is None and t.vanished < 10

        while not (self.submissions_done.is_set() and not any(map(followed, self.tasks.values()))):
            pending = [t for t in list(self.tasks.values()) if followed(t) and t.index % p == k]
            for task in pending:
                phase = self.phase
                try:
                    res = await self.mcp.call("get_task_status", {"task_id": task.task_id})
                except Unreachable as e:
                    self.errors.add(phase, "status", "unreachable", str(e))
                    await asyncio.sleep(0.2)
                    continue
                except ProtocolError as e:
                    self.errors.add(phase, "status", "protocol-error", str(e))
                    continue
                if res.is_error:
                    kind = classify_tool_error(res.text)
                    self.errors.add(phase, "status", kind, res.text)
                    if kind == "unknown-task":
                        task.vanished += 1
                        if task.vanished == 1:
                            task.regressions.append(f"{task.states[-1]} -> no record")
                    continue
                assert res.structured is not None
                task.vanished = 0
                self.observe(task, res.structured)
            await asyncio.sleep(0.5)

    # ------------------------------------------------------------------ Redis views

    async def pending_of(self, worker: str) -> list[tuple[str, str]]:
        """(entry id, task id) of the stream entries pending under `worker`."""
        st = self.stack
        r = st.aredis
        rows = await r.xpending_range(st.keys.jobs(), WORKER_GROUP, "-", "+", 1000, consumername=worker)
        out = []
        for row in rows:
            entry_id = row["message_id"]
            got = await r.xrange(st.keys.jobs(), entry_id, entry_id)
            if got:
                out.append((entry_id, got[0][1].get(JOB_TASK_ID, "")))
        return out

    async def record(self, task_id: str, *fields: str) -> dict[str, str | None]:
        vals = await self.stack.aredis.hmget(self.stack.keys.task(task_id), list(fields))
        return dict(zip(fields, vals))

    async def running_on(self, short: str) -> list[str]:
        """Tasks whose container worker `short` has started and still runs."""
        name = self.stack.workers[short].name
        ids = []
        for _, task_id in await self.pending_of(name):
            rec = await self.record(task_id, "state", "started_at", "worker")
            if rec["state"] == "running" and rec["started_at"] and rec["worker"] == name:
                ids.append(task_id)
        return ids

    async def wait_with_work(self, fault: str, what: str, ready: Callable[[], Awaitable[Any]], deadline: float, every: float) -> Any:
        """Waits for `ready` (the moment `fault` needs), letting clients submit
        further past the fault's hold whenever the workers run short of work:
        with few tasks (CI's 40), every task before the hold can be done before
        the worker the fault aims at has run one, and nothing more would come."""
        last_bump = 0.0

        async def check() -> Any:
            nonlocal last_bump
            got = await ready()
            if not got:
                in_flight = sum(1 for t in self.tasks.values() if t.final is None)
                if in_flight < self.window and time.monotonic() - last_bump > 1.0:
                    self.extra[fault] += self.window
                    last_bump = time.monotonic()
            return got

        return await wait_for(what, check, deadline, every=every)

    async def wait_gate(self, fault: str) -> None:
        gate = self.gates[fault]
        await wait_for(
            f"the {gate} submissions before {fault}",
            lambda: asyncio.sleep(0, all(i in self.done_indices for i in range(gate))),
            self.args.deadline,
            every=0.1,
        )

    # ------------------------------------------------------------------ faults

    async def worker_kill(self) -> None:
        st, short = self.stack, "w1"
        name = st.workers[short].name
        async def ready() -> bool:
            # w1 runs a task, and a job waits in the stream for the read below.
            jobs = st.keys.jobs()
            undelivered = await st.aredis.xlen(jobs) - (await st.aredis.xpending(jobs, WORKER_GROUP))["pending"]
            return undelivered > 0 and bool(await self.running_on(short))

        await self.wait_with_work("worker-kill", f"{short} to run a task while a job waits", ready, 120, every=0.05)
        # A job read under its name and never claimed: as if it died right after
        # XREADGROUP. Read just before the kill, so its own reaper has no time to
        # take it back (that needs two heartbeat periods of idleness).
        read = await st.aredis.xreadgroup(WORKER_GROUP, name, {st.keys.jobs(): ">"}, count=1)
        injected = [f.get(JOB_TASK_ID, "") for _, entries in (read or []) for _, f in entries]
        st.workers[short].proc.kill()
        t_kill = time.monotonic()
        self.phase = "worker-kill"
        self.injected["worker-kill"].set()
        held = await self.pending_of(name)
        classes: dict[str, list[str]] = {"running": [], "claimed-start-not-recorded": [], "read-not-claimed": [], "ended": []}
        for _, task_id in held:
            rec = await self.record(task_id, "state", "started_at")
            if rec["state"] == "running":
                classes["running" if rec["started_at"] else "claimed-start-not-recorded"].append(task_id)
            elif rec["state"] == "queued":
                classes["read-not-claimed"].append(task_id)
            else:
                classes["ended"].append(task_id)
        log(f"SIGKILLed worker w1 holding {len(held)} job(s): " + ", ".join(f"{k} {len(v)}" for k, v in classes.items()))

        async def forgotten() -> bool:
            return not await st.aredis.sismember(st.keys.workers(), name)

        await wait_for("w1 to be settled and forgotten by another worker's reaper", forgotten, 120, every=0.2)
        t_forgotten = time.monotonic() - t_kill
        # The reapers remove a lost worker's containers (same host) around the
        # time they forget it (two reapers may race; one removal can still be
        # under way): none may be left a little later.
        async def w1_containers_gone() -> bool:
            return not await asyncio.to_thread(containers_of, name)

        try:
            await wait_for("w1's containers to be removed", w1_containers_gone, 30, every=0.5)
        except TimeoutError:
            pass  # counted below
        w1_left = await asyncio.to_thread(containers_of, name)
        await asyncio.to_thread(st.start_worker, short)
        self.phase = "normal"
        self.figures["worker_kill"] = {
            "held_jobs": len(held),
            "classes": {k: len(v) for k, v in classes.items()},
            "injected_read_not_claimed": len(injected),
            "settled_and_forgotten_after_s": round(t_forgotten, 1),
            "w1_containers_left_after_reap": len(w1_left),
            "restarted_after_s": round(time.monotonic() - t_kill, 1),
        }
        self.kill_classes = classes
        log(f"w1 settled and forgotten after {t_forgotten:.1f} s; restarted")

    async def worker_term(self) -> None:
        st, short = self.stack, "w2"
        running = await self.wait_with_work("worker-term", f"{short} to run a task", lambda: self.running_on(short), 120, every=0.2)
        proc = st.workers[short].proc
        proc.signal(signal.SIGTERM)
        t = time.monotonic()
        self.phase = "worker-term"
        self.injected["worker-term"].set()
        log(f"SIGTERMed worker w2 running {len(running)} task(s)")
        code = await proc.wait_exit(self.args.grace + 60)
        drained = time.monotonic() - t
        await asyncio.to_thread(st.start_worker, short)
        self.phase = "normal"
        self.term_running = running
        self.figures["worker_term"] = {"running_at_signal": len(running), "exit_code": code, "exited_after_s": round(drained, 1)}
        if code != 0:
            self.failures.append(f"w2 exited with code {code} after SIGTERM (expected 0)")
        log(f"w2 exited {code} after {drained:.1f} s; restarted")

    async def redis_kill(self) -> None:
        st = self.stack
        assert st.redis_proc is not None
        # With everysec, Redis write()s the AOF before it answers (unless an fsync
        # is still running, when it may postpone the write for up to 2 s), so
        # killing the process loses what the kernel has not yet fsynced only if the
        # machine goes down too, which no process kill shows.
        st.redis_proc.kill()
        t_kill = time.monotonic()
        self.phase = "redis-down"
        self.injected["redis-kill"].set()
        log(f"SIGKILLed redis-server; down for {self.args.redis_outage} s")
        # The outage itself: this is the fault's length, not a wait for something.
        health = []
        end = t_kill + self.args.redis_outage
        while time.monotonic() < end:
            try:
                import httpx2

                async with httpx2.AsyncClient(timeout=5.0) as c:
                    health.append((await c.get(f"{st.base_url}/healthz")).status_code)
            except Exception as e:  # noqa: BLE001 - counted as what it is
                health.append(type(e).__name__)
            await asyncio.sleep(0.5)
        # From here on, answers may come from the restarted Redis.
        self.phase = "redis-recovery"
        down = time.monotonic() - t_kill
        await asyncio.to_thread(st.start_redis, self.args.appendfsync)
        t_up = time.monotonic()
        outage = t_up - t_kill

        async def api_healthy() -> bool:
            import httpx2

            async with httpx2.AsyncClient(timeout=5.0) as c:
                return (await c.get(f"{st.base_url}/healthz")).status_code == 200

        await wait_for("the api to report healthy after Redis came back", api_healthy, 60)
        api_back = time.monotonic() - t_up

        async def all_beating() -> bool:
            return all([await st.aredis.exists(st.keys.worker(n)) == 1 for n in st.worker_names()])

        await wait_for("every worker to heartbeat after Redis came back", all_beating, 60)
        workers_back = time.monotonic() - t_up
        await wait_for("a submit to succeed after Redis came back", lambda: asyncio.sleep(0, self.first_ok_in_redis_recovery is not None), 60)
        first_ok = max(0.0, (self.first_ok_in_redis_recovery or t_up) - t_up)
        self.phase = "normal"
        self.figures["redis_kill"] = {
            "down_s": round(down, 1),
            "outage_s": round(outage, 1),
            "aof_load_s": round(outage - down, 1),
            "healthz_during_outage": dict(Counter(str(h) for h in health)),
            "api_healthy_after_restart_s": round(api_back, 1),
            "workers_heartbeating_after_restart_s": round(workers_back, 1),
            "first_submit_ok_after_restart_s": round(first_ok, 1),
        }
        if any(h != 503 for h in health):
            self.failures.append(f"/healthz during the Redis outage answered {dict(Counter(map(str, health)))} (expected 503)")
        log(f"redis back after {outage:.1f} s; api healthy {api_back:.1f} s and workers {workers_back:.1f} s later")

    async def primary_kill(self) -> None:
        """SIGKILLs the Redis primary and follows the failover: /healthz of every
        live api every 0.2 s meanwhile; the sentinels' promotion; the old primary
        started again (once the new one serves) and made a replica; every worker
        writing its heartbeat to the new primary; every api healthy; the first
        submit acknowledged. Times from the SIGKILL."""
        st = self.stack
        old_port = await asyncio.to_thread(st.primary_port)
        old = st.redis_nodes()[old_port]
        running = sum(1 for t in self.tasks.values() if t.final is None and t.states[-1] == "running")
        old.kill()
        t_kill = self.t_primary_kill = time.monotonic()
        self.phase = "failover"
        self.injected["primary-kill"].set()
        log(f"SIGKILLed the Redis primary :{old_port} ({running} task(s) seen running); the sentinels fail over")

        def since() -> float:
            return round(time.monotonic() - t_kill, 2)

        # /healthz of each live api, directly (not through the proxy), until the end.
        health: dict[str, list[tuple[float, Any]]] = {}
        healthy_at: dict[str, float] = {}
        probing = True

        async def probe(short: str, url: str) -> None:
            import httpx2

            seen = health.setdefault(short, [])
            async with httpx2.AsyncClient(timeout=5.0) as c:
                while probing:
                    try:
                        code: Any = (await c.get(url)).status_code
                    except Exception as e:  # noqa: BLE001 - counted as what it is
                        code = type(e).__name__
                    seen.append((since(), code))
                    if code == 200 and any(h == 503 for _, h in seen) and short not in healthy_at:
                        healthy_at[short] = since()
                    await asyncio.sleep(0.2)

        probes = [asyncio.create_task(probe(a.short, f"{a.base_url}/healthz")) for a in st.apis.values() if a.proc.alive()]

        async def promoted() -> int:
            port = await asyncio.to_thread(st.primary_port)
            return port if port != old_port else 0

        failures_before = len(self.failures)

        async def step(what: str, check: Callable[[], Awaitable[Any]], deadline: float = 60, every: float = 0.1) -> float | None:
            """Seconds from the kill until `check`, or None (and a failure) if never."""
            try:
                await wait_for(what, check, deadline, every=every)
            except TimeoutError as e:
                self.failures.append(f"primary-kill: {e}")
                return None
            return since()

        new_port = 0

        async def named() -> bool:
            nonlocal new_port
            new_port = await promoted()
            return bool(new_port)

        promoted_s = await step("the sentinels to promote the replica", named)

        async def harness_follows() -> bool:
            return (await st.aredis.info("replication"))["role"] == "master" and await st.aredis.ping()

        harness_s = await step("the harness's own client (redis-py Sentinel) to reach the new primary", harness_follows, 30)
        self.phase = "failover-recovery"

        # The old primary's host comes back: same port, its append-only file.
        # Until the sentinels see it (INFO every second), it answers as a primary
        # with what it had: no binary may write there. Measured alongside the rest.
        back: dict[str, float | None] = {"restarted": None, "demoted": None, "in_sync": None}

        switched = asyncio.Event()  # every worker and api reached the new primary

        async def old_primary_returns() -> None:
            if not new_port:
                return
            if self.args.old_primary_back == "after-switch":
                await switched.wait()
            await asyncio.to_thread(st.restart_redis_node, old)
            back["restarted"] = since()
            node = AsyncRedis(port=old_port, decode_responses=True, socket_timeout=2, socket_connect_timeout=1)
            try:

                async def demoted() -> bool:
                    # A replica of the primary the sentinels name now (which a
                    # second failover may have changed since `new_port`).
                    info = await node.info("replication")
                    now = await asyncio.to_thread(st.primary_port)
                    return info["role"] == "slave" and int(info["master_port"]) in (new_port, now)

                async def in_sync() -> bool:
                    return (await node.info("replication")).get("master_link_status") == "up"

                back["demoted"] = await step("the old primary to be made a replica of the new one", demoted)
                back["in_sync"] = await step("the old primary to be in sync with the new one", in_sync)
            finally:
                await node.aclose()

        # Every worker writes its heartbeat (SET EX) to the new primary: its TTL
        # only goes down between renewals, so a rise (or the key coming back)
        # is a write. At most a third of a heartbeat period late.
        last_ttl: dict[str, int] = {}
        renewed_at: dict[str, float] = {}

        def live_workers() -> list[str]:
            return [w.name for w in st.workers.values() if w.proc.alive()]

        async def all_renewed() -> bool:
            for name in live_workers():
                if name in renewed_at:
                    continue
                ttl = await st.aredis.pttl(st.keys.worker(name))
                prev = last_ttl.get(name)
                if prev is not None and ttl > 0 and (prev < 0 or ttl > prev):
                    renewed_at[name] = since()
                last_ttl[name] = ttl
            return all(n in renewed_at for n in live_workers())

        async def apis_healthy() -> bool:
            return all(a.short in healthy_at or not a.proc.alive() for a in st.apis.values())

        async def submit_ok() -> bool:
            return self.first_ok_in_failover is not None

        async def binaries_switched() -> tuple[float | None, float | None]:
            got = await asyncio.gather(
                step("every worker to renew its heartbeat on the new primary", all_renewed, 60, every=0.05),
                step("every api's /healthz to answer 503 during the failover, then 200", apis_healthy),
            )
            switched.set()
            return got[0], got[1]

        _, (workers_s, apis_s), submit_s = await asyncio.gather(
            old_primary_returns(),
            binaries_switched(),
            step("a submit sent after the kill to be acknowledged", submit_ok),
        )
        probing = False
        await asyncio.gather(*probes)
        ctl = await asyncio.to_thread(st.ctl, "status")
        self.phase = "normal"

        first_ok = round(self.first_ok_in_failover - t_kill, 2) if self.first_ok_in_failover else None
        self.figures["primary_kill"] = {
            "old_primary_port": old_port,
            "new_primary_port": new_port,
            "running_at_kill": running,
            "promoted_after_s": promoted_s,
            "harness_client_followed_after_s": harness_s,
            "old_primary_restarted_after_s": back["restarted"],
            "old_primary_demoted_after_s": back["demoted"],
            "old_primary_in_sync_after_s": back["in_sync"],
            "every_worker_wrote_heartbeat_after_s": workers_s,
            "worker_heartbeats_after_s": renewed_at,
            "every_api_healthy_after_s": apis_s,
            "apis_healthy_after_s": healthy_at,
            # The unavailability window: from the SIGKILL to the first submit
            # sent after it and acknowledged (with REDIS_MIN_REPLICAS_ACK, replicated).
            "first_submit_ok_after_s": first_ok if submit_s is not None else None,
            "healthz": {short: dict(Counter(str(code) for _, code in seen)) for short, seen in health.items()},
            "healthz_first_503_s": {short: next((t for t, c in seen if c == 503), None) for short, seen in health.items()},
            "ctl_status_exit": ctl.returncode,
        }
        for short, seen in health.items():
            if not any(c == 503 for _, c in seen):
                self.failures.append(f"{short}'s /healthz never answered 503 during the failover: {dict(Counter(str(c) for _, c in seen))}")
        if ctl.returncode != 0:
            self.failures.append(f"script-runner-ctl status after the failover exited {ctl.returncode}: {(ctl.stderr or ctl.stdout)[-500:]}")
        ok = len(self.failures) == failures_before
        log(f"failover {'done' if ok else 'INCOMPLETE'}: promoted {promoted_s} s, first submit {first_ok} s, workers {workers_s} s, "
            f"apis {apis_s} s after the kill; old primary a replica in sync {back['in_sync']} s")  # fmt: skip

    async def api_kill(self) -> None:
        st = self.stack
        st.apis["api1"].proc.kill()
        self.phase = "api-killed"
        self.injected["api-kill"].set()
        log("SIGKILLed api1; clients go on through the proxy")

    async def controller(self) -> None:
        run = {
            "worker-kill": self.worker_kill,
            "worker-term": self.worker_term,
            "redis-kill": self.redis_kill,
            "primary-kill": self.primary_kill,
            "api-kill": self.api_kill,
        }
        for f in self.faults:
            await self.wait_gate(f)
            await run[f]()

    # ------------------------------------------------------------------ checks

    async def final_checks(self) -> None:
        st = self.stack
        assert self.mcp is not None and self.starts is not None
        starts_seen = self.starts
        # Each task as a client sees it now, through the proxy.
        for task in self.tasks.values():
            for _ in range(20):
                try:
                    res = await self.mcp.call("get_task_status", {"task_id": task.task_id})
                    break
                except Unreachable:
                    await asyncio.sleep(0.5)
            else:
                self.failures.append(f"task {task.task_id}: no answer in the final pass")
                continue
            if res.is_error:
                if classify_tool_error(res.text) == "unknown-task":
                    task.vanished += 1
                    task.final = None
                else:
                    self.failures.append(f"task {task.task_id}: final pass error {res.text}")
                continue
            assert res.structured is not None
            self.observe(task, res.structured)
        # Every record under the prefix, including tasks no client was told about
        # (a retried submit whose first answer was lost).
        head = st.keys.task("")
        all_ids = sorted({k[len(head) :] async for k in st.aredis.scan_iter(match=f"{head}*", count=1000) if ":" not in k[len(head) :]})
        records = {}
        for tid in all_ids:
            records[tid] = await st.aredis.hgetall(st.keys.task(tid))
        orphans = [tid for tid in all_ids if tid not in self.tasks and tid not in self.chain_ids]
        # Container starts, from docker events: wait until every task that says it
        # started has been seen (the event stream lags a little).
        def runs(tid: str) -> list[str]:
            return starts_seen.runs(tid, records.get(tid, {}).get("command", ""))

        async def events_caught_up() -> bool:
            return all(runs(tid) for tid, r in records.items() if r.get("started_at"))

        try:
            await wait_for("docker events for every started task", events_caught_up, 20)
        except TimeoutError as e:
            self.failures.append(str(e))
        await starts_seen.stop()

        async def no_containers() -> bool:
            return not await asyncio.to_thread(st.containers, False)

        try:
            await wait_for("every task container to be removed", no_containers, 60)
        except TimeoutError:
            self.failures.append(f"task containers left behind: {st.containers(idle_pool=False)}")

        async def stream_empty() -> bool:
            return await st.aredis.xlen(st.keys.jobs()) == 0

        try:
            await wait_for("the jobs stream to be empty", stream_empty, 60)
        except TimeoutError:
            self.failures.append(f"jobs stream not empty at the end: XLEN {await st.aredis.xlen(st.keys.jobs())}")

        # --- the figures
        handed = list(self.tasks.values())
        terminal = [t for t in handed if t.final and t.final["state"] in FINAL_STATES]
        lost = [t for t in handed if t.vanished and t.task_id not in records]
        regressed = [t for t in handed if t.regressions]
        starts = {tid: len(runs(tid)) for tid in records}
        twice = {tid: runs(tid) for tid, n in starts.items() if n > 1}
        never_started = [tid for tid, n in starts.items() if n == 0]
        # A cold run's container was made for its task (and carries its label).
        cold = sum(1 for tid in records if starts_seen.by_task.get(tid))
        warm = sum(1 for tid in records if runs(tid) and not starts_seen.by_task.get(tid))
        outcomes = Counter((r.get("state"), r.get("reason_kind")) for r in records.values())
        wrong_output = []
        for t in handed:
            if t.final and t.final["state"] == "succeeded":
                _, expected = command_for(t.index)
                if t.final.get("stdout_tail") != expected:
                    wrong_output.append(t.task_id)
        # Two records for one submission index: a retried submit made a second task.
        idx_of = {}
        for tid, r in records.items():
            if tid in self.chain_ids:
                continue
            cmd = r.get("command", "")
            idx_of[tid] = int(cmd.split()[2].rstrip(";")) if cmd.startswith("echo start ") else -1
        per_index = Counter(idx_of.values())
        duplicate_submits = sum(n - 1 for n in per_index.values() if n > 1)

        # --- checks
        if self.failed_submits:
            self.failures.append(f"{len(self.failed_submits)} submission(s) failed for good: {self.failed_submits[:3]}")
        if len(handed) != self.n:
            self.failures.append(f"{self.n - len(handed)} task(s) never got a task_id")
        not_terminal = [t.task_id for t in handed if t not in terminal]
        # Without replica acknowledgements a failover may lose what the old
        # primary acknowledged and had not yet sent to the replica: a submit
        # (the task unknown afterwards), a claim (the task queued again, maybe
        # run twice) or an end (the task running again, then settled "lost
        # track"). That is the loss window measured here: reported, each kind
        # counted, not a failure. With acknowledgements, each is a failure.
        loss_measured = "primary-kill" in self.faults and not self.args.min_replicas_ack
        loss: dict[str, Any] = {}
        if loss_measured:
            kill = self.t_primary_kill or 0.0
            loss["lost"] = len(lost)
            loss["acknowledged_before_kill_ms"] = sorted(round((kill - t.acked_at) * 1000) for t in lost)
            loss["task_ids"] = [t.task_id for t in lost]
            lost_ids = {t.task_id for t in lost}
            not_terminal = [tid for tid in not_terminal if tid not in lost_ids]
            loss["not_terminal"] = not_terminal
            loss["went_back"] = {t.task_id: t.regressions for t in regressed if t.task_id not in lost_ids}
            loss["started_twice"] = dict(twice)
            self.figures["loss_window"] = loss
        else:
            if lost:
                self.failures.append(f"{len(lost)} task(s) lost (unknown after they had a task_id): {[t.task_id for t in lost[:5]]}")
            if not_terminal:
                self.failures.append(f"{len(not_terminal)} task(s) not terminal: {not_terminal[:5]}")
            if regressed:
                self.failures.append(f"{len(regressed)} task(s) went back to an earlier state: {[(t.task_id, t.regressions) for t in regressed[:5]]}")
            if twice:
                self.failures.append(f"{len(twice)} task(s) started twice: {list(twice.items())[:5]}")
        # The duplicate check only means something if every run is seen.
        unseen = [tid for tid, r in records.items() if r.get("state") == "succeeded" and not starts[tid]]
        if unseen:
            self.failures.append(
                f"{len(unseen)} succeeded task(s) whose container start docker events never reported "
                f"(a container started or renamed for it that outlived the handoff): {unseen[:5]}"
            )
        if wrong_output:
            self.failures.append(f"{len(wrong_output)} succeeded task(s) with wrong output: {wrong_output[:5]}")
        for tid in orphans:
            if records[tid].get("state") not in FINAL_STATES:
                self.failures.append(f"orphan task {tid} (created by a retried submit) is not terminal")
        unexpected = self.errors.total("unexpected-tool-error") + self.errors.total("protocol-error")
        if unexpected:
            self.failures.append(f"{unexpected} unexpected error answer(s): {self.errors.samples}")

        expected_lost: set[str] = set()
        if "worker-kill" in self.faults:
            c = self.kill_classes
            expected_lost = set(c["running"]) | set(c["claimed-start-not-recorded"])
            if not c["running"]:
                self.failures.append("w1 was running no task when SIGKILLed")
            for tid in expected_lost:
                r = records.get(tid, {})
                if (r.get("state"), r.get("reason_kind"), r.get("reason")) != ("killed", "worker-lost", "worker lost"):
                    self.failures.append(f"w1's running task {tid} ended {r.get('state')} {r.get('reason_kind')} {r.get('reason')!r}, expected killed \"worker lost\"")
                api_says = self.tasks[tid].final if tid in self.tasks else None
                if api_says and api_says.get("reason") != "worker lost":
                    self.failures.append(f"get_task_status of w1's task {tid} says {api_says.get('reason')!r}")
            ran_elsewhere = {}
            for tid in c["read-not-claimed"]:
                r = records.get(tid, {})
                ran_elsewhere[tid] = r.get("worker")
                if r.get("state") != "succeeded" or starts.get(tid) != 1:
                    self.failures.append(f"w1's read-but-unclaimed job {tid} ended {r.get('state')} with {starts.get(tid, 0)} start(s), expected succeeded once")
            self.figures["worker_kill"]["read_not_claimed_ran_on"] = sorted({w or "?" for w in ran_elsewhere.values()})
            if self.figures["worker_kill"]["w1_containers_left_after_reap"]:
                self.failures.append("w1's containers were still there after the reaper forgot it")
        if "worker-term" in self.faults:
            for tid in self.term_running:
                r = records.get(tid, {})
                if r.get("state") != "succeeded":
                    self.failures.append(f"w2's task {tid} ended {r.get('state')} {r.get('reason')!r} after SIGTERM (grace {self.args.grace} s), expected succeeded")
        # Only w1 died: a reaper that settled or forgot any other worker took a
        # live one for dead (the workers log each).
        live_reaped = Counter()
        for w in st.workers.values():
            for line in w.proc.log_path.read_text(errors="replace").splitlines():
                m = re.search(r"(settling the jobs of a lost worker|lost worker forgotten) worker=(\S+)", line)
                if m and m.group(2) != st.workers["w1"].name:
                    live_reaped[m.group(2)] += 1
        if live_reaped:
            self.failures.append(f"live worker(s) taken for dead by a reaper: {dict(live_reaped)}")
        # A submit Redis could not confirm on enough replicas is withdrawn (killed
        # "not-replicated", so no worker runs it) and its client told to try
        # again: a record no client was given, never run.
        withdrawn = {tid for tid in orphans if records[tid].get("reason_kind") == "not-replicated"}
        for tid in withdrawn:
            if records[tid].get("state") != "killed" or starts.get(tid):
                self.failures.append(f"withdrawn submit {tid} ended {records[tid].get('state')} with {starts.get(tid, 0)} run(s), expected killed, never run")
        expected_lost |= withdrawn
        # Anything else must have succeeded: no fault but w1's death may end a task otherwise.
        for tid, r in records.items():
            if tid not in expected_lost and r.get("state") != "succeeded" and loss_measured:
                loss.setdefault("ended_otherwise", {})[tid] = f"{r.get('state')} {r.get('reason_kind')} {r.get('reason')!r}"
            elif tid not in expected_lost and r.get("state") != "succeeded":
                self.failures.append(f"task {tid} ended {r.get('state')} {r.get('reason_kind')} {r.get('reason')!r}")
        if "redis-kill" in self.faults:
            during = self.errors.total(phase="redis-down", call="submit")
            clear = self.errors.total(kind="store-unavailable", phase="redis-down", call="submit")
            self.figures["redis_kill"]["submits_refused_during_outage"] = during
            self.figures["redis_kill"]["of_which_store_error_text"] = clear
            self.figures["redis_kill"]["slowest_store_error_answer_s"] = round(self.errors.max_store_error_latency, 2)
            if during == 0:
                self.failures.append("no submit was tried during the Redis outage")
            if during != clear:
                self.failures.append(f"{during - clear} submit(s) during the Redis outage got something other than the store's error")
        if "primary-kill" in self.faults:
            kinds: Counter[str] = Counter()
            for (p, c, k), n in self.errors.counts.items():
                if p in FAILOVER_PHASES and c == "submit":
                    kinds[k] += n
            fig = self.figures.setdefault("primary_kill", {})
            fig["submits_refused_during_failover"] = dict(kinds)
            fig["try_again_answers"] = kinds["store-unavailable"]
            fig["slowest_store_error_answer_s"] = round(self.errors.max_store_error_latency, 2)
            if sum(kinds.values()) == 0:
                self.failures.append("no submit was refused during the failover (none tried, or the failover went unseen)")
            other = {k: n for k, n in kinds.items() if k not in ("store-unavailable", "at-capacity", "unreachable")}
            if other:
                self.failures.append(f"submits during the failover got something other than the store's 'try again' error: {other}")
        if "api-kill" in self.faults:
            self.figures["api_kill"] = {
                "client_errors_after_kill": self.errors.total(phase="api-killed", kind="unreachable"),
                "all_retried": True,
            }

        total = time.monotonic() - self.t0
        self.figures |= {
            "tasks": self.n,
            "task_ids_handed_out": len(handed),
            "terminal": len(terminal),
            "lost": len(lost),
            "state_regressions": len(regressed),
            "started_twice": len(twice),
            "records_in_redis": len(records),
            "orphan_tasks_from_retried_submits": len(orphans),
            "withdrawn_submits": len(withdrawn),
            "duplicate_submissions": duplicate_submits,
            "never_started": len(never_started),
            "started_warm": warm,
            "started_cold": cold,
            # A container handed its task that died at once: its prelude never
            # took it (dead idle, or its worker died first); the task ran elsewhere.
            "warm_starts_refused": len(starts_seen.refused),
            "warm_starts_refused_by": dict(Counter(w for _, w in starts_seen.refused)),
            "live_workers_reaped": sum(live_reaped.values()),
            "outcomes": {f"{s}/{k}": n for (s, k), n in sorted(outcomes.items(), key=str)},
            "client_errors": {f"{p}/{c}/{k}": n for (p, c, k), n in sorted(self.errors.counts.items())},
            "error_samples": self.errors.samples,
            "unreachable_errors": self.errors.unreachable,
            "total_s": round(total, 1),
            "settings": {
                "workers": self.args.workers,
                "concurrency": self.args.concurrency,
                "heartbeat_s": self.args.heartbeat,
                "grace_s": self.args.grace,
                "max_queued": self.args.max_queued,
                "appendfsync": self.args.appendfsync,
                "redis_outage_s": self.args.redis_outage,
                "sentinel": self.args.sentinel,
                "min_replicas_ack": self.args.min_replicas_ack,
                "replicas": self.args.replicas if self.args.sentinel else 0,
                "old_primary_back": self.args.old_primary_back,
                "clients": self.args.clients,
                "binaries": str(self.args.bin_dir),
                "faults": self.faults,
                "pool_size": self.args.pool_size or "worker default",
            },
        }

    def summary(self) -> None:
        f = self.figures
        print()
        if f["settings"]["sentinel"]:
            print(f"Redis: a primary, {f['settings']['replicas']} replica(s), three sentinels; REDIS_MIN_REPLICAS_ACK {f['settings']['min_replicas_ack']}")
        print(f"faults under load: {f['tasks']} tasks, {f['settings']['workers']} workers x {f['settings']['concurrency']} slots, "
              f"POOL_SIZE {f['settings']['pool_size']}, "
              f"heartbeat {f['settings']['heartbeat_s']} s, appendfsync {f['settings']['appendfsync']}, "
              f"MAX_QUEUED_TASKS {f['settings']['max_queued']}, {f['settings']['clients']} submitting clients")  # fmt: skip
        rows: list[tuple[str, Any]] = [
            ("task_ids handed out", f["task_ids_handed_out"]),
            ("terminal", f["terminal"]),
            ("lost", f["lost"]),
            ("went back to an earlier state", f["state_regressions"]),
            ("started twice", f["started_twice"]),
            ("started warm (pool container) / cold (new container)", f"{f['started_warm']} / {f['started_cold']}"),
            ("handoffs never taken (died at once; run elsewhere)", f"{f['warm_starts_refused']} {f['warm_starts_refused_by']}"),
            ("never started (ended before a container)", f["never_started"]),
            ("extra tasks from retried submits", f"{f['orphan_tasks_from_retried_submits']} ({f['withdrawn_submits']} withdrawn: not replicated, client told to try again)"),
            ("outcomes (state/reason_kind)", ", ".join(f"{k} {v}" for k, v in f["outcomes"].items())),
        ]
        if "worker_kill" in f:
            w = f["worker_kill"]
            rows.append(("w1 SIGKILL: jobs it held", ", ".join(f"{k} {v}" for k, v in w["classes"].items()) + f" (read-not-claimed injected: {w['injected_read_not_claimed']})"))
            rows.append(("w1: settled and forgotten after", f"{w['settled_and_forgotten_after_s']} s (read-not-claimed ran on {w.get('read_not_claimed_ran_on')})"))
        if "worker_term" in f:
            w = f["worker_term"]
            rows.append(("w2 SIGTERM", f"{w['running_at_signal']} running, exit code {w['exit_code']} after {w['exited_after_s']} s"))
        if "redis_kill" in f:
            r = f["redis_kill"]
            rows.append(("Redis SIGKILL: outage", f"{r['outage_s']} s (down {r['down_s']} s, then restart and AOF load {r['aof_load_s']} s); /healthz meanwhile {r['healthz_during_outage']}"))
            rows.append(("submits refused during outage", f"{r['submits_refused_during_outage']} ({r['of_which_store_error_text']} with the store's 'try again shortly' error; slowest answer {r['slowest_store_error_answer_s']} s)"))
            rows.append(("recovery after restart", f"api healthy {r['api_healthy_after_restart_s']} s, workers {r['workers_heartbeating_after_restart_s']} s, first submit {r['first_submit_ok_after_restart_s']} s"))
        if "primary_kill" in f:
            r = f["primary_kill"]
            rows.append(("primary SIGKILL: unavailable for", f"{r.get('first_submit_ok_after_s')} s (to the first submit sent after the kill and acknowledged)"))
            rows.append(("  sentinels promoted the replica", f"{r.get('promoted_after_s')} s; harness client followed {r.get('harness_client_followed_after_s')} s"))
            rows.append(("  writing to the new primary", f"every worker {r.get('every_worker_wrote_heartbeat_after_s')} s {r.get('worker_heartbeats_after_s')}, every api healthy {r.get('every_api_healthy_after_s')} s {r.get('apis_healthy_after_s')}"))
            rows.append((f"  old primary restarted ({f['settings']['old_primary_back']}) / a replica / in sync",
                         f"{r.get('old_primary_restarted_after_s')} / {r.get('old_primary_demoted_after_s')} / {r.get('old_primary_in_sync_after_s')} s"))
            rows.append(("  /healthz meanwhile", f"{r.get('healthz')} (first 503 at {r.get('healthz_first_503_s')} s)"))
            rows.append(("  submits refused meanwhile", f"{r.get('submits_refused_during_failover')} ({r.get('try_again_answers')} 'try again'; slowest answer {r.get('slowest_store_error_answer_s')} s)"))
            rows.append(("  tasks running at the kill", f"{r.get('running_at_kill')} (all must succeed)"))
        if "loss_window" in f:
            lw = f["loss_window"]
            rows.append(("LOST without replica acks (loss window)", f"{lw['lost']} task_id(s) handed out and unknown after the failover"
                         + (f", acknowledged {lw['acknowledged_before_kill_ms']} ms before the kill" if lw["lost"] else "")))
            effects = (f"not terminal {len(lw['not_terminal'])}, went back {len(lw['went_back'])}, "
                       f"started twice {len(lw['started_twice'])}, ended other than succeeded {len(lw.get('ended_otherwise', {}))}")
            rows.append(("  other transitions lost", effects))
        if "api_kill" in f:
            rows.append(("api1 SIGKILL: client errors, retried", f["api_kill"]["client_errors_after_kill"]))
        if "workspaces" in f:
            w = f["workspaces"]
            rows.append((f"workspaces ({w['chains']} chains, {w['tasks']} tasks): versions made / lost / half-written",
                         f"{w['versions_made']} / {w['versions_lost']} / {w['versions_half_written']}"))
            rows.append(("  tasks that made no version", f"{w['tasks_without_version']} {w['why_none'] or ''}"))
        rows.append(("client errors by phase/call/kind", ", ".join(f"{k} {v}" for k, v in f["client_errors"].items()) or "none"))
        rows.append(("total time", f"{f['total_s']} s"))
        print_table(rows)
        if self.failures:
            print(f"\nFAILED: {len(self.failures)} check(s)")
            for msg in self.failures[:40]:
                print(f"  - {msg}")
        else:
            print("\nall checks passed")

    # ------------------------------------------------------------------ main

    async def run(self) -> int:
        try:
            await self.start()
            self.t0 = time.monotonic()
            clients = [asyncio.create_task(self.submitter()) for _ in range(self.args.clients)]
            clients += [asyncio.create_task(self.workspace_chain(c)) for c in range(self.args.workspaces)]
            pollers = [asyncio.create_task(self.poller(k, self.args.pollers)) for k in range(self.args.pollers)]
            controller = asyncio.create_task(self.controller())
            await asyncio.wait_for(asyncio.gather(controller, *clients, *pollers), self.args.deadline)
            await self.final_checks()
            if self.chains:
                await self.workspace_checks()
        except (TimeoutError, asyncio.TimeoutError) as e:
            self.failures.append(f"run did not finish: {e or 'deadline'} (--deadline {self.args.deadline} s)")
            self.dump_state()
        finally:
            if self.starts is not None:
                await self.starts.stop()
            if self.mcp:
                await self.mcp.close()
            await self.stack.aclose()
            left = await asyncio.to_thread(self.stack.stop_all)
            if left:
                log(f"removed {len(left)} container(s) left behind")
        if "tasks" in self.figures:
            self.summary()
            if self.args.json:
                Path(self.args.json).write_text(json.dumps(self.figures | {"failures": self.failures}, indent=2))
        else:
            print("\n".join(f"FAILED: {m}" for m in self.failures))
        self.stack.cleanup(keep=self.args.keep or bool(self.failures))
        return 1 if self.failures else 0

    def dump_state(self) -> None:
        stuck = [t for t in self.tasks.values() if not t.final]
        log(f"{len(self.tasks)} handed out, {len(stuck)} not final, phase {self.phase}, done {len(self.done_indices)}/{self.n}")
        for t in stuck[:10]:
            log(f"  {t.task_id} #{t.index}: {t.states}")
        for p in self.stack.all_procs():
            log(f"--- {p.name} (alive {p.alive()}) ---\n{p.log_tail(15)}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--tasks", type=int, default=300, help="short tasks to submit (default 300)")
    p.add_argument("--workers", type=int, default=3, help="workers on this host (default 3; at least 3)")
    p.add_argument("--concurrency", type=int, default=2, help="WORKER_CONCURRENCY of each (default 2: two cores)")
    p.add_argument("--heartbeat", type=int, default=3, help="WORKER_HEARTBEAT_SECONDS (default 3)")
    p.add_argument("--grace", type=int, default=10, help="SHUTDOWN_GRACE_SECONDS (default 10)")
    p.add_argument("--max-queued", type=int, default=0, help="MAX_QUEUED_TASKS (default: twice the slots)")
    p.add_argument("--clients", type=int, default=6, help="concurrent submitting clients (default 6)")
    p.add_argument("--pollers", type=int, default=3, help="concurrent status pollers (default 3)")
    p.add_argument("--redis-outage", type=float, default=5.0, help="seconds Redis stays down (default 5)")
    p.add_argument("--appendfsync", choices=("everysec", "always"), default="everysec", help="Redis AOF fsync policy (default everysec, as deployed)")
    p.add_argument("--faults", default=",".join(DEFAULT_FAULTS), help=f"comma-separated subset of {','.join(FAULTS)} (default {','.join(DEFAULT_FAULTS)})")
    p.add_argument("--sentinel", action="store_true", help="Redis as a primary, one replica and three sentinels (implied by primary-kill)")
    p.add_argument("--replicas", type=int, default=1, help="replicas with --sentinel (default 1)")
    p.add_argument("--old-primary-back", choices=("after-switch", "at-once"), default="after-switch",
                   help="primary-kill: start the old primary again once every worker and api write to the new one "
                        "(default), or as soon as the sentinels name the new one (a restart policy; races the binaries' "
                        "next look at the sentinels)")
    p.add_argument("--min-replicas-ack", type=int, default=None,
                   help="REDIS_MIN_REPLICAS_ACK of api and workers (default 1 with --sentinel, else unset); 0 with primary-kill measures the loss window")
    p.add_argument("--workspaces", type=int, default=2, help="workspace chains run beside the tasks (default 2; 0: none)")
    p.add_argument("--deadline", type=float, default=900, help="abort (and fail) after this many seconds (default 900)")
    p.add_argument("--json", help="write the figures to this file")
    a = p.parse_args(argv)
    a.faults = [f.strip() for f in a.faults.split(",") if f.strip()]
    bad = [f for f in a.faults if f not in FAULTS]
    if bad:
        p.error(f"unknown fault(s) {bad}; known: {FAULTS}")
    if "primary-kill" in a.faults and "redis-kill" in a.faults:
        p.error("primary-kill and redis-kill do not go in one run: one fails over to the replica, the other restarts the one Redis in place")
    a.sentinel = a.sentinel or "primary-kill" in a.faults
    if a.min_replicas_ack is None:
        a.min_replicas_ack = 1 if a.sentinel else 0
    if a.min_replicas_ack and not a.sentinel:
        p.error("--min-replicas-ack needs a replica: add --sentinel")
    if a.sentinel and a.replicas < 1:
        p.error("--replicas must be at least 1 (the one promoted)")
    if a.workers < 3:
        p.error("--workers must be at least 3 (w1 is killed, w2 stopped, w3 stays)")
    if a.max_queued <= 0:
        a.max_queued = 2 * a.workers * a.concurrency
    return a


def main() -> int:
    return run_main(FaultRun(parse_args(sys.argv[1:])).run)


if __name__ == "__main__":
    sys.exit(main())
