"""mlx-lm's own kernel tests, from its source distribution, run unchanged with
``pytest --mtwork``: on a machine without Metal they skip by themselves
(``@unittest.skipIf(not mx.metal.is_available(), ...)``); with mtwork interposed they run
their Metal kernels on ``sim`` and must pass.

One test is left out, for a reason measured below: `test_qk_norm` compares the fused
norm-and-rotate kernel with ``mx.fast.rope`` within 1e-5. On a Mac both sides are Metal
code; interposed off a Mac the reference is MLX's CPU rope, and two correctly computed
single-precision rotations differ by up to about 1.1e-5 there (each about 7e-6 from the
float64 rotation, on opposite sides); test_mlx_lm_interposed.py's
`test_fused_rope_is_as_accurate_as_mlx_rope` holds the kernel to MLX's own accuracy instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import mlx.core as mx
import pytest

from . import mlx_lm_sdist

ROOT = Path(__file__).resolve().parents[2]
LEFT_OUT = "test_qk_norm"
# The two tests of the packed gated-delta kernel that take minutes on the emulator: the
# whole corpus runs them (-m slow), the default run the rest.
LONG = ("test_packed_matches_unpacked", "test_explicit_tree_matches_simd_sum_kernel")


def _tests() -> Path:
    try:
        return mlx_lm_sdist.tests_dir()
    except mlx_lm_sdist.Unavailable as exc:
        pytest.skip(str(exc))


def _run(tmp_path: Path, files: list[str], deselect: tuple[str, ...], *options: str
         ) -> tuple[dict[str, int], str]:
    tests = _tests()
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("MTWORK_SANITIZE", "MTWORK_BACKEND"):
        env.pop(name, None)
    installed = any(ep.value == "mtwork.pytest_plugin"
                    for ep in entry_points(group="pytest11"))
    plugin = () if installed else ("-p", "mtwork.pytest_plugin")
    left_out = ("-k", " and ".join(f"not {name}" for name in deselect)) if deselect else ()
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin,
            "-c", str(ini), "--rootdir", str(tmp_path), *left_out, *options,
            *(str(tests / f) for f in files)]
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=3600)
    output = done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    counts = {kind: int(n) for n, kind in re.findall(
        r"(\d+) (passed|failed|skipped|errors?|deselected)", last)}
    counts["returncode"] = done.returncode
    return counts, output


def test_without_mtwork_the_kernel_tests_skip_off_a_mac(tmp_path):
    if mx.metal.is_available():
        pytest.skip("a Mac runs them on its GPU")
    counts, output = _run(tmp_path, ["test_kernels.py"], ())
    assert counts.get("skipped", 0) > 0 and not counts.get("passed"), output


def test_mlx_lm_kernel_tests_pass_unchanged_with_pytest_mtwork(tmp_path):
    counts, output = _run(tmp_path, ["test_kernels.py", "test_gated_delta.py"],
                          (LEFT_OUT, *LONG), "--mtwork")
    assert counts["returncode"] == 0, output[-4000:]
    assert counts.get("passed", 0) >= 10 and not counts.get("skipped"), output[-4000:]


@pytest.mark.slow
def test_mlx_lm_gated_delta_tests_pass_unchanged_with_pytest_mtwork(tmp_path):
    counts, output = _run(tmp_path, ["test_gated_delta.py"], (), "--mtwork")
    assert counts["returncode"] == 0, output[-4000:]
    # Every test of the file passes (pytest counts a test's subtests apart).
    tests = len(re.findall(r"^\s+def test_", (_tests() / "test_gated_delta.py").read_text(),
                           flags=re.M))
    assert tests >= 8 and counts.get("passed", 0) == tests and not counts.get("skipped"), \
        output[-4000:]
