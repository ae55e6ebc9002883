"""Soak: a steady rate of mixed tasks for a long time, memory sampled as it goes,
and nothing left behind once retention has passed.

    scripts/soak.sh --release --duration 1800                  (the README's figures)
    scripts/soak.sh --duration 150 --sample-every 15           (a quick check)

A redis-server with an append-only file (everysec, as deployed), one api and
--workers workers, all real processes, TASK_RETENTION_SECONDS short (default 60,
the smallest allowed) so that records expire within the run. Tasks are submitted
open-loop at --rate per second (default 2), each picked in turn from a fixed mix:

  short    echo, and a line read from stdin                       -> succeeded
  failing  a line on stderr, exit 3                               -> failed, exit code 3
  long     sleeps --long-seconds (20)                             -> succeeded
  killed   sleeps 300 s, killed with kill_task once running       -> killed "killed by kill_task"
  big      1 to 5 MiB on stdout                                   -> succeeded, every byte counted
  zip      a zip with a script and data; collects the file it writes -> succeeded, file returned

Every --sample-every seconds (default 60) a row is printed (and written with
--csv): VmRSS of the api, of each worker and of redis-server (/proc/<pid>/status),
Redis's used_memory, its key count, tasks in flight, queued jobs, task containers
and entries in TASKS_DIR. After the load phase every task must reach the state its
kind expects; after retention has passed (plus a margin) there must be no task
container, no task network endpoint, nothing in TASKS_DIR and, under the prefix,
only the keys that are meant to stay (the stream, the worker registry and
heartbeats, the counters, the per-minute counters that expire after 2 h, and the
list_tasks index, which a list_tasks walk empties). Memory growth between the
first and the last quarter of the load phase must stay under the --max-growth-*
bounds. Exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import csv
import io
import json
import os
import statistics
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # common.py, and tests/: the shared harness package
from common import log, parser, print_table  # noqa: E402
from common import main as run_main  # noqa: E402
from harness.keys import FINAL_STATES, STATS_MINUTE_TTL_SECONDS, WORKER_GROUP  # noqa: E402
from harness.mcp_http import Mcp, ProtocolError, Unreachable  # noqa: E402
from harness.procs import DEFAULT_RUST_LOG  # noqa: E402
from harness.procs import wait_until_async as wait_for  # noqa: E402
from harness.stack import IMAGE, Stack, preflight  # noqa: E402

KINDS = ("short", "failing", "long", "short", "killed", "big", "short", "zip", "failing", "short")
TASK_NETWORK = "script-runner-tasks"  # the workers' default TASK_NETWORK
ZIP_DATA = "soak data line\n" * 64


def b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def project_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("run.sh", "mkdir -p out && cp data.txt out/result.txt && echo zipped\n")
        z.writestr("data.txt", ZIP_DATA)
    return buf.getvalue()


@dataclass
class Spec:
    kind: str
    args: dict[str, Any]
    expect: dict[str, Any]


def spec_for(i: int, long_seconds: int) -> Spec:
    kind = KINDS[i % len(KINDS)]
    base = {"runtime": "python3.13", "timeout_seconds": 120}
    if kind == "short":
        return Spec(kind, base | {"command_base64": b64(f"echo short {i}; cat"), "stdin_base64": b64(f"in {i}\n")},
                    {"state": "succeeded", "stdout_tail": f"short {i}\nin {i}\n"})  # fmt: skip
    if kind == "failing":
        return Spec(kind, base | {"command_base64": b64("echo oops >&2; exit 3")}, {"state": "failed", "exit_code": 3, "stderr_tail": "oops\n"})
    if kind == "long":
        return Spec(kind, base | {"command_base64": b64(f"echo long; sleep {long_seconds}; echo done")}, {"state": "succeeded", "stdout_tail": "long\ndone\n"})
    if kind == "killed":
        return Spec(kind, base | {"command_base64": b64("echo up; sleep 300")}, {"state": "killed", "reason": "killed by kill_task"})
    if kind == "big":
        n = (1 + i % 5) * 1024 * 1024  # 1 to 5 MiB
        return Spec(kind, base | {"command_base64": b64(f"yes 0123456789abcde | head -c {n}")}, {"state": "succeeded", "stdout_bytes": n})
    return Spec(kind, base | {"command_base64": b64("sh run.sh"), "zip_base64": b64(project_zip()), "collect": ["out/result.txt"]},
                {"state": "succeeded", "stdout_tail": "zipped\n", "files": [{"name": "out/result.txt", "size": len(ZIP_DATA)}]})  # fmt: skip


@dataclass
class Sample:
    t: float
    phase: str
    submitted: int
    finished: int
    in_flight: int
    queued: int
    api_mib: float
    worker_mib: list[float]
    redis_rss_mib: float
    redis_used_mib: float
    redis_keys: int
    containers: int
    pool_idle: int
    tasks_dir: int

    def row(self) -> list[Any]:
        return [round(self.t), self.phase, self.submitted, self.finished, self.in_flight, self.queued, self.api_mib,
                round(sum(self.worker_mib), 1), self.redis_rss_mib, self.redis_used_mib, self.redis_keys, self.containers,
                self.pool_idle, self.tasks_dir]  # fmt: skip


HEADER = ["t_s", "phase", "submitted", "finished", "in_flight", "queued", "api_rss_mib", "workers_rss_mib",
          "redis_rss_mib", "redis_used_mib", "redis_keys", "containers", "pool_idle", "tasks_dir_entries"]  # fmt: skip


@dataclass
class Outcome:
    kind: str
    task_id: str = ""
    status: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    wait_s: float | None = None  # created -> started


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stack = Stack(bin_dir=args.bin_dir, label="soak", rust_log=os.environ.get("RELIABILITY_RUST_LOG", DEFAULT_RUST_LOG))
        self.outcomes: list[Outcome] = []
        self.samples: list[Sample] = []
        self.phase = "load"
        self.failures: list[str] = []
        self.errors: dict[str, int] = {}
        self.t0 = time.monotonic()
        self.mcp: Mcp | None = None
        self.csv_file: Any = None

    async def start(self) -> None:
        a, st = self.args, self.stack
        preflight(st.bin_dir, images=[IMAGE])  # every task here is python3.13's
        log(f"soak {st.run_id}: logs in {st.tmp_dir}")
        await asyncio.to_thread(st.start_redis)
        st.common_env = {"TASK_RETENTION_SECONDS": str(a.retention)}
        pool = {"POOL_SIZE": a.pool_size} if a.pool_size is not None else {}
        if a.pool_size == "0":
            pool["EGRESS_POOL_SIZE"] = "0"
        for i in range(1, a.workers + 1):
            st.add_worker(f"w{i}", {"WORKER_CONCURRENCY": str(a.concurrency)} | pool)
        await asyncio.gather(*(asyncio.to_thread(st.start_worker, s) for s in st.workers))
        st.add_api("api", {})
        await asyncio.to_thread(st.start_api, "api")
        self.mcp = Mcp(st.base_url, st.token, timeout=30.0, connections=64)
        self.networks_before = set(self.networks())
        log(f"stack up: {a.workers} worker(s) x {a.concurrency} slots, {a.rate} task/s for {a.duration} s, retention {a.retention} s")

    @staticmethod
    def networks() -> list[str]:
        out = subprocess.run(["docker", "network", "ls", "--format", "{{.Name}}"], capture_output=True, text=True)
        return out.stdout.split()

    # ------------------------------------------------------------------ load

    async def call(self, tool: str, args: dict[str, Any]) -> Any:
        """A tool call retried through transient failures; the structured result,
        or the error text of a tool error."""
        assert self.mcp is not None
        for _ in range(60):
            try:
                res = await self.mcp.call(tool, args)
            except (Unreachable, ProtocolError) as e:
                key = f"{tool}: {str(e)[:60]}"
                self.errors[key] = self.errors.get(key, 0) + 1
                await asyncio.sleep(1)
                continue
            if res.is_error:
                if "try again" in res.text:
                    key = f"{tool}: {res.text[:60]}"
                    self.errors[key] = self.errors.get(key, 0) + 1
                    await asyncio.sleep(1)
                    continue
                return res.text
            return res.structured
        raise RuntimeError(f"{tool} kept failing")

    async def one_task(self, i: int) -> None:
        spec = spec_for(i, self.args.long_seconds)
        out = Outcome(spec.kind)
        self.outcomes.append(out)
        got = await self.call("run_script", spec.args)
        if isinstance(got, str):
            out.problems.append(f"run_script refused: {got}")
            return
        out.task_id = got["task_id"]
        killed = False
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            s = await self.call("get_task_status", {"task_id": out.task_id, "tail_bytes": 4096})
            if isinstance(s, str):
                out.problems.append(f"get_task_status: {s}")
                return
            if spec.kind == "killed" and not killed and s["state"] == "running" and s["stdout_tail"] == "up\n":
                await self.call("kill_task", {"task_id": out.task_id})
                killed = True
            if s["state"] in FINAL_STATES:
                out.status = s
                break
            await asyncio.sleep(1.0)
        else:
            out.problems.append("not final after 300 s")
            return
        self.check(spec, out)
        if spec.kind == "zip" and out.status and out.status.get("state") == "succeeded":
            await self.check_files(spec, out)

    def check(self, spec: Spec, out: Outcome) -> None:
        s = out.status or {}
        for k, v in spec.expect.items():
            if k == "files":
                continue
            if s.get(k) != v:
                out.problems.append(f"{k} is {str(s.get(k))[:80]!r}, expected {str(v)[:80]!r}")
        if s.get("started_at") and s.get("created_at"):
            from datetime import datetime

            started = datetime.fromisoformat(s["started_at"].replace("Z", "+00:00"))
            created = datetime.fromisoformat(s["created_at"].replace("Z", "+00:00"))
            out.wait_s = (started - created).total_seconds()

    async def check_files(self, spec: Spec, out: Outcome) -> None:
        """The collected file comes back (now: the record expires with retention)."""
        got = await self.call("get_task_files", {"task_id": out.task_id})
        if isinstance(got, str) or got.get("files") != spec.expect["files"]:
            out.problems.append(f"get_task_files: {got if isinstance(got, str) else got.get('files')}")

    async def load(self) -> None:
        a = self.args
        n = int(a.duration * a.rate)
        running: set[asyncio.Task[None]] = set()
        start = time.monotonic()
        for i in range(n):
            # Open loop: the schedule does not wait for the service.
            delay = start + i / a.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            t = asyncio.create_task(self.one_task(i))
            running.add(t)
            t.add_done_callback(running.discard)
        self.phase = "drain"
        if running:
            await asyncio.gather(*running)

    # ------------------------------------------------------------------ samples

    async def sample(self) -> Sample:
        st = self.stack
        mib = lambda kib: round((kib or 0) / 1024, 1)  # noqa: E731
        r = st.aredis
        used = int((await r.info("memory"))["used_memory"])
        xlen = await r.xlen(st.keys.jobs())
        pending = (await r.xpending(st.keys.jobs(), WORKER_GROUP))["pending"] if xlen else 0
        finished = sum(1 for o in self.outcomes if o.status or o.problems)
        assert st.redis_proc is not None
        containers = len(await asyncio.to_thread(st.containers, False))
        pool_idle = len(await asyncio.to_thread(st.idle_pool_names))
        tasks_dir = len(await asyncio.to_thread(st.tasks_dir_leftovers))
        s = Sample(
            t=time.monotonic() - self.t0,
            phase=self.phase,
            submitted=sum(1 for o in self.outcomes if o.task_id),
            finished=finished,
            in_flight=len(self.outcomes) - finished,
            queued=xlen - pending,
            api_mib=mib(st.apis["api"].proc.rss_kib()),
            worker_mib=[mib(w.proc.rss_kib()) for w in st.workers.values()],
            redis_rss_mib=mib(st.redis_proc.rss_kib()),
            redis_used_mib=round(used / 1048576, 1),
            redis_keys=await r.dbsize(),
            containers=containers,
            pool_idle=pool_idle,
            tasks_dir=tasks_dir,
        )
        self.samples.append(s)
        row = s.row()
        print(",".join(map(str, row)), flush=True)
        if self.csv_file:
            csv.writer(self.csv_file).writerow(row)
            self.csv_file.flush()
        return s

    async def sampler(self, stop: asyncio.Event) -> None:
        print(",".join(HEADER), flush=True)
        while True:
            await self.sample()
            try:
                await asyncio.wait_for(stop.wait(), self.args.sample_every)
                return
            except (TimeoutError, asyncio.TimeoutError):
                pass

    # ------------------------------------------------------------------ after

    async def leaks(self) -> dict[str, Any]:
        st = self.stack
        found: dict[str, Any] = {}

        async def clean() -> bool:
            return not await asyncio.to_thread(st.containers, False) and not await asyncio.to_thread(st.tasks_dir_leftovers)

        try:  # a pool container being replaced shows for a moment
            await wait_for("no task container and nothing in TASKS_DIR", clean, 30, every=1)
        except TimeoutError:
            pass  # reported below
        found["containers"] = await asyncio.to_thread(st.containers, False)
        names = {f"sr-{o.task_id}" for o in self.outcomes if o.task_id}
        out = subprocess.run(["docker", "network", "inspect", TASK_NETWORK, "--format", "{{range .Containers}}{{.Name}} {{end}}"],
                             capture_output=True, text=True)  # fmt: skip
        found["task_network_endpoints"] = [n for n in out.stdout.split() if n in names]
        found["new_networks"] = sorted(set(self.networks()) - self.networks_before)
        found["tasks_dir"] = await asyncio.to_thread(st.tasks_dir_leftovers)
        r = st.aredis
        keys = sorted({k async for k in r.scan_iter(match=f"{st.prefix}:*", count=1000)})
        live = {st.keys.worker(n) for n in st.worker_names()}
        stats_minute = [k for k in keys if k.startswith(st.keys.stats() + ":")]
        expected = {st.keys.jobs(), st.keys.workers(), st.keys.stats(), st.keys.task_index()} | live
        found["unexpected_keys"] = [k for k in keys if k not in expected and k not in stats_minute]
        found["stats_minute_keys"] = len(stats_minute)
        ttls = [await r.ttl(k) for k in stats_minute]
        found["stats_minute_bad_ttl"] = [k for k, t in zip(stats_minute, ttls) if not 0 < t <= STATS_MINUTE_TTL_SECONDS]
        found["jobs_stream"] = {"xlen": await r.xlen(st.keys.jobs()),
                                "pending": (await r.xpending(st.keys.jobs(), WORKER_GROUP))["pending"]}  # fmt: skip
        found["workers_set"] = sorted(await r.smembers(st.keys.workers()))
        index_before = await r.zcard(st.keys.task_index())
        # A list_tasks walk drops index entries whose record has expired.
        cursor = None
        for _ in range(10000):
            args: dict[str, Any] = {"limit": 100} | ({"cursor": cursor} if cursor else {})
            page = await self.call("list_tasks", args)
            if isinstance(page, str):
                self.failures.append(f"list_tasks: {page}")
                break
            if page["tasks"]:
                self.failures.append(f"list_tasks still lists {len(page['tasks'])} task(s) after retention")
            cursor = page.get("next_cursor")
            if not cursor:
                break
        found["task_index"] = {"before_walk": index_before, "after_walk": await r.zcard(st.keys.task_index())}
        return found

    def growth(self) -> dict[str, float]:
        """MiB gained between the first and the last quarter of the load phase
        (the highest sample of each; the very first sample, taken before any
        task, is left out)."""
        load = [s for s in self.samples if s.phase == "load"][1:]
        if len(load) < 4:
            return {}
        q = max(1, len(load) // 4)
        first, last = load[:q], load[-q:]
        series = {
            "api_rss": lambda s: s.api_mib,
            "workers_rss": lambda s: sum(s.worker_mib),
            "redis_rss": lambda s: s.redis_rss_mib,
            "redis_used": lambda s: s.redis_used_mib,
        }
        return {k: round(max(map(f, last)) - max(map(f, first)), 1) for k, f in series.items()}

    def chart(self, width: int = 60, height: int = 12) -> str:
        """The memory curves as text: api (a), workers (w), Redis RSS (r)."""
        pts = self.samples
        if len(pts) < 2:
            return ""
        series = [("a", [s.api_mib for s in pts]), ("w", [sum(s.worker_mib) for s in pts]), ("r", [s.redis_rss_mib for s in pts])]
        top = max(max(v) for _, v in series) * 1.1 or 1
        cols = min(width, len(pts))
        grid = [[" "] * cols for _ in range(height)]
        for ch, vals in series:
            for c in range(cols):
                v = vals[round(c * (len(vals) - 1) / max(1, cols - 1))]
                r = height - 1 - min(height - 1, int(v / top * height))
                grid[r][c] = ch if grid[r][c] == " " else "*"
        lines = [f"{top * (height - i) / height:7.1f} |" + "".join(row) for i, row in enumerate(grid)]
        lines.append("    MiB +" + "-" * cols)
        lines.append(f"         0 s{' ' * max(1, cols - 14)}{round(pts[-1].t)} s")
        lines.append("         a = api RSS, w = workers RSS, r = redis-server RSS, * = overlap")
        return "\n".join(lines)

    def markdown(self) -> str:
        head = "| min | phase | submitted | finished | in flight | queued | api RSS MiB | workers RSS MiB | Redis RSS MiB | Redis used MiB | keys | containers |"
        rows = [head, "|" + "---|" * 12]
        for s in self.samples:
            rows.append(f"| {s.t / 60:.1f} | {s.phase} | {s.submitted} | {s.finished} | {s.in_flight} | {s.queued} | {s.api_mib} | "
                        f"{round(sum(s.worker_mib), 1)} | {s.redis_rss_mib} | {s.redis_used_mib} | {s.redis_keys} | {s.containers} |")  # fmt: skip
        return "\n".join(rows)

    def png(self, path: str) -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            log("matplotlib is not installed: no PNG (pip install matplotlib into .venv)")
            return
        t = [s.t / 60 for s in self.samples]
        fig, ax = plt.subplots(figsize=(9, 4))
        ax.plot(t, [s.api_mib for s in self.samples], label="api RSS")
        ax.plot(t, [sum(s.worker_mib) for s in self.samples], label="worker RSS")
        ax.plot(t, [s.redis_rss_mib for s in self.samples], label="redis-server RSS")
        ax.plot(t, [s.redis_used_mib for s in self.samples], label="Redis used_memory", linestyle="--")
        for phase, label in (("drain", "load ends"), ("retention", "all tasks ended")):
            first = next((s.t / 60 for s in self.samples if s.phase == phase), None)
            if first is not None:
                ax.axvline(first, color="grey", linestyle=":", linewidth=1)
                ax.annotate(label, (first, 0), xytext=(3, 3), textcoords="offset points", fontsize=8, color="grey")
        ax.set_xlabel("minutes")
        ax.set_ylabel("MiB")
        ax.set_ylim(bottom=0)
        ax.set_title(f"soak: {self.args.rate:g} tasks/s mixed for {self.args.duration / 60:g} min, retention {self.args.retention} s")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        fig.tight_layout()
        fig.savefig(path)
        log(f"chart written to {path}")

    # ------------------------------------------------------------------ main

    async def run(self) -> int:
        a = self.args
        result: dict[str, Any] = {}
        try:
            await self.start()
            if a.csv:
                self.csv_file = open(a.csv, "w", newline="")  # noqa: SIM115 - closed below
                csv.writer(self.csv_file).writerow(HEADER)
            self.t0 = time.monotonic()
            stop = asyncio.Event()
            sampler = asyncio.create_task(self.sampler(stop))
            await asyncio.wait_for(self.load(), a.duration + 600)
            load_end = time.monotonic()
            # Retention: the last record expires `retention` s after its task ended.
            self.phase = "retention"
            log(f"load done; waiting {a.retention + a.margin} s for retention to pass")
            await asyncio.sleep(a.retention + a.margin)
            stop.set()
            await sampler
            await self.sample()
            leaks = await self.leaks()
            by_kind: dict[str, dict[str, int]] = {}
            for o in self.outcomes:
                k = by_kind.setdefault(o.kind, {"ok": 0, "bad": 0})
                k["bad" if o.problems else "ok"] += 1
            waits = sorted(o.wait_s for o in self.outcomes if o.wait_s is not None)
            growth = self.growth()
            result = {
                "tasks": len(self.outcomes),
                "by_kind": by_kind,
                "queue_wait_s": {"p50": round(statistics.median(waits), 2), "p95": round(waits[int(len(waits) * 0.95) - 1], 2), "max": round(waits[-1], 2)} if waits else {},
                "max_queued": max(s.queued for s in self.samples),
                "growth_mib": growth,
                "peak_mib": {"api": max(s.api_mib for s in self.samples), "workers": max(sum(s.worker_mib) for s in self.samples),
                             "redis_rss": max(s.redis_rss_mib for s in self.samples), "redis_used": max(s.redis_used_mib for s in self.samples)},  # fmt: skip
                "leaks": leaks,
                "client_errors": self.errors,
                "load_s": round(load_end - self.t0),
                "total_s": round(time.monotonic() - self.t0),
                "settings": {"rate": a.rate, "duration_s": a.duration, "workers": a.workers, "concurrency": a.concurrency,
                             "pool_size": a.pool_size or "worker default",
                             "retention_s": a.retention, "sample_every_s": a.sample_every, "binaries": str(a.bin_dir)},  # fmt: skip
            }
            bad = [o for o in self.outcomes if o.problems]
            if bad:
                self.failures.append(f"{len(bad)} task(s) did not end as their kind expects, e.g. " +
                                     "; ".join(f"{o.kind} {o.task_id}: {o.problems}" for o in bad[:5]))  # fmt: skip
            for what in ("containers", "task_network_endpoints", "tasks_dir", "unexpected_keys", "stats_minute_bad_ttl"):
                if leaks[what]:
                    self.failures.append(f"left behind ({what}): {leaks[what][:10]}")
            if leaks["jobs_stream"] != {"xlen": 0, "pending": 0}:
                self.failures.append(f"jobs stream not empty: {leaks['jobs_stream']}")
            if leaks["workers_set"] != sorted(self.stack.worker_names()):
                self.failures.append(f"worker registry {leaks['workers_set']} is not the live workers")
            if leaks["task_index"]["after_walk"]:
                self.failures.append(f"list_tasks index keeps {leaks['task_index']['after_walk']} entries of expired tasks")
            bounds = {"api_rss": a.max_growth_api, "workers_rss": a.max_growth_worker * a.workers,
                      "redis_rss": a.max_growth_redis, "redis_used": a.max_growth_redis}  # fmt: skip
            for k, v in growth.items():
                if v > bounds[k]:
                    self.failures.append(f"{k} grew by {v} MiB during the load, more than the {bounds[k]} MiB bound")
            result["bounds_mib"] = bounds
        except (TimeoutError, asyncio.TimeoutError) as e:
            self.failures.append(f"soak did not finish in time: {e}")
        finally:
            if self.csv_file:
                self.csv_file.close()
            if self.mcp:
                await self.mcp.close()
            await self.stack.aclose()
            left = await asyncio.to_thread(self.stack.stop_all)
            if left:
                log(f"removed {len(left)} container(s) left behind")
        if result:
            self.report(result)
            if a.json:
                Path(a.json).write_text(json.dumps(result | {"failures": self.failures, "samples": [s.__dict__ for s in self.samples]}, indent=2))
            if a.png:
                self.png(a.png)
        for m in self.failures:
            print(f"FAILED: {m}")
        if not self.failures:
            print("all checks passed")
        self.stack.cleanup(keep=a.keep or bool(self.failures))
        return 1 if self.failures else 0

    def report(self, r: dict[str, Any]) -> None:
        print()
        print(f"soak: {r['settings']['rate']} tasks/s for {r['settings']['duration_s']} s, {r['settings']['workers']} worker(s) x "
              f"{r['settings']['concurrency']} slots, POOL_SIZE {r['settings']['pool_size']}, retention {r['settings']['retention_s']} s, {r['settings']['binaries']}")  # fmt: skip
        print_table([
            ("tasks", r["tasks"]),
            ("as expected, by kind", ", ".join(f"{k} {v['ok']}/{v['ok'] + v['bad']}" for k, v in sorted(r["by_kind"].items()))),
            ("wait for a container (created -> started)", r["queue_wait_s"]),
            ("most jobs waiting at a sample", r["max_queued"]),
            ("peak MiB", r["peak_mib"]),
            ("growth MiB, first to last quarter of the load", r["growth_mib"]),
            ("left after retention", {k: v for k, v in r["leaks"].items()}),
            ("client errors (retried)", r["client_errors"] or "none"),
            ("load phase, total", f"{r['load_s']} s, {r['total_s']} s"),
        ])  # fmt: skip
        print()
        print(self.chart())
        print()
        print(self.markdown())


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--duration", type=float, default=1800, help="seconds of load (default 1800)")
    p.add_argument("--rate", type=float, default=2.0, help="tasks submitted per second (default 2)")
    p.add_argument("--sample-every", type=float, default=60, help="seconds between memory samples (default 60)")
    p.add_argument("--retention", type=int, default=60, help="TASK_RETENTION_SECONDS (default 60, the minimum)")
    p.add_argument("--margin", type=int, default=15, help="seconds past retention before the leak checks (default 15)")
    p.add_argument("--workers", type=int, default=1, help="workers (default 1)")
    p.add_argument("--concurrency", type=int, default=12, help="WORKER_CONCURRENCY (default 12)")
    p.add_argument("--long-seconds", type=int, default=20, help="how long a 'long' task sleeps (default 20)")
    p.add_argument("--max-growth-api", type=float, default=16, help="MiB the api may grow (default 16)")
    p.add_argument("--max-growth-worker", type=float, default=16, help="MiB each worker may grow (default 16)")
    p.add_argument("--max-growth-redis", type=float, default=16, help="MiB Redis may grow, RSS and used_memory (default 16)")
    p.add_argument("--csv", help="write the samples to this CSV file")
    p.add_argument("--json", help="write the figures and samples to this file")
    p.add_argument("--png", help="draw the memory curves to this PNG (needs matplotlib)")
    return p.parse_args(argv)


def main() -> int:
    return run_main(Soak(parse_args(sys.argv[1:])).run)


if __name__ == "__main__":
    sys.exit(main())
