"""The fast engine writes the fiber engine's bytes on other projects' kernels.

The conformance suite (MLX's kernel headers, mlx-lm, mlx-audio) and the family tests run
in a child interpreter with $MTWORK_SIM_ENGINE=compare: every dispatch the fast engine
takes runs on both engines, and one byte of difference in what they wrote fails that
call (and so its test). $MTWORK_ENGINE_LOG says, per dispatch, which engine ran it; every
kernel that blocks must have run on the fast engine, so a kernel the fast engine stops
taking shows up here, but for the kernels the fast engine hands to fibers by design
(`ON_FIBERS`). By default a representative part runs; `-m slow` runs it all.

Left out: mlx-lm's kl_forward and js_forward (its distillation losses), which race on
threadgroup memory (lane 0 of each SIMD-group writes its sum into `shared` while other
SIMD-groups may still read the maxima from it, with no barrier between; the sanitizer
reports it): what they compute depends on the order threads run in, which differs
between the engines as it does between runs on the GPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
# Sanitized variants run on the fiber engine only: nothing to compare.
SELECTED = "not distillation and not sanitized"
REPRESENTATIVE = [
    "tests/conformance/test_mlx_kernels_misc.py::test_softmax_single_row",
    "tests/conformance/test_mlx_kernels_misc.py::test_softmax_looped",
    "tests/conformance/test_mlx_kernels_misc.py::test_sdpa_vector",
    "tests/conformance/test_mlx_steel.py::test_steel_gemm_fused",
    "tests/conformance/test_mlx_quantized.py::test_affine_qmv",
    "tests/conformance/test_mlx_reduce.py::test_row_reduce_looped",
    "tests/conformance/test_mlx_scan_sort.py::test_block_sort",
    "tests/conformance/test_llama_cpp_matmul.py::test_mul_mat[q4_0-64-256-1-1-plain]",
    "tests/conformance/test_llama_cpp_norms.py::test_soft_max",
    "tests/conformance/test_mlx_lm.py::test_gated_delta_kernels_match_the_ops_reference",
    "tests/test_family_flash_attention.py::test_flash_matches_oracle",
]
# Kernels that run on fibers by design, with the reason their engine record gives:
# llama.cpp's flash attention and MLX's FFTs rely on a SIMD-group's lanes touching
# threadgroup memory in lockstep (backends/sim/compile/lockstep.py), which only the fiber engine
# keeps; in MLX's FFTs (threads past the transform return before its barriers), gemv_t
# and mlx-audio's dot_product the threads of a group do not all reach each barrier, which
# the fast engine finds at its first call and leaves to the fibers, as the GPU runs it.
# The dsv4 router's and bitonic top-k's loops store and load a lane's own slots through
# the same text (`slot_value[i]`) between barriers: the text check cannot tell the lanes'
# elements apart, and errs towards lockstep, which costs speed only.
LOCKSTEP = "rely on touching threadgroup memory in lockstep"
DIVERGED = "did not all reach the same barrier or SIMD-group function"
ON_FIBERS = [
    (re.compile(r"(mtw_)?kernel_flash_attn_ext\w*|mtw_(rader_|bluestein_|four_step_)?fft|"
                r"moe_router|topk_bitonic"), LOCKSTEP),
    (re.compile(r"(rader_|bluestein_|four_step_)?fft<.*>|(mtw_)?gemv_t\b.*|"
                r"(mtw_)?dot_product\b.*"), DIVERGED),
]
EVERYTHING = ["tests/conformance", *sorted(str(p.relative_to(ROOT))
                                           for p in (ROOT / "tests").glob("test_family_*.py"))]


def run_compared(targets: list[str], log: Path, markers: str = "not slow") -> list[dict]:
    """Runs pytest on `targets` (their tests `markers` selects) with both engines
    compared; returns the dispatch log."""
    env = {**os.environ, "MTWORK_SIM_ENGINE": "compare", "MTWORK_ENGINE_LOG": str(log)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", markers,
         "-k", SELECTED, *targets],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600, check=False)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    return [json.loads(line) for line in log.read_text().splitlines()]


def by_design(kernel: str, reason: str) -> bool:
    return any(name.fullmatch(kernel) and why in reason for name, why in ON_FIBERS)


def check(records: list[dict], at_least: int) -> None:
    print("dispatches by engine:", dict(Counter(r["engine"] for r in records)))
    compared = [r for r in records if r["engine"] == "fast"]
    assert all(r["reason"] == "compared with fibers" for r in compared)
    assert len(compared) >= at_least, f"only {len(compared)} dispatches ran on both engines"
    # Kernels that block ran on the fast engine, unless sanitized (kernels that never
    # block run as plain loops, "loops").
    refused = sorted({(r["kernel"], r["reason"]) for r in records if r["engine"] == "fibers"
                      and "sanitizer" not in (r["reason"] or "")
                      and not by_design(r["kernel"], r["reason"] or "")})
    assert not refused, "kernels the fast engine did not run:\n" + "\n".join(
        f"  {kernel}: {reason}" for kernel, reason in refused)


def test_representative_kernels_agree_bitwise(tmp_path: Path) -> None:
    check(run_compared(REPRESENTATIVE, tmp_path / "engines.jsonl"), at_least=20)


@pytest.mark.slow
def test_every_conformance_and_family_kernel_agrees_bitwise(tmp_path: Path) -> None:
    check(run_compared(EVERYTHING, tmp_path / "engines.jsonl", markers="slow or not slow"),
          at_least=250)
