"""What a pytest suite that runs one stack for its session needs, written once:
the session fixture's body and the report hook that attaches the services' logs
to a failing test. Used by tests/python/conftest.py and tests/compat/conftest.py
(the only harness module that imports pytest)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .procs import HarnessError
from .stack import Stack, one_worker_stack

_CURRENT: Stack | None = None  # the session's stack, for `attach_logs`


def session_stack(label: str, worker_env: dict[str, str]) -> Iterator[Stack]:
    """The body of a session-scoped `stack` fixture (`yield from` it): redis-server,
    one worker (`worker_env` added) and one api; a stack that cannot start fails
    the test with its reason, not a traceback."""
    global _CURRENT
    try:
        with one_worker_stack(label, worker_env) as stack:
            _CURRENT = stack
            yield stack
    except (HarnessError, TimeoutError) as e:
        pytest.fail(str(e), pytrace=False)
    finally:
        _CURRENT = None


def attach_logs(report: pytest.TestReport) -> None:
    """Adds the services' logs to the report of a failing test."""
    if report.failed and _CURRENT is not None:
        for title, text in _CURRENT.logs():
            report.sections.append((title, text))
