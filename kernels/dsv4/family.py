"""DeepSeek-V4 kernels: the weight formats, the MoE router, partial RoPE, the lightning
indexer's score and top-k, the mHC Sinkhorn split and decode attention with a sink.

* `mxfp4_dequant`: MXFP4 (e2m1 elements, one e8m0 scale per 32) to T.
* `fp8_dequant`: e4m3 weights with a float32 scale per (BLOCK x BLOCK) tile to T.
* `moe_router`: sqrt-softplus scores, top-k selection on score + bias, weights from the
  unbiased scores normalised over the chosen experts.
* `partial_rope`: RoPE on the last R features of each head, forward or inverse.
* `indexer_score`: score[s, t] = sum_h w[s, h] ReLU(q[s, h] . k[t, h]).
* `topk_bitonic`: per-row top-k by a bitonic sort in threadgroup memory.
* `sinkhorn_split`: mixes -> (pre, post, comb), comb doubly stochastic by Sinkhorn-Knopp.
* `sdpa_decode_sink`: one query token per head, softmax over [scores, sink_h].

T is float32, float16 or bfloat16 wherever a kernel reads or writes model tensors; the
kernels compute in float32. The formats live in `formats.py`, the float64 oracles in
`reference.py`; this module holds the specs, shapes, input generators, launch helpers
and the top-k sweep space.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import mlx.core as mx
import numpy as np

import mtwork
from mtwork.families import import_sibling
from mtwork.kernel import Launch
from mtwork.sweep import Config, Constraint

FOLDER = Path(__file__).parent  # where this family's .metal files are

formats = import_sibling(__name__, __file__, "formats")
reference = import_sibling(__name__, __file__, "reference")

DESCRIPTION = (
    "DeepSeek-V4: MXFP4 and FP8 block dequant, sqrt-softplus MoE router, partial RoPE, "
    "indexer score and bitonic top-k, mHC Sinkhorn split, decode SDPA with a sink"
)


def _spec(name: str, inputs: list[str], outputs: list[str], description: str,
          header: str | None = None) -> mtwork.KernelSpec:
    return mtwork.KernelSpec(folder=FOLDER, name=name, source=f"{name}.metal", header=header,
                             input_names=inputs, output_names=outputs,
                             description=description)


KERNELS = {
    "mxfp4_dequant": _spec(
        "mxfp4_dequant", ["packed", "scales"], ["out"],
        "MXFP4 -> T: 16-entry e2m1 table times the block's e8m0 power of two",
        header="formats.h"),
    "fp8_dequant": _spec(
        "fp8_dequant", ["weight", "scales"], ["out"],
        "FP8 e4m3 -> T: e4m3 decoded from its bits times the tile's float32 scale",
        header="formats.h"),
    "moe_router": _spec(
        "moe_router", ["x", "gate", "bias", "route_scale"], ["expert_ids", "expert_weights"],
        "one threadgroup per token: SIMD-group dot products, K rounds of a 32-lane argmax",
        header="activations.h"),
    "partial_rope": _spec(
        "partial_rope", ["x", "positions", "cos_table", "sin_table"], ["out"],
        "one thread per feature pair: copy the first D - R features, rotate the last R"),
    "indexer_score": _spec(
        "indexer_score", ["q", "k", "w"], ["score"],
        "one SIMD-group per (query, key position): per-head dot, ReLU, weighted sum"),
    "topk_bitonic": _spec(
        "topk_bitonic", ["scores"], ["indices", "values"],
        "one threadgroup per row: bitonic sort of (score, index) in threadgroup memory"),
    "sinkhorn_split": _spec(
        "sinkhorn_split", ["mixes", "hc_scale", "hc_base", "eps"], ["pre", "post", "comb"],
        "one quad per token: lane r owns comb row r; column sums by quad_sum",
        header="activations.h"),
    "sdpa_decode_sink": _spec(
        "sdpa_decode_sink", ["q", "k", "v", "sinks", "scale"], ["out"],
        "one threadgroup per head: online softmax per SIMD-group, merged with the sink"),
}

DTYPES = (mx.float32, mx.float16, mx.bfloat16)
SIMD_WIDTH = 32
THREADGROUP_MEMORY = 32 * 1024
HC = 4  # mHC residual streams (hc_mult): the comb matrix is HC x HC, one quad per token
MIXES = (2 + HC) * HC

# DeepSeek-V4-Flash's sizes and constants (some are the helpers' defaults below).
FLASH = {"hidden": 4096, "experts": 256, "top_k": 6, "head_dim": 512, "rope_dims": 64,
         "index_heads": 64, "index_head_dim": 128, "index_topk": 512,
         "sinkhorn_iters": 20, "hc_eps": 1e-6, "route_scale": 1.5, "rope_base": 10000.0}


def dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def parse_dtypes(names: Sequence[str]) -> list[mx.Dtype]:
    """mlx dtypes from names such as "float16" (notebook parameters are plain strings)."""
    return [getattr(mx, name) for name in names]


def _normal(rng: np.random.Generator, shape, dtype: mx.Dtype, std: float = 1.0) -> mx.array:
    return mx.array((std * rng.standard_normal(shape)).astype(np.float32)).astype(dtype)


def _check_dtype(dtype: mx.Dtype) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {dtype}")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# --- MXFP4 and FP8 dequantisation --------------------------------------------------------


def mxfp4_inputs(rows: int, cols: int, seed: int = 0,
                 scale_codes: tuple[int, int] = (118, 130)) -> list[mx.array]:
    """[packed (rows, cols/2) uint8, scales (rows, cols/32) uint8]: random e2m1 codes and
    e8m0 scales drawn from `scale_codes` (inclusive)."""
    if cols % formats.MX_BLOCK:
        raise ValueError(f"cols must be a multiple of {formats.MX_BLOCK}, got {cols}")
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 16, (rows, cols), dtype=np.uint8)
    scales = rng.integers(scale_codes[0], scale_codes[1] + 1,
                          (rows, cols // formats.MX_BLOCK), dtype=np.uint8)
    return [mx.array(formats.pack_nibbles(codes)), mx.array(scales)]


def mxfp4_reference(packed, scales) -> np.ndarray:
    return formats.dequant_mxfp4(np.array(packed), np.array(scales))


def mxfp4_launch(rows: int, cols: int, dtype: mx.Dtype = mx.float32, *,
                 per_thread: int = 8, threads: int = 256) -> Launch:
    """One thread per `per_thread` consecutive elements (even, dividing 32)."""
    _check_dtype(dtype)
    if per_thread % 2 or formats.MX_BLOCK % per_thread:
        raise ValueError(f"per_thread must be even and divide 32, got {per_thread}")
    n_threads = rows * cols // per_thread
    return Launch(
        KERNELS["mxfp4_dequant"].kernel(),
        grid=(n_threads, 1, 1), threadgroup=(min(threads, n_threads), 1, 1),
        template=[("T", dtype), ("EPT", per_thread)],
        output_shapes=[(rows, cols)], output_dtypes=[dtype],
    )


def fp8_inputs(rows: int, cols: int, block: int, seed: int = 0) -> list[mx.array]:
    """[weight (rows, cols) uint8 e4m3 codes (no NaN), scales (tiles_r, tiles_c) float32]:
    random finite codes and positive scales spread over a few binades."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
    codes[(codes & 0x7F) == formats.E4M3_NAN] ^= 1  # NaN -> the largest finite value
    scales = np.exp2(rng.uniform(-12, -4, (_ceil_div(rows, block), _ceil_div(cols, block))))
    return [mx.array(codes), mx.array(scales.astype(np.float32))]


