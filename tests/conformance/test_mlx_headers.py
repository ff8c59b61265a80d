"""MLX's own Metal kernels, read from the headers in the installed `mlx` wheel, run on
`sim` as full-source kernels and compared with the matching `mx.*` operation on the CPU.

Each dispatch follows what MLX's host code does for that kernel (threadgroup shape, grid,
function constants, argument values); the comments name the MLX source that says so.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mtwork import new_buffer

from .metal_path import run_both
from .sources import mlx_header

MLX = "mlx"
RNG_SEED = 0


def rng() -> np.random.Generator:
    return np.random.default_rng(RNG_SEED)


def name(dtype: mx.Dtype) -> str:
    return str(dtype).removeprefix("mlx.core.")


# --- softmax.h: SIMD reductions and threadgroup memory -----------------------------------


@pytest.mark.parametrize(
    ("dtype", "acc", "axis"),
    [(mx.float32, mx.float32, 100), (mx.float16, mx.float32, 77), (mx.bfloat16, mx.float32, 256)],
)
def test_softmax_single_row(agreement, dtype, acc, axis) -> None:
    # MLX's softmax.cpp: rows that fit one threadgroup use softmax_single_row with
    # N_READS = 4 and ceil(axis / 4) threads rounded up to whole SIMD-groups.
    n_reads = 4
    threads = -(-axis // n_reads)
    threads = -(-threads // 32) * 32
    x = mx.array(rng().standard_normal((5, axis)) * 3).astype(dtype)
    kernel = mlx_header("softmax.h").kernel("softmax_single_row", template=(dtype, acc, n_reads))
    out = run_both(kernel, buffers={"in": x, "out": new_buffer(x.shape), "axis_size": axis},
                 threadgroups=(x.shape[0],), threads_per_threadgroup=(threads,))
    expected = mx.softmax(x, axis=-1, precise=True)
    agreement(f"softmax_single_row<{name(dtype)}>", MLX, out.mx("out"), expected)


def test_softmax_looped(agreement) -> None:
    # Rows longer than a threadgroup reads at once use softmax_looped with 1024 threads,
    # every SIMD-group contributing to the shared maxima and sums.
    axis = 5000
    x = mx.array(rng().standard_normal((2, axis)) * 4).astype(mx.float32)
    kernel = mlx_header("softmax.h").kernel("softmax_looped", template=(mx.float32, mx.float32, 4))
    out = run_both(kernel, buffers={"in": x, "out": new_buffer(x.shape), "axis_size": axis},
                 threadgroups=(x.shape[0],), threads_per_threadgroup=(1024,))
    agreement("softmax_looped<float32>", MLX, out.mx("out"), mx.softmax(x, axis=-1))


# --- sdpa_vector.h: function constants, SIMD reductions, threadgroup memory --------------


def _sdpa_inputs(b: int, hq: int, hkv: int, q_len: int, n: int, d: int):
    g = rng()
    q = mx.array(g.standard_normal((b, hq, q_len, d)), dtype=mx.float32)
    k = mx.array(g.standard_normal((b, hkv, n, d)), dtype=mx.float32)
    v = mx.array(g.standard_normal((b, hkv, n, d)), dtype=mx.float32)
    return q, k, v


@pytest.mark.parametrize("variant", ["plain", "bool_mask", "causal", "sinks"])
def test_sdpa_vector(agreement, variant) -> None:
    # MLX's scaled_dot_product_attention.cpp (sdpa_vector): one threadgroup of 32
    # SIMD-groups per (batch * query head, query position); keys and values contiguous,
    # so head stride N * D and sequence stride D; scale folded into q.
    b, hq, hkv, q_len, n, d = 2, 4, 2, 2, 45, 64
    q, k, v = _sdpa_inputs(b, hq, hkv, q_len, n, d)
    scale = d**-0.5
    constants = {"has_mask": False, "query_transposed": False, "do_causal": False,
                 "bool_mask": False, "float_mask": False, "has_sinks": False}
    buffers = {"queries": q, "keys": k, "values": v, "out": new_buffer(q.shape),
               "gqa_factor": hq // hkv, "N": n, "k_head_stride": n * d, "k_seq_stride": d,
               "v_head_stride": n * d, "v_seq_stride": d, "scale": scale}
    mask = sinks = None
    if variant == "bool_mask":
        mask = mx.array(rng().random((b, hq, q_len, n)) < 0.7)
        mask[..., 0] = True  # every query sees at least one key
        constants |= {"has_mask": True, "bool_mask": True}
        # Strides of the mask in MLX's (batch * head, query, key) order.
        buffers |= {"bmask": mask, "mask_kv_seq_stride": 1, "mask_q_seq_stride": n,
                    "mask_head_stride": q_len * n}
    elif variant == "causal":
        constants["do_causal"] = True
        mask = "causal"
    elif variant == "sinks":
        sinks = mx.array(rng().standard_normal(hq), dtype=mx.float32)
        constants["has_sinks"] = True
        buffers |= {"sinks": sinks, "num_q_heads": hq}
    kernel = mlx_header("sdpa_vector.h").kernel("sdpa_vector", template=(mx.float32, d, d),
                                                constants=constants)
    out = run_both(kernel, buffers=buffers, threadgroups=(b * hq, q_len, 1),
                 threads_per_threadgroup=(1024, 1, 1))
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask,
                                                    sinks=sinks)
    agreement(f"sdpa_vector ({variant})", MLX, out.mx("out"), expected)


# --- steel GEMM: simdgroup_matrix, function constants, threadgroup memory ----------------

_GEMM_PARAMS = np.dtype(
    [("M", "i4"), ("N", "i4"), ("K", "i4"), ("lda", "i4"), ("ldb", "i4"), ("ldd", "i4"),
     ("tiles_n", "i4"), ("tiles_m", "i4"), ("batch_stride_a", "i8"), ("batch_stride_b", "i8"),
     ("batch_stride_d", "i8"), ("swizzle_log", "i4"), ("gemm_k_iterations_aligned", "i4"),
     ("batch_ndim", "i4")],
    align=True,
)  # steel/gemm/params.h GEMMParams, laid out with C's alignment rules


@pytest.mark.parametrize(("batch", "m", "n", "k"), [(1, 64, 64, 32), (2, 45, 38, 37)])
def test_steel_gemm_fused(agreement, batch, m, n, k) -> None:
    # MLX's matmul.cpp (steel_matmul_regular): tiles of BM x BN with 32 x WN x WM threads,
    # one threadgroup per tile and batch element; align_* say whether M, N, K are whole
    # tiles, has_batch is for batch shapes of more than one dimension.
    bm, bn, bk, wm, wn = 32, 32, 16, 2, 2
    g = rng()
    a = mx.array(g.standard_normal((batch, m, k)), dtype=mx.float32)
    b = mx.array(g.standard_normal((batch, k, n)), dtype=mx.float32)
    tiles_n, tiles_m = -(-n // bn), -(-m // bm)
    params = np.array([(m, n, k, k, n, n, tiles_n, tiles_m, m * k, k * n, m * n, 0, k // bk, 1)],
                      dtype=_GEMM_PARAMS)
    lib = mlx_header("steel/gemm/kernels/steel_gemm_fused.h", before=("steel/gemm/gemm.h",))
    kernel = lib.kernel(
        "gemm", template=(mx.float32, bm, bn, bk, wm, wn, False, False),
        constants={"has_batch": False, "use_out_source": False, "do_axpby": False,
                   "align_M": m % bm == 0, "align_N": n % bn == 0, "align_K": k % bk == 0},
    )
    out = run_both(kernel,
                   buffers={"A": a, "B": b, "D": new_buffer((batch, m, n)), "params": params},
                 threadgroups=(tiles_n, tiles_m, batch), threads_per_threadgroup=(32, wn, wm))
    agreement(f"steel gemm {batch}x{m}x{n}x{k}", MLX, out.mx("D"), a @ b)


# --- steel attention: flash attention on simdgroup_matrix, function constants -------------

_ATTN_PARAMS = np.dtype(
    [("B", "i4"), ("H", "i4"), ("D", "i4"), ("qL", "i4"), ("kL", "i4"), ("gqa_factor", "i4"),
     ("scale", "f4"), ("NQ", "i4"), ("NK", "i4"), ("NQ_aligned", "i4"), ("NK_aligned", "i4"),
     ("qL_rem", "i4"), ("kL_rem", "i4"), ("qL_off", "i4"), ("Q_strides", "i8", 3),
     ("K_strides", "i8", 3), ("V_strides", "i8", 3), ("O_strides", "i8", 3)],
    align=True,
)  # steel/attn/params.h AttnParams


@pytest.mark.parametrize("variant", ["plain", "causal", "sinks"])
def test_steel_attention(agreement, variant) -> None:
    # MLX's scaled_dot_product_attention.cpp (full attention): query blocks of BQ rows,
    # key blocks of BK, WM x WN SIMD-groups; threadgroups (query blocks, heads, batch);
    # align_Q / align_K say whether the lengths are whole blocks; causal queries are the
    # last qL of the kL positions (qL_off = kL - qL).
    b, hq, hkv, q_len, k_len, d = 1, 4, 2, 40, 45, 64
    bq, bk, wm, wn = 32, 16, 4, 1
    q, k, v = _sdpa_inputs(b, hq, hkv, q_len, k_len, d)
    scale = d**-0.5
    nq, nk = -(-q_len // bq), -(-k_len // bk)

    def strides(x: mx.array) -> tuple[int, int, int]:
        return (x.shape[1] * x.shape[2] * d, x.shape[2] * d, d)

    params = np.array([(b, hq, d, q_len, k_len, hq // hkv, scale, nq, nk, q_len // bq,
                        k_len // bk, q_len % bq, k_len % bk, k_len - q_len, strides(q),
                        strides(k), strides(v), strides(q))], dtype=_ATTN_PARAMS)
    buffers = {"Q": q, "K": k, "V": v, "O": new_buffer(q.shape), "params": params}
    sinks = None
    if variant == "sinks":
        sinks = mx.array(rng().standard_normal(hq), dtype=mx.float32)
        buffers["sinks"] = sinks
    lib = mlx_header("steel/attn/kernels/steel_attention.h", before=("steel/attn/attn.h",))
    kernel = lib.kernel(
        "attention", template=(mx.float32, bq, bk, d, d, wm, wn),
        constants={"align_Q": q_len % bq == 0, "align_K": k_len % bk == 0, "has_mask": False,
                   "do_causal": variant == "causal", "has_sinks": variant == "sinks",
                   "save_lse": False},
    )
    out = run_both(kernel, buffers=buffers, threadgroups=(nq, hq, b),
                   threads_per_threadgroup=(32, wm, wn))
    expected = mx.fast.scaled_dot_product_attention(
        q, k, v, scale=scale, mask="causal" if variant == "causal" else None, sinks=sinks
    )
    agreement(f"steel attention ({variant})", MLX, out.mx("O"), expected)


# --- indexing/scatter_axis.h: device atomics ----------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "op"),
    [(mx.float32, "Sum"), (mx.int32, "Sum"), (mx.float16, "Sum"), (mx.float32, "Max")],
)
def test_scatter_axis_atomic(agreement, dtype, op) -> None:
    # MLX's indexing.cpp (scatter_axis): one thread per update element, grid (inner,
    # updates along the axis, outer); colliding indices meet in the Op's atomic_update:
    # a native atomic for float and int, a compare-and-swap loop on the enclosing 32-bit
    # word for half (atomic.h).
    outer, length, inner, out_length = 3, 64, 4, 5
    g = rng()
    if dtype == mx.int32:
        upd = mx.array(g.integers(-50, 50, (outer, length, inner)), dtype=mx.int32)
    else:
        upd = mx.array(g.integers(-8, 8, (outer, length, inner)) / 4).astype(dtype)
    idx = mx.array(g.integers(0, out_length, (outer, length, inner)), dtype=mx.int32)
    start = mx.zeros((outer, out_length, inner), dtype=dtype)
    if op == "Max":
        start = mx.full(start.shape, -1e4, dtype=dtype)
    lib = mlx_header("indexing/scatter_axis.h", before=("atomic.h", "reduction/ops.h"))
    type_name = {mx.float32: "float", mx.int32: "int", mx.float16: "half"}[dtype]
    kernel = lib.kernel("scatter_axis", template=(dtype, mx.int32, "int64_t",
                                                  f"{op}<{type_name}>", True, True))
    out = np.array(start)
    run_both(kernel, buffers={"upd": upd, "indices": idx, "out": out,
                    "shape": np.array([outer, length, inner], np.int32),
                    "upd_strides": np.zeros(3, np.int64), "idx_strides": np.zeros(3, np.int64),
                    "ndim": np.uint64(3), "axis": 1, "out_axis_size": out_length,
                    "upd_ax_stride": np.uint64(inner), "idx_ax_stride": np.uint64(inner)},
           grid=(inner, length, outer), threads_per_threadgroup=(inner, 16, 1))
    z, _, x = np.meshgrid(np.arange(outer), np.arange(length), np.arange(inner), indexing="ij")
    at = start.at[mx.array(z), idx, mx.array(x)]
    expected = at.add(upd) if op == "Sum" else at.maximum(upd)
    # Updates are multiples of 1/4 and their sums stay small: every order of the atomic
    # additions gives the same bits.
    agreement(f"scatter_axis {op}<{type_name}>", MLX, out, expected, bitwise=True)


# --- arange.h: buffers bound by position -------------------------------------------------


@pytest.mark.parametrize("dtype", [mx.float32, mx.int32])
def test_arange(agreement, dtype) -> None:
    # arange.h declares its three buffers without [[buffer(n)]]; Metal numbers them 0, 1, 2.
    start, step, size = (2.5, 0.25, 300) if dtype == mx.float32 else (-7, 3, 300)
    kernel = mlx_header("arange.h").kernel("arange", template=(dtype,))
    out = run_both(kernel, buffers=[start, step, new_buffer((size,))], grid=(size,),
                 threads_per_threadgroup=(64,))
    expected = mx.arange(start, start + size * step, step, dtype=dtype)
    agreement(f"arange<{name(dtype)}>", MLX, out.mx("out"), expected)


# --- gated_delta_update.h: chunked WY form on simdgroup_matrix, and the sequential form --


def _gated_delta_inputs(b: int, t: int, hk: int, hv: int, dk: int, dv: int):
    g = rng()
    q = mx.array(g.standard_normal((b, t, hk, dk)) * dk**-0.5, dtype=mx.float32)
    k = g.standard_normal((b, t, hk, dk))
    k = mx.array(k / np.linalg.norm(k, axis=-1, keepdims=True), dtype=mx.float32)
    v = mx.array(g.standard_normal((b, t, hv, dv)), dtype=mx.float32)
    gamma = mx.array(g.uniform(0.6, 1.0, (b, t, hv)), dtype=mx.float32)
    beta = mx.array(g.uniform(0.1, 0.9, (b, t, hv)), dtype=mx.float32)
    state = mx.array(g.standard_normal((b, hv, dv, dk)) * 0.1, dtype=mx.float32)
    return q, k, v, gamma, beta, state


GDN_SHAPE = {"b": 1, "t": 21, "hk": 1, "hv": 2, "dk": 32, "dv": 16}


def test_gated_delta_fused_chunk(agreement) -> None:
    # The chunked kernel: 8x8 simdgroup_matrix tiles, chunks of C = 8 steps (the last
    # one partial), one SIMD-group per 8 value rows, threads (32, 4, 1).
    s = GDN_SHAPE
    q, k, v, gamma, beta, state = _gated_delta_inputs(*s.values())
    kernel = mlx_header("gated_delta_update.h").kernel(
        "gated_delta_fused_chunk", template=(mx.float32, s["dk"], s["dv"], s["hk"], s["hv"], 8),
        constants={"save_state": False},
    )
    out = run_both(kernel,
                   buffers={"q": q, "k": k, "v": v, "state_in": state, "g": gamma, "beta": beta,
                            "y": new_buffer(v.shape), "state_out": new_buffer(state.shape),
                            "T": s["t"]},
                   grid=(32, s["dv"] // 8, s["b"] * s["hv"]), threads_per_threadgroup=(32, 4, 1))
    y, final = mx.fast.gated_delta_update(q, k, v, gamma, beta, state)
    agreement("gated_delta_fused_chunk y", MLX, out.mx("y"), y, atol=1e-4, rtol=1e-3)
    agreement("gated_delta_fused_chunk state", MLX, out.mx("state_out"), final,
              atol=1e-4, rtol=1e-3)


def test_gated_delta_seq_with_checkpoints(agreement) -> None:
    # The sequential kernel; the function constant save_state adds the buffer of states
    # at the entry of every Ckpt-th step, which the backward pass replays from.
    s, ckpt = GDN_SHAPE, 4
    q, k, v, gamma, beta, state = _gated_delta_inputs(*s.values())
    n_ckpt = -(-s["t"] // ckpt)
    kernel = mlx_header("gated_delta_update.h").kernel(
        "gated_delta_seq", template=(mx.float32, s["dk"], s["dv"], s["hk"], s["hv"], ckpt),
        constants={"save_state": True},
    )
    out = run_both(kernel,
                   buffers={"q": q, "k": k, "v": v, "state_in": state, "g": gamma, "beta": beta,
                            "y": new_buffer(v.shape), "state_out": new_buffer(state.shape),
                            "T": s["t"],
                            "state_cache": new_buffer((s["b"] * s["hv"], n_ckpt, s["dv"],
                                                       s["dk"]))},
                   grid=(32, s["dv"], s["b"] * s["hv"]), threads_per_threadgroup=(32, 4, 1))
    y, final = mx.fast.gated_delta_update(q, k, v, gamma, beta, state)
    agreement("gated_delta_seq y", MLX, out.mx("y"), y)
    agreement("gated_delta_seq state", MLX, out.mx("state_out"), final)
    # Slot j holds the state after j * ckpt steps: the final state of the first j * ckpt.
    entry = [state] + [
        mx.fast.gated_delta_update(q[:, :t], k[:, :t], v[:, :t], gamma[:, :t], beta[:, :t],
                                   state)[1]
        for t in range(ckpt, s["t"], ckpt)
    ]
    expected = mx.stack(entry, axis=2).reshape(out["state_cache"].shape)
    agreement("gated_delta_seq state_cache", MLX, out.mx("state_cache"), expected)
