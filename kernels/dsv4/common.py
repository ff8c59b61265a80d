"""The DeepSeek-V4 family's kernel specs, sizes and the helpers its launch modules share
(dtype checks, seeded inputs)."""


from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import mlx.core as mx
import numpy as np

import mtwork

FOLDER = Path(__file__).parent  # where this family's .metal files are

DESCRIPTION = (
    "DeepSeek-V4: MXFP4 and FP8 block dequant, sqrt-softplus MoE router, partial RoPE, "
    "indexer score and bitonic top-k, CSA/HCA compressor pool, mHC Sinkhorn split, "
    "collapse and expand, decode SDPA with a sink, dense and over a CSA gather list"
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
    "compressor_pool": _spec(
        "compressor_pool", ["kv", "gate", "ape"], ["out"],
        "one thread per (channel, window): one online-softmax pass over the window's slots"),
    "mhc_collapse": _spec(
        "mhc_collapse", ["streams", "pre"], ["x"],
        "one thread per EPT features of a token: the 4 streams weighted by the token's pre"),
    "mhc_expand": _spec(
        "mhc_expand", ["f", "streams", "post", "comb"], ["out"],
        "one thread per EPT features of a token: post f plus the streams mixed by comb"),
    "csa_sdpa_decode": _spec(
        "csa_sdpa_decode", ["q", "k", "v", "indices", "sinks", "scale"], ["out"],
        "sdpa_decode_sink over the cache rows of a gather list (top-k and sliding window)"),
}

DTYPES = (mx.float32, mx.float16, mx.bfloat16)
SIMD_WIDTH = 32
THREADGROUP_MEMORY = 32 * 1024
HC = 4  # mHC residual streams (hc_mult): the comb matrix is HC x HC, one quad per token
MIXES = (2 + HC) * HC

# DeepSeek-V4-Flash's sizes and constants (some are the helpers' defaults below).
FLASH = {"hidden": 4096, "experts": 256, "top_k": 6, "head_dim": 512, "rope_dims": 64,
         "index_heads": 64, "index_head_dim": 128, "index_topk": 512,
         "sinkhorn_iters": 20, "hc_eps": 1e-6, "route_scale": 1.5, "rope_base": 10000.0,
         "csa_rate": 4, "hca_rate": 128, "sliding_window": 128}


def dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def parse_dtypes(names: Sequence[str]) -> list[mx.Dtype]:
    """mlx dtypes from names such as "float16" (notebook parameters are plain strings)."""
    return [getattr(mx, name) for name in names]


def normal(rng: np.random.Generator, shape, dtype: mx.Dtype, std: float = 1.0) -> mx.array:
    return mx.array((std * rng.standard_normal(shape)).astype(np.float32)).astype(dtype)


def check_dtype(dtype: mx.Dtype) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {dtype}")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


