"""MLX's steel convolution (steel/conv/kernels/steel_conv.h: the implicit-GEMM 2-D
convolution on simdgroup_matrix) on `sim`, against `mx.conv2d` on the CPU.

Template arguments are instantiations of MLX's steel_conv.metal
(`instantiate_implicit_2d_blocks`: 32 x 32 x 16 tiles with 2 x 2 SIMD-groups, or 32 x 8
with 4 x 1 for 16 or fewer output channels; channel and filter specializations); the
parameter structs, tiles and grid follow conv.cpp's `implicit_gemm_conv_2D_gpu`.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mtwork import new_buffer

from .metal_path import run_both
from .mlx_kernels import MLX, build, ceil_div, metal_library, rng

CONV = ("utils.h", "steel/gemm/mma.h", "steel/conv/conv.h", "steel/conv/params.h",
        "steel/conv/kernels/steel_conv.h")  # steel_conv.metal's includes

# steel/conv/params.h, laid out with C's alignment rules.
CONV_PARAMS_2D = np.dtype([
    ("N", "i4"), ("C", "i4"), ("O", "i4"), ("iS", "i4", 2), ("wS", "i4", 2), ("oS", "i4", 2),
    ("str", "i4", 2), ("pad", "i4", 2), ("kdil", "i4", 2), ("idil", "i4", 2),
    ("in_strides", "i8", 4), ("wt_strides", "i8", 4), ("out_strides", "i8", 4),
    ("groups", "i4"), ("flip", "?")], align=True)
GEMM_PARAMS_2D = np.dtype([(name, "i4") for name in (
    "M", "N", "K", "gemm_k_iterations", "inp_jump_w", "inp_jump_h", "inp_jump_c", "tiles_n",
    "tiles_m", "swizzle_log")])


def _strides(shape: tuple[int, ...]) -> list[int]:
    return [int(np.prod(shape[i + 1:])) for i in range(len(shape))]


@pytest.mark.parametrize(("c", "o"), [(16, 32), (3, 8)])
def test_implicit_gemm_conv_2d(agreement, c, o) -> None:
    # NHWC input, OHWC weights, stride 1, padding 1, 3 x 3 filter. With 3 input channels
    # the kernel takes the small-channel path (N_CHANNELS = 3, K iterations over the
    # whole filter); 8 output channels take 32 x 8 tiles with 4 x 1 SIMD-groups.
    n, h, w, kh, kw = 2, 9, 9, 3, 3
    g = rng()
    x = mx.array(g.standard_normal((n, h, w, c)), mx.float32)
    wt = mx.array(g.standard_normal((o, kh, kw, c)) / np.sqrt(kh * kw * c), mx.float32)
    oh, ow = h, w
    out_shape = (n, oh, ow, o)
    conv = np.array([(n, c, o, (h, w), (kh, kw), (oh, ow), (1, 1), (1, 1), (1, 1), (1, 1),
                      _strides(x.shape), _strides(wt.shape), _strides(out_shape), 1, False)],
                    dtype=CONV_PARAMS_2D)
    m, k = n * oh * ow, kh * kw * c
    bm, bn, bk, wm, wn = 32, 32, 16, 2, 2
    if o <= 16:
        bn, wm, wn = 8, 4, 1
    channels = c if c <= 4 else 0
    if c <= 2:
        k_iters = ceil_div(k, bk)
    elif c <= 4:
        k_iters = ceil_div(kh * kw * 4, bk)
    else:
        k_iters = kh * kw * ceil_div(c, bk)
    small_filter = not channels and kh <= 16 and kw <= 16
    ijw, ijh = c, w * c  # in_strides[2], in_strides[1] (dilation 1)
    tiles_n, tiles_m = ceil_div(o, bn), ceil_div(m, bm)
    gemm = np.array([(m, o, k, k_iters, ijw, ijh - (kw - 1) * ijw,
                      bk - (kh - 1) * ijh - (kw - 1) * ijw, tiles_n, tiles_m, 0)],
                    dtype=GEMM_PARAMS_2D)
    built = build(metal_library(*CONV), "implicit_gemm_conv_2d",
                  (mx.float32, bm, bn, bk, wm, wn, channels, small_filter))
    out = run_both(built.kernel,
                   buffers={"A": x, "B": wt, "C": new_buffer(out_shape), "params": conv,
                            "gemm_params": gemm},
                   threadgroups=(tiles_n, tiles_m, 1), threads_per_threadgroup=(32, wn, wm))
    expected = mx.conv2d(x, wt, stride=1, padding=1)
    agreement(f"implicit_gemm_conv_2d<float32, {bm}, {bn}, {bk}, {wm}, {wn}, {channels}> "
              f"C={c} O={o}", MLX, out.mx("C"), expected, reference="mx.conv2d (CPU)",
              compile_s=built.compile_s, atol=1e-4, rtol=1e-4)
