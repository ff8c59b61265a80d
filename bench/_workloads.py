"""The workloads of bench/vs_pocl.py: each one MSL kernel on sim, its OpenCL C twin on
PoCL (bench/vs_pocl.cl) with the same threadgroup geometry, numpy, and a float64 reference.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import _llama_cpp as llama
import mlx.core as mx
import numpy as np
from _pocl import PoCL
from _timing import evaluated
from emulator import EXP, GEMM, SOFTMAX, TREE_SUM

import mtwork


class Skipped(Exception):
    """A workload cannot run here; the message says why."""


class WrongOutput(AssertionError):
    """A side's output disagreed with the reference."""


@dataclass(frozen=True)
class Sizes:
    elements: int  # exp and tree sum
    softmax: tuple[int, int]  # rows, columns
    gemm: int  # M = N = K
    gated_delta_batch: int  # decode of one token, Hk=8 Hv=16 Dk=Dv=128
    attention: tuple[int, int]  # heads, sequence length (batch 1, head dim 64)
    mul_mv: tuple[int, int]  # M, K
    mul_mm: tuple[int, int, int]  # M, K, N


FULL = Sizes(1 << 24, (4096, 4096), 512, 8, (8, 1024), (4096, 4096), (1024, 4096, 256))
QUICK = Sizes(1 << 20, (256, 1024), 128, 1, (2, 128), (1024, 1024), (128, 512, 64))


@dataclass
class Workload:
    """Three ways to compute one thing and the float64 references of its outputs; each
    side's call returns its outputs (an array or a list) in the references' order."""

    label: str
    sim: Callable[[], Any]
    pocl: Callable[[], Any] | None
    numpy: Callable[[], Any]
    references: Sequence[np.ndarray]
    atol: float | None = None  # mtwork.diff's float32 band unless given
    rtol: float | None = None
    notes: list[str] = field(default_factory=list)

    def sides(self) -> dict[str, Callable[[], Any]]:
        out = {"sim": self.sim, "pocl": self.pocl, "numpy": self.numpy}
        return {name: fn for name, fn in out.items() if fn is not None}

    def check(self, side: str, result: Any) -> None:
        """Raises WrongOutput unless the sim or PoCL outputs match the references."""
        if side == "numpy":
            return
        outputs = result if isinstance(result, (list, tuple)) else [result]
        if len(outputs) != len(self.references):
            raise WrongOutput(f"the {side} side returned {len(outputs)} outputs, not "
                              f"{len(self.references)}")
        for actual, expected in zip(outputs, self.references):
            actual = np.asarray(actual, dtype=np.float32).reshape(expected.shape)
            report = mtwork.diff(actual, expected, atol=self.atol, rtol=self.rtol)
            if not report.ok:
                raise WrongOutput(f"the {side} output is wrong:\n{report}")


