"""A process that used the emulator's worker leaves nothing behind: no worker, no open
socket, no second cache decision, and the worker ends when the last kernel is gone."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CALL = """
import mlx.core as mx
import mtwork
k = mtwork.metal_kernel(name="twice", input_names=["a"], output_names=["o"],
                        source="o[thread_position_in_grid.x] = 2 * a[thread_position_in_grid.x];")
a = mx.arange(8, dtype=mx.float32)
out = k(inputs=[a], grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(8,)],
        output_dtypes=[mx.float32])[0]
assert out.tolist() == [2.0 * i for i in range(8)], out
"""


def _python(code: str, *, cwd: Path | None = None, env: dict[str, str] | None = None,
            flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "MTWORK_BACKEND": "sim", **(env or {})}
    full_env.pop("MTWORK_ISOLATE", None)
    return subprocess.run([sys.executable, *flags, "-c", textwrap.dedent(code)], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=300)


def test_a_kernel_call_exits_without_resource_warnings(tmp_path):
    done = _python(CALL, cwd=tmp_path, flags=("-X", "dev", "-W", "error::ResourceWarning"))
    assert done.returncode == 0, done.stderr
    assert "ResourceWarning" not in done.stderr, done.stderr
    assert "still running" not in done.stderr, done.stderr


def test_an_unusable_cache_is_decided_once_for_the_process_and_its_worker(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    done = _python(CALL + "\nprint('CACHE', mtwork.cachedir.cache_dir())\n", cwd=tmp_path,
                   env={"MTWORK_CACHE_DIR": str(blocker / "cache")})
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("is not usable") == 1, done.stderr
    assert done.stderr.count("building the emulator runtime") <= 1, done.stderr
    fallback = Path(done.stdout.split("CACHE", 1)[1].strip())
    assert not fallback.exists(), "the temporary cache outlived its process"


def test_the_worker_runs_the_callers_mtwork_whatever_the_working_folder(tmp_path):
    # A folder named like the package in the working directory must not be imported by
    # the worker in place of the caller's mtwork.
    impostor = tmp_path / "mtwork"
    impostor.mkdir()
    (impostor / "__init__.py").write_text("raise ImportError('the impostor was imported')\n")
    done = _python("import sys; sys.path.remove('') if '' in sys.path else None\n" + CALL,
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_the_worker_ends_when_the_last_kernel_is_collected(tmp_path):
    done = _python(CALL + """
import gc, os, time
from mtwork.backends import get
from mtwork.backends import sim
sim.IDLE_SECONDS = 0.2
backend = get("sim")
pid = backend.worker_pid
assert pid is not None, "the call ran in a worker"
del k
gc.collect()
deadline = time.monotonic() + 30
while backend.worker_pid is not None and time.monotonic() < deadline:
    time.sleep(0.05)
assert backend.worker_pid is None, "the worker outlived every kernel"
def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
while not gone(pid) and time.monotonic() < deadline:
    time.sleep(0.05)
assert gone(pid), "the worker process is still there"
k2 = mtwork.metal_kernel(name="again", input_names=["a"], output_names=["o"],
                         source="o[thread_position_in_grid.x] = a[thread_position_in_grid.x];")
again = k2(inputs=[a], grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(8,)],
           output_dtypes=[mx.float32])[0]
assert again.tolist() == a.tolist()
assert backend.worker_pid not in (None, pid), "a new kernel's call starts a new worker"
print("OK")
""", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "OK" in done.stdout
