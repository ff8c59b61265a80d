"""Scaled dot-product attention: a scalar kernel and a flash-attention v2 kernel on
8x8 `simdgroup_matrix` fragments, both against one float64 oracle.

Layouts: q, k, v are head-major [B, H, L, D]; the output is token-major [B, Lq, H, D]
(the transpose a following output projection wants is folded into the store). The
element type T of q, k, v and the output is float32, float16 or bfloat16; both kernels
accumulate in float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import mlx.core as mx
import numpy as np

import mtwork
from mtwork.kernel import Launch
from mtwork.sweep import Config, Constraint
from mtwork.timing import Measurement

FOLDER = Path(__file__).parent  # where this family's .metal files are

DESCRIPTION = (
    "Attention softmax(QK^T * scale) V: a scalar kernel and a flash-attention v2 kernel "
    "on simdgroup_matrix tiles, non-causal and causal"
)

_QKV = ["q", "k", "v", "scale"]

KERNELS = {
    "naive_attention": mtwork.KernelSpec(
        folder=FOLDER,
        name="naive_attention",
        source="naive_attention.metal",
        input_names=_QKV,
        output_names=["out"],
        description="one thread per query row; two scalar passes over the keys",
    ),
    "flash_attention": mtwork.KernelSpec(
        folder=FOLDER,
        name="flash_attention",
        source="flash_attention.metal",
        header="fragments.h",
        input_names=_QKV,
        output_names=["out"],
        description="flash attention v2: online softmax over key tiles, 8x8 "
                    "simdgroup_matrix products, SIMD-groups per threadgroup as a template value",
    ),
}

DTYPES = (mx.float32, mx.float16, mx.bfloat16)
FRAGMENT = 8  # the edge of a simdgroup_matrix
THREADGROUP_MEMORY = 32 * 1024  # bytes a threadgroup may use on Apple GPUs


@dataclass(frozen=True)
class Shape:
    """An attention problem: `kv_len` keys for each of `q_len` queries."""

    batch: int
    heads: int
    q_len: int
    kv_len: int
    head_dim: int

    @property
    def q_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads, self.q_len, self.head_dim)

    @property
    def kv_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads, self.kv_len, self.head_dim)

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.q_len, self.heads, self.head_dim)

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def flops(self, causal: bool = False) -> float:
        """Multiply-adds of QK^T and PV, counted as 2 flops each (causal: the kept half)."""
        pairs = self.q_len * self.kv_len
        if causal:
            shift = self.kv_len - self.q_len
            pairs = sum(min(self.kv_len, i + shift + 1) for i in range(self.q_len))
        return 4.0 * self.batch * self.heads * pairs * self.head_dim


# Small enough for CI on the emulator: 40 is not a multiple of any tile, and 2 heads
# check the head offsets and the token-major store.
SMALL = Shape(batch=1, heads=2, q_len=40, kv_len=40, head_dim=32)
SMALL_SHAPES = {
    "L40_D32": SMALL,
    "L40_D64": replace(SMALL, head_dim=64),
    "B2_L13_D16": Shape(batch=2, heads=2, q_len=13, kv_len=13, head_dim=16),
    "Lq24_Lk40": replace(SMALL, q_len=24),
}


@dataclass(frozen=True)
class Tiles:
    """Flash-attention tiling: `block_q` query rows and `block_k` keys a step, on
    `simdgroups` SIMD-groups of 32 threads."""

    block_q: int = 16
    block_k: int = 16
    simdgroups: int = 2

    @property
    def threads(self) -> int:
        return 32 * self.simdgroups


DEFAULT_TILES = Tiles()


# --- oracle ------------------------------------------------------------------------------------


def _float64(x: mx.array | np.ndarray) -> np.ndarray:
    if isinstance(x, mx.array):
        x = np.array(x.astype(mx.float32))
    return np.asarray(x, dtype=np.float64)


def attention_reference(q, k, v, scale, *, causal: bool = False) -> np.ndarray:
    """softmax(Q K^T * scale [+ causal mask]) V in float64, from head-major [B, H, L, D]
    inputs to a token-major [B, Lq, H, D] output. Causal: query i sees keys
    j <= i + Lk - Lq (the last query sees every key)."""
    q, k, v = _float64(q), _float64(k), _float64(v)
    scale = float(np.asarray(scale))
    scores = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if causal:
        lq, lk = q.shape[2], k.shape[2]
        seen = np.arange(lk)[None, :] <= np.arange(lq)[:, None] + (lk - lq)
        scores = np.where(seen, scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    return np.einsum("bhij,bhjd->bihd", weights, v)


def reference_for(causal: bool):
    """The oracle as a function of a kernel's inputs (q, k, v, scale)."""

    def reference(q, k, v, scale):
        return attention_reference(q, k, v, scale, causal=causal)

    reference.__name__ = f"attention_reference_{'causal' if causal else 'full'}"
    return reference


# --- inputs and launches ----------------------------------------------------------------------


