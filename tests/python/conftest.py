"""Fixtures for the end-to-end suite: a real redis-server, the worker and the api,
started once per session from target/debug, and an MCP client (the official Python
SDK, `mcp` 2.x) connected to the api over Streamable HTTP with the bearer token.

Nothing here sleeps and hopes: every wait polls a condition against a deadline and
fails at once, with the process's log, if the process it waits for has exited.

Environment:
  TEST_RUNTIME_IMAGE        image for python3.13 and python3.8 (default
                            script-runner-test/python:3.13-trixie, built by scripts/build-test-image.sh)
  TEST_NODE_IMAGE           image for node24 (default script-runner-test/node:24-trixie, same script)
  SCRIPT_RUNNER_KEEP_LOGS=1 keep the temporary directory (logs, task dirs) after the run
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN_DIR = REPO_ROOT / "target" / "debug"
API_BIN = BIN_DIR / "script-runner-api"
WORKER_BIN = BIN_DIR / "script-runner-worker"
IMAGE = os.environ.get("TEST_RUNTIME_IMAGE") or "script-runner-test/python:3.13-trixie"
NODE_IMAGE = os.environ.get("TEST_NODE_IMAGE") or "script-runner-test/node:24-trixie"
RUNTIMES = ("node24", "python3.13", "python3.8")
RUNTIME_IMAGES = f"node24={NODE_IMAGE},python3.13={IMAGE},python3.8={IMAGE}"
# The warm pool the workers keep: TEST_POOL_SIZE (e.g. 0 for none) or the worker's
# default. scripts/test.sh runs the suites both ways.
POOL_SIZE = os.environ.get("TEST_POOL_SIZE")

STARTUP_DEADLINE = 30.0  # seconds for each process to become ready
STOP_DEADLINE = 10.0  # seconds between SIGTERM and SIGKILL
LOG_TAIL_LINES = 200

# Only these variables reach the services from the caller's environment, so a
# developer's shell (MAX_TIMEOUT_SECONDS, TASK_USER, ALLOWED_HOSTS, ...) cannot
# change what the suite tests.
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
    "RUST_BACKTRACE",
)


# --------------------------------------------------------------------------- helpers


def free_port() -> int:
    """A TCP port that was free a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_command(port: int, *args: str, timeout: float = 2.0) -> object:
    """Sends one command to Redis over a raw socket (RESP2) and returns the reply:
    str for simple strings and bulk strings, int for integers, None for nil.
    Raises RuntimeError for an error reply and OSError when Redis is not there."""
    payload = f"*{len(args)}\r\n".encode()
    for a in args:
        b = a.encode()
        payload += b"$%d\r\n%s\r\n" % (len(b), b)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        f = s.makefile("rb")
        line = f.readline()
        if not line.endswith(b"\r\n"):
            raise OSError(f"truncated reply from Redis: {line!r}")
        kind, rest = line[:1], line[1:-2].decode()
        if kind == b"+":
            return rest
        if kind == b"-":
            raise RuntimeError(f"Redis error: {rest}")
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            return f.read(n + 2)[:-2].decode()
        raise OSError(f"unexpected reply from Redis: {line!r}")


@dataclass
class Service:
    """One child process with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"<could not read {self.log_path}: {e}>"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM, wait up to STOP_DEADLINE, then SIGKILL. Only ever this process."""
        if self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=STOP_DEADLINE)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=STOP_DEADLINE)


def wait_until(what: str, condition: Callable[[], bool], service: Service, deadline: float = STARTUP_DEADLINE) -> None:
    """Polls `condition` until it is true; fails with the service's log if the
    deadline passes or the service exits first."""
    end = time.monotonic() + deadline
    delay = 0.02
    while True:
        try:
            if condition():
                return
        except Exception:  # not ready yet (connection refused, ...)
            pass
        if not service.alive():
            raise RuntimeError(
                f"{service.name} exited with code {service.popen.returncode} while waiting for {what}.\n"
                f"--- {service.name} log ({service.log_path}) ---\n{service.log_tail()}"
            )
        if time.monotonic() > end:
            raise RuntimeError(
                f"timed out after {deadline:.0f} s waiting for {what}.\n"
                f"--- {service.name} log ({service.log_path}) ---\n{service.log_tail()}"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.25)


