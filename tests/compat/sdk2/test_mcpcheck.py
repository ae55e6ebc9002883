"""The outside conformance checker for MCP 2026-07-28 (PyPI `jbt-mcpcheck`)
against the real server: every one of its checks passes, the cache hints on
every list method the server implements among them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.stack import Stack


def test_every_check_of_mcpcheck_passes(stack: Stack) -> None:
    mcpcheck = Path(sys.executable).parent / "mcpcheck"
    run = subprocess.run(
        [str(mcpcheck), "--token", stack.token, stack.mcp_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "All 8 checks passed" in run.stdout, run.stdout
    # tools/list, resources/list and resources/templates/list all carry hints.
    assert "Cache hints valid on 3 list methods" in run.stdout, run.stdout
