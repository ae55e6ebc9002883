#!/usr/bin/env python3
"""Persistent workspaces (BENCHMARKS.md, "Workspaces"), through the MCP tools against
a real api, worker (warm pool on), Redis and Docker engine. Run through
scripts/bench.sh --workspaces (or directly, with --bin-dir).

  pool hit               `true` with wait_seconds, no workspace: the baseline; then the
                         same on a 1 MB workspace (restored, then saved): what a small
                         workspace adds (target: at most +20 ms at the median)
  restore and save       by workspace size (--sizes MB, 100 files each): the worker's own
                         figures (its log's `workspace restored ... ms=` and `workspace
                         saved ... ms=`), for the local file system and, where the
                         `garage` binary is installed, for S3 (a Garage node started here)
  changed bytes          on the largest size: a task that changes one file, then one
                         that rewrites all: the save time and the blobs uploaded
  dedup                  the bytes every version names against the bytes in the store
  npm                    the e2e test project: `npm ci && npm test` on a fresh workspace,
                         then `npm test` on its head (target: at most 0.3x)

Medians of --rounds.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the shared harness package
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cache import npm_test_project  # noqa: E402
from harness.mcp_http import call_once, tools_call  # noqa: E402
from harness.procs import HarnessError  # noqa: E402
from harness.stack import Stack, preflight  # noqa: E402

FINAL = ("succeeded", "failed", "killed", "timed-out")


class Api:
    def __init__(self, stack: Stack, url: str) -> None:
        self.stack, self.url = stack, url

    def call(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        r = call_once(self.url, self.stack.token, tools_call(tool, args), timeout=120)
        if r.is_error:
            raise HarnessError(f"{tool}: {r.text}")
        return r.structured or {}

    def run(self, command: str, workspace: Any = None, runtime: str = "python3.13", **extra: Any) -> tuple[dict[str, Any], float]:
        """Runs `command` to its end (and its workspace version); the status and the
        seconds from the call to the answer that showed it ended."""
        args: dict[str, Any] = {"runtime": runtime, "command_base64": base64.b64encode(command.encode()).decode(),
                                "wait_seconds": 30, "timeout_seconds": 600, **extra}  # fmt: skip
        if workspace is not None:
            args["workspace"] = workspace
        t0 = time.perf_counter()
        s = self.call("run_script", args)
        while s.get("state") not in FINAL:
            s = self.call("get_task_status", {"task_id": s["task_id"], "wait_seconds": 30})
        took = time.perf_counter() - t0
        if workspace is not None:
            end = time.monotonic() + 120
            while s.get("workspace_version") is None and s.get("workspace_note") is None:
                if time.monotonic() > end:
                    raise HarnessError(f"task {s['task_id']} made no version in time: {s}")
                s = self.call("get_task_status", {"task_id": s["task_id"]})
        if s.get("state") != "succeeded":
            raise HarnessError(f"task ended {s.get('state')}: {s.get('stdout_tail', '')[-500:]} {s.get('stderr_tail', '')[-500:]}")
        return s, took


def worker_figures(log: Path, task_id: str) -> dict[str, int]:
    """The worker's own restore and save figures for a task, from its log."""
    out: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)  # the log's colours
        if f'task_id="{task_id}"' not in line and f"task_id={task_id}" not in line:
            continue
        for what in ("restored", "saved"):
            if f"workspace {what}" in line:
                for k in ("ms", "uploaded", "bytes", "files"):
                    m = re.search(rf"\b{k}=(\d+)", line)
                    if m:
                        out[f"{what}_{k}"] = int(m.group(1))
    return out


