"""redis-server, workers, api replicas and Caddy as real processes.

One Stack is one run: one temporary directory (logs, Redis's data, TASKS_DIR),
one run id, one bearer token, and a default key prefix; a worker or an api may
take another prefix (the benchmark runs configurations side by side on one
Redis). Nothing is mocked: the binaries are this repository's (`cargo build
--bins`), Redis and Caddy are the Debian packages, tasks run in the real Docker
engine behind the real host firewall.

The methods block; an asyncio caller runs them with `asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis import Redis, RedisError
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.sentinel import Sentinel

from . import REPO_ROOT
from .keys import Keys
from .mcp_http import http_status
from .procs import HarnessError, Proc, base_env, free_port, wait_until

IMAGE = os.environ.get("TEST_RUNTIME_IMAGE") or "script-runner-test/python:3.13-trixie"
NODE_IMAGE = os.environ.get("TEST_NODE_IMAGE") or "script-runner-test/node:24-trixie"
RUNTIMES = ("node24", "python3.13", "python3.8")
RUNTIME_IMAGES = f"node24={NODE_IMAGE},python3.13={IMAGE},python3.8={IMAGE}"
API_BIN = "script-runner-api"
WORKER_BIN = "script-runner-worker"
# The api's spec signing key in tests (TASK_SIGNING_KEY: 32 bytes of 0x01), and
# its public key, which every worker verifies with (TASK_VERIFY_KEYS); the same
# pair as testkit's (`script-runner-ctl signing-key public` prints the second).
SIGNING_KEY = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="
VERIFY_KEY = "iojj3XQJ8ZX9UtstPLpdcspnCb8dlBIb83SIAbQPb1w="
CTL_BIN = "script-runner-ctl"

# The Docker label every task (and pool) container carries (worker/src/sandbox.rs).
LABEL_WORKER = "script-runner.worker"
# A warm pool container's name until a task claims it (then `sr-<task_id>`).
IDLE_POOL_PREFIX = "sr-pool-"

STARTUP_DEADLINE = 60.0  # seconds for a process to become ready

# The service name the sentinels watch (the binaries' REDIS_SENTINEL_MASTER default).
SENTINEL_MASTER = "mymaster"
# Sentinel's timers, shortened with `SENTINEL DEBUG` (runtime only, not written to
# its file): the primary's INFO every second instead of 10 s, so a restarted old
# primary is seen, and demoted, within a second or two of answering; hellos every
# 250 ms instead of 2 s, so the sentinels find each other, and the new primary's
# configuration spreads, at once.
SENTINEL_DEBUG = {"info-period": 1000, "publish-period": 250}


def bin_dir(profile: str = "debug") -> Path:
    """Where cargo put this profile's binaries: $CARGO_TARGET_DIR (as cargo reads
    it, relative to the working directory) or the repository's target/."""
    target = os.environ.get("CARGO_TARGET_DIR")
    return (Path(target).resolve() if target else REPO_ROOT / "target") / profile


def preflight(binaries: Path | None, tools: Iterable[str] = ("redis-server", "docker"), images: Iterable[str] = ()) -> None:
    """Raises HarnessError saying what to do when something a run needs is missing."""
    if binaries is not None:
        for name in (API_BIN, WORKER_BIN):
            path = binaries / name
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise HarnessError(f"{path} is missing: run `cargo build --bins` (or --release) in {REPO_ROOT}")
    for tool in tools:
        if shutil.which(tool) is None:
            raise HarnessError(f"`{tool}` is not on PATH (scripts/test.sh installs it with apt)")
    for image in images:
        probe = subprocess.run(["docker", "image", "inspect", image], capture_output=True, text=True)
        if probe.returncode != 0:
            raise HarnessError(
                f"the runtime image {image!r} is not in the local Docker engine "
                f"({probe.stderr.strip() or probe.stdout.strip()}): build it with scripts/build-test-image.sh "
                "or point TEST_RUNTIME_IMAGE / TEST_NODE_IMAGE at another image"
            )


def containers_of(worker: str, with_names: bool = False) -> list[str]:
    """Ids (or `id name` lines) of every container, any state, a worker labelled."""
    fmt = ["--format", "{{.ID}} {{.Names}}"] if with_names else ["-q"]
    out = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label={LABEL_WORKER}={worker}", *fmt],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.splitlines() if with_names else out.stdout.split()


def remove_containers(ids: list[str]) -> list[str]:
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, check=False)
    return ids


