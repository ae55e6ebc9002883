"""The processes a benchmark run starts (redis-server, workers, api), and a minimal
pipelining Redis client. Nothing here measures; bench.py does.

Every process is started in its own session and stopped by its own pid (SIGTERM,
then SIGKILL after a deadline); nothing is killed by name. Every wait polls a
condition against a deadline and fails with the process's log if it exits first.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

STARTUP_DEADLINE = 60.0  # seconds for a process to become ready
STOP_DEADLINE = 15.0  # seconds between SIGTERM and SIGKILL

# Only these reach the services from the caller's environment, so a developer's
# shell (MAX_TIMEOUT_SECONDS, TASK_USER, ...) cannot change what is measured.
PASSTHROUGH_ENV = (
    "PATH",
    "HOME",
    "TMPDIR",
    "XDG_RUNTIME_DIR",
    "DOCKER_HOST",
    "DOCKER_CONFIG",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "RUST_LOG",
)

# The Docker label every task (and pool) container carries (worker/src/sandbox.rs).
LABEL_WORKER = "script-runner.worker"


class BenchError(Exception):
    """Something the benchmark needs failed; the message says what."""


# --------------------------------------------------------------------------- Redis


class RedisError(Exception):
    pass


def _encode(args: Iterable[object]) -> bytes:
    parts = []
    items = list(args)
    parts.append(b"*%d\r\n" % len(items))
    for a in items:
        if isinstance(a, bytes):
            b = a
        elif isinstance(a, str):
            b = a.encode()
        else:
            b = str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)


class Redis:
    """One RESP2 connection. `pipeline` sends many commands in one write and reads
    their replies in order (an error reply comes back as a RedisError value);
    calling the object sends one command and raises on an error reply. Bulk
    strings come back as str (utf-8, invalid bytes replaced)."""

    def __init__(self, port: int, timeout: float = 60.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb", buffering=1 << 16)

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def _read(self) -> object:
        line = self.reader.readline()
        if not line.endswith(b"\r\n"):
            raise BenchError(f"Redis closed the connection or sent a truncated reply: {line!r}")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            return self.reader.read(n + 2)[:-2].decode(errors="replace")
        if kind == b"*":
            n = int(rest)
            if n < 0:
                return None
            return [self._read() for _ in range(n)]
        raise BenchError(f"unexpected reply from Redis: {line!r}")

    def pipeline(self, commands: list[tuple[object, ...]]) -> list[object]:
        self.sock.sendall(b"".join(_encode(c) for c in commands))
        return [self._read() for _ in commands]

    def __call__(self, *args: object) -> object:
        (reply,) = self.pipeline([args])
        if isinstance(reply, RedisError):
            raise reply
        return reply

    def info(self, section: str) -> dict[str, str]:
        text = self("INFO", section)
        assert isinstance(text, str)
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("#"))


# --------------------------------------------------------------------------- processes


def free_port() -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def rss_kib(self) -> int:
        """Resident memory (VmRSS) now, in KiB."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise BenchError(f"{self.name}: no VmRSS in /proc/{self.pid}/status")

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"<could not read {self.log_path}: {e}>"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_DEADLINE. Only this process."""
        if self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=STOP_DEADLINE)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=STOP_DEADLINE)


def wait_until(what: str, condition: Callable[[], bool], proc: Proc | None, deadline: float = STARTUP_DEADLINE) -> None:
    end = time.monotonic() + deadline
    delay = 0.01
    while True:
        try:
            if condition():
                return
        except (OSError, RedisError, BenchError):
            pass  # not ready yet
        if proc is not None and not proc.alive():
            raise BenchError(
                f"{proc.name} exited with code {proc.popen.returncode} while waiting for {what}\n"
                f"--- {proc.log_path} ---\n{proc.log_tail()}"
            )
        if time.monotonic() > end:
            log = f"\n--- {proc.log_path} ---\n{proc.log_tail()}" if proc else ""
            raise BenchError(f"timed out after {deadline:.0f} s waiting for {what}{log}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


@dataclass
class Worker:
    proc: Proc
    name: str
    prefix: str
    metrics_url: str


@dataclass
class Api:
    proc: Proc
    prefix: str
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mcp_url(self) -> str:
        return f"{self.base_url}/mcp"


@dataclass
class Stack:
    """Everything one run starts, under one temporary directory and one run id
    (every Redis key prefix and worker name carries it)."""

    bin_dir: Path
    tmp_dir: Path
    runtime_images: str
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    token: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)
    procs: list[Proc] = field(default_factory=list)
    redis_port: int = 0
    redis_proc: Proc | None = None
    workers: list[Worker] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in PASSTHROUGH_ENV}
        env["NO_COLOR"] = "1"
        return env

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        log_path = self.tmp_dir / f"{name}.log"
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(
                argv,
                env=env,
                cwd=self.tmp_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def redis(self, timeout: float = 60.0) -> Redis:
        return Redis(self.redis_port, timeout)

    def start_redis(self) -> None:
        """redis-server on a free port, persisting like the deployment (AOF,
        fsync every second), so writes cost what they cost in production."""
        last: Exception | None = None
        for attempt in range(5):  # a free port can be taken before redis binds it
            port = free_port()
            data = self.tmp_dir / f"redis-{attempt}"
            data.mkdir()
            proc = self.spawn(
                f"redis-{attempt}",
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                 "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""],
                self.env(),
            )  # fmt: skip
            try:
                wait_until(f"redis-server on port {port}", lambda: Redis(port, 1.0)("PING") == "PONG", proc, 10.0)
            except BenchError as e:
                proc.stop()
                last = e
                continue
            self.redis_port = port
            self.redis_proc = proc
            return
        raise BenchError(f"could not start redis-server: {last}")

    def start_worker(self, label: str, prefix: str, extra_env: dict[str, str]) -> Worker:
        name = f"bench-{self.run_id}-{label}"
        tasks_dir = self.tmp_dir / f"tasks-{label}"
        tasks_dir.mkdir()
        metrics_port = free_port()
        env = self.env() | {
            "REDIS_URL": f"redis://127.0.0.1:{self.redis_port}",
            "REDIS_KEY_PREFIX": prefix,
            "WORKER_NAME": name,
            "TASKS_DIR": str(tasks_dir),
            "RUNTIME_IMAGES": self.runtime_images,
            "SHUTDOWN_GRACE_SECONDS": "5",
            "WORKER_METRICS_ADDR": f"127.0.0.1:{metrics_port}",
        } | extra_env
        proc = self.spawn(f"worker-{label}", [str(self.bin_dir / "script-runner-worker")], env)
        beat = f"{prefix}:worker:{name}"
        r = self.redis()
        try:
            wait_until(f"worker {name}'s heartbeat", lambda: r("EXISTS", beat) == 1, proc)
        finally:
            r.close()
        worker = Worker(proc, name, prefix, f"http://127.0.0.1:{metrics_port}/metrics")
        self.workers.append(worker)
        return worker

    def start_api(self, label: str, prefix: str, extra_env: dict[str, str] | None = None) -> Api:
        port = free_port()
        env = self.env() | {
            "SCRIPT_RUNNER_TOKEN": self.token,
            "REDIS_URL": f"redis://127.0.0.1:{self.redis_port}",
            "REDIS_KEY_PREFIX": prefix,
            "LISTEN_ADDR": f"127.0.0.1:{port}",
            "RUNTIME_IMAGES": self.runtime_images,
        } | (extra_env or {})
        proc = self.spawn(f"api-{label}", [str(self.bin_dir / "script-runner-api")], env)
        api = Api(proc, prefix, port)
        wait_until(f"{api.base_url}/healthz", lambda: http_get(f"{api.base_url}/healthz", 1.0)[0] == 200, proc)
        return api

    def stop_worker(self, worker: Worker) -> None:
        worker.proc.stop()
        remove_containers_of(worker.name)

    def stop_all(self) -> list[str]:
        """Stops api, workers, then Redis (reverse start order); returns the
        containers a worker left behind (removed here)."""
        for proc in reversed(self.procs):
            proc.stop()
        left = []
        for w in self.workers:
            left += remove_containers_of(w.name)
        return left


def containers_of(worker: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={LABEL_WORKER}={worker}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def remove_containers_of(worker: str) -> list[str]:
    ids = containers_of(worker)
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, check=False)
    return ids