def fp8_reference_for(block: int):
    def fp8_reference(weight, scales) -> np.ndarray:
        return formats.dequant_fp8_blocks(np.array(weight), np.array(scales), block)

    return fp8_reference


def fp8_launch(rows: int, cols: int, block: int = 128, dtype: mx.Dtype = mx.float32, *,
               per_thread: int = 4, threads: int = 64) -> Launch:
    """Thread (x, r) writes `per_thread` columns of row r; per_thread divides block and
    cols (so a thread never straddles two tiles or two rows)."""
    _check_dtype(dtype)
    if block % per_thread or cols % per_thread:
        raise ValueError(f"per_thread={per_thread} must divide block={block} and cols={cols}")
    width = cols // per_thread
    return Launch(
        KERNELS["fp8_dequant"].kernel(),
        grid=(width, rows, 1), threadgroup=(min(threads, width), 1, 1),
        template=[("T", dtype), ("BLOCK", block), ("EPT", per_thread)],
        output_shapes=[(rows, cols)], output_dtypes=[dtype],
    )


def rounded_to(expected: np.ndarray, dtype: mx.Dtype) -> mx.array:
    """A float64 result rounded to float32 then to `dtype`: the kernels compute a product
    in float32 and store it as T."""
    return mx.array(np.asarray(expected, np.float64).astype(np.float32)).astype(dtype)


