#!/usr/bin/env python3
"""script-runner's benchmark: every figure beside a baseline measured in the same run.

Run it through scripts/bench.sh, which installs what it needs and builds the
binaries. It starts its own stack (a redis-server on a free port with AOF fsync
every second, release workers and apis on free ports, a Redis key prefix and
worker names unique to the run, the task firewall on as by default) and measures:

  e2e     `echo hi` from run_script until a get_task_status poll sees `succeeded`,
          through the official MCP Python SDK, for each worker configuration
          (pool off: POOL_SIZE=0 and EGRESS_POOL_SIZE=0; pool on: --pool for both), against
          `docker run --rm <image> sh -c 'echo hi'` on the default bridge (the floor).
          Samples are interleaved (floor, off, on, rotating), each taken when the
          worker is idle and its pool full.
  onecall `echo hi` in one run_script call with wait_seconds (the answer is the
          result), interleaved the same way (with e2e: in the same rotation).
  egress  the same one call with network {"allow": ["pypi.org"]}: an allow-list
          task, on the egress network with its proxy lease (pool on: a container
          of the egress pool, EGRESS_POOL_SIZE, as large as POOL_SIZE);
          interleaved in the same rotation.
  shapes  ComputeSDK's shapes, each --shapes-n one-call `echo hi` tasks per
          configuration: sequential, staggered (--stagger-ms apart) and burst
          (all at once); time to first command (call to result, client) and
          submit -> process started (the record's times), beside the peers'
          published figures.
  burst   --burst trivial tasks at WORKER_CONCURRENCY=--concurrency per
          configuration, against as many `docker run --rm` at that parallelism:
          tasks/s, from the records' own timestamps (Redis's clock). A second
          floor runs the same `docker run --rm` on a bridge network of the task
          network's kind (user-defined, inter-container traffic off): what the
          engine alone costs per container there, which the service cannot beat.
  api     with wrk: run_script at 1 and 32 connections, get_task_status at 1 and 64
          (random ids among finished tasks), GET /healthz (an HTTP round trip plus
          one Redis PING: the floor of any request) at the same connections; the
          api's resident memory idle and under load, and CPU time per request of
          api, Redis and wrk (they share the machine's cores).
  replication  what REDIS_MIN_REPLICAS_ACK=1 costs run_script (wrk at 1 and 32
          connections, an api with it and one without, alternating, against one
          primary with a replica on this host), and Redis's own cost per task:
          commands and CPU time of the task's whole life through the real Lua
          scripts (fill.py), against one PING's.
  growth  Redis memory per finished task (real tasks from the burst, and tasks
          written through the real Lua scripts by fill.py) and get_task_status with
          --fill finished tasks stored, against the same with --fill-base stored.

Tests never assert on these timings; `--quick` runs everything at a tiny size
(CI runs it, against debug binaries) to prove the tool still works.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from redis import Redis

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the shared harness package
from fill import Filler  # noqa: E402
from harness.keys import FINAL_STATES as FINAL  # noqa: E402
from harness.keys import STAT_SUBMITTED, Keys  # noqa: E402
from harness.mcp_http import ProtocolError, Unreachable, call_once, tools_call  # noqa: E402
from harness.procs import HarnessError, Proc, free_port, wait_until  # noqa: E402
from harness.stack import CTL_BIN, LABEL_WORKER, Api, Stack, Worker, containers_of, preflight  # noqa: E402

HERE = Path(__file__).resolve().parent
WRK_LUA = HERE / "wrk.lua"
ECHO_HI = "echo hi"
SECTIONS = ("e2e", "onecall", "egress", "shapes", "burst", "api", "growth", "replication")
# The sections that run tasks (workers, the floor, the image).
SERVICE_SECTIONS = {"e2e", "onecall", "egress", "shapes", "burst"}
# run_script's and get_task_status's wait_seconds cap (api/src/config.rs MAX_WAIT_SECONDS).
WAIT_CAP = 30
CLK_TCK = os.sysconf("SC_CLK_TCK")
# A record of a real `echo hi` task, once one ran: the fill's records are checked against it.
REAL_RECORD: dict[str, dict[str, str]] = {}


class BenchError(HarnessError):
    """Something the benchmark needs failed; the message says what."""


# --------------------------------------------------------------------------- statistics


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(p / 100 * len(v) + 0.5)) - 1))]


@dataclass
class Dist:
    """min / median / p99 of samples, in the unit given."""

    samples: list[float]
    unit: str

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def row(self) -> str:
        s = self.samples
        return f"{fmt(min(s))} {fmt(self.median)} {fmt(pct(s, 99))}"

    def as_json(self) -> dict[str, Any]:
        s = self.samples
        return {"unit": self.unit, "n": len(s), "min": min(s), "median": self.median, "p99": pct(s, 99)}


def fmt(x: float) -> str:
    if x >= 1000:
        return f"{x:9.0f}"
    if x >= 10:
        return f"{x:9.1f}"
    return f"{x:9.2f}"


class Report:
    """Prints sections as they are measured and keeps every figure for --json."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.lines: list[str] = []

    def out(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def section(self, title: str) -> None:
        self.out()
        self.out(f"== {title}")

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value


# --------------------------------------------------------------------------- process figures


class RssSampler:
    """Samples VmRSS of some processes every `interval` s while running."""

    def __init__(self, procs: dict[str, Proc], interval: float = 0.05) -> None:
        self.procs = procs
        self.interval = interval
        self.samples: dict[str, list[int]] = {n: [] for n in procs}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, p in self.procs.items():
                if (kib := p.rss_kib()) is not None:
                    self.samples[name].append(kib)
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def peak_mib(self, name: str) -> float:
        return max(self.samples[name]) / 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def mib(kib: int | None) -> float:
    if kib is None:
        raise BenchError("a process the benchmark measures is no longer running")
    return kib / 1024


# --------------------------------------------------------------------------- wrk


@dataclass
class WrkResult:
    conns: int
    requests: int
    seconds: float
    errors: dict[str, int]
    latency_ms: dict[str, float]
    cpu_ms_per_req: dict[str, float] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    def row(self) -> str:
        lat = self.latency_ms
        return f"{fmt(lat['min'])} {fmt(lat['p50'])} {fmt(lat['p99'])}  {self.rps:8.0f}/s"

    def as_json(self) -> dict[str, Any]:
        return {
            "connections": self.conns,
            "requests": self.requests,
            "seconds": self.seconds,
            "requests_per_second": self.rps,
            "latency_ms": self.latency_ms,
            "errors": self.errors,
            "cpu_ms_per_request": self.cpu_ms_per_req,
        }


def run_wrk(
    url: str,
    conns: int,
    seconds: float,
    tmp: Path,
    env: dict[str, str],
    cpu_of: dict[str, int],
) -> WrkResult:
    """wrk with --latency against `url`; `env` configures wrk.lua. `cpu_of`: the
    processes whose CPU time per request is reported (wrk's own is added)."""
    out = tmp / f"wrk-{time.monotonic_ns()}.json"
    threads = 1 if conns == 1 else min(conns, os.cpu_count() or 2)
    argv = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--latency", "-s", str(WRK_LUA), url]
    before = {n: cpu_seconds(pid) for n, pid in cpu_of.items()}
    proc = subprocess.Popen(
        argv,
        env=os.environ | env | {"BENCH_OUT": str(out)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    text = proc.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0 or not out.exists():
        raise BenchError(f"wrk failed (exit {proc.returncode}): {' '.join(argv)}\n{text}")
    data = json.loads(out.read_text())
    res = WrkResult(
        conns=conns,
        requests=data["requests"],
        seconds=data["duration_us"] / 1e6,
        errors=data["errors"],
        latency_ms={k: v / 1000 for k, v in data["latency_us"].items()},
    )
    if res.requests == 0:
        raise BenchError(f"wrk made no request: {' '.join(argv)}\n{text}")
    cpu = {n: cpu_seconds(pid) - before[n] for n, pid in cpu_of.items()}
    cpu["wrk"] = usage.ru_utime + usage.ru_stime
    res.cpu_ms_per_req = {n: c * 1000 / res.requests for n, c in cpu.items()}
    bad = {k: v for k, v in res.errors.items() if v}
    if bad:
        raise BenchError(f"wrk saw errors {bad} in {res.requests} requests against {url}\n{text}")
    return res


def post_once(api: Api, token: str, body: str) -> dict[str, Any]:
    """One POST /mcp exactly as wrk sends it (no initialize before: the transport
    is stateless); returns the tool's structuredContent, failing on any error."""
    try:
        result = call_once(api.mcp_url, token, body, timeout=10)
    except (Unreachable, ProtocolError) as e:
        raise BenchError(f"POST /mcp without initialize did not return a tool result: {e}") from e
    if result.is_error or result.structured is None:
        raise BenchError(f"POST /mcp without initialize did not return a tool result: {result.text[:500]}")
    return result.structured


# --------------------------------------------------------------------------- configurations


class HttpTimes:
    """When each request of an httpx client went out and its answer's headers
    came back (perf_counter seconds), from the client's event hooks: what a
    call spends in the SDK rather than on the wire and in the server."""

    def __init__(self) -> None:
        self.sent: list[float] = []
        self.answered: list[float] = []

    async def on_request(self, _request: Any) -> None:
        self.sent.append(time.perf_counter())

    async def on_response(self, _response: Any) -> None:
        self.answered.append(time.perf_counter())

    def mark(self) -> tuple[int, int]:
        return len(self.sent), len(self.answered)

    def sdk_ms(self, mark: tuple[int, int], t0: float, t1: float) -> float | None:
        """For one call from t0 to t1 that made exactly one request since
        `mark`: (first request out - t0) + (t1 - its answer's headers)."""
        sent, answered = self.sent[mark[0] :], self.answered[mark[1] :]
        if len(sent) != 1 or len(answered) != 1:
            return None
        return ((sent[0] - t0) + (t1 - answered[0])) * 1000



@dataclass
class Config:
    """A worker configuration measured against the floor: its own Redis prefix,
    worker and api, so several run side by side on one Redis."""

    label: str
    worker_env: dict[str, str]
    pool_expected: int
    worker: Worker | None = None
    api: Api | None = None
    pool_active: bool = False
    client: Client | None = None
    http_times: HttpTimes = field(default_factory=HttpTimes)

    @property
    def prefix(self) -> str:
        assert self.api is not None
        return self.api.prefix


def parse_pool(spec: str) -> int:
    """Containers a POOL_SIZE value asks for in all (e.g. python3.13=2,node24=1)."""
    total = 0
    for part in filter(None, (p.strip() for p in spec.split(","))):
        _, _, n = part.rpartition("=")
        total += int(n)
    return total


def wait_settled(cfg: Config, deadline: float = 60.0) -> None:
    """Until the worker holds only its pool (no task container left) and the pool
    is full: every sample starts from the same state."""
    assert cfg.worker is not None
    want = cfg.pool_expected if cfg.pool_active else 0
    name = cfg.worker.name

    def settled() -> bool:
        # Counting containers is not enough: a used one not yet removed and a
        # refill not yet created add up to a full pool. Every container must be
        # an idle pool container (named so until a claim renames it), running.
        rows = subprocess.run(
            ["docker", "ps", "-a", "--filter", f"label={LABEL_WORKER}={name}", "--format", "{{.Names}} {{.State}}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
        rows = [r.split() for r in rows if r.strip()]
        return len(rows) == want and all(n.startswith(POOL_PREFIX) and st == "running" for n, st in rows)

    wait_until(f"{cfg.label}: {want} idle running pool container(s) of worker {name}", settled, cfg.worker.proc, deadline)


def detect_pool(cfg: Config, rep: Report) -> None:
    """Waits for the pool to fill. A worker that starts no pool container within
    10 s is taken as one without a pool (a build that ignores POOL_SIZE)."""
    assert cfg.worker is not None
    if cfg.pool_expected == 0:
        return
    start = time.monotonic()
    while time.monotonic() - start < 10:
        if containers_of(cfg.worker.name):
            break
        time.sleep(0.2)
    else:
        rep.out(
            f"NOTE {cfg.label}: the worker started no pool container in 10 s with "
            f"POOL_SIZE={cfg.worker_env.get('POOL_SIZE')}: this build has no warm pool, so "
            f"'{cfg.label}' measures a cold worker."
        )
        return
    cfg.pool_active = True
    wait_settled(cfg, 120.0)
    rep.out(f"{cfg.label}: pool full ({cfg.pool_expected} containers) after {time.monotonic() - start:.1f} s")


def scrape(worker: Worker) -> dict[str, float]:
    """The worker's Docker call latency sums and counts (worker/src/metrics.rs)."""
    assert worker.metrics_url is not None
    resp = httpx2.get(worker.metrics_url, timeout=5.0)
    status, text = resp.status_code, resp.text
    if status != 200:
        raise BenchError(f"{worker.metrics_url} answered {status}")
    out = {}
    for m in re.finditer(r"^script_runner_worker_container_(\w+)_seconds_(sum|count) (\S+)$", text, re.M):
        out[f"{m[1]}_{m[2]}"] = float(m[3])
    return out


def docker_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean ms per Docker call between two scrapes."""
    means = {}
    for op in ("create", "attach", "start", "exec", "remove"):
        n = after.get(f"{op}_count", 0) - before.get(f"{op}_count", 0)
        if n > 0:
            means[op] = (after[f"{op}_sum"] - before.get(f"{op}_sum", 0)) * 1000 / n
    return means


def pool_container_mib(worker: Worker) -> list[float]:
    """Memory of each idle pool container, as `docker stats` reports it (cgroup)."""
    ids = containers_of(worker.name)
    if not ids:
        return []
    out = subprocess.run(
        ["docker", "stats", "--no-stream", "--format", "{{.MemUsage}}", *ids],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    units = {"B": 1 / 2**20, "KiB": 1 / 1024, "MiB": 1, "GiB": 1024, "kB": 1e3 / 2**20, "MB": 1e6 / 2**20}
    sizes = []
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)\s*([A-Za-z]+)", line)
        if m and m[2] in units:
            sizes.append(float(m[1]) * units[m[2]])
    return sizes


def shim_pss_mib(worker: Worker) -> list[float]:
    """Proportional set size (PSS, shared pages split among their users) of the
    engine's `containerd-shim` for each of the worker's containers: the host
    memory an idle container costs outside its own cgroup."""
    ids = subprocess.run(
        ["docker", "ps", "-aq", "--no-trunc", "--filter", f"label={LABEL_WORKER}={worker.name}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if not argv or b"containerd-shim" not in argv[0]:
                continue
            cid = argv[argv.index(b"-id") + 1].decode() if b"-id" in argv else ""
            if cid in ids:
                for line in (proc / "smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        found.append(int(line.split()[1]) / 1024)
        except (OSError, ValueError, IndexError):
            continue
    return found


# --------------------------------------------------------------------------- end to end


@dataclass
class E2eSample:
    total_ms: float
    submit_ms: float
    status_ms: list[float]
    task_id: str
    # Wall clock (ms since the epoch) of the run_script call and of the poll that
    # saw the end, and the record's *_at timestamps (Redis's clock, same host).
    t0_ms: float
    seen_ms: float
    at: dict[str, int]
    # The run_script call's time outside the HTTP exchange (the SDK's own work
    # before the request went out and after the answer's headers came), ms.
    sdk_ms: float | None = None


@dataclass
class FloorSample:
    total_ms: float
    label: str
    t0_ms: float
    t1_ms: float


FLOOR_LABEL = "script-runner-bench.floor"
TASK_LABEL = "script-runner.task"  # worker/src/sandbox.rs LABEL_TASK
POOL_PREFIX = "sr-pool-"  # worker/src/sandbox.rs POOL_CONTAINER_PREFIX


class DockerEvents:
    """Records container events (create, attach, start, die, destroy) while a
    phase runs (`docker events` running throughout: the engine replays only its
    last 256 events to a late `--since`, and several label filters would have to
    match all at once). `by(key)` then gives, for containers with the label
    `key`, {its value: {action: ms since the epoch}}, on the engine's clock,
    which is this host's."""

    def __init__(self, tmp: Path) -> None:
        self.path = tmp / f"events-{time.monotonic_ns()}.jsonl"
        with open(self.path, "wb") as out:
            self.proc = subprocess.Popen(
                ["docker", "events", "--filter", "type=container", "--format", "{{json .}}"],
                stdout=out,
                stderr=subprocess.DEVNULL,
            )

    def stop(self) -> None:
        time.sleep(0.5)  # the last events on their way
        self.proc.terminate()
        self.proc.wait(timeout=10)

    def by(self, key: str) -> dict[str, dict[str, float]]:
        """Events of containers with label `key`, by its value."""
        return self._group(lambda attrs: attrs.get(key))

    def by_task(self) -> dict[str, dict[str, float]]:
        """Events of task containers, by task id: a cold one carries the task's
        label; a warm pool container gets its task at claim time and is renamed
        `sr-<task_id>` then (its create and start came before)."""

        def task(attrs: dict[str, str]) -> str | None:
            name = attrs.get("name", "")
            return attrs.get(TASK_LABEL) or (name[3:] if name.startswith("sr-") else None)

        return self._group(task)

    def _group(self, key_of: Callable[[dict[str, str]], str | None]) -> dict[str, dict[str, float]]:
        by_id: dict[str, dict[str, float]] = {}
        keys: dict[str, str] = {}
        for line in self.path.read_text().splitlines():
            ev = json.loads(line)
            cid = ev.get("Actor", {}).get("ID") or ev.get("id", "")
            attrs = ev.get("Actor", {}).get("Attributes", {})
            action = ev.get("Action", "").split(":")[0]  # "exec_start: sh -c ..."
            if value := key_of(attrs):
                keys[cid] = value
            if action in ("create", "start", "die", "destroy", "exec_start", "exec_die", "rename"):
                by_id.setdefault(cid, {}).setdefault(action, ev["timeNano"] / 1e6)
        return {keys[cid]: evs for cid, evs in by_id.items() if cid in keys}


def stage_medians(rows: list[dict[str, float]]) -> dict[str, float]:
    """Median of each stage over the samples that have it."""
    names = list(dict.fromkeys(n for r in rows for n in r))
    return {n: statistics.median(r[n] for r in rows if n in r) for n in names}


def service_stages(s: E2eSample, ev: dict[str, float]) -> dict[str, float]:
    """Where one task's time went, in ms, in the order things happen on a cold
    start. With a pool, the container's create and start come before the claim
    (negative stages)."""
    at = s.at
    st: dict[str, float] = {
        "run_script call -> record created": at["created_at"] - s.t0_ms,
        "queued (created -> claimed)": at["claimed_at"] - at["created_at"],
    }
    if "start" in ev and ev["start"] < at["claimed_at"]:
        # A warm pool container: started before the claim, its prelude waiting;
        # the task is handed to it (no exec), and the prelude reports the end.
        st["(pool container started, before the claim)"] = ev["start"] - at["claimed_at"]
        st["claimed -> started recorded (handoff)"] = at["started_at"] - at["claimed_at"]
        st["started -> finished recorded (the script, usage read)"] = at["finished_at"] - at["started_at"]
    elif {"create", "start"} <= ev.keys():
        # A cold container: created and started after the claim, its prelude
        # handed the task once started.
        st["claimed -> container created"] = ev["create"] - at["claimed_at"]
        st["created -> started"] = ev["start"] - ev["create"]
        st["started -> started recorded (handoff)"] = at["started_at"] - ev["start"]
        st["started -> finished recorded (the script, usage read)"] = at["finished_at"] - at["started_at"]
    else:
        st["claimed -> started recorded"] = at["started_at"] - at["claimed_at"]
        st["started -> finished recorded"] = at["finished_at"] - at["started_at"]
    if "destroy" in ev:
        st["(container removed, from finished)"] = ev["destroy"] - at["finished_at"]
    st["finished -> seen by the client"] = s.seen_ms - at["finished_at"]
    return st


def floor_stages(s: FloorSample, ev: dict[str, float]) -> dict[str, float]:
    if not {"create", "start", "die", "destroy"} <= ev.keys():
        return {}
    return {
        "CLI start -> container created": ev["create"] - s.t0_ms,
        "created -> started (attach, start)": ev["start"] - ev["create"],
        "started -> exited (the script)": ev["die"] - ev["start"],
        "exited -> removed (--rm)": ev["destroy"] - ev["die"],
        "removed -> CLI returns": s.t1_ms - ev["destroy"],
    }


async def e2e_service(cfg: Config, redis: Redis, runtime: str, poll_s: float) -> E2eSample:
    assert cfg.client is not None
    client = cfg.client
    command = base64.b64encode(ECHO_HI.encode()).decode()
    t0_ms = time.time() * 1000
    t0 = time.perf_counter()
    mark = cfg.http_times.mark()
    r = await client.call_tool("run_script", {"runtime": runtime, "command_base64": command})
    submit = time.perf_counter() - t0
    sdk = cfg.http_times.sdk_ms(mark, t0, t0 + submit)
    if r.is_error or not r.structured_content:
        raise BenchError(f"{cfg.label}: run_script failed: {r.content}")
    task_id = r.structured_content["task_id"]
    status_ms = []
    while True:
        c0 = time.perf_counter()
        s = await client.call_tool("get_task_status", {"task_id": task_id, "tail_bytes": 64})
        status_ms.append((time.perf_counter() - c0) * 1000)
        sc = s.structured_content or {}
        if sc.get("state") in FINAL:
            break
        await asyncio.sleep(poll_s)
    total = time.perf_counter() - t0
    seen_ms = time.time() * 1000
    if sc.get("state") != "succeeded" or sc.get("stdout_tail") != "hi\n":
        raise BenchError(f"{cfg.label}: task {task_id} ended {sc}")
    record = redis.hgetall(Keys(cfg.prefix).task(task_id))
    REAL_RECORD.setdefault("record", record)
    at = {k: int(v) for k, v in record.items() if k.endswith("_at")}
    return E2eSample(total * 1000, submit * 1000, status_ms, task_id, t0_ms, seen_ms, at, sdk)


async def e2e_onecall(cfg: Config, redis: Redis, runtime: str, network: Any = None) -> E2eSample:
    """`echo hi` in one `run_script` call with `wait_seconds`: the answer is the
    result. Should the task outlast the wait (a busy machine), waiting
    `get_task_status` calls follow until it is final, and count."""
    assert cfg.client is not None
    t0_ms = time.time() * 1000
    t0 = time.perf_counter()
    mark = cfg.http_times.mark()
    sc, _ = await one_call(cfg, runtime, network)
    total = time.perf_counter() - t0
    seen_ms = time.time() * 1000
    calls = sc.pop("_calls")
    if sc.get("state") != "succeeded" or sc.get("stdout_tail") != "hi\n":
        raise BenchError(f"{cfg.label}: task {sc.get('task_id')} ended {sc}")
    task_id = str(sc["task_id"])
    record = redis.hgetall(Keys(cfg.prefix).task(task_id))
    at = {k: int(v) for k, v in record.items() if k.endswith("_at")}
    sdk = cfg.http_times.sdk_ms(mark, t0, t0 + total) if calls == 1 else None
    return E2eSample(total * 1000, total * 1000 if calls == 1 else 0.0, [0.0] * (calls - 1), task_id, t0_ms, seen_ms, at, sdk)


async def one_call(cfg: Config, runtime: str, network: Any = None) -> tuple[dict[str, Any], float]:
    """`run_script` of `echo hi` with `wait_seconds` at its cap; then, only if
    the task outlasted it, waiting `get_task_status` calls until it is final.
    Returns the final status (with `_calls`: how many calls it took) and the
    seconds until the first call answered."""
    assert cfg.client is not None
    client = cfg.client
    command = base64.b64encode(ECHO_HI.encode()).decode()
    t0 = time.perf_counter()
    args: dict[str, Any] = {"runtime": runtime, "command_base64": command, "wait_seconds": WAIT_CAP}
    if network is not None:
        args["network"] = network
    r = await client.call_tool("run_script", args)
    first = time.perf_counter() - t0
    if r.is_error or not r.structured_content:
        raise BenchError(f"{cfg.label}: run_script failed: {r.content}")
    sc = dict(r.structured_content)
    calls = 1
    while sc.get("state") not in FINAL:
        s = await client.call_tool(
            "get_task_status", {"task_id": sc["task_id"], "tail_bytes": 64, "wait_seconds": WAIT_CAP}
        )
        calls += 1
        if s.is_error or not s.structured_content:
            raise BenchError(f"{cfg.label}: get_task_status failed: {s.content}")
        sc = dict(s.structured_content)
    sc["_calls"] = calls
    return sc, first


def docker_run(image: str, command: str, label: str = "", network: str = "") -> FloorSample:
    """`docker run --rm image sh -c command`; `label` (a value of FLOOR_LABEL)
    finds its events afterwards; `network`: on that network, not the default bridge."""
    argv = ["docker", "run", "--rm", *(["--label", f"{FLOOR_LABEL}={label}"] if label else []),
            *(["--network", network] if network else []), image, "sh", "-c", command]  # fmt: skip
    t0_ms = time.time() * 1000
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True)
    took = (time.perf_counter() - t0) * 1000
    if out.returncode != 0 or out.stdout != "hi\n":
        raise BenchError(f"docker run --rm {image} failed ({out.returncode}): {out.stderr.strip()}")
    return FloorSample(took, label, t0_ms, t0_ms + took)


POLLED = "polled"
ONE_CALL = "one call"
ALLOW_CALL = "one call, allow-list"
ALLOW_LIST = {"allow": ["pypi.org"]}


async def e2e(configs: list[Config], args: argparse.Namespace, redis: Redis, rep: Report, modes: list[str]) -> None:
    """`echo hi` against the floor, samples interleaved: for each configuration,
    polled (run_script, then get_task_status every --poll-ms until final)
    and/or in one call (run_script with wait_seconds)."""
    how = {
        POLLED: f"run_script until a get_task_status poll sees succeeded (poll every {args.poll_ms} ms)",
        ONE_CALL: f"one run_script call with wait_seconds={WAIT_CAP} until its answer",
        ALLOW_CALL: f"the same with network {json.dumps(ALLOW_LIST)}",
    }
    rep.section(
        f"end to end: `{ECHO_HI}`, " + "; ".join(how[m] for m in modes)
        + f"; MCP Python SDK, {args.e2e_runs} runs each, interleaved with the floor"
    )
    # None: the docker run floor.
    targets: list[tuple[Config, str] | None] = [None, *((c, m) for c in configs for m in modes)]
    floor: list[FloorSample] = []
    samples: dict[tuple[str, str], list[E2eSample]] = {(c.label, m): [] for c in configs for m in modes}
    before = {c.label: scrape(c.worker) for c in configs if c.worker}
    recorder = DockerEvents(args.tmp)
    for i in range(args.e2e_runs):
        k = i % len(targets)
        for t in targets[k:] + targets[:k]:
            for c in configs:
                wait_settled(c)
            if t is None:
                label = f"{args.run_id}-{i}"
                floor.append(await asyncio.to_thread(docker_run, args.image, ECHO_HI, label))
            elif t[1] == POLLED:
                samples[(t[0].label, POLLED)].append(await e2e_service(t[0], redis, args.runtime, args.poll_ms / 1000))
            elif t[1] == ALLOW_CALL:
                samples[(t[0].label, ALLOW_CALL)].append(await e2e_onecall(t[0], redis, args.runtime, ALLOW_LIST))
            else:
                samples[(t[0].label, ONE_CALL)].append(await e2e_onecall(t[0], redis, args.runtime))
    after = {c.label: scrape(c.worker) for c in configs if c.worker}
    for c in configs:
        wait_settled(c)  # the last containers removed: their destroy events exist
    recorder.stop()
    floor_events = recorder.by(FLOOR_LABEL)
    task_events = recorder.by_task()
    fd = Dist([f.total_ms for f in floor], "ms")
    rep.out(f"{'':44}{'min':>9} {'median':>9} {'p99':>9}  ratio to the floor (median, p99)")
    rep.out(f"{'docker run --rm (floor)':44}{fd.row()}")
    out: dict[str, Any] = {"floor_ms": fd.as_json(), "poll_ms": args.poll_ms, "wait_seconds": WAIT_CAP}
    for c in configs:
        out[c.label] = {"pool_active": c.pool_active}
        for m in modes:
            ss = samples[(c.label, m)]
            d = Dist([s.total_ms for s in ss], "ms")
            note = "" if c.pool_expected == 0 or c.pool_active else "  (no pool in this build)"
            name = f"{c.label}, {m}"
            rep.out(f"{name:44}{d.row()}  {d.median / fd.median:5.2f}x {pct(d.samples, 99) / pct(fd.samples, 99):5.2f}x{note}")
            key = c.label if m == POLLED else f"{c.label}, {m}"
            out.setdefault(key, {"pool_active": c.pool_active})
            out[key] |= {"total_ms": d.as_json(), "ratio_median": d.median / fd.median, "ratio_p99": pct(d.samples, 99) / pct(fd.samples, 99)}
    rep.out()
    rep.out(
        "where the time goes, medians in ms: the engine's container events (docker events), "
        "the task record's timestamps (Redis's clock) and the client's clock, all on this host"
    )
    fs = stage_medians([floor_stages(f, floor_events.get(f.label, {})) for f in floor])
    rep.out("  docker run --rm (floor):")
    for n, v in fs.items():
        rep.out(f"    {n:44}{v:8.1f}")
    out["floor_stages_median_ms"] = fs
    for c in configs:
        assert c.worker is not None
        means = docker_means(before[c.label], after[c.label])
        for m in modes:
            ss = samples[(c.label, m)]
            vals = stage_medians([service_stages(s, task_events.get(s.task_id, {})) for s in ss])
            if m == POLLED:
                vals["run_script call (client)"] = statistics.median(s.submit_ms for s in ss)
                vals["get_task_status call (client)"] = statistics.median(x for s in ss for x in s.status_ms)
                vals["polls per task"] = statistics.median(len(s.status_ms) for s in ss)
            else:
                vals["calls per task (1: the answer was the result)"] = statistics.median(1 + len(s.status_ms) for s in ss)
            sdk = [s.sdk_ms for s in ss if s.sdk_ms is not None]
            if sdk:
                vals["run_script: the SDK's own time (outside HTTP)"] = statistics.median(sdk)
            rep.out(f"  {c.label}, {m}:")
            for n, v in vals.items():
                rep.out(f"    {n:48}{v:8.1f}")
            key = c.label if m == POLLED else f"{c.label}, {m}"
            out[key]["stages_median_ms"] = vals
        rep.out(
            f"  {c.label}: Docker calls, mean ms (the worker's metrics): "
            + ", ".join(f"{op} {ms:.1f}" for op, ms in means.items())
        )
        out[c.label]["docker_call_mean_ms"] = means
    rep.put("e2e", out)


# --------------------------------------------------------------------------- burst


async def submit_many(cfg: Config, runtime: str, n: int, parallel: int = 8) -> list[str]:
    assert cfg.client is not None
    client = cfg.client
    command = base64.b64encode(ECHO_HI.encode()).decode()
    sem = asyncio.Semaphore(parallel)

    async def one() -> str:
        async with sem:
            r = await client.call_tool("run_script", {"runtime": runtime, "command_base64": command})
            if r.is_error or not r.structured_content:
                raise BenchError(f"{cfg.label}: run_script failed: {r.content}")
            return str(r.structured_content["task_id"])

    return list(await asyncio.gather(*(one() for _ in range(n))))


def wait_final(redis: Redis, prefix: str, ids: list[str], deadline: float, proc: Proc) -> list[dict[str, str]]:
    """Until every task is final (read straight from Redis every 50 ms, so the
    wait adds no api load); returns their records."""

    keys = Keys(prefix)

    def each(command: str, *args: str) -> list[Any]:
        pipe = redis.pipeline(transaction=False)
        for i in ids:
            pipe.execute_command(command, keys.task(i), *args)
        return pipe.execute()

    wait_until(f"{len(ids)} tasks to finish", lambda: all(s in FINAL for s in each("HGET", "state")), proc, deadline)
    return each("HGETALL")


def used_memory(redis: Redis) -> int:
    """Redis's memory for data: used_memory without client buffers (each new
    pooled connection costs tens of KiB), the AOF buffer and the script cache."""
    m = redis.info("memory")
    return int(m["used_memory"]) - sum(int(m.get(k, 0)) for k in ("mem_clients_normal", "mem_aof_buffer", "used_memory_scripts"))


def events_bytes(redis: Redis, prefix: str, ids: list[str]) -> int:
    """The memory of these tasks' events streams (MEMORY USAGE): transient, as
    each expires FINAL_EVENTS_TTL_SECONDS (120 s) after its task's end, so a
    per-task figure taken at once counts them apart from what stays."""
    keys, total = Keys(prefix), 0
    for at in range(0, len(ids), 10_000):
        pipe = redis.pipeline(transaction=False)
        for i in ids[at : at + 10_000]:
            pipe.memory_usage(keys.task_events(i))
        total += sum(int(b or 0) for b in pipe.execute())
    return total


async def burst(configs: list[Config], args: argparse.Namespace, redis: Redis, rep: Report) -> None:
    n, par = args.burst, args.concurrency
    rep.section(f"burst: {n} trivial tasks (`{ECHO_HI}`) at WORKER_CONCURRENCY={par}, against {n} `docker run --rm` at parallelism {par}")

    def floor(network: str = "") -> tuple[float, list[float]]:
        """`n` `docker run --rm` at parallelism `par`: tasks/s, and each one's ms."""
        t0 = time.perf_counter()
        with ThreadPoolExecutor(par) as pool:
            each = [f.total_ms for f in pool.map(lambda _: docker_run(args.image, ECHO_HI, network=network), range(n))]
        return n / (time.perf_counter() - t0), each

    floor_rate, floor_each = floor()
    # The engine's own cost on a network of the task network's kind: a
    # user-defined bridge (the worker makes its task network one, with
    # inter-container traffic off) costs each container more to start than the
    # default bridge (a veth pair, its rules, the embedded DNS).
    net = f"sr-bench-floor-{os.getpid()}"
    subprocess.run(["docker", "network", "create", "-o", "com.docker.network.bridge.enable_icc=false", net],
                   check=True, capture_output=True)  # fmt: skip
    try:
        net_rate, net_each = floor(net)
    finally:
        subprocess.run(["docker", "network", "rm", net], capture_output=True)
    rep.out(f"{'':34}{'tasks/s':>9}   ratio   per task: min / median / p99 ms")
    rep.out(f"{'docker run --rm, parallel':34}{floor_rate:9.2f}          {Dist(floor_each, 'ms').row()}")
    rep.out(f"{'  the same, on a task-like network':34}{net_rate:9.2f}   {net_rate / floor_rate:5.2f}x  {Dist(net_each, 'ms').row()}")
    out: dict[str, Any] = {
        "floor_tasks_per_s": floor_rate,
        "floor_each_ms": Dist(floor_each, "ms").as_json(),
        "network_floor_tasks_per_s": net_rate,
        "network_floor_ratio": net_rate / floor_rate,
    }
    for c in configs:
        assert c.worker is not None
        # One task first: the first tasks on a prefix create its stream, group,
        # index and counters, a one-off cost that is not per task.
        first = await submit_many(c, args.runtime, 1)
        wait_final(redis, c.prefix, first, 60, c.worker.proc)
        wait_settled(c)
        mem0 = used_memory(redis)
        before = scrape(c.worker)
        with RssSampler({"worker": c.worker.proc}) as rss:
            ids = await submit_many(c, args.runtime, n)
            recs = wait_final(redis, c.prefix, ids, 30 + n * 5, c.worker.proc)
            wait_settled(c)
        bad = [r for r in recs if r.get("state") != "succeeded" or r.get("stdout_tail") != "hi\n"]
        if bad:
            raise BenchError(f"{c.label}: {len(bad)} burst tasks did not succeed, e.g. {bad[0]}")
        wait_until("the jobs stream to empty", lambda: redis.xlen(Keys(c.prefix).jobs()) == 0, c.worker.proc, 30)
        mem1 = used_memory(redis)
        events = events_bytes(redis, c.prefix, ids)
        created = min(int(r["created_at"]) for r in recs)
        finished = max(int(r["finished_at"]) for r in recs)
        rate = n / ((finished - created) / 1000)
        each = Dist([int(r["finished_at"]) - int(r["created_at"]) for r in recs], "ms")
        means = docker_means(before, scrape(c.worker))
        rep.out(f"{c.label:34}{rate:9.2f}   {rate / floor_rate:5.2f}x  {each.row()}  (submit to finished; "
                f"{rate / net_rate:.2f}x of the task-like network's floor)")  # fmt: skip
        rep.out(f"{'':34}Docker calls, mean ms: " + ", ".join(f"{op} {ms:.1f}" for op, ms in means.items()))
        out[c.label] = {
            "tasks_per_s": rate,
            "ratio": rate / floor_rate,
            "ratio_to_network_floor": rate / net_rate,
            "each_ms": each.as_json(),
            "docker_call_mean_ms": means,
            "worker_peak_rss_mib": rss.peak_mib("worker"),
            "redis_bytes_per_task": (mem1 - mem0 - events) / n,
            "redis_events_bytes_per_task": events / n,
            "sample_record": recs[0],
        }
    rep.put("burst", out)


# --------------------------------------------------------------------------- ComputeSDK's shapes

SHAPES = ("sequential", "staggered", "burst")
# Published p50s of create -> first command's result, sequential (ComputeSDK's
# benchmark, 2026-05, as issue 21 quotes it): a fresh sandbox created through
# each provider's API over the internet, then `echo`/`node -v` run in it.
PEERS = (("declaw", 42.0), ("Daytona", 186.0), ("E2B", 491.0), ("Vercel", 671.0), ("Modal", 1720.0))


async def shape_run(cfg: Config, args: argparse.Namespace, shape: str) -> list[tuple[float, dict[str, Any]]]:
    """--shapes-n one-call `echo hi` tasks in one of ComputeSDK's shapes:
    sequential (each after the last ended and the worker settled), staggered
    (started --stagger-ms apart, whatever is still running) or burst (all at
    once). Returns each one's time to its result (ms) and final status."""
    n = args.shapes_n

    async def timed() -> tuple[float, dict[str, Any]]:
        t0 = time.perf_counter()
        sc, _ = await one_call(cfg, args.runtime)
        return (time.perf_counter() - t0) * 1000, sc

    if shape == "sequential":
        out = []
        for _ in range(n):
            wait_settled(cfg)
            out.append(await timed())
        return out
    if shape == "staggered":
        start = time.perf_counter()
        running = []
        for i in range(n):
            # Against the start, not the last launch: no drift over 100 launches.
            await asyncio.sleep(max(0.0, start + i * args.stagger_ms / 1000 - time.perf_counter()))
            running.append(asyncio.create_task(timed()))
        return list(await asyncio.gather(*running))
    return list(await asyncio.gather(*(timed() for _ in range(n))))


async def shapes(configs: list[Config], args: argparse.Namespace, redis: Redis, rep: Report) -> None:
    n = args.shapes_n
    rep.section(
        f"ComputeSDK's shapes: time to first command, {n} one-call `{ECHO_HI}` tasks each (run_script with "
        f"wait_seconds, MCP Python SDK): sequential, staggered ({args.stagger_ms} ms apart), burst (all at once); "
        f"WORKER_CONCURRENCY={args.concurrency}"
    )
    rep.out(
        f"{'':34}{'first command (client), ms':>36}   {'submit -> process started (record), ms':>36}   calls"
    )
    rep.out(f"{'':34}{'min':>9} {'p50':>8} {'p99':>8} {'max':>8}   {'min':>9} {'p50':>8} {'p99':>8} {'max':>8}   >1")
    out: dict[str, Any] = {"n": n, "stagger_ms": args.stagger_ms}
    for c in configs:
        assert c.worker is not None
        out[c.label] = {}
        for shape in SHAPES:
            wait_settled(c, 120.0)
            t0 = time.perf_counter()
            res = await shape_run(c, args, shape)
            wall = time.perf_counter() - t0
            bad = [sc for _, sc in res if sc.get("state") != "succeeded" or sc.get("stdout_tail") != "hi\n"]
            if bad:
                raise BenchError(f"{c.label}, {shape}: {len(bad)} tasks did not succeed, e.g. {bad[0]}")
            keys = Keys(c.prefix)
            pipe = redis.pipeline(transaction=False)
            for _, sc in res:
                pipe.hmget(keys.task(str(sc["task_id"])), ["created_at", "started_at", "finished_at"])
            recs = [[int(x) for x in r] for r in pipe.execute()]
            first = [ms for ms, _ in res]
            started = [float(st - cr) for cr, st, _ in recs]
            more = sum(1 for _, sc in res if sc["_calls"] > 1)
            ttfc, to_start = Dist(first, "ms"), Dist(started, "ms")

            def row(d: Dist) -> str:
                v = d.samples
                return f"{min(v):9.1f} {d.median:8.1f} {pct(v, 99):8.1f} {max(v):8.1f}"

            rep.out(f"{c.label + ', ' + shape:34}{row(ttfc)}   {row(to_start)}   {more:3d}")
            rate = n / ((max(r[2] for r in recs) - min(r[0] for r in recs)) / 1000)
            out[c.label][shape] = {
                "first_command_ms": ttfc.as_json() | {"max": max(first)},
                "submit_to_started_ms": to_start.as_json() | {"max": max(started)},
                "tasks_needing_more_than_one_call": more,
                "wall_s": wall,
                "tasks_per_s": rate,
            }
    rep.out()
    rep.out("peers' published p50, sequential (ComputeSDK benchmark, 2026-05; create -> first command over the internet):")
    rep.out("  " + ", ".join(f"{name} {ms:g} ms" for name, ms in PEERS))
    for c in configs:
        seq = out[c.label]["sequential"]["first_command_ms"]["median"]
        rep.out(f"  {c.label}, sequential p50 here (localhost, no network between client and api): {seq:.1f} ms")
    out["peers_p50_ms"] = dict(PEERS)
    rep.put("shapes", out)


# --------------------------------------------------------------------------- api


def api_and_growth(stack: Stack, args: argparse.Namespace, redis: Redis, rep: Report, sections: set[str]) -> None:
    prefix = f"bench-{stack.run_id}-api"
    keys = Keys(prefix)
    # No worker on this prefix: the queued tasks run_script creates stay queued.
    stack.add_api("load", {"MAX_QUEUED_TASKS": "10000000"}, prefix=prefix)
    api = stack.start_api("load")
    time.sleep(0.5)  # let start-up allocations settle before reading idle memory
    idle_kib = api.proc.rss_kib()
    assert stack.redis_proc is not None
    cpu_of = {"api": api.proc.pid, "redis": stack.redis_proc.pid}
    token_env = {"BENCH_TOKEN": stack.token}
    secs = args.wrk_seconds
    out: dict[str, Any] = {"api_idle_rss_mib": mib(idle_kib)}
    run_body = tools_call(
        "run_script", {"runtime": args.runtime, "command_base64": base64.b64encode(ECHO_HI.encode()).decode()}
    )
    filler = Filler(redis, prefix, args.runtime, args.image, stack.binary(CTL_BIN))

    def wrk(path: str, conns: int, env: dict[str, str]) -> WrkResult:
        return run_wrk(f"{api.base_url}{path}", conns, secs, stack.tmp_dir, env, cpu_of)

    if "api" in sections:
        rep.section(f"api: wrk --latency, {secs:g} s per row, {os.cpu_count()} cores shared by wrk, api and Redis")
        # A single POST works without initialize (stateless); prove it before
        # wrk counts only HTTP statuses.
        sc = post_once(api, stack.token, run_body)
        if sc.get("state") != "queued":
            raise BenchError(f"run_script by a single POST answered {sc}")
        rep.out(f"{'':40}{'min':>9} {'p50':>9} {'p99':>9}  throughput   ms of CPU per request")
        rows: dict[str, WrkResult] = {}

        def show(name: str, r: WrkResult, target: str = "") -> None:
            cpu = ", ".join(f"{k} {v:.3f}" for k, v in r.cpu_ms_per_req.items())
            rep.out(f"{name:40}{r.row()}   {cpu}{target}")
            rows[name] = r

        for c in (1, 32, 64):
            show(f"GET /healthz, {c} conn (floor)", wrk("/healthz", c, {}))
        sub0 = int(redis.hget(keys.stats(), STAT_SUBMITTED) or 0)
        rss = RssSampler({"api": api.proc})
        with rss:
            show("run_script, 1 conn", wrk("/mcp", 1, token_env | {"BENCH_BODY": run_body}))
            show(
                "run_script, 32 conns",
                wrk("/mcp", 32, token_env | {"BENCH_BODY": run_body}),
                "   target p99 < 10 ms",
            )
        sub1 = int(redis.hget(keys.stats(), STAT_SUBMITTED) or 0)
        made = rows["run_script, 1 conn"].requests + rows["run_script, 32 conns"].requests
        if sub1 - sub0 < made:
            raise BenchError(f"wrk made {made} run_script calls but only {sub1 - sub0} tasks were stored")
        out["api_peak_rss_run_script_mib"] = rss.peak_mib("api")
        # The api may still be storing calls wrk gave up on: wait until the count
        # holds still. Then drop the queued jobs, which the fill's XREADGROUP
        # would read (their records stay, as a backlog's would).
        counts = [-1]

        def settled() -> bool:
            time.sleep(0.3)
            counts.append(int(redis.hget(keys.stats(), STAT_SUBMITTED) or 0))
            return counts[-1] == counts[-2]

        wait_until("run_script calls to stop arriving", settled, api.proc, 60)
        redis.delete(keys.jobs())
        filler = Filler(redis, prefix, args.runtime, args.image, stack.binary(CTL_BIN))

    mem0 = used_memory(redis)
    ids = filler.fill(args.fill_base)
    per_task_fill = (used_memory(redis) - mem0 - events_bytes(redis, prefix, ids)) / len(ids)
    status_tpl = tools_call("get_task_status", {"task_id": "{ID}"})
    sc = post_once(api, stack.token, status_tpl.replace("{ID}", ids[0]))
    if sc.get("state") != "succeeded" or sc.get("stdout_tail") != "hi\n" or sc.get("exit_code") != 0:
        raise BenchError(f"a filled task reads back wrong through get_task_status: {sc}")
    check_fill_matches_real(redis, prefix, ids[0], rep)

    def status_rows(ids_now: list[str], label: str) -> dict[str, WrkResult]:
        ids_file = stack.tmp_dir / f"ids-{len(ids_now)}.txt"
        ids_file.write_text("\n".join(ids_now) + "\n")
        env = token_env | {"BENCH_TEMPLATE": status_tpl, "BENCH_IDS": str(ids_file)}
        res = {}
        rss = RssSampler({"api": api.proc})
        with rss:
            res[1] = wrk("/mcp", 1, env)
            res[64] = wrk("/mcp", 64, env)
        out[f"api_peak_rss_status_{label}_mib"] = rss.peak_mib("api")
        return res

    base = status_rows(ids, "base")
    if "api" in sections:
        for c, r in base.items():
            show(f"get_task_status, {c} conn{'s' if c > 1 else ''}", r, "   target >= 5000/s" if c == 64 else "")
        out["wrk"] = {k: v.as_json() for k, v in rows.items()}
        rep.out()
        rep.out(
            f"api resident memory (VmRSS): idle {out['api_idle_rss_mib']:.1f} MiB, "
            f"peak under run_script load {out['api_peak_rss_run_script_mib']:.1f} MiB, "
            f"peak under get_task_status load {out['api_peak_rss_status_base_mib']:.1f} MiB   target < 30 MiB"
        )

    if "growth" in sections:
        rep.section(f"growth: Redis memory per finished task, and get_task_status with {args.fill:,} finished tasks stored")
        mem0 = used_memory(redis)
        more = filler.fill(args.fill - len(ids))
        events = events_bytes(redis, prefix, more)
        per_task_big = (used_memory(redis) - mem0 - events) / len(more)
        ids += more
        big = status_rows(ids, "big")
        rep.out(f"Redis used_memory per finished task (fill path, {len(ids):,} tasks): {per_task_big:.0f} B "
                f"(first {args.fill_base:,}: {per_task_fill:.0f} B), and {events / len(more):.0f} B more for 120 s "
                "(its events stream)")  # fmt: skip
        rep.out(f"{'':40}{'min':>9} {'p50':>9} {'p99':>9}  throughput   ratio to {args.fill_base:,} stored (p50, rps)")
        for c in (1, 64):
            b, g = base[c], big[c]
            name = f"get_task_status, {c} conn{'s' if c > 1 else ''}, {len(ids):,} stored"
            rep.out(f"{name:40}{g.row()}   {g.latency_ms['p50'] / b.latency_ms['p50']:.2f}x, {g.rps / b.rps:.2f}x")
        out["growth"] = {
            "redis_bytes_per_task_fill": per_task_big,
            "redis_events_bytes_per_task_fill": events / len(more),
            "redis_bytes_per_task_fill_base": per_task_fill,
            "stored": len(ids),
            "status_base": {c: r.as_json() for c, r in base.items()},
            "status_big": {c: r.as_json() for c, r in big.items()},
        }
    out["api_end_rss_mib"] = mib(api.proc.rss_kib())
    rep.put("api", out)


def replication(stack: Stack, args: argparse.Namespace, redis: Redis, rep: Report) -> None:
    """run_script with and without REDIS_MIN_REPLICAS_ACK=1 against a primary
    with one replica, alternating; and Redis's cost per task."""
    assert stack.redis_proc is not None
    port = free_port()
    data = stack.tmp_dir / "replica"
    data.mkdir()
    replica = Proc(
        "replica",
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data), "--save", "",
         "--appendonly", "yes", "--appendfsync", "everysec", "--replicaof", "127.0.0.1", str(stack.redis_port)],
        stack.env({}), stack.tmp_dir / "replica.log",
    ).start()  # fmt: skip
    try:
        probe = Redis(port=port)
        wait_until("the replica to sync", lambda: probe.info("replication").get("master_link_status") == "up", replica, 60)
        secs = args.wrk_seconds
        rep.section(
            f"replication: run_script with REDIS_MIN_REPLICAS_ACK=1 (WAIT 1) against without, a replica on this host, "
            f"wrk {secs:g} s per row, alternating"
        )
        run_body = tools_call(
            "run_script", {"runtime": args.runtime, "command_base64": base64.b64encode(ECHO_HI.encode()).decode()}
        )
        apis = {}
        for ack in ("0", "1"):
            prefix = f"bench-{stack.run_id}-ack{ack}"
            stack.add_api(f"ack{ack}", {"MAX_QUEUED_TASKS": "10000000", "REDIS_MIN_REPLICAS_ACK": ack}, prefix=prefix)
            apis[ack] = (stack.start_api(f"ack{ack}"), Keys(prefix))
        token_env = {"BENCH_TOKEN": stack.token, "BENCH_BODY": run_body}
        results: dict[str, dict[int, list[WrkResult]]] = {"0": {1: [], 32: []}, "1": {1: [], 32: []}}
        for _round in range(1 if args.quick else 2):
            for conns in (1, 32):
                for ack in ("0", "1"):
                    api, keys = apis[ack]
                    before = int(redis.hget(keys.stats(), STAT_SUBMITTED) or 0)
                    cpu_of = {"api": api.proc.pid, "redis": stack.redis_proc.pid}
                    r = run_wrk(f"{api.base_url}/mcp", conns, secs, stack.tmp_dir, token_env, cpu_of)
                    stored = int(redis.hget(keys.stats(), STAT_SUBMITTED) or 0) - before
                    withdrawn = int(redis.hget(keys.stats(), "finished:killed:not-replicated") or 0)
                    if stored < r.requests or withdrawn:
                        raise BenchError(f"ack {ack}: wrk made {r.requests} calls, {stored} stored, {withdrawn} withdrawn")
                    results[ack][conns].append(r)
        rep.out(f"{'':40}{'min':>9} {'p50':>9} {'p99':>9}  throughput   ms of CPU per request")
        out: dict[str, Any] = {}
        for conns in (1, 32):
            for ack in ("0", "1"):
                for i, r in enumerate(results[ack][conns]):
                    cpu = ", ".join(f"{k} {v:.3f}" for k, v in r.cpu_ms_per_req.items())
                    rep.out(f"{f'run_script, {conns} conn, ack {ack} (#{i + 1})':40}{r.row()}   {cpu}")
            p50 = {a: statistics.median(r.latency_ms["p50"] for r in results[a][conns]) for a in ("0", "1")}
            rps = {a: statistics.median(r.rps for r in results[a][conns]) for a in ("0", "1")}
            rep.out(
                f"{'':40}WAIT 1 adds {p50['1'] - p50['0']:.2f} ms to the p50 ({p50['1'] / p50['0']:.2f}x), "
                f"throughput {rps['1'] / rps['0']:.2f}x"
            )
            out[f"conns_{conns}"] = {a: [r.as_json() for r in results[a][conns]] for a in ("0", "1")}
        # Redis's own cost per task: everything a task's life sends through the
        # real scripts (fill.py), against a PING's.
        prefix = f"bench-{stack.run_id}-cost"
        filler = Filler(redis, prefix, args.runtime, args.image, stack.binary(CTL_BIN))
        n = 500 if args.quick else 5000

        def totals() -> tuple[float, int]:
            info = redis.info("cpu") | redis.info("stats")
            return float(info["used_cpu_user"]) + float(info["used_cpu_sys"]), int(info["total_commands_processed"])

        c0, k0 = totals()
        filler.fill(n)
        c1, k1 = totals()
        pipe = redis.pipeline(transaction=False)
        for _ in range(n):
            pipe.ping()
        c2, k2 = totals()
        pipe.execute()
        c3, k3 = totals()
        per_task_us, per_ping_us = (c1 - c0) * 1e6 / n, (c3 - c2) * 1e6 / n
        rep.out(
            f"Redis per task (fill path, {n} tasks: SUBMIT, XREADGROUP, CLAIM, STARTED, PROGRESS, FINISH, XACK, XDEL): "
            f"{(k1 - k0) / n:.1f} commands (the scripts' own calls counted), {per_task_us:.0f} us of Redis CPU ({per_task_us / max(per_ping_us, 0.01):.0f}x "
            f"a pipelined PING's {per_ping_us:.1f} us)"
        )
        out["redis_per_task"] = {"commands": (k1 - k0) / n, "cpu_us": per_task_us, "ping_cpu_us": per_ping_us}
        rep.put("replication", out)
    finally:
        for ack in ("0", "1"):
            if (a := stack.apis.get(f"ack{ack}")) is not None:
                a.proc.stop()
        replica.stop()


def check_fill_matches_real(redis: Redis, prefix: str, filled_id: str, rep: Report) -> None:
    """A filled record has the fields a real `echo hi` record has (compared with
    one from the burst when it ran)."""
    filled = redis.hgetall(Keys(prefix).task(filled_id))
    real = REAL_RECORD.get("record")
    if real is None:
        return
    if set(filled) != set(real):
        raise BenchError(
            f"a filled record's fields differ from a real one's: only filled {sorted(set(filled) - set(real))}, "
            f"only real {sorted(set(real) - set(filled))}"
        )
    for f in ("state", "reason", "reason_kind", "exit_code", "runtime", "network", "timeout_seconds"):
        if filled.get(f) != real.get(f):
            raise BenchError(f"a filled record's {f} is {filled.get(f)!r}, a real one's {real.get(f)!r}")
    rep.out(f"(fill checked: a filled record has the same {len(filled)} fields as a real one)")


# --------------------------------------------------------------------------- main


async def with_clients(configs: list[Config], token: str, body: Callable[[], Any]) -> Any:
    async with contextlib.AsyncExitStack() as stack:
        for c in configs:
            assert c.api is not None
            # Read timeout above wait_seconds' cap; connections for a burst of
            # waiting calls (each holds one until its answer).
            http = await stack.enter_async_context(
                httpx2.AsyncClient(
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=httpx2.Timeout(30.0, read=WAIT_CAP + 30.0),
                    limits=httpx2.Limits(max_connections=256, max_keepalive_connections=256),
                    event_hooks={"request": [c.http_times.on_request], "response": [c.http_times.on_response]},
                )
            )
            c.client = await stack.enter_async_context(Client(streamable_http_client(c.api.mcp_url, http_client=http)))
        return await body()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", type=Path, required=True, help="where script-runner-api and -worker are")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: proves the tool works (CI)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"sections to run, of {','.join(SECTIONS)} (default: all)")
    ap.add_argument("--runtime", default="python3.13")
    ap.add_argument(
        "--image",
        default=os.environ.get("TEST_RUNTIME_IMAGE") or "script-runner-test/python:3.13-trixie",
        help="the image the runtime runs in, and the floor's (default $TEST_RUNTIME_IMAGE or the test image)",
    )
    ap.add_argument("--concurrency", type=int, default=4, help="WORKER_CONCURRENCY, and the floor's parallelism")
    ap.add_argument("--pool", default=None, help="POOL_SIZE of the pool-on worker (default <runtime>=<concurrency>, quick 1; 0 skips it)")
    ap.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE", help="more worker settings, both configurations")
    ap.add_argument("--poll-ms", type=int, default=10, help="get_task_status poll interval in the e2e runs")
    ap.add_argument("--e2e-runs", type=int, default=None, help="samples per target (default 30, quick 3)")
    ap.add_argument("--burst", type=int, default=None, help="tasks per burst (default 200, quick 6)")
    ap.add_argument("--shapes-n", type=int, default=None, help="tasks per ComputeSDK shape (default 100, quick 4)")
    ap.add_argument("--stagger-ms", type=int, default=200, help="spacing of the staggered shape's starts (ComputeSDK: 200)")
    ap.add_argument("--wrk-seconds", type=int, default=None, help="per wrk row (default 10, quick 1)")
    ap.add_argument("--fill-base", type=int, default=None, help="finished tasks stored for the status rows (default 1000, quick 200)")
    ap.add_argument("--fill", type=int, default=None, help="finished tasks stored for the growth rows (default 100000, quick 1000)")
    ap.add_argument("--json", type=Path, help="also write every figure here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    args = ap.parse_args()
    q = args.quick
    args.e2e_runs = args.e2e_runs or (3 if q else 30)
    args.burst = args.burst or (6 if q else 200)
    args.shapes_n = args.shapes_n or (4 if q else 100)
    args.wrk_seconds = args.wrk_seconds or (1 if q else 10)
    args.fill_base = args.fill_base or (200 if q else 1000)
    args.fill = max(args.fill or (1000 if q else 100_000), args.fill_base + 1)
    if args.pool is None:
        args.pool = f"{args.runtime}={1 if q else args.concurrency}"
    sections = set(filter(None, args.only.split(",")))
    unknown = sections - set(SECTIONS)
    if unknown:
        ap.error(f"--only: unknown section(s) {sorted(unknown)}")

    # scripts/bench.sh installs wrk and redis-server and builds the image.
    needs_image = bool(sections & SERVICE_SECTIONS)
    preflight(args.bin_dir, ("wrk", "redis-server", "docker"), [args.image] if needs_image else [])

    stack = Stack(bin_dir=args.bin_dir, label="bench", runtime_images=f"{args.runtime}={args.image}")
    tmp = stack.tmp_dir
    args.run_id, args.tmp = stack.run_id, tmp
    rep = Report()
    commit = subprocess.run(["git", "-C", str(HERE), "describe", "--always", "--dirty"], capture_output=True, text=True)
    engine = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True)
    rep.out(
        f"script-runner benchmark, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}, commit {commit.stdout.strip() or '?'}, Docker {engine.stdout.strip() or '?'}"
    )
    rep.out(f"binaries {stack.bin_dir}, image {args.image}")
    if q:
        rep.out("QUICK: tiny sizes (proves the tool works; these figures mean nothing)")
    rep.put(
        "run",
        {
            "date": time.strftime("%Y-%m-%d"),
            "cores": os.cpu_count(),
            "bin_dir": str(stack.bin_dir),
            "image": args.image,
            "quick": q,
            "args": {k: str(v) for k, v in vars(args).items()},
        },
    )
    status = 1
    try:
        stack.start_redis()
        redis = stack.redis
        rep.out(f"redis-server {redis.info('server')['redis_version']} on port {stack.redis_port}, AOF everysec")
        extra = dict(kv.split("=", 1) for kv in args.worker_env)
        common = {"WORKER_CONCURRENCY": str(args.concurrency)} | extra
        configs = [Config("pool off", common | {"POOL_SIZE": "0", "EGRESS_POOL_SIZE": "0"}, 0)]
        if args.pool != "0":
            # The same pool on the egress network, for the allow-list samples.
            pools = {"POOL_SIZE": args.pool, "EGRESS_POOL_SIZE": args.pool}
            configs.append(Config(f"pool on ({args.pool})", common | pools, 2 * parse_pool(args.pool)))
        mem: dict[str, Any] = {}
        if sections & SERVICE_SECTIONS:
            # The floor first: warm the engine (image cache, network) for everyone.
            for _ in range(2):
                docker_run(args.image, ECHO_HI)
            for i, c in enumerate(configs):
                label = "off" if i == 0 else "on"
                prefix = f"bench-{stack.run_id}-{label}"
                stack.add_worker(
                    label, c.worker_env | {"SHUTDOWN_GRACE_SECONDS": "5"}, prefix=prefix,
                    name=f"bench-{stack.run_id}-{label}", tasks_dir=tmp / f"tasks-{label}", metrics=True,
                )  # fmt: skip
                c.worker = stack.start_worker(label)
                stack.add_api(label, prefix=prefix)
                c.api = stack.start_api(label)
                time.sleep(0.5)
                detect_pool(c, rep)
                mem[c.label] = {"worker_idle_rss_mib": mib(c.worker.proc.rss_kib())}
                if c.pool_active:
                    mem[c.label]["pool_container_mib"] = pool_container_mib(c.worker)
                    mem[c.label]["pool_shim_pss_mib"] = shim_pss_mib(c.worker)
            rep.section("resident memory (VmRSS) of the workers, idle")
            for c in configs:
                m = mem[c.label]
                line = f"{c.label:34}worker {m['worker_idle_rss_mib']:.1f} MiB"
                rep.out(line + (" (pool full)" if "pool_container_mib" in m else "") + "   target < 50 MiB (pool containers aside)")
                if m.get("pool_container_mib"):
                    each, shims = m["pool_container_mib"], m.get("pool_shim_pss_mib") or [0.0]
                    rep.out(
                        f"{'':34}each idle pool container: {statistics.median(each):.1f} MiB in its cgroup (docker stats) "
                        f"+ {statistics.median(shims):.1f} MiB for its containerd-shim (PSS), medians of {len(each)}"
                    )

            async def services() -> None:
                modes = [m for sec, m in (("e2e", POLLED), ("onecall", ONE_CALL), ("egress", ALLOW_CALL)) if sec in sections]
                if modes:
                    await e2e(configs, args, redis, rep, modes)
                if "shapes" in sections:
                    await shapes(configs, args, redis, rep)
                if "burst" in sections:
                    await burst(configs, args, redis, rep)

            asyncio.run(with_clients(configs, stack.token, services))
            if "burst" in sections:
                b = rep.data["burst"]
                REAL_RECORD.setdefault("record", b[configs[0].label]["sample_record"])
                rep.out()
                for c in configs:
                    rep.out(
                        f"{c.label}: worker peak RSS during the burst {b[c.label]['worker_peak_rss_mib']:.1f} MiB; "
                        f"Redis used_memory per finished task {b[c.label]['redis_bytes_per_task']:.0f} B (real tasks), "
                        f"and {b[c.label]['redis_events_bytes_per_task']:.0f} B more for 120 s (its events stream)"
                    )
            for c in configs:
                mem[c.label]["worker_end_rss_mib"] = mib(c.worker.proc.rss_kib())  # type: ignore[union-attr]
            rep.put("memory", mem)
        if sections & {"api", "growth"}:
            api_and_growth(stack, args, redis, rep, sections)
        if "replication" in sections:
            replication(stack, args, redis, rep)
        status = 0
    except (HarnessError, TimeoutError) as e:
        print(f"\nbench: {e}", file=sys.stderr)
    finally:
        left = stack.stop_all()
        if left:
            print(f"bench: removed {len(left)} container(s) a worker left behind", file=sys.stderr)
            status = status or 1
        if args.json:
            args.json.write_text(json.dumps(rep.data, indent=2, default=str) + "\n")
        if args.keep or status:
            print(f"bench: logs kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