def make_inputs(shape: Shape, dtype: mx.Dtype = mx.float32, seed: int = 0) -> list[mx.array]:
    """[q, k, v, scale]: standard normal q, k, v in `dtype` and scale = 1/sqrt(D) as a
    float32 scalar."""
    rng = np.random.default_rng(seed)
    q, k, v = (
        mx.array(rng.standard_normal(s).astype(np.float32)).astype(dtype)
        for s in (shape.q_shape, shape.kv_shape, shape.kv_shape)
    )
    return [q, k, v, mx.array(shape.scale, dtype=mx.float32)]


def _check(shape: Shape, dtype: mx.Dtype, causal: bool) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {dtype}")
    if causal and shape.kv_len < shape.q_len:
        raise ValueError("causal attention needs kv_len >= q_len (no query without keys)")


def naive_launch(shape: Shape, dtype: mx.Dtype = mx.float32, *, causal: bool = False,
                 threads: int = 32) -> Launch:
    """The scalar kernel: one thread per (query row, head, batch)."""
    _check(shape, dtype, causal)
    return Launch(
        KERNELS["naive_attention"].kernel(),
        grid=(shape.q_len, shape.heads, shape.batch),
        threadgroup=(min(threads, shape.q_len), 1, 1),
        template=[("T", dtype), ("D", shape.head_dim), ("CAUSAL", causal)],
        output_shapes=[shape.out_shape],
        output_dtypes=[dtype],
    )


def flash_launch(shape: Shape, dtype: mx.Dtype = mx.float32, *, causal: bool = False,
                 tiles: Tiles = DEFAULT_TILES) -> Launch:
    """The flash kernel: one threadgroup per (query tile, head, batch)."""
    _check(shape, dtype, causal)
    problems = flash_tile_problems(tiles, shape.head_dim, dtype)
    if problems:
        raise ValueError(f"{tiles} for D={shape.head_dim}: {'; '.join(problems)}")
    query_tiles = -(-shape.q_len // tiles.block_q)
    return Launch(
        KERNELS["flash_attention"].kernel(),
        grid=(query_tiles * tiles.threads, shape.heads, shape.batch),
        threadgroup=(tiles.threads, 1, 1),
        template=[("T", dtype), ("D", shape.head_dim), ("BQ", tiles.block_q),
                  ("BK", tiles.block_k), ("SG", tiles.simdgroups), ("CAUSAL", causal)],
        output_shapes=[shape.out_shape],
        output_dtypes=[dtype],
    )


# --- tile space ---------------------------------------------------------------------------------


def flash_threadgroup_bytes(block_k: int, head_dim: int, dtype: mx.Dtype) -> int:
    """Threadgroup memory of the flash kernel: the staged key and value tiles,
    2 * BK * D elements of T (queries, scores and the output stay in registers)."""
    return 2 * block_k * head_dim * dtype.size


def flash_tile_problems(tiles: Tiles, head_dim: int, dtype: mx.Dtype) -> list[str]:
    """Why a tiling cannot run (empty when it can)."""
    problems = []
    if head_dim % FRAGMENT or tiles.block_k % FRAGMENT:
        problems.append("head_dim and block_k must be multiples of 8")
    if tiles.simdgroups < 1 or tiles.block_q % (FRAGMENT * tiles.simdgroups):
        problems.append("block_q must be a multiple of 8 * simdgroups")
    used = flash_threadgroup_bytes(tiles.block_k, head_dim, dtype)
    if used > THREADGROUP_MEMORY:
        problems.append(f"{used} bytes of threadgroup memory, over {THREADGROUP_MEMORY}")
    return problems


# The sweep's space: template values of the flash kernel.
FLASH_SPACE = {
    "block_q": [8, 16, 32, 64],
    "block_k": [8, 16, 32, 64, 128],
    "simdgroups": [1, 2, 4],
}
CI_FLASH_SPACE = {"block_q": [8, 16, 32], "block_k": [16, 32], "simdgroups": [1, 2]}


def tiles_of(config: Config) -> Tiles:
    return Tiles(config["block_q"], config["block_k"], config["simdgroups"])


def flash_constraints(head_dim: int, dtype: mx.Dtype) -> list[Constraint]:
    """What a configuration of the space must satisfy: whole 8-row fragments on every
    SIMD-group, and the key and value tiles inside the 32 KiB threadgroup budget."""

    def tg_bytes(c: Config) -> int:
        return flash_threadgroup_bytes(c["block_k"], head_dim, dtype)

    return [
        mtwork.divides("8 * simdgroups", "block_q"),
        mtwork.threadgroup_memory_under(tg_bytes, THREADGROUP_MEMORY),
    ]


def flash_builder(shape: Shape, dtype: mx.Dtype, *, causal: bool = False):
    """build(config) for `mtwork.sweep` over FLASH_SPACE."""

    def build(config: Config) -> Launch:
        return flash_launch(shape, dtype, causal=causal, tiles=tiles_of(config))

    return build


def gflops_metric(shape: Shape, causal: bool = False):
    """A sweep metric: useful attention flops per second of the median time."""

    def gflops(_config: Config, measurement: Measurement) -> float:
        return shape.flops(causal) / measurement.median / 1e9

    return gflops


def dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def parse_dtypes(names: Sequence[str]) -> list[mx.Dtype]:
    """mlx dtypes from names such as "float16" (notebook parameters are plain strings)."""
    return [getattr(mx, name) for name in names]