# --- MoE router ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RouterShape:
    tokens: int
    hidden: int
    experts: int
    top_k: int


def router_inputs(shape: RouterShape, dtype: mx.Dtype = mx.float32, seed: int = 0,
                  route_scale: float = FLASH["route_scale"]) -> list[mx.array]:
    """[x (tokens, hidden), gate (experts, hidden), bias (experts,) float32, route_scale]:
    x and gate rows of unit RMS-ish scale so logits are O(1), bias ~ 0.1 N(0, 1)."""
    rng = np.random.default_rng(seed)
    x = _normal(rng, (shape.tokens, shape.hidden), dtype)
    gate = _normal(rng, (shape.experts, shape.hidden), dtype, std=shape.hidden ** -0.5)
    bias = mx.array((0.1 * rng.standard_normal(shape.experts)).astype(np.float32))
    return [x, gate, bias, mx.array(route_scale, dtype=mx.float32)]


def router_reference_for(top_k: int):
    def router_reference(x, gate, bias, route_scale):
        return list(reference.router(x, gate, bias, float(np.array(route_scale)), top_k))

    return router_reference


def router_launch(shape: RouterShape, dtype: mx.Dtype = mx.float32, *,
                  threads: int = 128) -> Launch:
    _check_dtype(dtype)
    if not 1 <= shape.top_k <= min(SIMD_WIDTH, shape.experts):
        raise ValueError(f"top_k must be in [1, min(32, experts)], got {shape.top_k}")
    if threads % SIMD_WIDTH:
        raise ValueError(f"threads must be a multiple of 32, got {threads}")
    return Launch(
        KERNELS["moe_router"].kernel(),
        grid=(threads, shape.tokens, 1), threadgroup=(threads, 1, 1),
        template=[("T", dtype), ("E", shape.experts), ("H", shape.hidden),
                  ("K", shape.top_k)],
        output_shapes=[(shape.tokens, shape.top_k)] * 2,
        output_dtypes=[mx.int32, mx.float32],
    )


# --- partial RoPE --------------------------------------------------------------------------


@dataclass(frozen=True)
class RopeShape:
    tokens: int
    heads: int
    head_dim: int
    rope_dims: int
    max_position: int = 4096

    @property
    def x_shape(self) -> tuple[int, int, int]:
        return (self.tokens, self.heads, self.head_dim)


def rope_tables(max_position: int, rope_dims: int, base: float) -> tuple[mx.array, mx.array]:
    """cos and sin of theta[p, i] = p * base^(-2i/R) for p < max_position, in double
    precision, rounded once to float32 (a float32 product p * inv_freq would be off by up
    to half an ULP of p, 2.4e-4 rad at p = 4096)."""
    theta = reference.rope_angles(np.arange(max_position), rope_dims, base)
    return (mx.array(np.cos(theta).astype(np.float32)),
            mx.array(np.sin(theta).astype(np.float32)))


