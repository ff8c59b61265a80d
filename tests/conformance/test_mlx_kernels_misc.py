"""MLX's softmax, sdpa_vector, scatter_axis, arange and gated-delta kernels, read from
the headers in the installed `mlx` wheel, run on `sim` as full-source kernels and compared
with the matching `mx.*` operation on the CPU.

Each library is written as MLX's `.metal` file writes it (its includes, in order; see
`mlx_kernels.metal_library`); each dispatch follows what MLX's host code does for that
kernel (threadgroup shape, grid, function constants, argument values); the comments name
the MLX source that says so.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mtwork import new_buffer

from .metal_path import run_both
from .mlx_kernels import MLX, build, metal_library, name, rng

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
    built = build(metal_library("utils.h", "softmax.h"), "softmax_single_row",
                  (dtype, acc, n_reads))
    out = run_both(built.kernel, buffers={"in": x, "out": new_buffer(x.shape), "axis_size": axis},
                 threadgroups=(x.shape[0],), threads_per_threadgroup=(threads,))
    expected = mx.softmax(x, axis=-1, precise=True)
    agreement(f"softmax_single_row<{name(dtype)}>", MLX, out.mx("out"), expected,
              reference="mx.softmax precise (CPU)", compile_s=built.compile_s)


def test_softmax_looped(agreement) -> None:
    # Rows longer than a threadgroup reads at once use softmax_looped with 1024 threads,
    # every SIMD-group contributing to the shared maxima and sums.
    axis = 5000
    x = mx.array(rng().standard_normal((2, axis)) * 4).astype(mx.float32)
    built = build(metal_library("utils.h", "softmax.h"), "softmax_looped",
                  (mx.float32, mx.float32, 4))
    out = run_both(built.kernel, buffers={"in": x, "out": new_buffer(x.shape), "axis_size": axis},
                 threadgroups=(x.shape[0],), threads_per_threadgroup=(1024,))
    agreement("softmax_looped<float32>", MLX, out.mx("out"), mx.softmax(x, axis=-1),
              reference="mx.softmax (CPU)", compile_s=built.compile_s)


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
    # scaled_dot_product_attention.metal includes utils.h, then sdpa_vector.h, which
    # declares the function constants.
    built = build(metal_library("utils.h", "sdpa_vector.h"), "sdpa_vector", (mx.float32, d, d),
                  constants)
    out = run_both(built.kernel, buffers=buffers, threadgroups=(b * hq, q_len, 1),
                 threads_per_threadgroup=(1024, 1, 1))
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask,
                                                    sinks=sinks)
    agreement(f"sdpa_vector ({variant})", MLX, out.mx("out"), expected,
              reference="mx.fast.scaled_dot_product_attention (CPU)", compile_s=built.compile_s)


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
    # As MLX's JIT indexing source: utils.h, atomic.h, the reduction ops, the kernel.
    lib = metal_library("utils.h", "atomic.h", "reduction/ops.h", "indexing/scatter_axis.h")
    type_name = {mx.float32: "float", mx.int32: "int", mx.float16: "half"}[dtype]
    built = build(lib, "scatter_axis", (dtype, mx.int32, "int64_t", f"{op}<{type_name}>", True,
                                         True))
    out = np.array(start)
    run_both(built.kernel, buffers={"upd": upd, "indices": idx, "out": out,
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
    agreement(f"scatter_axis {op}<{type_name}>", MLX, out, expected, bitwise=True,
              reference=f"array.at[].{'add' if op == 'Sum' else 'maximum'} (CPU)",
              compile_s=built.compile_s)


# --- arange.h: buffers bound by position -------------------------------------------------


@pytest.mark.parametrize("dtype", [mx.float32, mx.int32])
def test_arange(agreement, dtype) -> None:
    # arange.h declares its three buffers without [[buffer(n)]]; Metal numbers them 0, 1, 2.
    start, step, size = (2.5, 0.25, 300) if dtype == mx.float32 else (-7, 3, 300)
    built = build(metal_library("utils.h", "arange.h"), "arange", (dtype,))
    out = run_both(built.kernel, buffers=[start, step, new_buffer((size,))], grid=(size,),
                 threads_per_threadgroup=(64,))
    expected = mx.arange(start, start + size * step, step, dtype=dtype)
    agreement(f"arange<{name(dtype)}>", MLX, out.mx("out"), expected, reference="mx.arange (CPU)",
              compile_s=built.compile_s)


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
    built = build(metal_library("utils.h", "gated_delta_update.h"), "gated_delta_fused_chunk",
                  (mx.float32, s["dk"], s["dv"], s["hk"], s["hv"], 8), {"save_state": False})
    out = run_both(built.kernel,
                   buffers={"q": q, "k": k, "v": v, "state_in": state, "g": gamma, "beta": beta,
                            "y": new_buffer(v.shape), "state_out": new_buffer(state.shape),
                            "T": s["t"]},
                   grid=(32, s["dv"] // 8, s["b"] * s["hv"]), threads_per_threadgroup=(32, 4, 1))
    y, final = mx.fast.gated_delta_update(q, k, v, gamma, beta, state)
    ref = {"reference": "mx.fast.gated_delta_update (CPU)", "compile_s": built.compile_s}
    agreement("gated_delta_fused_chunk y", MLX, out.mx("y"), y, atol=1e-4, rtol=1e-3, **ref)
    agreement("gated_delta_fused_chunk state", MLX, out.mx("state_out"), final,
              atol=1e-4, rtol=1e-3, **ref)


def test_gated_delta_seq_with_checkpoints(agreement) -> None:
    # The sequential kernel; the function constant save_state adds the buffer of states
    # at the entry of every Ckpt-th step, which the backward pass replays from.
    s, ckpt = GDN_SHAPE, 4
    q, k, v, gamma, beta, state = _gated_delta_inputs(*s.values())
    n_ckpt = -(-s["t"] // ckpt)
    built = build(metal_library("utils.h", "gated_delta_update.h"), "gated_delta_seq",
                  (mx.float32, s["dk"], s["dv"], s["hk"], s["hv"], ckpt), {"save_state": True})
    out = run_both(built.kernel,
                   buffers={"q": q, "k": k, "v": v, "state_in": state, "g": gamma, "beta": beta,
                            "y": new_buffer(v.shape), "state_out": new_buffer(state.shape),
                            "T": s["t"],
                            "state_cache": new_buffer((s["b"] * s["hv"], n_ckpt, s["dv"],
                                                       s["dk"]))},
                   grid=(32, s["dv"], s["b"] * s["hv"]), threads_per_threadgroup=(32, 4, 1))
    y, final = mx.fast.gated_delta_update(q, k, v, gamma, beta, state)
    ref = {"reference": "mx.fast.gated_delta_update (CPU)", "compile_s": built.compile_s}
    agreement("gated_delta_seq y", MLX, out.mx("y"), y, **ref)
    agreement("gated_delta_seq state", MLX, out.mx("state_out"), final, **ref)
    # Slot j holds the state after j * ckpt steps: the final state of the first j * ckpt.
    entry = [state] + [
        mx.fast.gated_delta_update(q[:, :t], k[:, :t], v[:, :t], gamma[:, :t], beta[:, :t],
                                   state)[1]
        for t in range(ckpt, s["t"], ckpt)
    ]
    expected = mx.stack(entry, axis=2).reshape(out["state_cache"].shape)
    agreement("gated_delta_seq state_cache", MLX, out.mx("state_cache"), expected, **ref)
