"""Child processes, free ports and waits.

Every process is started in its own session (a Ctrl-C reaches the harness,
which stops its children in order) and signalled only by its own pid: nothing
is ever killed by name. Every wait polls a condition against a deadline and
fails at once, with the process's log, if the process it waits for exits.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# Only these variables reach the services from the caller's environment, so a
# developer's shell (MAX_TIMEOUT_SECONDS, TASK_USER, ALLOWED_HOSTS, ...) cannot
# change what is tested or measured.
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
# The api logs three INFO lines per stateless request from rmcp; the logs stay
# readable without them (the api itself adds rmcp=warn unless RUST_LOG names rmcp).
DEFAULT_RUST_LOG = "info,rmcp=warn"


class HarnessError(Exception):
    """Something the harness needs failed; the message says what, and what to do."""


def base_env(rust_log: str | None = None) -> dict[str, str]:
    """The pass-through variables, plain logs (NO_COLOR) and a log filter:
    `rust_log` if given, else the caller's RUST_LOG, else DEFAULT_RUST_LOG."""
    env = {k: v for k, v in os.environ.items() if k in PASSTHROUGH_ENV}
    env["NO_COLOR"] = "1"  # tracing-subscriber honours it
    if rust_log is not None:
        env["RUST_LOG"] = rust_log
    env.setdefault("RUST_LOG", DEFAULT_RUST_LOG)
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    """A child process and its log file; can be started again after it stopped
    (a restart appends to the same log, after a marker line)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> Proc:
        if self.alive():
            raise HarnessError(f"{self.name} is already running")
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start #{self.starts} at {time.strftime('%H:%M:%S')} =====\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.log_path.parent,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        if self.popen is None:
            raise HarnessError(f"{self.name} was never started")
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.popen is None or not self.alive():
            raise HarnessError(f"{self.name} is not running")
        self.popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL and reap, as a crash would."""
        if self.popen is not None and self.alive():
            self.popen.kill()
            self.popen.wait()

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds."""
        if self.popen is None or not self.alive():
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()

    async def wait_exit(self, deadline: float) -> int:
        """Waits (without blocking the event loop) until it has exited; its code."""
        popen = self.popen
        if popen is None:
            raise HarnessError(f"{self.name} was never started")
        await wait_until_async(f"{self.name} to exit", lambda: asyncio.sleep(0, popen.poll() is not None), deadline)
        return popen.returncode

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"<could not read {self.log_path}: {e}>"

    def rss_kib(self) -> int | None:
        """Resident memory (VmRSS) now, in KiB; None once it is not running."""
        if not self.alive():
            return None
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        except OSError:
            return None
        return None


def _exited(proc: Proc, what: str) -> HarnessError:
    return HarnessError(
        f"{proc.name} exited with code {proc.returncode} while waiting for {what}\n"
        f"--- {proc.log_path} ---\n{proc.log_tail()}"
    )


def _timed_out(what: str, deadline: float, proc: Proc | None, last: BaseException | None) -> TimeoutError:
    msg = f"timed out after {deadline:.0f} s waiting for {what}"
    if last is not None:
        msg += f" (last error: {last})"
    if proc is not None:
        msg += f"\n--- {proc.log_path} ---\n{proc.log_tail()}"
    return TimeoutError(msg)


def wait_until(what: str, condition: Callable[[], Any], proc: Proc | None = None, deadline: float = 60.0) -> Any:
    """Polls `condition` until it returns something truthy (returned). An
    exception from it counts as "not yet". Raises HarnessError with `proc`'s log
    if `proc` exits first, TimeoutError after `deadline` seconds."""
    end = time.monotonic() + deadline
    delay = 0.01
    last: BaseException | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as e:  # not ready yet (connection refused, ...)
            last = e
        if proc is not None and not proc.alive():
            raise _exited(proc, what)
        if time.monotonic() > end:
            raise _timed_out(what, deadline, proc, last)
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


async def wait_until_async(
    what: str, check: Callable[[], Awaitable[T]], deadline: float, every: float = 0.1, proc: Proc | None = None
) -> T:
    """`wait_until` for the event loop: awaits `check` every `every` seconds."""
    end = time.monotonic() + deadline
    last: BaseException | None = None
    while True:
        try:
            value = await check()
            if value:
                return value
        except Exception as e:  # not ready yet
            last = e
        if proc is not None and not proc.alive():
            raise _exited(proc, what)
        if time.monotonic() > end:
            raise _timed_out(what, deadline, proc, last)
        await asyncio.sleep(every)