def rope_inputs(shape: RopeShape, dtype: mx.Dtype = mx.float32, seed: int = 0,
                base: float = FLASH["rope_base"]) -> list[mx.array]:
    """[x, positions (tokens,) int32, cos_table, sin_table]."""
    rng = np.random.default_rng(seed)
    x = _normal(rng, shape.x_shape, dtype)
    positions = mx.array(rng.integers(0, shape.max_position, shape.tokens).astype(np.int32))
    return [x, positions, *rope_tables(shape.max_position, shape.rope_dims, base)]


def rope_reference_for(rope_dims: int, inverse: bool = False,
                       base: float = FLASH["rope_base"]):
    def rope_reference(x, positions, cos_table, sin_table):
        return reference.partial_rope(x, np.array(positions), rope_dims, base, inverse)

    return rope_reference


def rope_launch(shape: RopeShape, dtype: mx.Dtype = mx.float32, *, inverse: bool = False,
                threads: int = 64) -> Launch:
    _check_dtype(dtype)
    if shape.head_dim % 2 or shape.rope_dims % 2 or not 0 < shape.rope_dims <= shape.head_dim:
        raise ValueError("head_dim and rope_dims must be even, 0 < rope_dims <= head_dim")
    pairs = shape.head_dim // 2
    return Launch(
        KERNELS["partial_rope"].kernel(),
        grid=(pairs, shape.heads, shape.tokens), threadgroup=(min(threads, pairs), 1, 1),
        template=[("T", dtype), ("D", shape.head_dim), ("R", shape.rope_dims),
                  ("INVERSE", inverse)],
        output_shapes=[shape.x_shape], output_dtypes=[dtype],
    )


# --- lightning indexer: score and top-k ------------------------------------------------------


@dataclass(frozen=True)
class IndexerShape:
    queries: int
    heads: int
    head_dim: int
    keys: int
    shared_key: bool = True  # one key per position for every head (KH = 1)

    @property
    def key_heads(self) -> int:
        return 1 if self.shared_key else self.heads


def indexer_inputs(shape: IndexerShape, dtype: mx.Dtype = mx.float32,
                   seed: int = 0) -> list[mx.array]:
    """[q (queries, heads, head_dim), k (keys, key_heads, head_dim), w (queries, heads)
    float32]; w carries the 1/sqrt(heads) the indexer folds into its weights."""
    rng = np.random.default_rng(seed)
    q = _normal(rng, (shape.queries, shape.heads, shape.head_dim), dtype)
    k = _normal(rng, (shape.keys, shape.key_heads, shape.head_dim), dtype,
                std=shape.head_dim ** -0.5)
    w = (rng.standard_normal((shape.queries, shape.heads)) * shape.heads ** -0.5)
    return [q, k, mx.array(w.astype(np.float32))]


def indexer_reference(q, k, w) -> np.ndarray:
    return reference.indexer_score(q, k, w)


def indexer_launch(shape: IndexerShape, dtype: mx.Dtype = mx.float32, *,
                   simdgroups: int = 4) -> Launch:
    _check_dtype(dtype)
    return Launch(
        KERNELS["indexer_score"].kernel(),
        grid=(SIMD_WIDTH * shape.keys, shape.queries, 1),
        threadgroup=(SIMD_WIDTH * min(simdgroups, shape.keys), 1, 1),
        template=[("T", dtype), ("H", shape.heads), ("KH", shape.key_heads),
                  ("DK", shape.head_dim)],
        output_shapes=[(shape.queries, shape.keys)], output_dtypes=[mx.float32],
    )


@dataclass(frozen=True)
class TopKShape:
    rows: int
    n: int
    k: int

    @property
    def capacity(self) -> int:
        """Slots of the sort: the power of two at or above n."""
        return 1 << max(self.n - 1, 1).bit_length()


