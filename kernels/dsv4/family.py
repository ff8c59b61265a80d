"""DeepSeek-V4 kernels: the weight formats, the MoE router, partial RoPE, the lightning
indexer's score and top-k, the CSA/HCA compressor pool, the mHC Sinkhorn split, collapse
and expand, and decode attention with a sink, dense and over a CSA gather list.

* `mxfp4_dequant`: MXFP4 (e2m1 elements, one e8m0 scale per 32) to T.
* `fp8_dequant`: e4m3 weights with a float32 scale per (BLOCK x BLOCK) tile to T.
* `moe_router`: sqrt-softplus scores, top-k selection on score + bias, weights from the
  unbiased scores normalised over the chosen experts.
* `partial_rope`: RoPE on the last R features of each head, forward or inverse.
* `indexer_score`: score[s, t] = sum_h w[s, h] ReLU(q[s, h] . k[t, h]).
* `topk_bitonic`: per-row top-k by a bitonic sort in threadgroup memory.
* `compressor_pool`: CSA / HCA compression, every window of tokens pooled into one entry
  by a per-channel softmax over gate scores plus an absolute position embedding.
* `sinkhorn_split`: mixes -> (pre, post, comb), comb doubly stochastic by Sinkhorn-Knopp.
* `mhc_collapse`, `mhc_expand`: the 4 residual streams weighted by a token's pre into the
  layer's input; the layer's output (times post) and the streams mixed by comb out.
* `sdpa_decode_sink`: one query token per head, softmax over [scores, sink_h].
* `csa_sdpa_decode`: the same over the cache rows of a gather list (CSA's top-k entries
  and sliding window).

T is float32, float16 or bfloat16 wherever a kernel reads or writes model tensors; the
kernels compute in float32. The formats live in `formats.py`, the float64 oracles in
`reference.py`, the specs and sizes in `common.py`, the decode-step kernels' inputs and
launches (indexer, top-k and its sweep space, Sinkhorn, SDPA dense and CSA) in
`decode.py`, the compressor pool's in `compressor.py`, mHC collapse and expand's in
`mhc.py`; this module holds those of the dequantisers, the router and RoPE, and is the
family's interface.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mtwork.families import import_sibling
from mtwork.kernel import Launch

common = import_sibling(__name__, __file__, "common")
formats = import_sibling(__name__, __file__, "formats")
reference = import_sibling(__name__, __file__, "reference")
decode = import_sibling(__name__, __file__, "decode")
compressor = import_sibling(__name__, __file__, "compressor")
mhc = import_sibling(__name__, __file__, "mhc")

# The family's interface (what `mtwork.load_family("dsv4")` gives): the specs and sizes
# from `common`, the decode-step kernels' helpers from `decode`, the rest defined below.
FOLDER, KERNELS, DESCRIPTION = common.FOLDER, common.KERNELS, common.DESCRIPTION
DTYPES, SIMD_WIDTH, THREADGROUP_MEMORY = common.DTYPES, common.SIMD_WIDTH, common.THREADGROUP_MEMORY
HC, MIXES, FLASH = common.HC, common.MIXES, common.FLASH
dtype_name, parse_dtypes = common.dtype_name, common.parse_dtypes
IndexerShape, TopKShape, AttentionShape = (decode.IndexerShape, decode.TopKShape,
                                           decode.AttentionShape)
indexer_inputs, indexer_reference, indexer_launch = (
    decode.indexer_inputs, decode.indexer_reference, decode.indexer_launch)
topk_inputs, topk_reference_for, topk_launch = (
    decode.topk_inputs, decode.topk_reference_for, decode.topk_launch)
topk_threadgroup_bytes, topk_constraints, topk_sweep_parts = (
    decode.topk_threadgroup_bytes, decode.topk_constraints, decode.topk_sweep_parts)
TOPK_SPACE, CI_TOPK_SPACE = decode.TOPK_SPACE, decode.CI_TOPK_SPACE
sinkhorn_inputs, sinkhorn_reference_for, sinkhorn_launch = (
    decode.sinkhorn_inputs, decode.sinkhorn_reference_for, decode.sinkhorn_launch)
sdpa_inputs, sdpa_reference, sdpa_launch = (
    decode.sdpa_inputs, decode.sdpa_reference, decode.sdpa_launch)
sdpa_threadgroup_bytes, SDPA_TOLERANCE = decode.sdpa_threadgroup_bytes, decode.SDPA_TOLERANCE
csa_indices, csa_inputs, csa_reference, csa_launch, CSA_SPACE = (
    decode.csa_indices, decode.csa_inputs, decode.csa_reference, decode.csa_launch,
    decode.CSA_SPACE)
PoolShape, pool_inputs, pool_reference_for, pool_launch = (
    compressor.PoolShape, compressor.pool_inputs, compressor.pool_reference_for,
    compressor.pool_launch)
mhc_weights, streams_input = mhc.mhc_weights, mhc.streams_input
collapse_reference, collapse_launch = mhc.collapse_reference, mhc.collapse_launch
expand_reference, expand_launch = mhc.expand_reference, mhc.expand_launch
EXPAND_SPACE, expand_constraints = mhc.EXPAND_SPACE, mhc.expand_constraints

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
    common.check_dtype(dtype)
    if per_thread % 2 or formats.MX_BLOCK % per_thread:
        raise ValueError(f"per_thread must be even and divide 32, got {per_thread}")
    n_threads = rows * cols // per_thread
    return Launch(
        common.KERNELS["mxfp4_dequant"].kernel(),
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
    tiles = (common.ceil_div(rows, block), common.ceil_div(cols, block))
    scales = np.exp2(rng.uniform(-12, -4, tiles))
    return [mx.array(codes), mx.array(scales.astype(np.float32))]


def fp8_reference_for(block: int):
    def fp8_reference(weight, scales) -> np.ndarray:
        return formats.dequant_fp8_blocks(np.array(weight), np.array(scales), block)

    return fp8_reference


def fp8_launch(rows: int, cols: int, block: int = 128, dtype: mx.Dtype = mx.float32, *,
               per_thread: int = 4, threads: int = 64) -> Launch:
    """Thread (x, r) writes `per_thread` columns of row r; per_thread divides block and
    cols (so a thread never straddles two tiles or two rows)."""
    common.check_dtype(dtype)
    if block % per_thread or cols % per_thread:
        raise ValueError(f"per_thread={per_thread} must divide block={block} and cols={cols}")
    width = cols // per_thread
    return Launch(
        common.KERNELS["fp8_dequant"].kernel(),
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
                  route_scale: float = common.FLASH["route_scale"]) -> list[mx.array]:
    """[x (tokens, hidden), gate (experts, hidden), bias (experts,) float32, route_scale]:
    x and gate rows of unit RMS-ish scale so logits are O(1), bias ~ 0.1 N(0, 1)."""
    rng = np.random.default_rng(seed)
    x = common.normal(rng, (shape.tokens, shape.hidden), dtype)
    gate = common.normal(rng, (shape.experts, shape.hidden), dtype, std=shape.hidden ** -0.5)
    bias = mx.array((0.1 * rng.standard_normal(shape.experts)).astype(np.float32))
    return [x, gate, bias, mx.array(route_scale, dtype=mx.float32)]


def router_reference_for(top_k: int):
    def router_reference(x, gate, bias, route_scale):
        return list(reference.router(x, gate, bias, float(np.array(route_scale)), top_k))

    return router_reference


def router_launch(shape: RouterShape, dtype: mx.Dtype = mx.float32, *,
                  threads: int = 128) -> Launch:
    common.check_dtype(dtype)
    if not 1 <= shape.top_k <= min(common.SIMD_WIDTH, shape.experts):
        raise ValueError(f"top_k must be in [1, min(32, experts)], got {shape.top_k}")
    if threads % common.SIMD_WIDTH:
        raise ValueError(f"threads must be a multiple of 32, got {threads}")
    return Launch(
        common.KERNELS["moe_router"].kernel(),
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
                base: float = common.FLASH["rope_base"]) -> list[mx.array]:
    """[x, positions (tokens,) int32, cos_table, sin_table]."""
    rng = np.random.default_rng(seed)
    x = common.normal(rng, shape.x_shape, dtype)
    positions = mx.array(rng.integers(0, shape.max_position, shape.tokens).astype(np.int32))
    return [x, positions, *rope_tables(shape.max_position, shape.rope_dims, base)]


def rope_reference_for(rope_dims: int, inverse: bool = False,
                       base: float = common.FLASH["rope_base"]):
    def rope_reference(x, positions, cos_table, sin_table):
        return reference.partial_rope(x, np.array(positions), rope_dims, base, inverse)

    return rope_reference


def rope_launch(shape: RopeShape, dtype: mx.Dtype = mx.float32, *, inverse: bool = False,
                threads: int = 64) -> Launch:
    common.check_dtype(dtype)
    if shape.head_dim % 2 or shape.rope_dims % 2 or not 0 < shape.rope_dims <= shape.head_dim:
        raise ValueError("head_dim and rope_dims must be even, 0 < rope_dims <= head_dim")
    pairs = shape.head_dim // 2
    return Launch(
        common.KERNELS["partial_rope"].kernel(),
        grid=(pairs, shape.heads, shape.tokens), threadgroup=(min(threads, pairs), 1, 1),
        template=[("T", dtype), ("D", shape.head_dim), ("R", shape.rope_dims),
                  ("INVERSE", inverse)],
        output_shapes=[shape.x_shape], output_dtypes=[dtype],
    )


