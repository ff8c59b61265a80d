"""The DeepSeek-V4 decode-step kernels' inputs, launches and references: the lightning
indexer's score and its bitonic top-k (with the top-k sweep space), the mHC Sinkhorn
split and SDPA decode with a sink."""

from __future__ import annotations

from dataclasses import dataclass, replace

import mlx.core as mx
import numpy as np

import mtwork
from mtwork.families import import_sibling
from mtwork.kernel import Launch
from mtwork.sweep import Config, Constraint

common = import_sibling(__name__.rsplit(".", 1)[0], __file__, "common")
reference = import_sibling(__name__.rsplit(".", 1)[0], __file__, "reference")

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
    q = common.normal(rng, (shape.queries, shape.heads, shape.head_dim), dtype)
    k = common.normal(rng, (shape.keys, shape.key_heads, shape.head_dim), dtype,
                std=shape.head_dim ** -0.5)
    w = (rng.standard_normal((shape.queries, shape.heads)) * shape.heads ** -0.5)
    return [q, k, mx.array(w.astype(np.float32))]


def indexer_reference(q, k, w) -> np.ndarray:
    return reference.indexer_score(q, k, w)


def indexer_launch(shape: IndexerShape, dtype: mx.Dtype = mx.float32, *,
                   simdgroups: int = 4) -> Launch:
    common.check_dtype(dtype)
    return Launch(
        common.KERNELS["indexer_score"].kernel(),
        grid=(common.SIMD_WIDTH * shape.keys, shape.queries, 1),
        threadgroup=(common.SIMD_WIDTH * min(simdgroups, shape.keys), 1, 1),
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
    common.check_dtype(dtype)
    capacity = capacity or shape.capacity
    if capacity & (capacity - 1) or capacity < shape.n:
        raise ValueError(f"capacity must be a power of two >= n={shape.n}, got {capacity}")
    if not 1 <= shape.k <= shape.n:
        raise ValueError(f"k must be in [1, n], got {shape.k}")
    if topk_threadgroup_bytes(capacity) > common.THREADGROUP_MEMORY:
        raise ValueError(f"n={shape.n} needs more than {common.THREADGROUP_MEMORY} bytes")
    return Launch(
        common.KERNELS["topk_bitonic"].kernel(),
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
        mtwork.divides(common.SIMD_WIDTH, "threads"),
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
                    eps: float = common.FLASH["hc_eps"]) -> list[mx.array]:
    """[mixes (tokens, 24), hc_scale (3,) float32, hc_base (24,) float32, eps]."""
    rng = np.random.default_rng(seed)
    mixes = common.normal(rng, (tokens, common.MIXES), dtype)
    scale = rng.uniform(0.5, 2.0, 3).astype(np.float32)
    base = (0.5 * rng.standard_normal(common.MIXES)).astype(np.float32)
    return [mixes, mx.array(scale), mx.array(base), mx.array(eps, dtype=mx.float32)]


def sinkhorn_reference_for(iters: int):
    def sinkhorn_reference(mixes, hc_scale, hc_base, eps):
        return list(reference.sinkhorn_split(mixes, hc_scale, hc_base, iters,
                                             float(np.array(eps)), common.HC))

    return sinkhorn_reference


def sinkhorn_launch(tokens: int, dtype: mx.Dtype = mx.float32, *,
                    iters: int = common.FLASH["sinkhorn_iters"], threads: int = 64) -> Launch:
    common.check_dtype(dtype)
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    return Launch(
        common.KERNELS["sinkhorn_split"].kernel(),
        grid=(common.HC * tokens, 1, 1), threadgroup=(min(threads, common.HC * tokens), 1, 1),
        template=[("T", dtype), ("ITERS", iters)],
        output_shapes=[(tokens, common.HC), (tokens, common.HC), (tokens, common.HC, common.HC)],
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
    q = common.normal(rng, (shape.batch, shape.heads, shape.head_dim), dtype)
    kv_shape = (shape.batch, shape.kv_heads, shape.length, shape.head_dim)
    k, v = common.normal(rng, kv_shape, dtype), common.normal(rng, kv_shape, dtype)
    sinks = mx.array(rng.uniform(-2.0, 4.0, shape.heads).astype(np.float32))
    return [q, k, v, sinks, mx.array(shape.scale, dtype=mx.float32)]


def sdpa_reference(q, k, v, sinks, scale) -> np.ndarray:
    return reference.sdpa_sink(q, k, v, sinks, float(np.array(scale)))


def sdpa_threadgroup_bytes(head_dim: int, simdgroups: int) -> int:
    return 4 * simdgroups * (head_dim + 2)


def sdpa_launch(shape: AttentionShape, dtype: mx.Dtype = mx.float32, *,
                simdgroups: int = 4) -> Launch:
    common.check_dtype(dtype)
    if shape.head_dim % common.SIMD_WIDTH or shape.heads % shape.kv_heads:
        raise ValueError("head_dim must be a multiple of 32 and heads of kv_heads")
    if sdpa_threadgroup_bytes(shape.head_dim, simdgroups) > common.THREADGROUP_MEMORY:
        raise ValueError(f"{simdgroups} SIMD-groups x D={shape.head_dim} exceed 32 KiB")
    return Launch(
        common.KERNELS["sdpa_decode_sink"].kernel(),
        grid=(common.SIMD_WIDTH * simdgroups * shape.heads, shape.batch, 1),
        threadgroup=(common.SIMD_WIDTH * simdgroups, 1, 1),
        template=[("T", dtype), ("D", shape.head_dim), ("H", shape.heads),
                  ("HKV", shape.kv_heads), ("SG", simdgroups)],
        output_shapes=[(shape.batch, shape.heads, shape.head_dim)], output_dtypes=[dtype],
    )


# Tolerance bands: elementwise results use the dtype's default band; attention
# accumulates over the keys, so it gets the wider SDPA band of the kernels' origin.
SDPA_TOLERANCE = {mx.float32: 1e-3, mx.float16: 3e-3, mx.bfloat16: 1.5e-2}


# --- CSA decode: SDPA with a sink over a gather list ------------------------------------------


def csa_indices(batch: int, length: int, top_k: int, window: int, capacity: int | None = None,
                seed: int = 0) -> mx.array:
    """Gather lists [batch, capacity] int32, as DeepSeek-V4's CSA decode builds them: the
    last `window` rows of the cache (the sliding window) and `top_k` of the rows before
    them (standing for the indexer's choice, drawn at random), in no particular order,
    padded with -1 to `capacity` (default top_k + window)."""
    capacity = capacity or top_k + window
    if not 0 <= window <= length or not 0 <= top_k <= length - window:
        raise ValueError(f"window={window} and top_k={top_k} must fit in length={length} "
                         "(window <= length, top_k <= length - window)")
    if capacity < top_k + window:
        raise ValueError(f"capacity={capacity} is below top_k + window = {top_k + window}")
    rng = np.random.default_rng(seed)
    lists = np.full((batch, capacity), -1, np.int32)
    for b in range(batch):
        chosen = rng.choice(length - window, top_k, replace=False)
        rows = np.concatenate([chosen, np.arange(length - window, length)])
        lists[b, rng.permutation(capacity)[:rows.size]] = rows
    return mx.array(lists)


def csa_inputs(shape: AttentionShape, top_k: int, window: int, dtype: mx.Dtype = mx.float32,
               seed: int = 0, capacity: int | None = None) -> list[mx.array]:
    """[q, k, v, indices, sinks, scale]: `sdpa_inputs` with gather lists (`csa_indices`)
    inserted before the sinks."""
    q, k, v, sinks, scale = sdpa_inputs(shape, dtype, seed)
    indices = csa_indices(shape.batch, shape.length, top_k, window, capacity, seed)
    return [q, k, v, indices, sinks, scale]


def csa_reference(q, k, v, indices, sinks, scale) -> np.ndarray:
    return reference.csa_sdpa(q, k, v, np.array(indices), sinks, float(np.array(scale)))


def csa_launch(shape: AttentionShape, dtype: mx.Dtype = mx.float32, *,
               simdgroups: int = 4) -> Launch:
    """As `sdpa_launch`, for csa_sdpa_decode: one threadgroup per (head, batch)."""
    dense = sdpa_launch(shape, dtype, simdgroups=simdgroups)
    return replace(dense, kernel=common.KERNELS["csa_sdpa_decode"].kernel())


# The sweep's space: SIMD-groups splitting the gather list.
CSA_SPACE = {"simdgroups": [1, 2, 4, 8]}