@dataclass
class Worker:
    short: str
    name: str  # WORKER_NAME, the label on its containers
    prefix: str
    tasks_dir: Path
    proc: Proc
    metrics_url: str | None = None


@dataclass
class Api:
    short: str
    prefix: str
    port: int
    proc: Proc

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mcp_url(self) -> str:
        return f"{self.base_url}/mcp"


@dataclass
class Stack:
    """Everything one run starts. `prefix` defaults to `<label>-<run id>`;
    `common_env` goes to every worker and api.

    With `sentinel`, Redis is a primary with `replicas` replicas, watched by three
    sentinels (quorum 2) that fail over a second after the primary stops
    answering: every worker and api (and `ctl`) is given REDIS_SENTINELS and
    REDIS_SENTINEL_MASTER, and the harness's own clients (`redis`, `aredis`)
    follow the primary through the sentinels too (redis-py's Sentinel)."""

    bin_dir: Path = field(default_factory=bin_dir)
    label: str = "sr"
    rust_log: str | None = None
    runtime_images: str = RUNTIME_IMAGES
    common_env: dict[str, str] = field(default_factory=dict)
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    token: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)
    prefix: str = ""
    tmp_dir: Path = field(init=False)
    sentinel: bool = False
    redis_port: int = 0  # the first primary's (with `sentinel`, not necessarily the primary now)
    redis_proc: Proc | None = None
    replicas: int = 1  # with `sentinel`
    replica_ports: list[int] = field(default_factory=list)
    replica_procs: list[Proc] = field(default_factory=list)
    sentinel_ports: list[int] = field(default_factory=list)
    sentinel_procs: list[Proc] = field(default_factory=list)
    workers: dict[str, Worker] = field(default_factory=dict)
    apis: dict[str, Api] = field(default_factory=dict)
    proxy: Proc | None = None
    proxy_port: int = 0
    _redis: Redis | None = field(default=None, repr=False)
    _aredis: AsyncRedis | None = field(default=None, repr=False)
    _asentinel: AsyncSentinel | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.bin_dir = self.bin_dir.resolve()  # the children run in the temporary directory
        self.prefix = self.prefix or f"{self.label}-{self.run_id}"
        self.keys = Keys(self.prefix)
        self.tmp_dir = Path(tempfile.mkdtemp(prefix=f"script-runner-{self.label}-{self.run_id}-"))

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        return base_env(self.rust_log) | extra

    def binary(self, name: str) -> str:
        path = self.bin_dir / name
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise HarnessError(f"{path} is missing: run `cargo build --bins` (or --release) in {REPO_ROOT}")
        return str(path)

    # -- Redis

    @property
    def redis(self) -> Redis:
        """A client of the run's Redis (pooled, thread-safe, replies as str);
        with `sentinel`, of whichever node the sentinels name the primary."""
        if self._redis is None:
            if self.sentinel:
                self._redis = self._sentinels(Sentinel).master_for(SENTINEL_MASTER, **self._client_options())
            else:
                self._redis = Redis(port=self._first_port(), **self._client_options())
        return self._redis

    @property
    def aredis(self) -> AsyncRedis:
        """The same for asyncio code; made on first use, inside the event loop."""
        if self._aredis is None:
            if self.sentinel:
                self._asentinel = self._sentinels(AsyncSentinel)
                self._aredis = self._asentinel.master_for(SENTINEL_MASTER, **self._client_options())
            else:
                self._aredis = AsyncRedis(port=self._first_port(), **self._client_options())
        return self._aredis

    def _first_port(self) -> int:
        if not self.redis_port:
            raise HarnessError("Redis is not started yet (Stack.start_redis)")
        return self.redis_port

    @staticmethod
    def _client_options() -> dict[str, Any]:
        # Replies as str, as every caller reads them; an odd byte must not raise.
        return {"decode_responses": True, "encoding_errors": "replace", "socket_timeout": 10, "socket_connect_timeout": 2}

    def _sentinels(self, kind: Any) -> Any:
        """redis-py's Sentinel (sync or asyncio `kind`) over the run's sentinels."""
        if not self.sentinel_ports:
            raise HarnessError("the sentinels are not started yet (Stack.start_redis with sentinel=True)")
        quick = {"socket_timeout": 1, "socket_connect_timeout": 1}
        return kind([("127.0.0.1", p) for p in self.sentinel_ports], sentinel_kwargs=quick, **quick)

    def redis_env(self) -> dict[str, str]:
        """How a binary reaches the run's Redis: REDIS_URL, and with `sentinel`
        the sentinels to ask for the primary (REDIS_URL's host and port are
        then unused)."""
        env = {"REDIS_URL": f"redis://127.0.0.1:{self._first_port()}"}
        if self.sentinel:
            env["REDIS_SENTINELS"] = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
            env["REDIS_SENTINEL_MASTER"] = SENTINEL_MASTER
        return env

    def start_redis(self, appendfsync: str = "everysec") -> Proc:
        """redis-server persisting as production runs it (deploy/redis: an
        append-only file, fsync `appendfsync`, no RDB snapshots, noeviction): the
        api and the worker refuse a Redis that would lose tasks on a restart.
        Started again after a stop or kill, it keeps its port and its data.

        With `sentinel`, the first start also starts the replicas (the same
        settings, `--replicaof` the primary) and three sentinels, and returns
        once the replicas are in sync and every sentinel knows them and the
        two other sentinels (so a failover can be agreed). Started again,
        the first primary comes back from its append-only file as a primary,
        until the sentinels, if another node was promoted meanwhile, make it
        a replica of the new one: see `restart_redis_node`."""
        if self.redis_proc is not None:
            return self.restart_redis_node(self.redis_proc)
        self.redis_port, self.redis_proc = self._start_redis_node("redis", appendfsync)
        if self.sentinel:
            replica_of = ["--replicaof", "127.0.0.1", str(self.redis_port)]
            for k in range(1, self.replicas + 1):
                port, proc = self._start_redis_node(f"redis-replica{k}", appendfsync, replica_of)
                self.replica_ports.append(port)
                self.replica_procs.append(proc)
            self._start_sentinels()
        return self.redis_proc

    def restart_redis_node(self, proc: Proc) -> Proc:
        """Starts a stopped or killed redis-server again, same port and data,
        and waits until it answers PING."""
        proc.start()
        self._wait_redis(self._port_of(proc), proc)
        return proc

    def _start_redis_node(self, name: str, appendfsync: str, extra: list[str] | None = None) -> tuple[int, Proc]:
        last: Exception | None = None
        for attempt in range(5):  # a port free_port() picked can be taken before redis binds it
            port = free_port()
            data = self.tmp_dir / f"{name}-{attempt}"
            data.mkdir()
            argv = [
                "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                "--save", "", "--appendonly", "yes", "--appendfsync", appendfsync,
                "--maxmemory-policy", "noeviction", *(extra or []),
            ]  # fmt: skip
            proc = Proc(f"{name}-{attempt}", argv, self.env({}), self.tmp_dir / f"{name}-{attempt}.log").start()
            try:
                self._wait_redis(port, proc)
            except (HarnessError, TimeoutError) as e:
                proc.stop()
                last = e
                continue
            return port, proc
        raise HarnessError(f"could not start redis-server ({name}): {last}")

    def _start_sentinels(self) -> None:
        """Three sentinels watching the primary (quorum 2, down after 1 s of
        silence, failover timeout 10 s), each with the file it rewrites."""
        for port, proc in zip(self.replica_ports, self.replica_procs):
            replica = Redis(port=port, socket_timeout=1, socket_connect_timeout=1, decode_responses=True)
            try:
                wait_until(f"{proc.name} to be in sync with the primary",
                           lambda r=replica: r.info("replication").get("master_link_status") == "up", proc, 30)  # fmt: skip
            finally:
                replica.close()
        for k in range(1, 4):
            for attempt in range(5):
                port = free_port()
                data = self.tmp_dir / f"sentinel-{k}"
                data.mkdir(exist_ok=True)
                conf = data / "sentinel.conf"
                # down-after 2 s, not 1: a new primary busy with two full syncs on
                # a loaded 2-core machine missed a second of PINGs and was failed
                # over again (a second failover in one run).
                conf.write_text(
                    f"port {port}\nbind 127.0.0.1\ndir {data}\n"
                    f"sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {self.redis_port} 2\n"
                    f"sentinel down-after-milliseconds {SENTINEL_MASTER} 2000\n"
                    f"sentinel failover-timeout {SENTINEL_MASTER} 10000\n"
                )
                proc = Proc(f"sentinel-{k}", ["redis-sentinel", str(conf)], self.env({}), self.tmp_dir / f"sentinel-{k}.log").start()
                try:
                    self._wait_redis(port, proc)
                except (HarnessError, TimeoutError):
                    proc.stop()
                    if attempt == 4:
                        raise
                    continue
                self.sentinel_ports.append(port)
                self.sentinel_procs.append(proc)
                break
        clients = [Redis(port=p, socket_timeout=1, socket_connect_timeout=1, decode_responses=True) for p in self.sentinel_ports]
        try:
            for s in clients:
                s.execute_command("SENTINEL", "DEBUG", *(str(x) for kv in SENTINEL_DEBUG.items() for x in kv))
            for s, proc in zip(clients, self.sentinel_procs):

                def ready(s: Redis = s) -> bool:
                    m = _as_dict(s.execute_command("SENTINEL", "MASTER", SENTINEL_MASTER))
                    return int(m["num-slaves"]) >= self.replicas and int(m["num-other-sentinels"]) >= 2

                wait_until(f"{proc.name} to know the replicas and the other sentinels", ready, proc, 30)
        finally:
            for s in clients:
                s.close()

    def primary_port(self) -> int:
        """The port of the node the sentinels name the primary now (the most
        recent configuration, as the binaries pick it); without `sentinel`, the
        one Redis's."""
        if not self.sentinel:
            return self._first_port()
        best: tuple[int, int] | None = None
        errors = []
        for port in self.sentinel_ports:
            s = Redis(port=port, socket_timeout=1, socket_connect_timeout=1, decode_responses=True)
            try:
                m = _as_dict(s.execute_command("SENTINEL", "MASTER", SENTINEL_MASTER))
            except RedisError as e:  # a sentinel that does not answer has no say
                errors.append(f":{port}: {e}")
                continue
            finally:
                s.close()
            epoch = int(m.get("config-epoch", 0))
            if best is None or epoch > best[0]:
                best = (epoch, int(m["port"]))
        if best is None:
            raise HarnessError(f"no sentinel answered SENTINEL MASTER: {errors}")
        return best[1]

    def redis_nodes(self) -> dict[int, Proc]:
        """Every redis-server of the run (not the sentinels), by port."""
        nodes = {self.redis_port: self.redis_proc} | dict(zip(self.replica_ports, self.replica_procs))
        return {port: proc for port, proc in nodes.items() if port and proc is not None}

    def primary_proc(self) -> Proc:
        """The redis-server the sentinels name the primary now."""
        return self.redis_nodes()[self.primary_port()]

    def _port_of(self, proc: Proc) -> int:
        return next(port for port, p in self.redis_nodes().items() if p is proc)

    @staticmethod
    def _wait_redis(port: int, proc: Proc) -> None:
        probe = Redis(port=port, socket_timeout=1, socket_connect_timeout=1)
        try:
            wait_until(f"redis-server on port {port} to answer PING", probe.ping, proc, 30)
        finally:
            probe.close()

    # -- workers

    def add_worker(
        self,
        short: str,
        env: dict[str, str] | None = None,
        *,
        prefix: str | None = None,
        name: str | None = None,
        tasks_dir: Path | None = None,
        metrics: bool = False,
    ) -> Worker:
        """A worker, not started yet. Its name defaults to `<prefix>-<short>`, its
        TASKS_DIR to the run's shared `tasks/`; `metrics` gives it /metrics on a
        free port."""
        prefix = prefix or self.prefix
        name = name or f"{prefix}-{short}"
        tasks_dir = tasks_dir or self.tmp_dir / "tasks"
        tasks_dir.mkdir(exist_ok=True)
        settings = self.redis_env() | {
            "REDIS_KEY_PREFIX": prefix,
            "WORKER_NAME": name,
            "TASK_VERIFY_KEYS": VERIFY_KEY,
            "TASKS_DIR": str(tasks_dir),
            "RUNTIME_IMAGES": self.runtime_images,
            # One store for every worker of the run, as a fleet shares one.
            "WORKSPACE_STORE": str(self.tmp_dir / "tasks" / "workspace-store"),
        }
        metrics_url = None
        if metrics:
            port = free_port()
            settings["WORKER_METRICS_ADDR"] = f"127.0.0.1:{port}"
            metrics_url = f"http://127.0.0.1:{port}/metrics"
        proc_env = self.env(settings | self.common_env | (env or {}))
        proc = Proc(f"worker-{short}", [self.binary(WORKER_BIN)], proc_env, self.tmp_dir / f"worker-{short}.log")
        worker = Worker(short, name, prefix, tasks_dir, proc, metrics_url)
        self.workers[short] = worker
        return worker

    def start_worker(self, short: str, wait: bool = True) -> Worker:
        """Starts (or starts again, under the same name) a worker and waits for a
        heartbeat written by this process: when starting again, the old key is
        deleted first, so one still expiring does not count."""
        worker = self.workers[short]
        beat = Keys(worker.prefix).worker(worker.name)
        if worker.proc.starts:
            self.redis.delete(beat)
        worker.proc.start()
        if wait:
            wait_until(f"worker {worker.name}'s heartbeat {beat}", lambda: self.redis.exists(beat), worker.proc)
        return worker

    def worker_names(self) -> list[str]:
        return [w.name for w in self.workers.values()]

    # -- api replicas and the proxy

    def add_api(
        self, short: str, env: dict[str, str] | None = None, *, prefix: str | None = None, port: int | None = None
    ) -> Api:
        """An api replica (not started). `port`: one the caller picked already,
        e.g. to give the api its own public URL (OAUTH_RESOURCE)."""
        port = port or free_port()
        prefix = prefix or self.prefix
        settings = self.redis_env() | {
            "SCRIPT_RUNNER_TOKEN": self.token,
            "TASK_SIGNING_KEY": SIGNING_KEY,
            "REDIS_KEY_PREFIX": prefix,
            "LISTEN_ADDR": f"127.0.0.1:{port}",
            "RUNTIME_IMAGES": self.runtime_images,
            # The workers' store (their default under the shared tasks/), for read_files.
            "WORKSPACE_STORE": str(self.tmp_dir / "tasks" / "workspace-store"),
        }
        proc_env = self.env(settings | self.common_env | (env or {}))
        api = Api(short, prefix, port, Proc(short, [self.binary(API_BIN)], proc_env, self.tmp_dir / f"{short}.log"))
        self.apis[short] = api
        return api

    def start_api(self, short: str) -> Api:
        api = self.apis[short]
        api.proc.start()
        wait_healthy(api.proc, f"{api.base_url}/healthz")
        return api

    def start_proxy(self) -> Proc:
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
        upstreams = " ".join(f"127.0.0.1:{a.port}" for a in self.apis.values())
        caddyfile = self.tmp_dir / "Caddyfile"
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
        env = self.env({"XDG_DATA_HOME": str(self.tmp_dir / "caddy-data"), "XDG_CONFIG_HOME": str(self.tmp_dir / "caddy-config")})
        argv = ["caddy", "run", "--adapter", "caddyfile", "--config", str(caddyfile)]
        self.proxy = Proc("caddy", argv, env, self.tmp_dir / "caddy.log").start()
        wait_healthy(self.proxy, f"http://127.0.0.1:{self.proxy_port}/healthz")
        return self.proxy

    @property
    def base_url(self) -> str:
        """Where clients go: the proxy if there is one, else the first api."""
        if self.proxy is not None:
            return f"http://127.0.0.1:{self.proxy_port}"
        return next(iter(self.apis.values())).base_url

    @property
    def mcp_url(self) -> str:
        return f"{self.base_url}/mcp"

    # -- script-runner-ctl

    def ctl(self, *args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Runs `script-runner-ctl args...` against the run's Redis and prefix
        (through the sentinels with `sentinel`); its output as text."""
        ctl_env = self.env(self.redis_env() | {"REDIS_KEY_PREFIX": self.prefix} | (env or {}))
        return subprocess.run([self.binary(CTL_BIN), *args], env=ctl_env, capture_output=True, text=True, timeout=timeout, check=False)

    # -- Docker

    def containers(self, idle_pool: bool = True) -> list[str]:
        """Ids of the containers of this run's workers, any state. Without
        `idle_pool`, leaves out warm pool containers waiting for a task."""
        ids = []
        for name in self.worker_names():
            for line in containers_of(name, with_names=True):
                cid, cname = line.split(maxsplit=1)
                if idle_pool or not cname.startswith(IDLE_POOL_PREFIX):
                    ids.append(cid)
        return ids

    def idle_pool_names(self) -> set[str]:
        """Names of this run's warm pool containers that wait for a task."""
        names = (line.split(maxsplit=1)[1] for w in self.worker_names() for line in containers_of(w, with_names=True))
        return {n for n in names if n.startswith(IDLE_POOL_PREFIX)}

    def tasks_dir_leftovers(self) -> list[str]:
        """What is in the shared TASKS_DIR besides the directories of idle warm
        pool containers (`pool-<worker>/<container name>`) and the owners'
        dependency caches (`cache-<worker>/owners`, kept on purpose; a cache
        still lent after its task ended shows as `cache-<worker>/lent/<id>`),
        the workspace store (`workspace-store/`, the default one) and the workers'
        workspace blob caches (`blobs-<worker>/`; a file still being written
        shows as `blobs-<worker>/tmp/<name>`)."""
        idle = self.idle_pool_names()
        pool_dirs = {f"pool-{n}" for n in self.worker_names()}
        cache_dirs = {f"cache-{n}" for n in self.worker_names()}
        blob_dirs = {f"blobs-{n}" for n in self.worker_names()}
        left = []
        for entry in sorted((self.tmp_dir / "tasks").iterdir()):
            if entry.name == "workspace-store" and entry.is_dir():
                continue
            if entry.name in blob_dirs and entry.is_dir():
                tmp = entry / "tmp"
                left += [f"{entry.name}/tmp/{sub.name}" for sub in sorted(tmp.iterdir())] if tmp.is_dir() else []
            elif entry.name in cache_dirs and entry.is_dir():
                lent = entry / "lent"
                left += [f"{entry.name}/lent/{sub.name}" for sub in sorted(lent.iterdir())] if lent.is_dir() else []
            elif entry.name in pool_dirs and entry.is_dir():
                left += [f"{entry.name}/{sub.name}" for sub in sorted(entry.iterdir()) if sub.name not in idle]
            else:
                left.append(entry.name)
        return left

    # -- teardown

    def all_procs(self) -> list[Proc]:
        procs = [w.proc for w in self.workers.values()] + [a.proc for a in self.apis.values()]
        return procs + [p for p in (self.redis_proc, *self.replica_procs, *self.sentinel_procs, self.proxy) if p is not None]

    def stop_worker(self, short: str) -> list[str]:
        """Stops a worker; removes (and returns) the containers it left."""
        worker = self.workers[short]
        worker.proc.stop(30)
        return remove_containers(containers_of(worker.name))

    def stop_all(self) -> list[str]:
        """Stops the proxy, the apis, the workers, then the sentinels (so none
        fails over meanwhile) and Redis; removes (and returns) the containers the
        workers left behind."""
        if self.proxy:
            self.proxy.stop(5)
        for a in self.apis.values():
            a.proc.stop(10)
        for w in self.workers.values():
            w.proc.stop(30)
        for s in self.sentinel_procs:
            s.stop(5)
        for p in (*self.replica_procs, self.redis_proc):
            if p:
                p.stop(10)
        if self._redis is not None:
            self._redis.close()
        return remove_containers(self.containers())

    async def aclose(self) -> None:
        """Closes the asyncio client (`aredis`), if one was made."""
        if self._aredis is not None:
            await self._aredis.aclose()
            self._aredis = None
        if self._asentinel is not None:
            await self._asentinel.aclose()
            self._asentinel = None

    def logs(self) -> list[tuple[str, str]]:
        return [(f"{p.name} log ({p.log_path})", p.log_tail(200)) for p in self.all_procs()]

    def cleanup(self, keep: bool) -> None:
        """Removes the temporary directory unless `keep` (then says where it is)."""
        if keep:
            print(f"script-runner logs and data kept in {self.tmp_dir}", flush=True)
        else:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)


