"""MLX's Hadamard transform (hadamard.h: `hadamard_n`) on `sim`, against
`mx.hadamard_transform` on the CPU.

MLX builds this library at run time (hadamard.cpp): utils.h, a codelet
`hadamard_radix_m` that its host code writes for the non-power-of-two factor m (for m = 1
an empty function), then hadamard.h; sizes above 8192 split into a strided n1 stage and a
contiguous n2 stage (`hadamard_mn_contiguous`), with threadgroups of n / min(n, 16)
threads.
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork import new_buffer

from .metal_path import run_both
from .mlx_kernels import KERNELS, MLX, build, rng
from .sources import mlx_kernels_dir

# What gen_hadamard_codelet writes for m = 1.
CODELET_M1 = "METAL_FUNC void hadamard_radix_m(thread float *x) {\n}\n"


@cache
def _library() -> mtwork.Library:
    mlx_kernels_dir()
    text = (f'#include "{KERNELS}utils.h"\n{CODELET_M1}#include "{KERNELS}hadamard.h"\n')
    return mtwork.load_metal(text, name="hadamard (as hadamard.cpp builds it)")


def _stage(x, out, n: int, stride: int, scale: float) -> tuple[np.ndarray, float]:
    """One hadamard_n dispatch of length `n` (a power of two) over elements `stride`
    apart."""
    radix = min(n, 16)
    read_width = 2 if n == 2 else 4
    template = (mx.float32, n, radix, read_width) + ((stride,) if stride > 1 else ())
    built = build(_library(), "hadamard_n", template)
    size = int(np.prod(x.shape))
    grid = (n // radix, size // (n * stride), stride)
    result = run_both(built.kernel, buffers={"in": x, "out": out, "scale": float(scale)},
                      grid=grid, threads_per_threadgroup=(n // radix, 1, 1))
    return result["out"], built.compile_s


@pytest.mark.parametrize("n", [256, 16384])
def test_hadamard_n(agreement, n) -> None:
    rows = 3
    x = mx.array(rng().standard_normal((rows, n)), mx.float32)
    scale = 1 / np.sqrt(n)
    if n <= 8192:
        out, compile_s = _stage(x, new_buffer(x.shape), n, 1, scale)
    else:
        n2 = 2
        while n2 * n2 < n:
            n2 *= 2
        n1 = n // n2
        temp, first_s = _stage(x, new_buffer(x.shape), n1, n2, 1.0)
        out, second_s = _stage(temp, temp, n2, 1, scale)
        compile_s = first_s + second_s
    agreement(f"hadamard_n n={n}", MLX, out, mx.hadamard_transform(x, scale=scale),
              reference="mx.hadamard_transform (CPU)", compile_s=compile_s,
              atol=1e-5, rtol=1e-4)
