"""The DeepSeek-V4 compressor pool's inputs, launch and reference: CSA (overlapping
windows of 4 tokens, 2D channels) and HCA (windows of 128 tokens) in one kernel."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mtwork.families import import_sibling
from mtwork.kernel import Launch

common = import_sibling(__name__.rsplit(".", 1)[0], __file__, "common")
reference = import_sibling(__name__.rsplit(".", 1)[0], __file__, "reference")


@dataclass(frozen=True)
class PoolShape:
    """`tokens` pooled by windows of `rate` into entries of `dim` channels; `overlap`:
    CSA's overlapping windows (kv and gate are 2 * dim wide), else HCA's."""

    tokens: int
    dim: int
    rate: int
    overlap: bool

    def __post_init__(self) -> None:
        if self.rate < 1 or self.dim < 1:
            raise ValueError(f"rate and dim must be >= 1, got rate={self.rate}, dim={self.dim}")
        if self.tokens < self.rate:
            raise ValueError(f"tokens={self.tokens} make no window of rate={self.rate}")

    @property
    def width(self) -> int:
        """Channels of a token in kv, gate and ape."""
        return 2 * self.dim if self.overlap else self.dim

    @property
    def windows(self) -> int:
        return self.tokens // self.rate

    @property
    def name(self) -> str:
        return "CSA" if self.overlap else "HCA"


def pool_inputs(shape: PoolShape, dtype: mx.Dtype = mx.float32, seed: int = 0,
                gate_std: float = 2.0) -> list[mx.array]:
    """[kv (tokens, width), gate (tokens, width), ape (rate, width) float32]: normal kv,
    gate scores of spread `gate_std` (so some windows are dominated by one slot and others
    mix evenly), a smaller APE."""
    rng = np.random.default_rng(seed)
    kv = common.normal(rng, (shape.tokens, shape.width), dtype)
    gate = common.normal(rng, (shape.tokens, shape.width), dtype, std=gate_std)
    ape = (0.5 * rng.standard_normal((shape.rate, shape.width))).astype(np.float32)
    return [kv, gate, mx.array(ape)]


def pool_reference_for(shape: PoolShape):
    def pool_reference(kv, gate, ape) -> np.ndarray:
        return reference.compressor_pool(kv, gate, ape, shape.rate, shape.overlap)

    return pool_reference


def pool_launch(shape: PoolShape, dtype: mx.Dtype = mx.float32, *,
                threads: int = 128) -> Launch:
    """One thread per (channel, window): grid (dim, windows)."""
    common.check_dtype(dtype)
    return Launch(
        common.KERNELS["compressor_pool"].kernel(),
        grid=(shape.dim, shape.windows, 1), threadgroup=(min(threads, shape.dim), 1, 1),
        template=[("T", dtype), ("RATE", shape.rate), ("D", shape.dim),
                  ("OVERLAP", shape.overlap)],
        output_shapes=[(shape.windows, shape.dim)], output_dtypes=[dtype],
    )
