"""A sweep's build and oracle at module level, so that a process pool can run them."""

import mlx.core as mx
import numpy as np

import mtwork

N = 1024
SCALE = mtwork.metal_kernel("scale_by", ["inp"], ["out"], """
    uint first = thread_position_in_grid.x * ITEMS;
    for (uint k = 0; k < ITEMS; ++k) out[first + k] = inp[first + k] * 3.0f;
""")


def build(c):
    return mtwork.Launch(SCALE, grid=(N // c["items"], 1, 1), threadgroup=(c["tg"], 1, 1),
                         defines={"ITEMS": c["items"]}, output_shapes=[(N,)],
                         output_dtypes=[mx.float32])


def oracle(x):
    return 3 * np.asarray(x, np.float64)


def inputs():
    return [mx.arange(N, dtype=mx.float32)]


SPACE = {"items": [1, 2, 4], "tg": [32, 64]}
