"""Runs test code in a child interpreter, so a hang or a crash fails one test only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_isolated(code: str, *, timeout: float, env: dict[str, str] | None = None) -> Any:
    """Runs `code` in a fresh interpreter (this checkout first on the path, kernels on
    sim) and returns the JSON it prints on its last line. A crash, a non-zero exit or a
    run past `timeout` seconds fails the test."""
    child_env = {**os.environ, "PYTHONPATH": str(ROOT), "MTWORK_BACKEND": "sim", **(env or {})}
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                              env=child_env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the child interpreter hung for {timeout} s:\n{exc.stdout}\n{exc.stderr}")
    if done.returncode != 0:
        pytest.fail(f"the child interpreter died (exit {done.returncode}):\n{done.stdout}\n"
                    f"{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])