def topk_inputs(shape: TopKShape, dtype: mx.Dtype = mx.float32, seed: int = 0,
                distinct: int | None = None) -> list[mx.array]:
    """[scores (rows, n)]: normal scores, or with `distinct` only that many different
    values (many ties, to check their order)."""
    rng = np.random.default_rng(seed)
    if distinct:
        values = rng.integers(0, distinct, (shape.rows, shape.n)).astype(np.float32) / 4
    else:
        values = rng.standard_normal((shape.rows, shape.n)).astype(np.float32)
    return [mx.array(values).astype(dtype)]


def topk_reference_for(k: int):
    def topk_reference(scores):
        ids, values = reference.top_k(np.array(scores.astype(mx.float32)), k)
        return [ids, values]

    return topk_reference


def topk_threadgroup_bytes(capacity: int) -> int:
    """A float score and an int index per slot."""
    return 8 * capacity


def topk_launch(shape: TopKShape, dtype: mx.Dtype = mx.float32, *, threads: int = 256,
                capacity: int | None = None) -> Launch:
    _check_dtype(dtype)
    capacity = capacity or shape.capacity
    if capacity & (capacity - 1) or capacity < shape.n:
        raise ValueError(f"capacity must be a power of two >= n={shape.n}, got {capacity}")
    if not 1 <= shape.k <= shape.n:
        raise ValueError(f"k must be in [1, n], got {shape.k}")
    if topk_threadgroup_bytes(capacity) > THREADGROUP_MEMORY:
        raise ValueError(f"n={shape.n} needs more than {THREADGROUP_MEMORY} bytes")
    return Launch(
        KERNELS["topk_bitonic"].kernel(),
        grid=(threads, shape.rows, 1), threadgroup=(threads, 1, 1),
        template=[("T", dtype), ("N", capacity), ("K", shape.k)],
        output_shapes=[(shape.rows, shape.k)] * 2, output_dtypes=[mx.int32, dtype],
    )


# The sweep's space: the row length n and the threads per threadgroup of the top-k kernel.
TOPK_SPACE = {"n": [256, 512, 1024], "threads": [32, 64, 128, 256, 512]}
CI_TOPK_SPACE = {"n": [128, 256], "threads": [32, 64, 128]}


def topk_constraints() -> list[Constraint | str]:
    """Whole SIMD-groups, and no more threads than the sort compares pairs (N / 2)."""
    return [
        mtwork.divides(SIMD_WIDTH, "threads"),
        mtwork.threads_per_threadgroup_under(1024, key="threads"),
        lambda c: c["threads"] <= TopKShape(1, c["n"], 1).capacity // 2,
    ]


def topk_sweep_parts(rows: int, k: int, dtype: mx.Dtype = mx.float32, seed: int = 0):
    """(build, oracle) for `mtwork.sweep(build, TOPK_SPACE, oracle=oracle)` with no sweep
    inputs: each n has its own scores [rows, n], which its Launches carry."""
    scores: dict[int, list[mx.array]] = {}

    def inputs_for(n: int) -> list[mx.array]:
        if n not in scores:
            scores[n] = topk_inputs(TopKShape(rows, n, k), dtype, seed)
        return scores[n]

    def build(config: Config) -> Launch:
        launch = topk_launch(TopKShape(rows, config["n"], k), dtype, threads=config["threads"])
        return replace(launch, inputs=inputs_for(config["n"]))

    def oracle(*, config: Config):
        return topk_reference_for(k)(*inputs_for(config["n"]))

    return build, oracle


# --- mHC Sinkhorn split --------------------------------------------------------------------


def sinkhorn_inputs(tokens: int, dtype: mx.Dtype = mx.float32, seed: int = 0,
                    eps: float = FLASH["hc_eps"]) -> list[mx.array]:
    """[mixes (tokens, 24), hc_scale (3,) float32, hc_base (24,) float32, eps]."""
    rng = np.random.default_rng(seed)
    mixes = _normal(rng, (tokens, MIXES), dtype)
    scale = rng.uniform(0.5, 2.0, 3).astype(np.float32)
    base = (0.5 * rng.standard_normal(MIXES)).astype(np.float32)
    return [mixes, mx.array(scale), mx.array(base), mx.array(eps, dtype=mx.float32)]


