"""Test set-up: kernels run on the `sim` backend, whatever the machine.

The world's kernels also run sanitized: every test of `tests/conformance/` and of the
kernel families (`tests/test_family_*.py`) gets a second variant, ``[...-sanitized]``,
that runs every kernel with ``sanitize="warn"`` and fails on any finding (correct kernels
must give none: the sanitizer's false-positive check). A representative set of them runs
in the default run; the others are marked `slow` (``python -m pytest -m slow`` runs
them).
"""

import os
import re
import warnings
from pathlib import Path

import pytest

from mtwork.sanitizer import SanitizerError, SanitizerWarning

os.environ.setdefault("MTWORK_BACKEND", "sim")

TESTS = Path(__file__).parent

# Sanitized in the default suite: one of each kind of kernel (SIMD reductions, private
# arrays, simdgroup_matrix with copies into threadgroup memory and edge tiles, atomics,
# struct copies into outputs, a third-party defect).
SANITIZED_BY_DEFAULT = {
    "test_softmax_single_row[dtype0-acc0-100-sanitized]",
    "test_sdpa_vector[causal-sanitized]",
    "test_steel_gemm_fused[2-45-38-37-sanitized]",
    "test_steel_attention[plain-sanitized]",
    "test_affine_qmv_fast[sanitized]",
    "test_scatter_axis_atomic[dtype2-Sum-sanitized]",
    "test_gated_delta_fused_chunk[sanitized]",
    "test_gated_delta_kernels_match_the_ops_reference[packed (Dk=128)-sanitized]",
    "test_distillation_losses[1000-kl_div_loss-sanitized]",
    "test_depthwise_conv1d[dtype0-7-sanitized]",
    "test_packed_is_bitwise_equal_to_seq[Hk2-Hv6-float32-sanitized]",
    "test_sinkhorn_split_matches_the_oracle[float32-20-sanitized]",
}

# Real defects of third-party kernels: what the sanitizer reports on them (and must keep
# reporting), by test. mlx-lm 0.32.2, mlx_lm/tuner/losses.py: kl_forward, js_forward,
# kl_backward and js_backward keep each SIMD-group's maximum in `shared`, read it back
# (lane l of every SIMD-group reads shared[2l]), and then lane 0 of each SIMD-group
# writes its sum into the same `shared` with no threadgroup_barrier between: a
# SIMD-group still reading the maxima can read a sum instead (a write-after-read race
# across SIMD-groups).
_LOSSES_RACE = tuple(f"threadgroup memory race in kernel `{k}`, write of `shared`"
                     for k in ("kl_forward", "js_forward", "kl_backward", "js_backward"))
# llama.cpp (llama-cpp-python 0.3.36), ggml-metal/kernels/fa_vec_common.metal,
# kernel_flash_attn_ext_vec (matched up to the threads and threadgroup, which vary):
# - it zeroes its SIMD-group's scratch with `ss4[i] = 0` for i < SH/4, but SH counts
#   halves and ss4 holds float4s (8 halves): the loop zeroes twice its region, into the
#   next SIMD-group's scratch or the output tile other lanes zeroed just before (benign on
#   the GPU: every write is a zero);
# - it relies on a SIMD-group's lanes touching threadgroup memory in lockstep (sim runs
#   it so, see backends/sim/compile/lockstep.py), which MSL leaves undefined without a
#   simdgroup_barrier: lane 0 writes the sums and maxima into `ss` after the other lanes
#   read the scores there (line 570, head size 128: one lane per element, no SIMD-group
#   function between) and, in the reduce across SIMD-groups, over the values the lanes
#   have just read (lines 600-601);
# - every SIMD-group writes the same query row into the one shared `sq4` (lines 118-120:
#   a race across SIMD-groups, benign as they write the same values).
_FA_VEC = r"threadgroup memory race in kernel `kernel_flash_attn_ext_vec_\w+`, thread "
_FA_VEC_KNOWN = tuple(re.compile(_FA_VEC + tail) for tail in (
    r".*fa_vec_common\.metal:140, ",
    r"\(0, 0, 0\) of threadgroup \([\d, ]+\), and thread \(\d+, 0, 0\) \(read\), at "
    r".*fa_vec_common\.metal:60[01], ",
    r"\(0, 0, 0\) of threadgroup \([\d, ]+\), and thread \(\d+, 0, 0\) \(read\), \(\d+ times\)$",
    r"\(\d+, [1-3], 0\) of threadgroup .*fa_vec_common\.metal:1(?:18|20), "))
