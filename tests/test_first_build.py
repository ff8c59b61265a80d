"""A cold cache says what it is doing: the emulator runtime's first build is announced
once, and a warm cache builds nothing and says nothing."""

import os
import subprocess
import sys
from pathlib import Path

BUILD = "from mtwork.backends.sim.compile.compiler import runtime_library; runtime_library()"
MESSAGE = "building the emulator runtime, once: about"


def build_in_child(cache: Path) -> str:
    env = dict(os.environ, MTWORK_CACHE_DIR=str(cache),
               PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                           os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", BUILD], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_the_first_runtime_build_is_announced_and_only_the_first(tmp_path):
    assert MESSAGE in build_in_child(tmp_path / "cache")
    assert MESSAGE not in build_in_child(tmp_path / "cache")
