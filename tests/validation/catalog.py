"""The validation set: every pair, its published figures and where they were published.

Figures are copied as published (ms per token, ms per call, speed-ups); the sources of
both sides are fetched from their packages when a pair is modelled (`published`).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import mlx.core as mx

from . import gated_delta, llama, mlx_side
from .pairs import Pair, Published, Side

MS = 1e-3
LLAMA_7B = {"embd": 4096, "ff": 11008, "layers": 32}
LLAMA_13B = {"embd": 5120, "ff": 13824, "layers": 40}


def _llama_side(version: str, quant: str, model: dict) -> Side:
    vocabulary = (" (kernel_mul_mat_q6_K_f32 for the vocabulary projection)"
                  if quant.endswith("_K") and quant != "q6_K" else "")
    return Side(f"llama-cpp-python {version}", f"kernel_mul_mat_{quant}_f32{vocabulary}",
                partial(llama.llama_token, version, quant, **model))


def _llama_2023(name: str, url: str, says: str, quant: str, model: dict,
                versions: tuple[str, str], ms: tuple[float, float]) -> Pair:
    return Pair(name, "token", "M2 Max 30-core",
                Published(url, says, ms[0] / ms[1], ms[0] * MS, ms[1] * MS),
                _llama_side(versions[0], quant, model), _llama_side(versions[1], quant, model))


LLAMA_PAIRS = (
    _llama_2023("llama.cpp #2188: q4_0 mat-vec, 8 rows a threadgroup, SIMD-group sums "
                "(13B)", "https://github.com/ggml-org/llama.cpp/pull/2188",
                "13B Q4_0 (WizardLM 13B), M2 Max 30-core GPU: 46.97 -> 36.70 ms/tok",
                "q4_0", LLAMA_13B, ("0.1.70", "0.1.71"), (46.97, 36.70)),
    _llama_2023("llama.cpp #2290: faster Q4_K mat-vec (7B)",
                "https://github.com/ggml-org/llama.cpp/pull/2290",
                "7B Q4_K, M2 Max 30-core GPU: 23.7 -> 19.5 ms/t", "q4_K", LLAMA_7B,
                ("0.1.73", "0.1.74"), (23.7, 19.5)),
    _llama_2023("llama.cpp #2290: faster Q4_K mat-vec (13B)",
                "https://github.com/ggml-org/llama.cpp/pull/2290",
                "13B Q4_K, M2 Max 30-core GPU: 41.4 -> 31.9 ms/t", "q4_K", LLAMA_13B,
                ("0.1.73", "0.1.74"), (41.4, 31.9)),
    _llama_2023("llama.cpp #2294: faster Q5_K mat-vec (7B)",
                "https://github.com/ggml-org/llama.cpp/pull/2294",
                "Q5_K_S 7B, M2 Max 30-core GPU: 26.2 -> 22.8 ms/t", "q5_K", LLAMA_7B,
                ("0.1.73", "0.1.74"), (26.2, 22.8)),
    _llama_2023("llama.cpp #2294: faster Q6_K mat-vec (7B)",
                "https://github.com/ggml-org/llama.cpp/pull/2294",
                "Q6_K 7B, M2 Max 30-core GPU: 25.6 -> 24.6 ms/t", "q6_K", LLAMA_7B,
                ("0.1.73", "0.1.74"), (25.6, 24.6)),
)

QMV_WIDE = "https://github.com/ml-explore/mlx/pull/3764"
QMV_WIDE_FOLLOW_UP = "https://github.com/ml-explore/mlx/issues/3839"


def _qmv_side(version: str, m: int, n: int, k: int, bits: int, wide: bool) -> Side:
    name = "affine_qmv_wide" if wide else ("affine_qmv_fast" if k % 512 == 0 else "affine_qmv")
    return Side(f"mlx {version}", name,
                lambda: [(mlx_side.qmv(version, m, n, k, bits=bits, wide=wide), 1)])


def _qmv_wide(chip: str, m: int, bits: int, ratio: float, *, n: int = 15360, k: int = 3840,
              url: str = QMV_WIDE, says: str = "") -> Pair:
    says = says or (f"GPU kernel time, Gemma-4-12B MLP gate/up [15360x3840], bf16 "
                    f"activations, int{bits}, M={m}, {chip}: {ratio}x over qmv")
    return Pair(f"MLX #3764: qmv_wide for {m} vectors, int{bits}, {n}x{k}", "kernel", chip,
                Published(url, says, ratio),
                _qmv_side("0.31.2", m, n, k, bits, False),
                _qmv_side("0.32.0", m, n, k, bits, True), timed="gpu")


QMV_QUAD = Pair(
    "MLX #1503: qmv_quad for a quantized KV cache (D=128)", "kernel", "M1 Max",
    Published("https://github.com/ml-explore/mlx/pull/1503",
              "M1 Max, queries (1, 8, 4, 1, 128) x keys (1, 8, 4, 32768, 128) quantized: "
              "quant_matmul 2.66873 -> 0.54323 msec", 2.66873 / 0.54323, 2.66873 * MS,
              0.54323 * MS),
    Side("mlx 0.19.3", "qmv (batched; the kernel qmv_quad replaced for D=64, 128)",
         lambda: [(mlx_side.qmv_kv_cache(False), 1)]),
    Side("mlx 0.19.3", "qmv_quad<float, 64, 4, 128, batched>",
         lambda: [(mlx_side.qmv_kv_cache(True), 1)]),
    timed="call")

FASTER_SORT = "https://github.com/ml-explore/mlx/pull/1831"


def _sort(rows: int, size: int, pre: float, post: float) -> Pair:
    def side(version: str) -> Side:
        bn, tn = mlx_side.block_sort_geometry(version, size)
        return Side(f"mlx {version}", f"block_sort<float, float, false, {bn}, {tn}>",
                    lambda: [(mlx_side.block_sort(version, rows, size), 1)])

    return Pair(f"MLX #1831: faster sort, ({rows}, {size})", "kernel", "M2 Ultra",
                Published(FASTER_SORT, f"mx.sort of shape ({rows}, {size}), 'benchmarks "
                          f"on M2' (the author's M2 Ultra assumed): {pre} -> {post} (ms, "
                          "repetitions not stated: the ratio is used)", pre / post),
                side("0.21.1"), side("0.22.1"), timed="call")


GEMM_UPDATE = "https://github.com/ml-explore/mlx/pull/1518"


def _gemm_update(batch: int, m: int, n: int, k: int, nt: bool, before: float,
                 after: float) -> Pair:
    """#1518 restructured the steel GEMM's MMA; on an M2 Ultra float32 products of a
    million outputs or more keep 64x64x16 tiles of 2x2 SIMD-groups on both sides (0.18.1:
    the large-matmul branch; 0.19.3: GEMM_TPARAM_MACRO's 'd' device, "float takes
    default")."""
    flops = 2 * batch * m * n * k
    t = "nt" if nt else "nn"

    def side(version: str) -> Side:
        return Side(f"mlx {version}", f"gemm<float, 64, 64, 16, 2, 2, false, {str(nt).lower()}>",
                    lambda: [(mlx_side.steel_gemm(version, batch, m, n, k, nt=nt), 1)])

    return Pair(f"MLX #1518: steel GEMM update, {batch}x{m}x{n}x{k} {t}", "kernel",
                "M2 Ultra",
                Published(GEMM_UPDATE, f"M2 Ultra, B={batch} M={m} N={n} K={k} float32 {t}: "
                          f"{before} -> {after} GFLOP/s", after / before,
                          flops / (before * 1e9), flops / (after * 1e9)),
                side("0.18.1"), side("0.19.3"))


GEMV_WIDE = "https://github.com/ml-explore/mlx/pull/3888"
# matmul.cpp 0.32.0, steel_matmul_regular's GEMM_TPARAM_MACRO for bfloat16 nt products of
# fewer than 2^20 outputs: the 'd' (Ultra) devices take 64x32x32 tiles of 2x2 SIMD-groups,
# the 's' (Pro, Max) ones the default 64x64x16 of 2x2; swizzle_log 2 on both.
GEMM_TILES = {"M3 Ultra": (64, 32, 32, 2, 2), "M4 Pro": (64, 64, 16, 2, 2)}


def _gemv_wide(chip: str, what: str, n: int, ratio: float) -> Pair:
    m, k = 2, 2048
    if n <= 2048:  # split-K: _tm * _tn <= 2048 (Max and Ultra 's', 'd'), K >= max(M, N)
        before = Side("mlx 0.32.0", "gemm_splitk<bfloat, float, 16, 16, 16, 2, 2> and "
                      "gemm_splitk_accum", lambda: mlx_side.steel_splitk("0.32.0", m, n, k))
    else:
        tiles = GEMM_TILES[chip]
        before = Side("mlx 0.32.0", f"gemm<bfloat, {', '.join(map(str, tiles))}, false, true>",
                      lambda: [(mlx_side.steel_gemm("0.32.0", 1, m, n, k, nt=True, tiles=tiles,
                                                    dtype=mx.bfloat16, swizzle_log=2,
                                                    slice_tiles=4096 // tiles[1] // 32), 1)])
    after = Side("mlx 0.32.1", f"gemv_wide<bfloat, {m}, 32>",
                 lambda: [(mlx_side.gemv_wide("0.32.1", m, n, k), 1)])
    return Pair(f"MLX #3888: gemv_wide, {what} [{m}, {k}] x [{k}, {n}]", "kernel", chip,
                Published(GEMV_WIDE, f"per-kernel GPU time against the stock routing, "
                          f"uncached weights, {what} [M, 2048] x [2048, {n}], M={m}, {chip}: "
                          f"{ratio}x", ratio),
                before, after, timed="gpu")


PR_4409 = "https://github.com/ml-explore/mlx/pull/4409"
SEED_002 = "seed 002, the MLX port's description"


def _gated_delta(name: str, url: str, says: str, batch: int, steps: int, dtype: mx.Dtype,
                 ratio: float) -> Pair:
    """Both measured an MLX port of mlx-lm #1559's layout (unreleased) against MLX's
    `gated_delta_seq`; the after side here is mlx-lm's own packed kernel, the layout the
    port copies (its author's), as released."""
    before = Side("mlx-metal 0.32.4", f"gated_delta_seq<{dtype_name(dtype)}, 128, 128, 16, 32, 1>",
                  lambda: [(gated_delta.mlx_seq("0.32.4", batch, steps, dtype), 1)])
    after = Side("mlx-lm 0.32.0", "gated_delta_step_packed_btree (mlx-lm #1559's layout, "
                 "which the measured MLX port copies)",
                 lambda: [(gated_delta.mlx_lm("0.32.0", batch, steps, dtype, True), 1)])
    return Pair(f"{name}: gated delta, 8 value rows a SIMD-group, B={batch} T={steps} "
                f"{dtype_name(dtype)}", "kernel", "M5 Max", Published(url, says, ratio),
                before, after)


def dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).removeprefix("mlx.core.")


GATED_DELTA_PAIRS = (
    *(_gated_delta("MLX #4409", PR_4409, f"M5 Max, (Hk, Hv) = (16, 32), Dk = Dv = 128, "
                   f"{label}, B={b}, T={t}, float32: {r}x (paired geometric mean; timing "
                   "includes graph construction, dispatch, GPU execution and both outputs)",
                   b, t, mx.float32, r)
      for label, b, t, r in (("sequential", 1, 2048, 1.2481), ("sequential", 8, 2048, 1.8678),
                             ("sequential", 16, 2048, 1.8877), ("default", 8, 8, 1.4144))),
    *(_gated_delta("Seed 002", SEED_002, f"M5 Max, B={b}, T={t}: {r}x (median of paired "
                   "rounds; dtype not stated, bfloat16 taken: #4409 measured 1.97x for "
                   "bfloat16 at B=1, 1.25x for float32)", b, t, mx.bfloat16, r)
      for b, t, r in ((1, 2048, 1.90), (8, 2048, 2.16), (16, 2048, 1.86), (1, 8, 1.0))),
)

MLX_PAIRS = (
    _gemv_wide("M3 Ultra", "in_proj", 32, 3.0),
    _gemv_wide("M4 Pro", "in_proj", 32, 2.3),
    _gemv_wide("M3 Ultra", "lm_head", 248320, 1.7),
    _gemv_wide("M4 Pro", "lm_head", 248320, 2.3),
    _gemm_update(1, 1024, 4096, 11008, False, 19117.517, 19274.840),
    _gemm_update(1, 4096, 4096, 11008, False, 19131.385, 19872.386),
    _gemm_update(16, 1024, 1024, 1024, False, 20106.087, 20153.883),
    _gemm_update(1, 4096, 4096, 4096, False, 20587.211, 20745.885),
    _gemm_update(1, 1024, 4096, 11008, True, 17736.890, 18268.362),
    _gemm_update(1, 4096, 4096, 11008, True, 17341.110, 18559.295),
    _sort(1, 160, 0.687, 0.467),
    _sort(1024, 4, 1.308, 0.457),
    _sort(4096, 256, 4.085, 1.231),
    _sort(1024, 1024, 1.740, 1.510),
    _sort(4096, 1024, 5.277, 4.540),
    QMV_QUAD,
    _qmv_wide("M3 Ultra", 2, 4, 1.1),
    _qmv_wide("M4 Pro", 2, 4, 1.2),
    _qmv_wide("M5 Max", 2, 4, 1.3),
    _qmv_wide("M4 Pro", 2, 8, 1.0),
    _qmv_wide("M3 Ultra", 2, 8, 1.2),
    _qmv_wide("M5 Max", 2, 8, 1.2),
    _qmv_wide("M3 Ultra", 4, 4, 1.4),
    _qmv_wide("M3 Ultra", 4, 8, 1.6),
    _qmv_wide("M4 Pro", 4, 4, round(1.89 / 1.47, 3), n=24576, k=4096,
              url=QMV_WIDE_FOLLOW_UP,
              says="mlx 0.31.2 vs 0.32.0 wheels, M4 Pro, bf16, affine 4-bit gs=64, "
                   "4096x24576 (mlp gate+up): m=4 costs 1.89x of m=1 on 0.31.2, 1.47x on "
                   "0.32.0 (m=1 takes qmv on both)"),
)

# The two parts of the cross-validation (fit.py): even places are the "fit" part, odd
# ones "held out", so every family has pairs in both.
PAIRS: tuple[Pair, ...] = tuple(
    replace(p, part="fit" if i % 2 == 0 else "held out")
    for i, p in enumerate((*LLAMA_PAIRS, *MLX_PAIRS, *GATED_DELTA_PAIRS)))
