"""Test code in a child interpreter with a time limit: what a kernel does to a process
must not take the test run down or hang it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_snippet(code: str, *, timeout: float = 120.0, env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess:
    """`code` run by `python -c` from this checkout (kernels on sim); a run past
    `timeout` seconds raises `subprocess.TimeoutExpired`."""
    child_env = {**os.environ, "MTWORK_BACKEND": "sim", **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO),
                                                            child_env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, env=child_env)


def run_isolated(code: str, *, timeout: float, env: dict[str, str] | None = None) -> Any:
    """`code` in a fresh interpreter, kernels run in that interpreter's own process (the
    runtime itself under test, not the worker that shields from it); returns the JSON it
    prints on its last line. A crash, a non-zero exit or a hang fails the test."""
    try:
        done = run_snippet(code, timeout=timeout, env={"MTWORK_ISOLATE": "0", **(env or {})})
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the child interpreter hung for {timeout} s:\n{exc.stdout}\n{exc.stderr}")
    if done.returncode != 0:
        pytest.fail(f"the child interpreter died (exit {done.returncode}):\n{done.stdout}\n"
                    f"{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])
