"""llama.cpp's row and copy kernels of quantize.metal: get_rows (gather, dequantising),
set_rows (scatter, converting or quantising) and cpy (convert, quantise, dequantise,
reshape), dispatched as ggml_metal_op_get_rows / _set_rows / _cpy do, against numpy and
gguf's (de)quantisers.
"""

from __future__ import annotations

import numpy as np
import pytest

from .llama_cpp import MAX_THREADS, built, check, new, run
from .llama_cpp_structs import pack
from .llama_cpp_tensors import Tensor, blocks, decode, encoded, integers, random_blocks

SLOW = pytest.mark.slow
REFERENCE = "numpy, gguf's (de)quantisers (decoded values equal)"
EXACT = {"dtype": "float64", "atol": 0.0, "rtol": 0.0}


def _rng() -> np.random.Generator:
    return np.random.default_rng(17)


def _source(gtype: str, shape: tuple[int, ...]) -> Tensor:
    g = _rng()
    if gtype in ("q4_K", "q6_K"):
        return random_blocks(shape, gtype, g)
    return encoded(g.standard_normal(shape), gtype)


def _quantised(gtype: str) -> bool:
    return blocks(gtype)[0] > 1


@pytest.mark.parametrize(("gtype", "shape"), [
    ("q4_0", (2, 10, 64)),
    pytest.param("f32", (3, 7, 40), marks=SLOW),
    pytest.param("f16", (1, 9, 130), marks=SLOW),
    pytest.param("bf16", (2, 5, 64), marks=SLOW),
    pytest.param("q8_0", (1, 6, 96), marks=SLOW),
    pytest.param("q6_K", (1, 4, 512), marks=SLOW),
])
def test_get_rows(agreement, gtype, shape) -> None:
    # ggml_metal_op_get_rows: src1 holds, per (i11, i12), ne10 row numbers into src0's
    # matrix (i02, i03) = (i11, i12); quantised rows go 16 values (a float4x4) a thread.
    src = _source(gtype, shape)
    picks = _rng().integers(0, shape[1], size=(shape[0], 5)).astype(np.int32)
    idx = integers(picks)
    ne00t = src.ne[0] // 16 if _quantised(gtype) else src.ne[0]
    b = built("quantize.metal", f"kernel_get_rows_{gtype}")
    out_shape = (shape[0], picks.shape[1], shape[2])
    dst = encoded(np.zeros(out_shape), "f32")
    args = pack("ggml_metal_kargs_get_rows", src.locals("0"), idx.locals("1"), dst.locals(""),
                ne00t=ne00t)
    nth = min(ne00t, MAX_THREADS)
    groups = (-(-ne00t // nth) * idx.ne[0], idx.ne[1], idx.ne[2])
    out = run(b, {0: args, 1: src, 2: idx, 3: new(dst.nbytes)}, groups, (nth, 1, 1))
    actual = decode(out[3], "f32", out_shape)
    expected = np.take_along_axis(src.values, picks[:, :, None], axis=1)
    check(agreement, b, f"kernel_get_rows_{gtype} {shape}", actual, expected, REFERENCE,
          **EXACT)


def _set_rows_geometry(nk0: int) -> tuple[int, int]:
    """(threads along a row, rows per threadgroup) of ggml_metal_op_set_rows."""
    nth = 32
    while nth < nk0 and nth < MAX_THREADS:
        nth *= 2
    nrptg = 1
    if nth > nk0:
        nrptg, nth = -(-nth // nk0), nk0
        if nrptg * nth > MAX_THREADS:
            nrptg -= 1
    return min(nth, nk0), nrptg


@pytest.mark.parametrize(("dst_type", "index_type", "shape"), [
    ("f16", "i64", (2, 6, 64)),
    pytest.param("f32", "i32", (3, 4, 1000), marks=SLOW),
    pytest.param("bf16", "i64", (1, 5, 40), marks=SLOW),
    pytest.param("q8_0", "i32", (2, 3, 128), marks=SLOW),
    pytest.param("q4_0", "i64", (1, 4, 64), marks=SLOW),
])
def test_set_rows(agreement, dst_type, index_type, shape) -> None:
    # ggml_metal_op_set_rows: src0 row i01 of matrix (i02, i03) goes to dst row
    # src1[i03 % ne12, i02 % ne11, i01]; the other rows of dst keep what they held.
    g = _rng()
    src = encoded(g.standard_normal(shape), "f32")
    rows_in_dst = shape[1] + 3
    picks = np.stack([g.permutation(rows_in_dst)[:shape[1]] for _ in range(shape[0])])
    idx = integers(picks, index_type)
    before = encoded(g.standard_normal((shape[0], rows_in_dst, shape[2])), dst_type)
    per_block, _ = blocks(dst_type)
    nk0 = shape[2] // per_block
    nth, nrptg = _set_rows_geometry(nk0)
    b = built("quantize.metal", f"kernel_set_rows_f32_{index_type}_{dst_type}")
    args = pack("ggml_metal_kargs_set_rows", src.locals("0"), idx.locals("1"),
                before.locals(""), nk0=nk0)
    dst = before.data.copy()
    out = run(b, {0: args, 1: src, 2: idx, 3: dst},
              (-(-shape[1] // nrptg), shape[0], 1), (nth, nrptg, 1))
    actual = decode(out[3], dst_type, before.values.shape)
    # Written rows hold src's rows as numpy / gguf store them in dst_type (rounded to
    # nearest even, or quantised by gguf's quantiser), the others what they held.
    expected = before.values.copy()
    for m in range(shape[0]):
        expected[m, picks[m]] = encoded(src.values[m], dst_type).values
    check(agreement, b, f"kernel_set_rows_f32_{index_type}_{dst_type} {shape}", actual,
          expected, REFERENCE, **EXACT)


def _cpy_geometry(src: Tensor, dst_type: str) -> tuple[int, int, int]:
    """(nk0, threads along a row, rows per threadgroup) of ggml_metal_op_cpy."""
    ne00, ne01 = src.ne[0], src.ne[1]
    nk0 = ne00
    if _quantised(src.gtype):
        nk0 = ne00 // 16
    elif _quantised(dst_type):
        nk0 = ne00 // blocks(dst_type)[0]
    nth = min(nk0 * ne01, 256)
    nrptg = 1
    if not _quantised(src.gtype) and not _quantised(dst_type) and nth > nk0:
        nrptg, nth = -(-nth // nk0), nk0
        if nrptg * nth > 256:
            nrptg -= 1
    return nk0, min(nth, nk0), nrptg


@pytest.mark.parametrize(("src_type", "dst_type", "shape", "dst_shape"), [
    ("f32", "f16", (3, 5, 48), (3, 5, 48)),
    pytest.param("f32", "f32", (4, 6, 10), (6, 40), marks=SLOW),       # a reshape
    pytest.param("f32", "bf16", (2, 3, 64), (2, 3, 64), marks=SLOW),
    pytest.param("bf16", "f32", (2, 7, 20), (2, 7, 20), marks=SLOW),
    pytest.param("f32", "q8_0", (2, 4, 256), (2, 4, 256), marks=SLOW),
    pytest.param("q4_0", "f32", (3, 5, 64), (3, 5, 64), marks=SLOW),
])
def test_cpy(agreement, src_type, dst_type, shape, dst_shape) -> None:
    src = _source(src_type, shape)
    dst = encoded(np.zeros(dst_shape), dst_type)
    nk0, nth, nrptg = _cpy_geometry(src, dst_type)
    b = built("quantize.metal", f"kernel_cpy_{src_type}_{dst_type}")
    args = pack("ggml_metal_kargs_cpy", src.locals("0"), dst.locals(""), nk0=nk0)
    nw0 = -(-nk0 // nth) if nrptg == 1 else 1
    groups = (nw0 * (src.ne[1] + nrptg - 1) // nrptg, src.ne[2], src.ne[3])
    out = run(b, {0: args, 1: src, 2: new(dst.nbytes)}, groups, (nth, nrptg, 1))
    actual = decode(out[2], dst_type, dst_shape)
    expected = encoded(src.values.reshape(dst_shape), dst_type).values
    check(agreement, b, f"kernel_cpy_{src_type}_{dst_type} {shape} to {dst_shape}", actual,
          expected, REFERENCE, **EXACT)