@contextlib.contextmanager
def one_worker_stack(label: str, worker_env: dict[str, str]) -> Iterator[Stack]:
    """redis-server, one worker (`worker_env` added to its environment) and one api,
    for a test session. On the way out: stopped (api, then worker, then redis), the
    task containers the worker left removed, and the temporary directory removed
    unless SCRIPT_RUNNER_KEEP_LOGS=1."""
    preflight(bin_dir(), images=(IMAGE, NODE_IMAGE))
    stack = Stack(label=label)
    try:
        stack.start_redis()
        stack.add_worker("worker", worker_env)
        stack.start_worker("worker")
        stack.add_api("api")
        stack.start_api("api")
        yield stack
    finally:
        leftovers = stack.stop_all()
        if leftovers:
            print(f"\nwarning: removed {len(leftovers)} task container(s) the worker left behind", file=sys.stderr)
        stack.cleanup(keep=os.environ.get("SCRIPT_RUNNER_KEEP_LOGS") == "1")


def _as_dict(reply: Any) -> dict[str, str]:
    """A SENTINEL MASTER reply (a flat list of names and values over RESP2)."""
    return dict(zip(reply[::2], reply[1::2])) if isinstance(reply, list) else dict(reply)


def wait_healthy(proc: Proc, url: str, deadline: float = STARTUP_DEADLINE) -> None:
    """Until GET `url` answers 200; fails with the process's log if it exits."""
    wait_until(f"GET {url} to answer 200", lambda: http_status(url) == 200, proc, deadline)
