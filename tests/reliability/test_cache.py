"""The compile cache protects and repairs itself: broken or changed artefacts are rebuilt,
never loaded; a cache that cannot be written is replaced by a temporary one; what killed
builds leave is removed; the size limit holds. Each test works on its own copy of a
warmed cache, in fresh interpreters."""

import json
import os
import shutil
import stat

import pytest

from .child import run_snippet

RUN = """
import json, mlx.core as mx, numpy as np, mtwork, warnings
warnings.simplefilter("always")
k = mtwork.metal_kernel("scale", ["inp"], ["out"],
                        "uint i = thread_position_in_grid.x; out[i] = inp[i] * 3.0f;")
x = mx.arange(64, dtype=mx.float32)
out = k(inputs=[x], grid=(64, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(64,)],
        output_dtypes=[mx.float32], isolate=False)[0]
from mtwork.cachedir import cache_dir
print(json.dumps({"ok": bool(np.array_equal(np.array(out), 3 * np.arange(64))),
                  "cache": str(cache_dir())}))
"""


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """A cache with the emulator runtime and zig's C runtime already built."""
    root = tmp_path_factory.mktemp("warm") / "cache"
    result = run_snippet(RUN, env={"MTWORK_CACHE_DIR": str(root)}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return root


@pytest.fixture
def cache(warmed, tmp_path):
    root = tmp_path / "cache"
    shutil.copytree(warmed, root, symlinks=True)
    return root


def run(cache, **env):
    result = run_snippet(RUN, env={"MTWORK_CACHE_DIR": str(cache), **env}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def kernels(cache):
    return sorted((cache / "kernels").glob("*.so"))


def newest_kernel(cache):
    return max(kernels(cache), key=lambda p: p.stat().st_mtime)


@pytest.mark.parametrize("damage", ["zeroed", "truncated", "changed"])
def test_a_damaged_kernel_is_rebuilt_not_loaded(cache, damage):
    run(cache)  # the kernel, built for this cache's place
    so = newest_kernel(cache)
    data = bytearray(so.read_bytes())
    if damage == "zeroed":
        data = bytearray(len(data))
    elif damage == "truncated":
        data = data[: len(data) // 3]
    else:  # same size, other code: what a tampered shared cache would hold
        data[len(data) // 2: len(data) // 2 + 64] = bytes(64)
    so.write_bytes(bytes(data))
    outcome, _ = run(cache)
    assert outcome["ok"]
    assert so.read_bytes() != bytes(data)  # built again


def test_a_read_only_cache_falls_back_to_a_temporary_one_with_a_warning(cache):
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # root writes through permissions: make the cache path a file instead
        shutil.rmtree(cache)
        cache.write_text("not a folder")
    else:
        cache.chmod(stat.S_IRUSR | stat.S_IXUSR)
    outcome, stderr = run(cache)
    assert outcome["ok"] and outcome["cache"] != str(cache)
    assert "is not usable" in stderr and "MTWORK_CACHE_DIR" in stderr


def test_what_a_killed_build_left_is_removed(cache):
    dead_pid = 2**22 + 12345  # above Linux's default pid_max: no such process
    left = [cache / "builds" / f"tmp-{dead_pid}-{name}" for name in ("abc", "x", "runtime")]
    for folder in left:
        folder.mkdir(parents=True)
        (folder / "kernel.cpp").write_text("half a build")
    alive = cache / "builds" / f"tmp-{os.getpid()}-mine"
    alive.mkdir()
    run(cache)
    assert not any(folder.exists() for folder in left)
    assert alive.exists()  # a build of a process that is still running stays


def test_the_size_limit_evicts_the_least_recently_used(cache):
    [stale] = kernels(cache)  # built for the warmed cache's place: never used here
    result = run_snippet("""
import mlx.core as mx, mtwork
for n in range(6):
    k = mtwork.metal_kernel(f"k{n}", ["inp"], ["out"],
                            f"out[thread_position_in_grid.x] = inp[0] + {n}.0f;")
    k(inputs=[mx.zeros(4)], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
      output_dtypes=[mx.float32], isolate=False)
from mtwork.cachedir import cache_info
print(cache_info()["artefact_bytes"])
""", env={"MTWORK_CACHE_DIR": str(cache), "MTWORK_CACHE_MAX": "1M"}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    left = kernels(cache)
    assert not stale.exists()  # the least recently used went first
    assert 1 <= len(left) < 6  # the six new ones did not all stay


def test_mtwork_cache_reports_and_clears(cache):
    from mtwork.cli import main

    os.environ["MTWORK_CACHE_DIR"] = str(cache)
    try:
        assert main(["cache"]) == 0
        assert main(["cache", "clear"]) == 0
        assert kernels(cache) == []
    finally:
        del os.environ["MTWORK_CACHE_DIR"]


@pytest.mark.parametrize("value", ["lots", "-1G", "2T"])
def test_a_bad_size_limit_is_named(cache, value):
    result = run_snippet(RUN, env={"MTWORK_CACHE_DIR": str(cache), "MTWORK_CACHE_MAX": value})
    assert result.returncode != 0 and "MTWORK_CACHE_MAX" in result.stderr


def test_threads_of_one_process_share_a_fresh_cache_and_its_builds(tmp_path):
    """Threads that meet a cache folder not yet made, and build the same kernel at once,
    agree on one folder and none loses another's build (eviction leaves builds alone)."""
    root = tmp_path / "fresh" / "cache"
    result = run_snippet("""
import json, threading, warnings
warnings.simplefilter("error")  # a fallback to a temporary folder would warn
from pathlib import Path
from mtwork import cachedir
seen, errors = [], []
def work():
    try:
        root = cachedir.cache_dir()
        seen.append(str(root))
        for _ in range(20):
            built = cachedir.work_dir()
            (built / "x.so").write_bytes(b"same bytes")
            cachedir.evict(limit=0)  # must leave every build in progress alone
            cachedir.publish(built / "x.so", root / "kernels" / "x.so")
            built.rmdir()
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"roots": sorted(set(seen)), "errors": errors}))
""", env={"MTWORK_CACHE_DIR": str(root)}, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report == {"roots": [str(root)], "errors": []}