def _normal(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _cl(pocl: PoCL | None, name: str, global_size: Sequence[int], local_size: Sequence[int],
        inputs: Sequence[np.ndarray], outputs: Sequence[tuple[int, ...]],
        scalars: Sequence[np.generic] = ()):
    """The PoCL side. Kernel arguments: the `inputs` (copied once into device buffers), one
    float32 output buffer per shape in `outputs`, then `scalars` (numpy scalars of the
    kernel's types), the order every kernel of vs_pocl.cl declares."""
    if pocl is None:
        return None
    outs = [pocl.output(shape) for shape in outputs]
    args = [*(pocl.to_device(a) for a in inputs), *(o.buffer for o in outs), *scalars]
    return pocl.launcher(name, global_size, local_size, args, outs)


def _body_kernel(name: str, input_names: list[str], output_names: list[str], source: str,
                 **call: Any) -> Callable[[], list[mx.array]]:
    kernel = mtwork.metal_kernel(name, input_names, output_names, source)

    return lambda: evaluated(kernel(**call))


# --- 1, 2: elementwise and a threadgroup tree -----------------------------------------------


def exp(sizes: Sizes, pocl: PoCL | None) -> Workload:
    n = sizes.elements
    x = _normal(n)
    sim = _body_kernel("bench_exp", ["inp"], ["out"], EXP, inputs=[mx.array(x)],
                       grid=(n, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(n,)],
                       output_dtypes=[mx.float32])
    return Workload(f"exp, {n:,} f32", sim, _cl(pocl, "exp_f32", (n,), (256,), [x], [(n,)]),
                    lambda: np.exp(x), [np.exp(x.astype(np.float64))])


MULTIPLY_ADD = "uint i = thread_position_in_grid.x; out[i] = a[i] * b[i] + c[i];"


def multiply_add(sizes: Sizes, pocl: PoCL | None) -> Workload:
    """a * b + c, rounded after each operation on every side (math mode "safe", OpenCL's
    FP_CONTRACT off, numpy's two operations)."""
    n = sizes.elements
    a, b, c = (_normal(n, seed=k) for k in range(3))
    sim = _body_kernel("bench_multiply_add", ["a", "b", "c"], ["out"], MULTIPLY_ADD,
                       inputs=[mx.array(a), mx.array(b), mx.array(c)], grid=(n, 1, 1),
                       threadgroup=(256, 1, 1), output_shapes=[(n,)],
                       output_dtypes=[mx.float32])
    wide = [v.astype(np.float64) for v in (a, b, c)]
    return Workload(f"a * b + c, {n:,} f32", sim,
                    _cl(pocl, "multiply_add_f32", (n,), (256,), [a, b, c], [(n,)]),
                    lambda: a * b + c, [wide[0] * wide[1] + wide[2]])


def tree_sum(sizes: Sizes, pocl: PoCL | None) -> Workload:
    n = sizes.elements
    x = _normal(n)
    sim = _body_kernel("bench_tree_sum", ["inp"], ["out"], TREE_SUM, inputs=[mx.array(x)],
                       grid=(n, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(n // 256,)],
                       output_dtypes=[mx.float32])
    blocks = x.reshape(-1, 256)
    return Workload(f"threadgroup tree sum, {n:,} f32 / 256", sim,
                    _cl(pocl, "tree_sum_256", (n,), (256,), [x], [(n // 256,)]),
                    lambda: blocks.sum(axis=1), [blocks.astype(np.float64).sum(axis=1)])


# --- 3, 5: row softmax with threadgroup reductions, and with SIMD-group reductions --------

SOFTMAX_TG = """
    threadgroup float part[256];
    uint row = threadgroup_position_in_grid.y;
    uint t = thread_position_in_threadgroup.x;
    const device float* x = inp + row * N;
    float m = -INFINITY;
    for (uint j = t; j < N; j += 256) m = metal::max(m, x[j]);
    part[t] = m;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = 128; s > 0; s >>= 1) {
        if (t < s) part[t] = metal::max(part[t], part[t + s]);
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    m = part[0];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float sum = 0.0f;
    for (uint j = t; j < N; j += 256) sum += metal::exp(x[j] - m);
    part[t] = sum;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = 128; s > 0; s >>= 1) {
        if (t < s) part[t] += part[t + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    sum = part[0];
    for (uint j = t; j < N; j += 256) out[row * N + j] = metal::exp(x[j] - m) / sum;
"""


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _softmax_workload(label: str, sizes: Sizes, pocl: PoCL | None, source: str,
                      width: int, cl_name: str) -> Workload:
    rows, cols = sizes.softmax
    x = _normal(rows, cols)
    sim = _body_kernel(f"bench_softmax_{width}", ["inp"], ["out"], source,
                       inputs=[mx.array(x)], template=[("N", cols)], grid=(width, rows, 1),
                       threadgroup=(width, 1, 1), output_shapes=[(rows, cols)],
                       output_dtypes=[mx.float32])
    cl = _cl(pocl, cl_name, (width, rows), (width, 1), [x], [(rows, cols)],
             [np.uint32(cols)])
    # Each output is near 1/cols: an absolute band of 1e-4 would pass nonsense.
    return Workload(f"{label}, {rows}x{cols}", sim, cl, lambda: _softmax(x),
                    [_softmax(x.astype(np.float64))], atol=1e-8)


def softmax_threadgroup(sizes: Sizes, pocl: PoCL | None) -> Workload:
    return _softmax_workload("row softmax, 256-thread tree", sizes, pocl, SOFTMAX_TG, 256,
                             "softmax_tg256")


def softmax_simd(sizes: Sizes, pocl: PoCL | None) -> Workload:
    workload = _softmax_workload("row softmax, simd_max/simd_sum", sizes, pocl, SOFTMAX, 32,
                                 "softmax_row32")
    workload.notes += _reduction_notes(pocl)
    return workload


def _reduction_notes(pocl: PoCL | None) -> list[str]:
    """How the OpenCL side does what simd_sum and simd_max do."""
    if pocl is None:
        return []
    if pocl.has_subgroups:
        return ["OpenCL side reduces 32 work-items with sub_group_reduce_add/max"]
    return ["this PoCL has no cl_khr_subgroups: the OpenCL side reduces the 32 work-items "
            "of a row in local memory (a 5-step tree with barriers)"]


# --- 4, 6: GEMM with threadgroup tiles, and with simdgroup_matrix fragments ----------------

GEMM_TILED = """
    threadgroup float a_tile[16][16];
    threadgroup float b_tile[16][16];
    uint tx = thread_position_in_threadgroup.x, ty = thread_position_in_threadgroup.y;
    uint col = thread_position_in_grid.x, row = thread_position_in_grid.y;
    float acc = 0.0f;
    for (uint k0 = 0; k0 < K; k0 += 16) {
        a_tile[ty][tx] = A[row * K + k0 + tx];
        b_tile[ty][tx] = B[(k0 + ty) * N + col];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint k = 0; k < 16; ++k) acc += a_tile[ty][k] * b_tile[k][tx];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    C[row * N + col] = acc;
"""


def _gemm_workload(label: str, sizes: Sizes, pocl: PoCL | None, source: str,
                   grid: tuple[int, int], threadgroup: tuple[int, int],
                   cl_name: str) -> Workload:
    n = sizes.gemm
    a, b = _normal(n, n, seed=1), _normal(n, n, seed=2)
    sim = _body_kernel(f"bench_vs_{cl_name}", ["A", "B"], ["C"], source,
                       inputs=[mx.array(a), mx.array(b)], template=[("K", n), ("N", n)],
                       grid=(*grid, 1), threadgroup=(*threadgroup, 1),
                       output_shapes=[(n, n)], output_dtypes=[mx.float32])
    cl = _cl(pocl, cl_name, grid, threadgroup, [a, b], [(n, n)], [np.uint32(n), np.uint32(n)])
    return Workload(f"{label}, {n}^3 f32", sim, cl, lambda: a @ b,
                    [a.astype(np.float64) @ b.astype(np.float64)],
                    notes=["numpy side: BLAS sgemm"])


def gemm_tiled(sizes: Sizes, pocl: PoCL | None) -> Workload:
    n = sizes.gemm
    return _gemm_workload("GEMM, 16x16 threadgroup tiles", sizes, pocl, GEMM_TILED, (n, n),
                          (16, 16), "gemm_tiled16")


def gemm_simdgroup(sizes: Sizes, pocl: PoCL | None) -> Workload:
    n = sizes.gemm
    workload = _gemm_workload("GEMM, simdgroup_matrix 8x8", sizes, pocl, GEMM, (n, n // 32),
                              (32, 1), "gemm_block32")
    workload.notes.insert(0, "OpenCL side: the same 32x32 tile per 32 work-items, each "
                             "holding a 4x8 register block (float8 rows) instead of 8x8 "
                             "fragments, operands read from global memory as simdgroup_load "
                             "does")
    return workload


# --- 7: gated-delta decode ------------------------------------------------------------------


def gated_delta(sizes: Sizes, pocl: PoCL | None) -> Workload:
    family = mtwork.load_family("gated_delta")
    problem = family.Problem(batch=sizes.gated_delta_batch, tokens=1, key_heads=8,
                             value_heads=16, dk=128, dv=128)  # vs_pocl.cl's GD_DK, GD_DV
    inputs = family.make_inputs(problem)
    q, k, v, g, beta, state = (np.array(a) for a in inputs)
    p, groups = problem, problem.value_heads // problem.key_heads
    bh = p.batch * p.value_heads

    def numpy_step():
        kh, qh = np.repeat(k[:, 0], groups, axis=1), np.repeat(q[:, 0], groups, axis=1)
        s = state * g[:, 0][:, :, None, None]
        delta = (v[:, 0] - np.einsum("bhvk,bhk->bhv", s, kh)) * beta[:, 0][:, :, None]
        s = s + delta[..., None] * kh[:, :, None, :]
        return np.einsum("bhvk,bhk->bhv", s, qh), s

    cl = _cl(pocl, "gated_delta_seq", (32, p.dv, bh), (32, 4, 1), [q, k, v, g, beta, state],
             [v.shape, state.shape],
             [np.int32(p.tokens), np.int32(p.key_heads), np.int32(p.value_heads)])
    return Workload(f"gated-delta decode, B={p.batch} Hv=16 D=128", lambda: family.run(
        "seq", inputs), cl, numpy_step, list(family.recurrence(q, k, v, g, beta, state)),
        notes=["two 32-lane sums a value row and token", *_reduction_notes(pocl)])


# --- 8: a flash-attention tile --------------------------------------------------------------


def flash_attention(sizes: Sizes, pocl: PoCL | None) -> Workload:
    family = mtwork.load_family("flash_attention")
    heads, length = sizes.attention
    shape = family.Shape(batch=1, heads=heads, q_len=length, kv_len=length, head_dim=64)
    tiles = family.Tiles(block_q=16, block_k=16, simdgroups=2)  # vs_pocl.cl's FA_* values
    inputs = family.make_inputs(shape)
    launch = family.flash_launch(shape, mx.float32, tiles=tiles)
    q, k, v = (np.array(a) for a in inputs[:3])
    scale = np.float32(shape.scale)

    def numpy_attention():
        s = q @ k.transpose(0, 1, 3, 2) * scale
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return ((e / e.sum(axis=-1, keepdims=True)) @ v).transpose(0, 2, 1, 3)

    groups = -(-length // tiles.block_q)
    cl = _cl(pocl, "flash_attention", (groups * tiles.threads, heads, 1),
             (tiles.threads, 1, 1), [q, k, v], [shape.out_shape],
             [np.int32(heads), np.int32(length), np.int32(length), scale])
    gflop = shape.flops() / 1e9
    return Workload(f"flash attention, H={heads} L={length} D=64", lambda: launch(*inputs),
                    cl, numpy_attention, [family.attention_reference(*inputs)],
                    notes=[f"{gflop:.2g} GFLOP a call; BQ=BK=16, 2 SIMD-groups; OpenCL side: "
                           "4 work-items a query row, scores through local memory"])


# --- 9: llama.cpp's q4_0 kernels ------------------------------------------------------------


def _q4_0(label: str, shape: llama.MatMul, pocl: PoCL | None, sim_of: Callable[..., Any],
          cl_name: str, global_size: tuple[int, int], local_size: tuple[int, int],
          rtol: float | None, notes: list[str]) -> Workload:
    try:
        import gguf  # noqa: F401 - its quantiser and dequantiser make the data and reference
    except ImportError as exc:
        raise Skipped("the gguf package is not installed (pip install gguf)") from exc
    weights = llama.quantize(_normal(shape.m, shape.k, seed=3))
    x = _normal(shape.n, shape.k, seed=4)
    try:
        sim = sim_of(llama.ggml_src(), shape, weights, x)
    except llama.Unavailable as exc:
        raise Skipped(str(exc)) from exc
    reference = llama.reference(weights, x)
    cl = _cl(pocl, cl_name, global_size, local_size, [weights, x], [(shape.n, shape.m)],
             [np.int32(shape.k), np.int32(shape.m)])
    # Sums of K products: the absolute band follows the outputs' scale.
    atol = (rtol or 1e-5) * float(np.abs(reference).max())
    return Workload(label, sim, cl, llama.numpy_matmul(weights, x), [reference], atol=atol,
                    rtol=rtol, notes=["numpy side: dequantise every block, then BLAS sgemm",
                                      *notes])


def q4_0_mul_mv(sizes: Sizes, pocl: PoCL | None) -> Workload:
    m, k = sizes.mul_mv
    return _q4_0(f"llama.cpp q4_0 mul_mv, {m}x{k}", llama.MatMul(m, k, 1), pocl,
                 llama.mul_mv_sim, "mul_mv_q4_0", (m // 8 * 32, 2), (32, 2), None,
                 ["OpenCL side: 2 row groups of 32 a work-group, 4 rows each, half a block "
                  "a work-item, sums through local memory"])


def q4_0_mul_mm(sizes: Sizes, pocl: PoCL | None) -> Workload:
    m, k, n = sizes.mul_mm
    # Both sides round the weights and x to half in their tiles.
    return _q4_0(f"llama.cpp q4_0 mul_mm, {m}x{k} by {n}", llama.MatMul(m, k, n), pocl,
                 llama.mul_mm_sim, "mul_mm_q4_0", (n // 32 * 128, m // 64), (128, 1), 5e-3,
                 ["OpenCL side: 64x32 tiles, 128 work-items with 4x4 register blocks, "
                  "half tiles in local memory"])


BUILDERS: dict[str, Callable[[Sizes, PoCL | None], Workload]] = {
    "exp": exp,
    "multiply_add": multiply_add,
    "tree_sum": tree_sum,
    "softmax": softmax_threadgroup,
    "gemm": gemm_tiled,
    "simd_softmax": softmax_simd,
    "simdgroup_gemm": gemm_simdgroup,
    "gated_delta": gated_delta,
    "flash_attention": flash_attention,
    "q4_0_mul_mv": q4_0_mul_mv,
    "q4_0_mul_mm": q4_0_mul_mm,
}


def parse_arguments(description: str) -> argparse.Namespace:
    """The command line the PoCL benchmarks share: --quick, --rounds, --only, --pocl."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="small problems, a fast run")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--only", nargs="+", choices=list(BUILDERS),
                        metavar="NAME", help=f"workloads to run: {', '.join(BUILDERS)}")
    parser.add_argument("--pocl", metavar="TEXT",
                        help="use the PoCL platform whose name or version contains TEXT")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    return args
