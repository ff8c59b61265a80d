"""The profiler's count of a sample of threadgroups (backends/sim/report/sampling.py)
against its count of every threadgroup, on other projects' kernels and the families.

The conformance and family tests run in a child interpreter with a plugin
(tests/helpers/profile_compare.py) that profiles each of their dispatches both ways:
wherever the sample stands for the whole, the counters must be identical to the exact
ones, field by field, and the sample must have counted fewer threadgroups than there are
on the kernels whose threadgroups all do the same work. By default a representative part
runs; `-m slow` runs it all. Then the sample's own rules, on kernels written for them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    print(f"{len(compared)} dispatches compared, {len(sampled)} from a sample; kernels "
          f"counted whole: {sorted({r['kernel'] for r in compared if r.get('reason')})}")
    assert len(sampled) >= sampled_at_least, f"only {len(sampled)} dispatches were sampled"
    assert all(r["counted"] < r["groups"] for r in sampled)


def test_representative_kernels_count_the_same_from_a_sample(tmp_path: Path) -> None:
    check(run_compared(REPRESENTATIVE, tmp_path / "counts.jsonl"), sampled_at_least=10)


@pytest.mark.slow
def test_every_conformance_and_family_kernel_counts_the_same_from_a_sample(
        tmp_path: Path) -> None:
    check(run_compared(EVERYTHING, tmp_path / "counts.jsonl", markers="slow or not slow"),
          sampled_at_least=100)
