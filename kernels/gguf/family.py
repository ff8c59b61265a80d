"""GGUF dequantisation: q8_0, q2_K and iq2_xxs blocks, as llama.cpp lays them out, to
float32, float16 or bfloat16 weights.

The kernels read a tensor's blocks as raw bytes (a uint8 array, exactly as in a .gguf
file) and each thread writes `EPT` consecutive weights. The CPU side of the formats
(block layouts, quantisers, float64 dequantisers) lives in `quants.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

import mtwork
from mtwork.families import import_sibling

FOLDER = Path(__file__).parent  # where this family's .metal files are

quants = import_sibling(__name__, __file__, "quants")

DESCRIPTION = "GGUF block dequantisation (q8_0, q2_K, iq2_xxs) to f32/f16/bf16"


@dataclass(frozen=True)
class Format:
    """A GGUF block format: its size and its CPU quantiser and float64 dequantiser."""

    name: str
    weights: int  # weights per block
    nbytes: int  # bytes per block
    quantize: Callable[[np.ndarray], np.ndarray]  # float32 (..., n) -> uint8 blocks
    dequantize: Callable[[np.ndarray], np.ndarray]  # uint8 blocks -> float64 (..., n)

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.nbytes / self.weights


FORMATS = {
    "q8_0": Format("q8_0", quants.QK8_0, quants.BLOCK_Q8_0.itemsize,
                   quants.quantize_q8_0, quants.dequantize_q8_0),
    "q2_K": Format("q2_K", quants.QK_K, quants.BLOCK_Q2_K.itemsize,
                   quants.quantize_q2_K, quants.dequantize_q2_K),
    "iq2_xxs": Format("iq2_xxs", quants.QK_K, quants.BLOCK_IQ2_XXS.itemsize,
                      quants.quantize_iq2_xxs, quants.dequantize_iq2_xxs),
}

KERNELS = {
    name: mtwork.KernelSpec(
        folder=FOLDER,
        name=f"gguf_dequant_{name}",
        source=f"dequant_{name}.metal",
        header="gguf.h",
        input_names=["blocks"],
        output_names=["out"],
        description=f"{name} blocks (uint8) -> T, EPT consecutive weights per thread",
    )
    for name in FORMATS
}

DTYPES = (mx.float32, mx.float16, mx.bfloat16)

# Largest ULP distance (in the output dtype) from the float64 oracle. The kernels compute
# in float and round once to T. q8_0 and iq2_xxs values are exact in float, so every
# output is the correctly rounded oracle value. q2_K's d*sc*q - dmin*m rounds once in
# float (exact, hence bitwise, for float32 output) and again to half/bfloat16, and double
# rounding can land one ULP away.
MAX_ULP = {(fmt, dtype): 0 for fmt in FORMATS for dtype in DTYPES}
MAX_ULP["q2_K", mx.float16] = MAX_ULP["q2_K", mx.bfloat16] = 1

# Relative RMS error |w - dequant(quant(w))| / |w| the quantisers must stay under on
# `sample_weights` (measured about 0.008, 0.30 and 0.40). q8_0's error is about step/sqrt(12)
# with step = block max / 127; the 2-bit formats sit near the 0.34 of the optimal
# 4-level quantiser of a Gaussian.
MAX_RELATIVE_RMSE = {"q8_0": 0.012, "q2_K": 0.34, "iq2_xxs": 0.47}

TEST_SHAPE = (4, 1024)  # rows, weights per row: 16 super-blocks, 128 q8_0 blocks
# The work splits a sweep tries (the notebook's defaults).
SWEEP_SPACE = {"format": list(FORMATS), "elems_per_thread": [1, 2, 4, 8, 16, 32],
               "threadgroup": [32, 64, 128, 256, 512]}


def sample_weights(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Weights that look trained: Gaussian rows whose scales vary (log-normal) and whose
    means drift a little, with about one weight in 500 an outlier 5-15 times larger."""
    rng = np.random.default_rng(seed)
    row_scale = 0.02 * np.exp(rng.normal(0.0, 0.5, (rows, 1)))
    w = rng.standard_normal((rows, cols)) + rng.normal(0.0, 0.1, (rows, 1))
    outliers = rng.random((rows, cols)) < 0.002
    w[outliers] *= rng.uniform(5.0, 15.0, outliers.sum())
    return (w * row_scale).astype(np.float32)


@cache
def kernel(fmt: str) -> mtwork.MetalKernel:
    return KERNELS[fmt].kernel()


def check_launch(fmt: str, cols: int, elems_per_thread: int, nbytes: int | None = None) -> None:
    """Raises ValueError unless rows of `cols` weights (`nbytes` packed) split into whole
    blocks and each thread's weights stay inside one block."""
    f = FORMATS[fmt]
    if cols % f.weights or (nbytes is not None and nbytes % f.nbytes):
        raise ValueError(f"{fmt} rows hold whole blocks of {f.weights} weights "
                         f"({f.nbytes} bytes), not {cols} weights ({nbytes} bytes)")
    if elems_per_thread < 1 or f.weights % elems_per_thread:
        raise ValueError(f"{fmt}: elems_per_thread must divide {f.weights}, "
                         f"not {elems_per_thread}")


def launch(fmt: str, packed: mx.array, dtype: mx.Dtype = mx.float32, *,
           elems_per_thread: int = 4, threadgroup: int = 256) -> mtwork.Launch:
    """The dispatch that dequantises `packed` (uint8, rows x bytes) into rows x weights
    of `dtype`; the threadgroup is capped at the number of threads."""
    if packed.ndim != 2 or packed.dtype != mx.uint8:
        raise ValueError(f"packed blocks must be a 2-D uint8 array, got {packed.dtype} "
                         f"of shape {tuple(packed.shape)}")
    f = FORMATS[fmt]
    rows, cols = packed.shape[0], packed.shape[1] // f.nbytes * f.weights
    check_launch(fmt, cols, elems_per_thread, nbytes=packed.shape[1])
    threads = rows * cols // elems_per_thread
    return mtwork.Launch(
        kernel(fmt),
        inputs=[packed],
        grid=(threads, 1, 1),
        threadgroup=(min(threadgroup, threads), 1, 1),
        template=[("T", dtype), ("EPT", elems_per_thread)],
        output_shapes=[(rows, cols)],
        output_dtypes=[dtype],
    )


def dequantize(fmt: str, packed: np.ndarray | mx.array, dtype: mx.Dtype = mx.float32, *,
               elems_per_thread: int = 4, threadgroup: int = 256,
               backend: str | None = None) -> mx.array:
    """Runs the kernel on packed blocks (uint8, rows x bytes); returns rows x weights."""
    if isinstance(packed, np.ndarray):
        packed = mx.array(packed)
    run = launch(fmt, packed, dtype, elems_per_thread=elems_per_thread,
                 threadgroup=threadgroup)
    return run(backend=backend)[0]


def bytes_moved(fmt: str, rows: int, cols: int, dtype: mx.Dtype) -> int:
    """Bytes a dequantisation reads (blocks) plus writes (weights): its memory traffic."""
    f = FORMATS[fmt]
    return rows * cols // f.weights * f.nbytes + rows * cols * dtype.size


def sweep_constraints(rows: int, cols: int) -> list[Callable[[Mapping[str, Any]], bool] | str]:
    """Constraints for a sweep over SWEEP_SPACE's parameters on a rows x cols matrix."""

    def inside_one_block(c: Mapping[str, Any]) -> bool:
        return FORMATS[c["format"]].weights % c["elems_per_thread"] == 0

    return [inside_one_block, f"threadgroup * elems_per_thread <= {rows * cols}"]