def spawn(name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> Service:
    log_path = log_dir / f"{name}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - the child owns it; closed below after fork
    try:
        popen = subprocess.Popen(
            argv,
            env=env,
            cwd=log_dir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal reaches pytest, which stops us in order
        )
    finally:
        log.close()
    return Service(name, popen, log_path)


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in PASSTHROUGH_ENV}
    env["NO_COLOR"] = "1"  # plain logs (tracing-subscriber honours NO_COLOR)
    # rmcp logs three INFO lines per stateless request; keep the logs readable.
    env.setdefault("RUST_LOG", "info,rmcp=warn")
    return env


def preflight() -> None:
    """Fails early, with what to do, when something the suite needs is missing."""
    for binary in (API_BIN, WORKER_BIN):
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            pytest.fail(
                f"{binary.name} not found at {binary}: run `cargo build --bins` in {REPO_ROOT}", pytrace=False
            )
    for tool in ("redis-server", "docker"):
        if shutil.which(tool) is None:
            pytest.fail(f"`{tool}` is not on PATH; the end-to-end suite needs it", pytrace=False)
    for image, var in ((IMAGE, "TEST_RUNTIME_IMAGE"), (NODE_IMAGE, "TEST_NODE_IMAGE")):
        probe = subprocess.run(["docker", "image", "inspect", image], capture_output=True, text=True)
        if probe.returncode != 0:
            pytest.fail(
                f"the runtime image {image!r} is not in the local Docker engine "
                f"({probe.stderr.strip() or probe.stdout.strip()}); build it with scripts/build-test-image.sh "
                f"or point {var} at another image",
                pytrace=False,
            )


# --------------------------------------------------------------------------- the stack


@dataclass
class Stack:
    tmp_dir: Path
    token: str = field(repr=False)
    prefix: str
    worker_name: str
    redis_port: int = 0
    api_port: int = 0
    services: list[Service] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def mcp_url(self) -> str:
        return f"{self.base_url}/mcp"

    def redis(self, *args: str) -> object:
        return redis_command(self.redis_port, *args)

    def task_count(self) -> int:
        """How many task records exist under this run's prefix. A record stays
        after its task has run (until the retention TTL), unlike its stream entry,
        so this counts every task ever created in the run."""
        n = self.redis("EVAL", "return #redis.call('KEYS', ARGV[1])", "0", f"{self.prefix}:task:*")
        assert isinstance(n, int)
        return n

    def logs(self) -> list[tuple[str, str]]:
        return [(f"{s.name} log ({s.log_path})", s.log_tail()) for s in self.services]


_STACK: Stack | None = None  # for the failure-report hook below


def _start_redis(stack: Stack) -> Service:
    last_error: Exception | None = None
    for _ in range(5):  # a port picked by free_port() can be taken before redis binds it
        port = free_port()
        # An append-only file (in the stack's temporary directory, its cwd): the api
        # and the worker refuse a Redis that would lose tasks on a restart.
        service = spawn(
            "redis",
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes"],
            base_env(),
            stack.tmp_dir,
        )
        try:
            wait_until(f"redis-server on port {port} to answer PING", lambda: redis_command(port, "PING") == "PONG", service)
        except RuntimeError as e:
            service.stop()
            last_error = e
            continue
        stack.redis_port = port
        return service
    raise RuntimeError(f"could not start redis-server: {last_error}")


def _start_worker(stack: Stack) -> Service:
    tasks_dir = stack.tmp_dir / "tasks"
    tasks_dir.mkdir()
    env = base_env() | {
        "REDIS_URL": f"redis://127.0.0.1:{stack.redis_port}",
        "REDIS_KEY_PREFIX": stack.prefix,
        "WORKER_NAME": stack.worker_name,
        "TASKS_DIR": str(tasks_dir),
        "WORKER_CONCURRENCY": "2",
        "SHUTDOWN_GRACE_SECONDS": "0",
        "RUNTIME_IMAGES": RUNTIME_IMAGES,
        **({"POOL_SIZE": POOL_SIZE} if POOL_SIZE is not None else {}),
    }
    service = spawn("worker", [str(WORKER_BIN)], env, stack.tmp_dir)
    # Ready when its heartbeat key is in Redis (it has joined the consumer group by then).
    heartbeat = f"{stack.prefix}:worker:{stack.worker_name}"
    wait_until(f"the worker's heartbeat key {heartbeat}", lambda: stack.redis("EXISTS", heartbeat) == 1, service)
    return service