def start_garage(tmp: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]] | None:
    """A one-node Garage with a bucket and a key, as testkit/src/garage.rs starts
    one; None without the binary."""
    garage = shutil.which("garage") or str(Path.home() / ".cargo/bin/garage")
    if not Path(garage).is_file():
        return None
    import socket

    def port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    s3, rpc = port(), port()
    conf = tmp / "garage.toml"
    conf.write_text(
        f'metadata_dir = "{tmp}/meta"\ndata_dir = "{tmp}/data"\ndb_engine = "sqlite"\nreplication_factor = 1\n'
        f'rpc_bind_addr = "127.0.0.1:{rpc}"\nrpc_public_addr = "127.0.0.1:{rpc}"\nrpc_secret = "{secrets.token_hex(32)}"\n'
        f'[s3_api]\ns3_region = "garage"\napi_bind_addr = "127.0.0.1:{s3}"\n'
    )
    proc = subprocess.Popen([garage, "-c", str(conf), "server"], stdout=subprocess.DEVNULL, stderr=open(tmp / "garage.log", "wb"))

    def cli(*a: str) -> str:
        return subprocess.run([garage, "-c", str(conf), *a], capture_output=True, text=True, check=True).stdout

    end = time.monotonic() + 30
    while True:
        try:
            node = cli("node", "id", "-q").strip().split("@")[0]
            break
        except subprocess.CalledProcessError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)
    # `node id` reads the key from disk before the server listens for RPC: the layout
    # is asked again until the server takes it.
    while True:
        try:
            cli("layout", "assign", "-z", "dc1", "-c", "1G", node)
            break
        except subprocess.CalledProcessError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)
    cli("layout", "apply", "--version", "1")
    cli("bucket", "create", "bench")
    key = cli("key", "create", "bench")
    field = lambda name: re.search(rf"{name}:\s*(\S+)", key).group(1)  # noqa: E731
    cli("bucket", "allow", "--read", "--write", "--owner", "bench", "--key", "bench")
    env = {"WORKSPACE_STORE": "s3://bench/sr", "WORKSPACE_S3_ENDPOINT": f"http://127.0.0.1:{s3}",
           "WORKSPACE_S3_REGION": "garage", "WORKSPACE_S3_ACCESS_KEY_ID": field("Key ID"),
           "WORKSPACE_S3_SECRET_ACCESS_KEY": field("Secret key")}  # fmt: skip
    return proc, env