def sinkhorn_reference_for(iters: int):
    def sinkhorn_reference(mixes, hc_scale, hc_base, eps):
        return list(reference.sinkhorn_split(mixes, hc_scale, hc_base, iters,
                                             float(np.array(eps)), HC))

    return sinkhorn_reference


def sinkhorn_launch(tokens: int, dtype: mx.Dtype = mx.float32, *,
                    iters: int = FLASH["sinkhorn_iters"], threads: int = 64) -> Launch:
    _check_dtype(dtype)
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    return Launch(
        KERNELS["sinkhorn_split"].kernel(),
        grid=(HC * tokens, 1, 1), threadgroup=(min(threads, HC * tokens), 1, 1),
        template=[("T", dtype), ("ITERS", iters)],
        output_shapes=[(tokens, HC), (tokens, HC), (tokens, HC, HC)],
        output_dtypes=[mx.float32] * 3,
    )


# --- SDPA decode with a sink ---------------------------------------------------------------


@dataclass(frozen=True)
class AttentionShape:
    batch: int
    heads: int
    kv_heads: int
    length: int
    head_dim: int

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5


def sdpa_inputs(shape: AttentionShape, dtype: mx.Dtype = mx.float32,
                seed: int = 0) -> list[mx.array]:
    """[q (B, H, D), k and v (B, HKV, L, D), sinks (H,) float32, scale]: normal q, k, v;
    sinks spread over [-2, 4] so some heads put most of their mass on the sink."""
    rng = np.random.default_rng(seed)
    q = _normal(rng, (shape.batch, shape.heads, shape.head_dim), dtype)
    kv_shape = (shape.batch, shape.kv_heads, shape.length, shape.head_dim)
    k, v = _normal(rng, kv_shape, dtype), _normal(rng, kv_shape, dtype)
    sinks = mx.array(rng.uniform(-2.0, 4.0, shape.heads).astype(np.float32))
    return [q, k, v, sinks, mx.array(shape.scale, dtype=mx.float32)]


def sdpa_reference(q, k, v, sinks, scale) -> np.ndarray:
    return reference.sdpa_sink(q, k, v, sinks, float(np.array(scale)))


def sdpa_threadgroup_bytes(head_dim: int, simdgroups: int) -> int:
    return 4 * simdgroups * (head_dim + 2)


def sdpa_launch(shape: AttentionShape, dtype: mx.Dtype = mx.float32, *,
                simdgroups: int = 4) -> Launch:
    _check_dtype(dtype)
    if shape.head_dim % SIMD_WIDTH or shape.heads % shape.kv_heads:
        raise ValueError("head_dim must be a multiple of 32 and heads of kv_heads")
    if sdpa_threadgroup_bytes(shape.head_dim, simdgroups) > THREADGROUP_MEMORY:
        raise ValueError(f"{simdgroups} SIMD-groups x D={shape.head_dim} exceed 32 KiB")
    return Launch(
        KERNELS["sdpa_decode_sink"].kernel(),
        grid=(SIMD_WIDTH * simdgroups * shape.heads, shape.batch, 1),
        threadgroup=(SIMD_WIDTH * simdgroups, 1, 1),
        template=[("T", dtype), ("D", shape.head_dim), ("H", shape.heads),
                  ("HKV", shape.kv_heads), ("SG", simdgroups)],
        output_shapes=[(shape.batch, shape.heads, shape.head_dim)], output_dtypes=[dtype],
    )


# Tolerance bands: elementwise results use the dtype's default band; attention
# accumulates over the keys, so it gets the wider SDPA band of the kernels' origin.
SDPA_TOLERANCE = {mx.float32: 1e-3, mx.float16: 3e-3, mx.bfloat16: 1.5e-2}