def _start_api(stack: Stack) -> Service:
    stack.api_port = free_port()
    return spawn_api(stack, stack.api_port, "api")


def spawn_api(stack: Stack, port: int, name: str) -> Service:
    """An api process on `port` against the stack's Redis (a second one makes a
    second replica: any replica must answer for any task)."""
    env = base_env() | {
        "SCRIPT_RUNNER_TOKEN": stack.token,
        "REDIS_URL": f"redis://127.0.0.1:{stack.redis_port}",
        "REDIS_KEY_PREFIX": stack.prefix,
        "LISTEN_ADDR": f"127.0.0.1:{port}",
        "RUNTIME_IMAGES": RUNTIME_IMAGES,
    }
    service = spawn(name, [str(API_BIN)], env, stack.tmp_dir)
    base_url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        return httpx2.get(f"{base_url}/healthz", timeout=2.0).status_code == 200

    wait_until(f"GET {base_url}/healthz to return 200", healthy, service)
    return service


def _remove_leftover_containers(stack: Stack) -> list[str]:
    """Safety net: task containers this run's worker left behind (it should leave none)."""
    label = f"label=script-runner.worker={stack.worker_name}"
    found = subprocess.run(["docker", "ps", "-aq", "--filter", label], capture_output=True, text=True)
    ids = found.stdout.split()
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True)
    return ids


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    """redis-server + script-runner-worker + script-runner-api, for the whole session."""
    global _STACK
    preflight()
    run_id = uuid.uuid4().hex
    stack = Stack(
        tmp_dir=Path(tempfile.mkdtemp(prefix="script-runner-pytest-")),
        token=secrets.token_hex(32),
        prefix=f"pytest-{run_id}",
        worker_name=f"pytest-{run_id}",
    )
    try:
        stack.services.append(_start_redis(stack))
        stack.services.append(_start_worker(stack))
        stack.services.append(_start_api(stack))
        _STACK = stack
        yield stack
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    finally:
        _STACK = None
        for service in reversed(stack.services):  # api, then worker, then redis
            service.stop()
        leftovers = _remove_leftover_containers(stack)
        if leftovers:
            print(f"\nwarning: removed {len(leftovers)} task container(s) the worker left behind", file=sys.stderr)
        if os.environ.get("SCRIPT_RUNNER_KEEP_LOGS") == "1":
            print(f"\nscript-runner logs kept in {stack.tmp_dir}", file=sys.stderr)
        else:
            shutil.rmtree(stack.tmp_dir, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attaches the services' logs to the report of a failing test."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and _STACK is not None:
        for title, text in _STACK.logs():
            report.sections.append((title, text))


# --------------------------------------------------------------------------- the client


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@contextlib.asynccontextmanager
async def connect(
    stack: Stack,
    *,
    token: str | None = None,
    mode: str = "auto",
    statuses: list[int] | None = None,
) -> AsyncIterator[Client]:
    """An SDK client on the api's /mcp with `Authorization: Bearer <token>`
    (the stack's token unless another is given). `statuses`, if given, collects
    the HTTP status of every response the SDK's transport received."""
    headers = {"Authorization": f"Bearer {stack.token if token is None else token}"}
    timeout = httpx2.Timeout(30.0, read=60.0)

    async def record(response: httpx2.Response) -> None:
        if statuses is not None:
            statuses.append(response.status_code)

    hooks = {"response": [record]}
    async with httpx2.AsyncClient(headers=headers, timeout=timeout, event_hooks=hooks) as http:
        async with Client(streamable_http_client(stack.mcp_url, http_client=http), mode=mode) as client:
            yield client


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[Client]:
    async with connect(stack) as c:
        yield c
