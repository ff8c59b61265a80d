"""llama.cpp's argsort.metal: the bitonic sort of row blocks in threadgroup memory and the
merge passes that join them, dispatched as ggml_metal_op_argsort does, against numpy's
argsort (rows of distinct values: the order is unique).
"""

from __future__ import annotations

import numpy as np
import pytest

from .llama_cpp import MAX_THREADS, built, check, new, run
from .llama_cpp_structs import pack
from .llama_cpp_tensors import encoded

SLOW = pytest.mark.slow
REFERENCE = "numpy argsort"


def argsort(x: np.ndarray, order: str) -> tuple[np.ndarray, list]:
    """ggml_metal_op_argsort: each threadgroup sorts a block of nth (a power of two, up to
    1024) indices of a row; then merge passes double the sorted length, each reading the
    last pass's indices (the host ping-pongs between dst and a scratch buffer after it;
    here each pass writes a new buffer)."""
    src = encoded(x, "f32")
    ne00 = src.ne[0]
    nth = 1
    while nth < ne00 and 2 * nth <= MAX_THREADS:
        nth *= 2
    npr = -(-ne00 // nth)
    dst = encoded(np.zeros(x.shape, np.int32), "i32")
    sort = built("argsort.metal", f"kernel_argsort_f32_i32_{order}")
    args = pack("ggml_metal_kargs_argsort", src.locals("0"), dst.locals(""), top_k=nth)
    out = run(sort, {0: args, 1: src, 2: new(dst.nbytes)},
              (npr * src.ne[1], src.ne[2], src.ne[3]), (nth, 1, 1), -(-nth * 4 // 16) * 16)
    sorted_blocks = out[2]
    parts = [sort]
    length = nth
    while length < ne00:
        merge = built("argsort.metal", f"kernel_argsort_merge_f32_i32_{order}")
        margs = pack("ggml_metal_kargs_argsort_merge", src.locals("0"), dst.locals(""),
                     top_k=ne00, len=length)
        nm = -(-ne00 // (2 * length))
        out = run(merge, {0: margs, 1: src, 2: sorted_blocks, 3: new(dst.nbytes)},
                  (nm * src.ne[1], src.ne[2], src.ne[3]), (min(512, MAX_THREADS), 1, 1))
        sorted_blocks = out[3]
        parts.append(merge)
        length <<= 1
    return sorted_blocks.view(np.int32).reshape(x.shape), parts


@pytest.mark.parametrize(("order", "shape"), [
    ("asc", (3, 100)),
    pytest.param("desc", (2, 2, 700), marks=SLOW),
    pytest.param("asc", (2, 3000), marks=SLOW),   # three blocks of 1024, two merge passes
    pytest.param("desc", (1, 5000), marks=SLOW),  # five blocks, three merge passes
])
def test_argsort(agreement, order, shape) -> None:
    g = np.random.default_rng(23)
    # Distinct values (a permutation, scaled) so the sorted order is unique.
    x = (g.permutation(int(np.prod(shape))).reshape(shape) * 0.37 - 100).astype(np.float32)
    actual, parts = argsort(x, order)
    expected = np.argsort(x, axis=-1, kind="stable")
    if order == "desc":
        expected = expected[..., ::-1]
    check(agreement, parts, f"kernel_argsort_f32_i32_{order} {shape}", actual,
          expected.astype(np.int32), REFERENCE, bitwise=True)