def fill(mb: int) -> str:
    """A command that writes `mb` MB into 100 files (urandom: nothing compresses)."""
    per = max(1, mb * 1_000_000 // 100)
    return f"for i in $(seq 1 100); do head -c {per} /dev/urandom > f$i; done"


POOL_IDLE = re.compile(r'^script_runner_worker_pool_idle\{runtime="python3\.13",network="internet"\} (\d+)', re.M)


def wait_pool(stack: Stack, deadline: float = 60) -> None:
    """Until the worker has its warm container (python3.13, the only pool) ready to
    take a task again: by its own gauge, not the container's name, which shows
    while the container is still being created and started (a task then would go
    cold, and its time would be a cold start's)."""
    url = stack.workers["w"].metrics_url
    assert url is not None
    end = time.monotonic() + deadline
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                m = POOL_IDLE.search(r.read().decode())
            if m and int(m.group(1)) > 0:
                return
        except OSError:
            pass
        if time.monotonic() > end:
            raise HarnessError("the warm pool did not refill")
        time.sleep(0.02)


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one round (proves the tool works)")
    ap.add_argument("--rounds", type=int, default=None, help="samples per figure (default 15, quick 2)")
    ap.add_argument("--sizes", default=None, help="workspace sizes in MB (default 1,100,1000; quick 1,5)")
    ap.add_argument("--image", default=os.environ.get("TEST_RUNTIME_IMAGE", "script-runner-test/python:3.13-trixie"))
    ap.add_argument("--node-image", default=os.environ.get("TEST_NODE_IMAGE", "script-runner-test/node:24-trixie"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rounds = args.rounds or (2 if args.quick else 15)
    sizes = [int(s) for s in (args.sizes or ("1,5" if args.quick else "1,100,1000")).split(",")]
    preflight(args.bin_dir, ("redis-server", "docker", "npm"), [args.image, args.node_image])
    print(f"workspaces, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}, {rounds} rounds, sizes {sizes} MB")  # fmt: skip
    results: dict[str, Any] = {}
    status = 1
    stacks: list[Stack] = []
    garage: subprocess.Popen[bytes] | None = None
    tmp = Path(tempfile.mkdtemp(prefix="sr-bench-ws-"))
    try:
        stores: list[tuple[str, dict[str, str]]] = [("local", {})]
        started = start_garage(tmp)
        if started:
            garage, s3_env = started
            stores.append(("s3", s3_env))
        else:
            print("  (no garage binary: S3 rows skipped; scripts/test.sh installs it)")
        for store, env in stores:
            stack = Stack(bin_dir=args.bin_dir, label=f"bench-ws-{store}",
                          runtime_images=f"python3.13={args.image},node24={args.node_image}")  # fmt: skip
            stacks.append(stack)
            stack.start_redis()
            disk = max(sizes) * 2 + 64
            stack.add_worker("w", {"POOL_SIZE": "python3.13=1", "EGRESS_POOL_SIZE": "0", "WORKER_CONCURRENCY": "1",
                                   "TASK_DISK_MB": str(disk), "TASK_MEMORY_MB": str(disk + 512), **env},
                             metrics=True)  # fmt: skip
            stack.start_worker("w")
            api = Api(stack, _api(stack))
            log = stack.tmp_dir / "worker-w.log"
            r: dict[str, Any] = results.setdefault(store, {})
            if store == "local":
                # Pool hits: each sample waits until the pool has its idle container again.
                def hit(workspace: Any = None) -> float:
                    wait_pool(stack)
                    return api.run("true", workspace)[1]

                ws = api.run(fill(1), "new")[0]["workspace_id"]
                base, small = [], []
                for _ in range(rounds):  # interleaved, so drift hits both alike
                    base.append(hit())
                    small.append(hit({"id": ws}))
                b, s = statistics.median(base) * 1000, statistics.median(small) * 1000
                r["pool_hit_ms"], r["pool_hit_1mb_ms"] = b, s
                print(f"  pool hit, no workspace {b:7.1f} ms   on a 1 MB workspace {s:7.1f} ms   (+{s - b:.1f} ms)")
            for mb in sizes:
                first = api.run(fill(mb), "new")[0]
                ws = first["workspace_id"]
                restore, save = [], []
                for _ in range(rounds):
                    st = api.run("true", {"id": ws})[0]
                    f = worker_figures(log, st["task_id"])
                    restore.append(f.get("restored_ms", 0))
                    save.append(f.get("saved_ms", 0))
                rm, sm = statistics.median(restore), statistics.median(save)
                r[f"{mb}mb"] = {"restore_ms": restore, "save_ms": save}
                print(f"  {store:5} {mb:5} MB   restore {rm:7.0f} ms   save (unchanged) {sm:7.0f} ms")
            # One file changed against all, on the largest size.
            mb = max(sizes)
            one = api.run("head -c 1000 /dev/urandom > f1", {"id": ws})[0]
            all_ = api.run(fill(mb), {"id": ws})[0]
            fo, fa = worker_figures(log, one["task_id"]), worker_figures(log, all_["task_id"])
            r["one_file"], r["all_files"] = fo, fa
            print(f"  {store:5} {mb:5} MB   one file changed: save {fo.get('saved_ms')} ms, {fo.get('saved_uploaded')} blobs sent;"
                  f" all changed: save {fa.get('saved_ms')} ms, {fa.get('saved_uploaded')} blobs sent")  # fmt: skip
            if store == "local":
                named = 0
                for w in api.call("list_workspaces", {"limit": 100}).get("workspaces", []):
                    info = api.call("get_workspace", {"workspace_id": w["workspace_id"]})
                    named += sum(v["bytes"] for v in info.get("versions", []))
                stored = du(stack.tmp_dir / "tasks" / "workspace-store")
                r["dedup"] = {"named_bytes": named, "stored_bytes": stored}
                print(f"  dedup: versions name {named / 1e6:.1f} MB, the store holds {stored / 1e6:.1f} MB"
                      f" ({named / max(stored, 1):.1f}x)")  # fmt: skip
                zip_b64 = base64.b64encode(npm_test_project(tmp / "npm")).decode()
                fresh, again = [], []
                for _ in range(rounds):
                    st, t1 = api.run("npm ci --no-audit --no-fund && npm test", "new", "node24", zip_base64=zip_b64)
                    _, t2 = api.run("npm test", {"id": st["workspace_id"]}, "node24")
                    fresh.append(t1)
                    again.append(t2)
                f, a = statistics.median(fresh) * 1000, statistics.median(again) * 1000
                r["npm"] = {"fresh_ms": fresh, "head_ms": again}
                print(f"  npm: fresh npm ci && npm test {f:7.0f} ms   npm test on the head {a:7.0f} ms   ({a / f:.2f}x)")
            stack.stop_all()
        status = 0
    except (HarnessError, TimeoutError, subprocess.CalledProcessError) as e:
        print(f"\nbench workspaces: {e}", file=sys.stderr)
    finally:
        for stack in stacks:
            stack.stop_all()
        if garage:
            garage.kill()
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")
        for stack in stacks:
            if status:
                print(f"bench workspaces: logs kept in {stack.tmp_dir}", file=sys.stderr)
            else:
                stack.cleanup(keep=bool(os.environ.get("BENCH_KEEP")))
        shutil.rmtree(tmp, ignore_errors=True)
    return status


def _api(stack: Stack) -> str:
    api = stack.add_api("api")
    stack.start_api("api")
    return api.mcp_url


if __name__ == "__main__":
    sys.exit(main())