# MLX 0.32.4's own kernels. fft.h: threads past the transform return
# (`if (read_writer.out_of_bounds()) return;`) before the stages' threadgroup_barriers;
# gemv.h's gemv_t: a barrier in the loop under `if (out_col < out_vec_size)`. Apple GPUs
# run them (an exited thread does not hold a barrier), but the MSL specification leaves a
# barrier some threads never reach undefined, so it is reported as divergence. scan.h's
# contiguous_scan: SIMD-group 0 reads simdgroup_sums[simd_lane_id] for all 32 lanes, where
# only one entry per SIMD-group was written (the results of the other lanes are unused).
# llama.cpp's reduce.metal, kernel_cumsum_blk: SIMD-group 0 scans shmem_f32[tiisg] for
# all 32 lanes where a threadgroup of fewer than 32 SIMD-groups (rows of 300: 16) wrote
# one entry each (the lanes past them feed only sums no one reads).
_CUMSUM_UNWRITTEN = ("read of uninitialized threadgroup memory in kernel "
                     "`kernel_cumsum_blk_f32`",)
_FFT_BARRIER = ("barrier divergence in kernel `fft<",)
_SCAN_UNWRITTEN = ("read of uninitialized threadgroup memory in kernel `contiguous_scan<",)
KNOWN_DEFECTS = {  # by test function, or by a test's full id for one parametrization
    "test_distillation_losses": _LOSSES_RACE,
    "test_distillation_loss_gradients": _LOSSES_RACE,
    "test_c2c_fft[64-False-stockham-sanitized]": _FFT_BARRIER,
    "test_c2c_fft[60-True-stockham-sanitized]": _FFT_BARRIER,
    "test_c2c_fft[47-False-bluestein-sanitized]": ("barrier divergence in kernel "
                                                   "`bluestein_fft<",),
    "test_rfft": _FFT_BARRIER,
    "test_gemv_t": ("barrier divergence in kernel `gemv_t<",),
    "test_flash_attn_ext_vec": _FA_VEC_KNOWN,
    "test_cumsum[shape0-sanitized]": _CUMSUM_UNWRITTEN,
    **{f"test_contiguous_scan[{case}-sanitized]": _SCAN_UNWRITTEN for case in (
        "CumSum-dtype0-1000-True-False", "CumMax-dtype1-5000-False-True",
        "CumLogaddexp-dtype2-700-True-False")},
}

# A third-party defect the sanitizer stops at (an out-of-bounds write is stopped before it
# happens, in any mode): rader_fft reads and writes a little past its last row, which
# Metal's page-rounded buffers absorb.
STOPPED_DEFECTS = {
    "test_c2c_fft[34-False-rader-sanitized]": "rader_fft writes past the end of its output",
}

# Tests that check a fault itself (a sanitized run reports it as a finding instead): no
# sanitized variant. The planted-bug corpus covers these kinds.
NOT_SANITIZED = {"test_threadgroup_formula_is_what_the_kernel_declares"}


def _sanitized_suite(path: Path) -> bool:
    return path.parent == TESTS / "conformance" or path.name.startswith("test_family_")


@pytest.hookimpl(trylast=True)  # after the tests' own parameters: ids end in -sanitized
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if (_sanitized_suite(Path(metafunc.module.__file__))
            and metafunc.function.__name__ not in NOT_SANITIZED):
        metafunc.parametrize("sanitized", [False, True], ids=["plain", "sanitized"],
                             indirect=True)


@pytest.hookimpl(tryfirst=True)  # marks set before `-m` selects (pyproject: -m 'not slow')
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        sanitized = item.name.endswith(("-sanitized]", "[sanitized]"))
        if sanitized and item.name not in SANITIZED_BY_DEFAULT:
            item.add_marker(pytest.mark.slow)
        if item.name in STOPPED_DEFECTS:
            item.add_marker(pytest.mark.xfail(raises=SanitizerError, strict=True,
                                              reason=STOPPED_DEFECTS[item.name]))


def _known(finding: str, known: str | re.Pattern[str]) -> bool:
    """Whether `finding` is the known defect: a text it starts with, or a pattern."""
    if isinstance(known, re.Pattern):
        return known.match(finding) is not None
    return finding.startswith(known)


def _findings(message: str) -> list[str]:
    """The finding lines of a report's text."""
    lines = [line.strip() for line in message.splitlines()[1:-1]]
    return [line.split(". ", 1)[1] for line in lines if ". " in line]


@pytest.fixture(autouse=True)
def sanitized(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """For a ``-sanitized`` variant: every kernel of the test runs sanitized; afterwards
    its findings must be none (or, for a known third-party defect, that defect only)."""
    if not getattr(request, "param", False):
        yield False
        return
    monkeypatch.setenv("MTWORK_SANITIZE", "warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SanitizerWarning)
        yield True
    found = [f for w in caught if issubclass(w.category, SanitizerWarning)
             for f in _findings(str(w.message))]
    known = KNOWN_DEFECTS.get(request.node.name,
                              KNOWN_DEFECTS.get(request.function.__name__, ()))
    unexpected = [f for f in found if not any(_known(f, k) for k in known)]
    assert not unexpected, "sanitizer findings on a correct kernel:\n" + "\n".join(unexpected)
    assert not known or found, f"the known defect is no longer reported: {known}"
