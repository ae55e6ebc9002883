"""What the fault and soak runs share: real processes (redis-server, the api and
worker binaries, Caddy), a minimal Redis client, an MCP client that speaks plain
JSON-RPC over HTTP, and a `docker events` recorder.

Nothing is mocked: the binaries come from `cargo build --bins` (debug) or
`cargo build --release --bins`, Redis and Caddy are the Debian packages, tasks
run in the real Docker engine behind the real host firewall.

Every wait polls a condition against a deadline; nothing sleeps and hopes.
Only processes started here are ever signalled, by their own pid.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("TEST_RUNTIME_IMAGE") or "script-runner-test/python:3.13-trixie"
NODE_IMAGE = os.environ.get("TEST_NODE_IMAGE") or "script-runner-test/node:24-trixie"
RUNTIME_IMAGES = f"node24={NODE_IMAGE},python3.13={IMAGE},python3.8={IMAGE}"
FINAL_STATES = frozenset({"succeeded", "failed", "killed", "timed-out"})
# A warm pool container's name until a task claims it (then `sr-<task_id>`).
IDLE_POOL_PREFIX = "sr-pool-"

# Only these variables reach the services from the caller's environment, so a
# developer's shell cannot change what is measured.
PASSTHROUGH_ENV = ("PATH", "HOME", "TMPDIR", "DOCKER_HOST", "DOCKER_CONFIG", "RUST_BACKTRACE")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_for(what: str, check: Callable[[], Awaitable[Any]], deadline: float, every: float = 0.1) -> Any:
    """Polls `check` until it returns something truthy (returned), or raises
    TimeoutError naming `what` after `deadline` seconds. An exception from
    `check` counts as "not yet"."""
    end = time.monotonic() + deadline
    last: BaseException | None = None
    while True:
        try:
            v = await check()
            if v:
                return v
        except Exception as e:  # not ready yet
            last = e
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {deadline:.0f} s waiting for {what}" + (f" (last error: {last})" if last else ""))
        await asyncio.sleep(every)


# --------------------------------------------------------------------------- Redis


class RedisError(Exception):
    """An error reply from Redis."""


def _encode(args: tuple[Any, ...]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


async def _read_reply(r: asyncio.StreamReader) -> Any:
    line = await r.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError(f"truncated reply from Redis: {line!r}")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RedisError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = await r.readexactly(n + 2)
        return data[:-2].decode(errors="replace")
    if kind == b"*":
        n = int(rest)
        if n < 0:
            return None
        return [await _read_reply(r) for _ in range(n)]
    raise ConnectionError(f"unexpected reply from Redis: {line!r}")


async def redis(port: int, *args: Any, timeout: float = 2.0) -> Any:
    """One command on a fresh connection (RESP2). Raises OSError/TimeoutError when
    Redis is not there, RedisError for an error reply."""
    r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    try:
        w.write(_encode(args))
        await w.drain()
        return await asyncio.wait_for(_read_reply(r), timeout)
    finally:
        w.close()


async def scan_keys(port: int, pattern: str) -> list[str]:
    """Every key matching `pattern`, with SCAN (never KEYS)."""
    keys: list[str] = []
    cursor = "0"
    while True:
        cursor, batch = await redis(port, "SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
        keys.extend(batch)
        if cursor == "0":
            return sorted(set(keys))


def pairs(flat: list[Any] | None) -> dict[str, Any]:
    """[k1, v1, k2, v2] -> {k1: v1, k2: v2} (HGETALL, XRANGE fields)."""
    flat = flat or []
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}


class Keys:
    """The Redis key schema (shared/src/keys.rs, README's "Redis key schema"),
    spelled once for these tools."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def jobs(self) -> str:
        return f"{self.prefix}:jobs"

    def task(self, task_id: str) -> str:
        return f"{self.prefix}:task:{task_id}"

    def task_index(self) -> str:
        return f"{self.prefix}:tasks"

    def worker(self, name: str) -> str:
        return f"{self.prefix}:worker:{name}"

    def workers(self) -> str:
        return f"{self.prefix}:workers"

    def stats(self) -> str:
        return f"{self.prefix}:stats"

    GROUP = "workers"


# --------------------------------------------------------------------------- processes


@dataclass
class Proc:
    """A child process with its log file. Signalled only by its own pid."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        assert not self.alive(), f"{self.name} is already running"
        self.starts += 1
        with open(self.log_path, "ab") as logf:
            logf.write(f"\n===== start #{self.starts} at {time.strftime('%H:%M:%S')} =====\n".encode())
            logf.flush()
            self.popen = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.log_path.parent,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches us; we stop the children in order
            )

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        assert self.popen is not None and self.alive(), f"{self.name} is not running"
        self.popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL and reap, as a crash would."""
        if self.alive():
            assert self.popen is not None
            self.popen.kill()
            self.popen.wait()

    async def wait_exit(self, deadline: float) -> int:
        assert self.popen is not None
        popen = self.popen
        await wait_for(f"{self.name} to exit", lambda: asyncio.sleep(0, popen.poll() is not None), deadline)
        return popen.returncode

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds."""
        if not self.alive():
            return
        assert self.popen is not None
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"<cannot read {self.log_path}: {e}>"

    def vm_rss_kib(self) -> int | None:
        """Resident memory (VmRSS) of the process, from /proc."""
        if not self.alive():
            return None
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        except OSError:
            return None
        return None


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in PASSTHROUGH_ENV}
    env["NO_COLOR"] = "1"
    env["RUST_LOG"] = os.environ.get("RELIABILITY_RUST_LOG", "info,rmcp=warn")
    return env


async def wait_healthy(proc: Proc, url: str, what: str) -> None:
    """Waits (30 s at most) until `url` answers 200; stops the run with the
    process's log if it exits meanwhile."""

    async def healthy() -> bool:
        if not proc.alive():
            raise SystemExit(f"{proc.name} exited:\n{proc.log_tail()}")
        async with httpx2.AsyncClient(timeout=2.0) as c:
            return (await c.get(url)).status_code == 200

    await wait_for(what, healthy, 30)


@dataclass
class Stack:
    """Redis, workers, api replicas and (optionally) a Caddy in front of them, all
    as real processes under one key prefix and one temporary directory."""

    bin_dir: Path
    appendfsync: str = "everysec"
    keep: bool = False
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    token: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)
    tmp: Path = field(init=False)
    prefix: str = field(init=False)
    redis_port: int = 0
    redis_proc: Proc | None = None
    workers: dict[str, Proc] = field(default_factory=dict)
    apis: dict[str, Proc] = field(default_factory=dict)
    api_ports: dict[str, int] = field(default_factory=dict)
    proxy: Proc | None = None
    proxy_port: int = 0
    common_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix=f"sr-reliability-{self.run_id}-"))
        self.prefix = f"rel{self.run_id}"
        self.keys = Keys(self.prefix)
        self.tasks_dir = self.tmp / "tasks"
        self.tasks_dir.mkdir()

    # -- binaries and preflight

    def binary(self, name: str) -> str:
        path = self.bin_dir.resolve() / name  # the children run in the log directory
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise SystemExit(f"{path} is missing: run `cargo build --bins` (or --release) first")
        return str(path)

    @staticmethod
    def preflight(need_caddy: bool) -> None:
        tools = ["redis-server", "docker"] + (["caddy"] if need_caddy else [])
        for tool in tools:
            if shutil.which(tool) is None:
                raise SystemExit(f"`{tool}` is not on PATH (scripts/test.sh installs it with apt)")
        # Every task these runs submit is python3.13's (a shell in that image).
        if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0:
            raise SystemExit(f"runtime image {IMAGE} is missing: run scripts/build-test-image.sh")

    # -- Redis

    async def r(self, *args: Any, timeout: float = 2.0) -> Any:
        return await redis(self.redis_port, *args, timeout=timeout)

    async def start_redis(self) -> None:
        """redis-server with an append-only file, as production runs it
        (deploy/redis: appendonly yes, appendfsync everysec, no RDB snapshots,
        noeviction)."""
        data = self.tmp / "redis"
        data.mkdir(exist_ok=True)
        if self.redis_proc is None:
            self.redis_port = free_port()
            argv = [
                "redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "yes", "--appendfsync", self.appendfsync,
                "--maxmemory-policy", "noeviction", "--dir", str(data),
            ]  # fmt: skip
            self.redis_proc = Proc("redis", argv, base_env(), self.tmp / "redis.log")
        self.redis_proc.start()
        proc = self.redis_proc

        async def ready() -> bool:
            if not proc.alive():
                raise SystemExit(f"redis-server exited:\n{proc.log_tail()}")
            return await self.r("PING") == "PONG"

        await wait_for("redis-server to answer PING", ready, 20)

    # -- services

    def service_env(self, extra: dict[str, str]) -> dict[str, str]:
        return base_env() | {
            "REDIS_URL": f"redis://127.0.0.1:{self.redis_port}",
            "REDIS_KEY_PREFIX": self.prefix,
            "RUNTIME_IMAGES": RUNTIME_IMAGES,
        } | self.common_env | extra

    def worker_name(self, short: str) -> str:
        return f"{self.prefix}-{short}"

    def add_worker(self, short: str, extra: dict[str, str]) -> Proc:
        name = self.worker_name(short)
        env = self.service_env({"WORKER_NAME": name, "TASKS_DIR": str(self.tasks_dir)} | extra)
        proc = Proc(short, [self.binary("script-runner-worker")], env, self.tmp / f"worker-{short}.log")
        self.workers[short] = proc
        return proc

    async def start_worker(self, short: str, wait: bool = True) -> None:
        """Starts (or restarts, under the same name) a worker; waits for a heartbeat
        written by this process (the old key is deleted first when restarting, so
        an expiring one does not count)."""
        proc = self.workers[short]
        key = self.keys.worker(self.worker_name(short))
        if proc.starts:
            await self.r("DEL", key)
        proc.start()
        if not wait:
            return

        async def beating() -> bool:
            if not proc.alive():
                raise SystemExit(f"worker {short} exited:\n{proc.log_tail()}")
            return await self.r("EXISTS", key) == 1

        await wait_for(f"worker {short} to heartbeat", beating, 60)

    def add_api(self, short: str, extra: dict[str, str]) -> Proc:
        port = free_port()
        env = self.service_env({"SCRIPT_RUNNER_TOKEN": self.token, "LISTEN_ADDR": f"127.0.0.1:{port}"} | extra)
        proc = Proc(short, [self.binary("script-runner-api")], env, self.tmp / f"{short}.log")
        self.apis[short] = proc
        self.api_ports[short] = port
        return proc

    async def start_api(self, short: str) -> None:
        proc = self.apis[short]
        proc.start()
        await wait_healthy(proc, f"http://127.0.0.1:{self.api_ports[short]}/healthz", f"{short} /healthz")

    async def start_proxy(self) -> None:
        """Caddy as a round-robin reverse proxy in front of every api replica,
        taking a replica out for 30 s once a request to it fails (passive health
        check). Clients retry a failed request themselves.

        No `lb_try_duration`: Caddy 2.6 (Debian's) retries a POST after a refused
        connection with an already consumed body, so the retry fails with "http:
        invalid Read on closed Body" (caddyserver/caddy#5454) and counts as a
        failure of the healthy replica, which is then taken out too: with every
        replica out, Caddy answers 503 "no upstreams available" for the whole
        fail_duration, again each time the dead replica comes back into rotation.
        No active health check either: /healthz answers 503 while Redis is down,
        and taking every replica out then would hide the api's own error answer."""
        self.proxy_port = free_port()
        upstreams = " ".join(f"127.0.0.1:{p}" for p in self.api_ports.values())
        caddyfile = self.tmp / "Caddyfile"
        caddyfile.write_text(
            "{\n\tadmin off\n\tauto_https off\n}\n"
            f"http://127.0.0.1:{self.proxy_port} {{\n"
            f"\treverse_proxy {upstreams} {{\n"
            "\t\tlb_policy round_robin\n"
            "\t\tfail_duration 30s\n"
            "\t\tmax_fails 1\n"
            # As the deployment's Caddyfile: idle upstream connections closed
            # before the api's header timeout (10 s) closes them under a request.
            "\t\ttransport http {\n\t\t\tkeepalive 5s\n\t\t}\n"
            "\t}\n}\n"
        )
        env = base_env() | {"XDG_DATA_HOME": str(self.tmp / "caddy-data"), "XDG_CONFIG_HOME": str(self.tmp / "caddy-config")}
        self.proxy = Proc("caddy", ["caddy", "run", "--adapter", "caddyfile", "--config", str(caddyfile)], env, self.tmp / "caddy.log")
        self.proxy.start()
        await wait_healthy(self.proxy, f"http://127.0.0.1:{self.proxy_port}/healthz", "caddy to proxy /healthz")

    @property
    def url(self) -> str:
        """Where clients go: the proxy if there is one, else the first api."""
        if self.proxy is not None:
            return f"http://127.0.0.1:{self.proxy_port}"
        return f"http://127.0.0.1:{next(iter(self.api_ports.values()))}"

    # -- Docker

    def worker_names(self) -> list[str]:
        return [self.worker_name(s) for s in self.workers]

    def containers(self, idle_pool: bool = True) -> list[str]:
        """Ids of the containers of this run's workers, any state. Without
        `idle_pool`, leaves out warm pool containers waiting for a task (named
        `sr-pool-...` until a task claims one and it is renamed `sr-<task_id>`)."""
        ids: list[str] = []
        for name in self.worker_names():
            out = subprocess.run(
                ["docker", "ps", "-a", "--filter", f"label=script-runner.worker={name}", "--format", "{{.ID}} {{.Names}}"],
                capture_output=True, text=True,
            )  # fmt: skip
            for line in out.stdout.splitlines():
                cid, cname = line.split(maxsplit=1)
                if idle_pool or not cname.startswith(IDLE_POOL_PREFIX):
                    ids.append(cid)
        return ids

    def idle_pool_names(self) -> set[str]:
        """Names of this run's warm pool containers that wait for a task."""
        names: set[str] = set()
        for name in self.worker_names():
            out = subprocess.run(
                ["docker", "ps", "-a", "--filter", f"label=script-runner.worker={name}", "--format", "{{.Names}}"],
                capture_output=True, text=True,
            )  # fmt: skip
            names |= {n for n in out.stdout.split() if n.startswith(IDLE_POOL_PREFIX)}
        return names

    def tasks_dir_leftovers(self) -> list[str]:
        """What is in TASKS_DIR besides the directories of idle warm pool
        containers (`pool-<worker>/<container name>`)."""
        idle = self.idle_pool_names()
        pool_dirs = {f"pool-{n}" for n in self.worker_names()}
        left = []
        for entry in sorted(self.tasks_dir.iterdir()):
            if entry.name in pool_dirs and entry.is_dir():
                left += [f"{entry.name}/{sub.name}" for sub in sorted(entry.iterdir()) if sub.name not in idle]
            else:
                left.append(entry.name)
        return left

    # -- teardown

    def stop_all(self) -> None:
        if self.proxy:
            self.proxy.stop(5)
        for p in self.apis.values():
            p.stop(10)
        for p in self.workers.values():
            p.stop(30)
        if self.redis_proc:
            self.redis_proc.stop(10)
        leftovers = self.containers()
        if leftovers:
            log(f"removing {len(leftovers)} task container(s) left behind")
            subprocess.run(["docker", "rm", "-f", *leftovers], capture_output=True)

    def cleanup(self, failed: bool) -> None:
        if self.keep or failed:
            log(f"logs and data kept in {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def all_procs(self) -> list[Proc]:
        procs = list(self.workers.values()) + list(self.apis.values())
        return procs + [p for p in (self.redis_proc, self.proxy) if p is not None]


# --------------------------------------------------------------------------- MCP


class Unreachable(Exception):
    """The request did not get an MCP answer: connection refused or reset, a
    timeout, or an HTTP error status from a proxy. It may or may not have been
    applied by the server."""


class ProtocolError(Exception):
    """A JSON-RPC error answer (not a tool error)."""


@dataclass
class ToolResult:
    is_error: bool
    text: str
    structured: dict[str, Any] | None


class Mcp:
    """An MCP client over the stateless Streamable HTTP transport: one JSON-RPC
    `tools/call` per POST, as README's curl example. Plain HTTP rather than the
    Python SDK's session, so that each failure (refused, reset, 502, timeout)
    surfaces as one exception on one call, which a fault run must count and
    retry exactly."""

    def __init__(self, base_url: str, token: str, timeout: float = 15.0, connections: int = 32) -> None:
        self.url = f"{base_url}/mcp"
        self._id = 0
        self.http = httpx2.AsyncClient(
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json, text/event-stream",
                "Content-Type": "application/json",
            },
            timeout=httpx2.Timeout(timeout),
            limits=httpx2.Limits(max_connections=connections, max_keepalive_connections=connections),
        )

    async def close(self) -> None:
        await self.http.aclose()

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolResult:
        self._id += 1
        body = {"jsonrpc": "2.0", "id": self._id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
        try:
            resp = await self.http.post(self.url, content=json.dumps(body))
        except httpx2.TransportError as e:
            raise Unreachable(f"{type(e).__name__}: {e}") from e
        if resp.status_code != 200:
            raise Unreachable(f"HTTP {resp.status_code}: {resp.text[:200]}")
        try:
            msg = resp.json()
        except ValueError as e:
            raise Unreachable(f"not JSON: {resp.text[:200]}") from e
        if "error" in msg:
            raise ProtocolError(json.dumps(msg["error"])[:300])
        result = msg["result"]
        text = "\n".join(c.get("text", "") for c in result.get("content", []) if c.get("type") == "text")
        return ToolResult(bool(result.get("isError")), text, result.get("structuredContent"))


# --------------------------------------------------------------------------- docker events


class ContainerStarts:
    """Counts how many times each task started, from `docker events` running for
    the whole run: the outside counter (tasks cannot reach the host to count
    themselves: the firewall). A task starts either as its own container (cold:
    a `start` event of a container labelled `script-runner.task=<id>`) or as a
    process exec'd in a warm pool container (an `exec_start` event, whose action
    is the command line: the submitter puts a nonce in each command, `# n<hex>`,
    to tell them apart). The engine reports `exec_start` before the runtime has
    started the process, and an exec that then failed to start (its container had
    just stopped; the worker falls back to a cold start) never gets an `exec_die`:
    an exec counts once its `exec_die` arrives, which every process that started
    gets, however it ended. Only containers of the given workers count."""

    NONCE = re.compile(r"# n([0-9a-f]{12})\b")

    def __init__(self, worker_names: list[str]) -> None:
        self.workers = set(worker_names)
        self.by_task: dict[str, list[str]] = {}  # task id -> workers whose container started it
        self.by_nonce: dict[str, list[str]] = {}  # command nonce -> workers that exec'd it
        self.execs: dict[str, tuple[str, str]] = {}  # exec id -> (nonce, worker), until its exec_die
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    def runs(self, task_id: str, command: str) -> list[str]:
        """The workers that started this task, once per start."""
        m = self.NONCE.search(command)
        return self.by_task.get(task_id, []) + (self.by_nonce.get(m.group(1), []) if m else [])

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            "docker", "events", "--filter", "type=container", "--filter", "event=start",
            "--filter", "event=exec_start", "--filter", "event=exec_die", "--filter", "label=script-runner.worker",
            "--format", "{{json .}}", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        self._reader = asyncio.create_task(self._read())
        # `docker events` subscribes asynchronously: make sure it is listening before
        # any task runs, with a container of our own whose start must be seen.
        probe = f"sr-events-probe-{uuid.uuid4().hex[:8]}"
        self.workers.add(probe)
        subprocess.run(
            ["docker", "run", "--rm", "--name", probe, "--label", f"script-runner.task={probe}",
             "--label", f"script-runner.worker={probe}", "--network", "none", IMAGE, "true"],
            capture_output=True, check=True,
        )  # fmt: skip
        await wait_for("docker events to report a probe container", lambda: asyncio.sleep(0, probe in self.by_task), 30)
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
            worker = attrs.get("script-runner.worker")
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
