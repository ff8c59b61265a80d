"""``pytest --mtwork``: a test file written for a Mac, one that calls ``mx.fast.metal_kernel``
itself and skips without ``mx.metal.is_available()``, runs unchanged; ``--mtwork-sanitize``
finds the bug the GPU hides. Each run is a separate pytest process, as in a project's CI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import tomllib

from mtwork import graph
from mtwork.native import metal_available

ROOT = Path(__file__).resolve().parents[1]

# What a kernel project's own test file looks like: nothing of mtwork in it.
THIRD_PARTY = '''
import mlx.core as mx
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(not mx.metal.is_available(), reason="needs a Metal GPU")

_softplus = mx.fast.metal_kernel(
    name="softplus",
    input_names=["x"],
    output_names=["y"],
    source="""
        uint i = thread_position_in_grid.x;
        y[i] = metal::precise::log(1.0f + metal::precise::exp(x[i]));
    """,
)


def softplus(x):
    return _softplus(inputs=[x], grid=(x.size, 1, 1), threadgroup=(256, 1, 1),
                     output_shapes=[x.shape], output_dtypes=[x.dtype])[0]


def test_matches_mlx():
    x = mx.random.normal((1000,), key=mx.random.key(0))
    np.testing.assert_allclose(np.array(softplus(x)), np.array(mx.logaddexp(x, 0.0)),
                               rtol=1e-5, atol=1e-6)


def test_inside_compile():
    x = mx.random.normal((1000,), key=mx.random.key(1))
    assert mx.array_equal(mx.compile(softplus)(x), softplus(x))


def test_the_device_is_an_apple_gpu():
    info = mx.device_info()
    assert info["architecture"].startswith("applegpu")
    assert info["max_recommended_working_set_size"] <= info["memory_size"]


def test_the_default_device_is_the_gpu():  # as mlx-lm's models choose their Metal path
    assert mx.default_device() == mx.gpu and mx.metal.is_available()
    with mx.stream(mx.new_stream(mx.default_device())):
        assert mx.exp(mx.array(0.0)).item() == 1.0
'''

# A neighbour difference that reads one element past the end on its last thread: the
# GPU (and sim) read whatever lies there, and the test passes by luck.
OFF_BY_ONE = '''
import mlx.core as mx
import numpy as np

_diff = mx.fast.metal_kernel(
    name="diff", input_names=["x"], output_names=["y"],
    source="uint i = thread_position_in_grid.x; y[i] = x[i + 1] - x[i];")


def test_diff_of_the_first_elements():
    x = mx.arange(64, dtype=mx.float32) ** 2
    y = _diff(inputs=[x], grid=(64, 1, 1), threadgroup=(64, 1, 1),
              output_shapes=[(64,)], output_dtypes=[mx.float32])[0]
    np.testing.assert_array_equal(np.array(y)[:63], np.diff(np.array(x)))
'''


def _plugin_installed() -> bool:
    return any(ep.value == "mtwork.pytest_plugin" for ep in entry_points(group="pytest11"))


def run_pytest(tmp_path: Path, source: str, *options: str) -> dict[str, int]:
    """Runs pytest on `source` as a project would; returns its outcome counts."""
    (tmp_path / "test_project.py").write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    plugin = () if _plugin_installed() else ("-p", "mtwork.pytest_plugin")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MTWORK_SANITIZE", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin, *options,
         str(tmp_path / "test_project.py")], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=600)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|error)",
                                                     summary)}
    counts["output"] = result.stdout + result.stderr  # type: ignore[assignment]
    return counts


@pytest.mark.skipif(not graph.available(), reason="no MLX extension for kernels in compile")
def test_pytest_mtwork_runs_a_metal_projects_test_file_unchanged(tmp_path) -> None:
    with_mtwork = run_pytest(tmp_path, THIRD_PARTY, "--mtwork")
    assert with_mtwork.get("passed") == 4, with_mtwork["output"]
    assert "mtwork: mx.fast.metal_kernel runs on sim" in with_mtwork["output"] or (
        metal_available())
    if not metal_available():  # without the plugin's option, a Linux run skips them all
        plain = run_pytest(tmp_path, THIRD_PARTY)
        assert plain.get("skipped") == 4, plain["output"]
        # mx.gpu left as MLX's: the default device is the CPU, as a Linux run says.
        kept = run_pytest(tmp_path, THIRD_PARTY, "--mtwork", "--mtwork-keep-gpu")
        assert (kept.get("passed"), kept.get("failed")) == (3, 1), kept["output"]


def test_mtwork_sanitize_finds_what_a_plain_run_lets_pass(tmp_path) -> None:
    plain = run_pytest(tmp_path, OFF_BY_ONE, "--mtwork")
    assert plain.get("passed") == 1, plain["output"]
    sanitized = run_pytest(tmp_path, OFF_BY_ONE, "--mtwork-sanitize")
    assert sanitized.get("failed") == 1, sanitized["output"]
    assert "out-of-bounds" in sanitized["output"] and "diff" in sanitized["output"]


def test_the_plugin_is_registered_for_pytest_and_silent_without_its_options() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["pytest11"] == {"mtwork": "mtwork.pytest_plugin"}
    # Loaded into every pytest run once installed: without its options it changes
    # nothing of MLX's and starts nothing of the emulator's.
    code = textwrap.dedent("""
        import sys, mlx.core as mx
        before = mx.fast.metal_kernel
        import mtwork.pytest_plugin as plugin
        class Config:  # a pytest run without the plugin's options
            def getoption(self, name):
                return None if name == "mtwork_chip" else False
        plugin.pytest_configure(Config())
        print(mx.fast.metal_kernel is before, mx.metal.is_available(),
              "mtwork.backends.sim" in sys.modules)
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True).stdout
    assert out.split() == ["True", str(metal_available()), "False"], out
