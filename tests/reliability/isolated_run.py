"""Runs a Python snippet in a fresh interpreter with a time limit: a test of what a
kernel can do to a process must not be able to take the test run down or hang it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).parents[2]


def run_snippet(code: str, *, timeout: float = 120.0, env: dict | None = None
                ) -> subprocess.CompletedProcess:
    """`code` run by `python -c` from the repository; a hang past `timeout` fails."""
    full_env = {**os.environ, "MTWORK_BACKEND": "sim", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, env=full_env)
