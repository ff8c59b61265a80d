"""The profiler's count of a sample of threadgroups (backends/sim/report/sampling.py)
against its count of every threadgroup, on other projects' kernels and the families.

The conformance and family tests run in a child interpreter with a plugin
(tests/helpers/profile_compare.py) that profiles each of their dispatches both ways:
wherever the sample stands for the whole, the counters must be identical to the exact
ones, field by field, and the sample must have counted fewer threadgroups than there are
on the kernels whose threadgroups all do the same work. The tests' grids are small, so
there the sample is taken from two threadgroups on (not from `profiled.SAMPLED_FROM`).
By default a representative part runs; `-m slow` runs it all. Then the sample's own
rules, on kernels written for them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.backends.sim.report import kept, sampling

ROOT = Path(__file__).parent.parent
REPRESENTATIVE = [
    "tests/conformance/test_mlx_kernels_misc.py::test_softmax_looped",
    "tests/conformance/test_mlx_steel.py::test_steel_gemm_fused",
    "tests/conformance/test_mlx_reduce.py::test_row_reduce_looped",
    "tests/conformance/test_llama_cpp_norms.py::test_soft_max",
    "tests/test_family_gated_delta.py::test_wy_pads_the_last_chunk",
    "tests/test_family_flash_attention.py::test_flash_matches_oracle",
    "tests/test_family_gguf.py::test_every_work_split_gives_the_same_bits",
]
EVERYTHING = ["tests/conformance", *sorted(str(p.relative_to(ROOT))
                                           for p in (ROOT / "tests").glob("test_family_*.py"))]


def run_compared(targets: list[str], log: Path, markers: str = "not slow") -> list[dict]:
    env = {**os.environ, "MTWORK_ISOLATE": "0", "MTWORK_PROFILE_COMPARE_LOG": str(log),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "tests.helpers.profile_compare", "-m", markers, "-k", "not sanitized",
         *targets], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600,
        check=False)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    return [json.loads(line) for line in log.read_text().splitlines()]


def check(rows: list[dict], sampled_at_least: int) -> None:
    compared = [r for r in rows if "skipped" not in r]
    differing = [r for r in compared if not r["same"]]
    assert not differing, "sampled counts differ from exact ones:\n" + "\n".join(
        f"  {r['kernel']} ({r['groups']} threadgroups, {r.get('counted')} counted): "
        f"{r['differ']}" for r in differing[:20])
    sampled = [r for r in compared if r.get("counted") and not r.get("reason")]
    fewer = [r for r in sampled if r["counted"] < r["groups"]]
    print(f"{len(compared)} dispatches compared, {len(sampled)} from a sample ({len(fewer)} "
          f"counting fewer threadgroups than the grid has); counted whole: "
          f"{sorted({r['kernel'] for r in compared if r.get('reason')})}")
    assert len(fewer) >= sampled_at_least, f"only {len(fewer)} dispatches were sampled"


def test_representative_kernels_count_the_same_from_a_sample(tmp_path: Path) -> None:
    check(run_compared(REPRESENTATIVE, tmp_path / "counts.jsonl"), sampled_at_least=10)


@pytest.mark.slow
def test_every_conformance_and_family_kernel_counts_the_same_from_a_sample(
        tmp_path: Path) -> None:
    check(run_compared(EVERYTHING, tmp_path / "counts.jsonl", markers="slow or not slow"),
          sampled_at_least=100)


# --- the sample's rules, on kernels written for them -------------------------------------

# Each threadgroup sums a row of 64 floats (a tile of x) through threadgroup memory; the
# grid's last threadgroup is cut short where the rows do not fill it (an edge tile).
ROW_SUM = """
    threadgroup float part[64];
    uint t = thread_position_in_threadgroup.x;
    uint row = threadgroup_position_in_grid.y;
    part[t] = t < n[0] ? x[row * n[0] + t] : 0.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = 32; s > 0; s >>= 1) {
        if (t < s) part[t] += part[t + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (t == 0) out[row] = part[0];
"""
# Each threadgroup handles 8 weights of a block of 32 (four threadgroups a block), reading
# the block's scale: a threadgroup's addresses move by a constant only every fourth one.
BLOCK_SCALE = """
    uint i = thread_position_in_grid.x;
    out[i] = scale[i / 32] * w[i];
"""
# Row r loops over r + 1 elements: every threadgroup does other work (a causal mask's).
TRIANGLE = """
    uint row = threadgroup_position_in_grid.x;
    uint t = thread_position_in_threadgroup.x;
    float s = 0.0f;
    for (uint j = 0; j <= row; ++j) s += x[j * 32 + t];
    out[row * 32 + t] = s;
"""
# The same per head (y): row r of head h reads r + 1 elements of that head's column.
TRIANGLE_HEADS = """
    uint row = threadgroup_position_in_grid.x, head = threadgroup_position_in_grid.y;
    uint t = thread_position_in_threadgroup.x;
    float s = 0.0f;
    for (uint j = 0; j <= row; ++j) s += x[(head * 16 + j) * 32 + t];
    out[(head * 16 + row) * 32 + t] = s;
"""
ATOMIC_COUNT = """
    uint i = thread_position_in_grid.x;
    if (x[i] > 0.0f) atomic_fetch_add_explicit(&out[0], 1, memory_order_relaxed);
"""


@pytest.fixture
def both_ways(monkeypatch: pytest.MonkeyPatch):
    """Profiles a call on a sample and on every threadgroup (nothing kept from before);
    returns both counters and what the sample did (threadgroups counted, why not used)."""
    monkeypatch.setattr(kept, "kept", lambda name: None)
    monkeypatch.setattr(kept, "keep", lambda name, counters: None)
    seen: dict = {}
    whole = sampling.whole

    def spied(groups, count, **options):
        out = whole(groups, count, **options)
        seen.update(groups=groups, counted=out[1], reason=out[2])
        return out

    monkeypatch.setattr(sampling, "whole", spied)

    def profile(kernel, **call):
        counts = {}
        for how in ("exact", "sampled"):
            monkeypatch.setenv("MTWORK_PROFILER", how)
            outs = kernel(**call, isolate=False, profile=True)
            counts[how] = (kernel.last_counters, [np.array(o) for o in outs])
        (exact, a), (sampled, b) = counts["exact"], counts["sampled"]
        assert all(x.tobytes() == y.tobytes() for x, y in zip(a, b))
        return exact, sampled, dict(seen)

    return profile


def test_tiles_and_an_edge_tile_count_as_every_threadgroup_does(both_ways) -> None:
    kernel = mtwork.metal_kernel("sample_rows", ["x", "n"], ["out"], ROW_SUM)
    x = mx.array(np.arange(40 * 48, dtype=np.float32))
    exact, sampled, seen = both_ways(
        kernel, inputs=[x, mx.array([48], mx.uint32)], grid=(64, 40, 1),
        threadgroup=(64, 1, 1), output_shapes=[(40,)], output_dtypes=[mx.float32])
    assert sampled == exact
    assert not seen["reason"] and seen["counted"] < 40 // 4


def test_a_period_of_threadgroups_counts_as_every_threadgroup_does(both_ways) -> None:
    kernel = mtwork.metal_kernel("sample_blocks", ["scale", "w"], ["out"], BLOCK_SCALE)
    w = mx.array(np.random.default_rng(1).standard_normal(32 * 64).astype(np.float32))
    exact, sampled, seen = both_ways(
        kernel, inputs=[mx.arange(64, dtype=mx.float32), w], grid=(32 * 64, 1, 1),
        threadgroup=(8, 1, 1), output_shapes=[(32 * 64,)], output_dtypes=[mx.float32])
    assert sampled == exact
    # four classes of threadgroups (the slots of a block), each counted at its corner,
    # the next one along and two checked ones, and the period found on the way
    assert not seen["reason"] and seen["counted"] <= 24 < seen["groups"][0] // 4


def test_work_that_changes_from_threadgroup_to_threadgroup_is_counted_whole(
        both_ways) -> None:
    kernel = mtwork.metal_kernel("sample_triangle", ["x"], ["out"], TRIANGLE)
    exact, sampled, seen = both_ways(
        kernel, inputs=[mx.ones((64 * 32,))], grid=(64 * 32, 1, 1), threadgroup=(32, 1, 1),
        output_shapes=[(64 * 32,)], output_dtypes=[mx.float32])
    assert sampled == exact
    assert "the work changes from one threadgroup to the next" in seen["reason"]
    assert seen["counted"] <= 6  # two boxes tried: the whole, and all but its first slice


def test_work_that_changes_along_one_dimension_only_is_counted_slice_by_slice(
        both_ways) -> None:
    kernel = mtwork.metal_kernel("sample_triangle_heads", ["x"], ["out"], TRIANGLE_HEADS)
    exact, sampled, seen = both_ways(
        kernel, inputs=[mx.ones((16 * 16 * 32,))], grid=(16 * 32, 16, 1),
        threadgroup=(32, 1, 1), output_shapes=[(16 * 16 * 32,)], output_dtypes=[mx.float32])
    assert sampled == exact
    # a corner per row, the step across the first row's heads, three rows checked, and
    # the first row, split off before the work was seen to change row by row
    assert not seen["reason"] and seen["counted"] <= 16 + 10 < 16 * 16 // 3


def test_device_atomics_are_counted_whole(both_ways) -> None:
    kernel = mtwork.metal_kernel("sample_atomic", ["x"], ["out"], ATOMIC_COUNT,
                                 atomic_outputs=True)
    x = mx.array(np.random.default_rng(2).standard_normal(64 * 32).astype(np.float32))
    exact, sampled, seen = both_ways(
        kernel, inputs=[x], grid=(64 * 32, 1, 1), threadgroup=(32, 1, 1),
        output_shapes=[(1,)], output_dtypes=[mx.int32], init_value=0)
    assert sampled == exact
    assert "device atomics" in seen["reason"]


def test_a_configuration_counted_once_is_not_counted_again(monkeypatch) -> None:
    """Counters are kept by kernel, geometry and argument values: the same call is not
    counted again; other values are."""
    calls = []
    whole = sampling.whole
    monkeypatch.setattr(sampling, "whole", lambda *a, **k: calls.append(1) or whole(*a, **k))
    kernel = mtwork.metal_kernel("sample_kept", ["x", "n"], ["out"],
                                 f"// {uuid.uuid4()}\n{ROW_SUM}")
    call = dict(grid=(64, 40, 1), threadgroup=(64, 1, 1), output_shapes=[(40,)],
                output_dtypes=[mx.float32], isolate=False, profile=True)
    x = np.arange(40 * 48, dtype=np.float32)
    first = kernel(inputs=[mx.array(x), mx.array([48], mx.uint32)], **call)
    counted = kernel.last_counters
    again = kernel(inputs=[mx.array(x), mx.array([48], mx.uint32)], **call)
    assert len(calls) == 1 and kernel.last_counters == counted
    assert np.array(first).tobytes() == np.array(again).tobytes()
    kernel(inputs=[mx.array(x + 1), mx.array([48], mx.uint32)], **call)
    assert len(calls) == 2
