"""Emulator speed against numpy on the same data, measured side by side.

Prints ratios (emulator time / numpy time) from interleaved rounds, and compile costs:
the first compile on an empty cache, a warm compile of a new small kernel, and the
overhead of a cached call of a tiny kernel.

    python bench/emulator.py [--size 16777216] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import mlx.core as mx
import numpy as np
from _timing import evaluated, interleaved, interleaved_times, paired

import mtwork

EXP = "uint i = thread_position_in_grid.x; out[i] = metal::exp(inp[i]);"

TREE_SUM = """
    threadgroup float partial[256];
    uint t = thread_position_in_threadgroup.x;
    partial[t] = inp[thread_position_in_grid.x];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = 128; s > 0; s >>= 1) {
        if (t < s) partial[t] += partial[t + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (t == 0) out[threadgroup_position_in_grid.x] = partial[0];
"""

SOFTMAX = """
    uint row = threadgroup_position_in_grid.y;
    uint lane = thread_index_in_simdgroup;
    const device float* x = inp + row * N;
    float m = -INFINITY;
    for (uint j = lane; j < N; j += 32) m = metal::max(m, x[j]);
    m = simd_max(m);
    float s = 0.0f;
    for (uint j = lane; j < N; j += 32) s += metal::exp(x[j] - m);
    s = simd_sum(s);
    for (uint j = lane; j < N; j += 32) out[row * N + j] = metal::exp(x[j] - m) / s;
"""


def report(label: str, ratios: list[float], target: float | None = None) -> None:
    med = statistics.median(ratios)
    goal = f"  (target < {target:g}x: {'met' if med < target else 'NOT met'})" if target else ""
    print(f"{label:<44} emulator/numpy = {med:6.2f}x  [min {min(ratios):.2f}, "
          f"max {max(ratios):.2f}]{goal}")


def bench_exp(n: int, rounds: int) -> None:
    """The whole call, isolated (the default: inputs copied into the worker's arena,
    outputs out of it) and in this process, each against numpy, in the same rounds."""
    x = mx.random.normal((n,))
    xn = np.array(x)
    k = mtwork.metal_kernel("bench_exp", ["inp"], ["out"], EXP)

    def emulator(isolate: bool):
        return lambda: evaluated(k(inputs=[x], grid=(n, 1, 1), threadgroup=(256, 1, 1),
                                   output_shapes=[(n,)], output_dtypes=[mx.float32],
                                   isolate=isolate))

    times = interleaved_times({"isolated": emulator(True), "in-process": emulator(False),
                               "numpy": lambda: np.exp(xn)}, rounds)
    for side in ("isolated", "in-process"):
        report(f"(a) elementwise exp, {n:,} floats, {side}",
               paired(times[side], times["numpy"]), 1.5)


def bench_tree_sum(n: int, rounds: int) -> None:
    x = mx.random.normal((n,))
    xn = np.array(x)
    k = mtwork.metal_kernel("bench_tree_sum", ["inp"], ["out"], TREE_SUM)

    def emulator():
        return evaluated(k(inputs=[x], grid=(n, 1, 1), threadgroup=(256, 1, 1),
                           output_shapes=[(n // 256,)], output_dtypes=[mx.float32]))

    report(f"(b) threadgroup tree sum, {n:,} floats", interleaved(emulator, xn.sum, rounds), 20)


def bench_softmax(n: int, rounds: int) -> None:
    cols = 1024
    rows = max(1, n // cols)
    x = mx.random.normal((rows, cols))
    xn = np.array(x)
    k = mtwork.metal_kernel("bench_softmax", ["inp"], ["out"], SOFTMAX)

    def emulator():
        return evaluated(k(inputs=[x], template=[("N", cols)], grid=(32, rows, 1),
                           threadgroup=(32, 1, 1), output_shapes=[(rows, cols)],
                           output_dtypes=[mx.float32]))

    def numpy_softmax():
        e = np.exp(xn - xn.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    report(f"(c) row softmax (simd_max/simd_sum), {rows}x{cols}",
           interleaved(emulator, numpy_softmax, rounds))


# One SIMD-group computes a 32x32 tile of C = A B as 4x4 simdgroup_matrix fragments.
GEMM = """
    uint row0 = threadgroup_position_in_grid.y * 32, col0 = threadgroup_position_in_grid.x * 32;
    simdgroup_float8x8 acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    for (uint k = 0; k < K; k += 8) {
        simdgroup_float8x8 a[4], b[4];
        for (int i = 0; i < 4; ++i) {
            simdgroup_load(a[i], A, K, ulong2(k, row0 + 8 * i));
            simdgroup_load(b[i], B, N, ulong2(col0 + 8 * i, k));
        }
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j)
                simdgroup_multiply_accumulate(acc[i][j], a[i], b[j], acc[i][j]);
    }
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j)
            simdgroup_store(acc[i][j], C, N, ulong2(col0 + 8 * j, row0 + 8 * i));
"""


def bench_gated_delta_decode(rounds: int) -> None:
    """mtwork's sequential gated-delta kernel (two simd_sum per token and value row) for one
    decode step, against the same step in numpy."""
    family = mtwork.load_family("gated_delta")
    problem = family.Problem(batch=1, tokens=1, key_heads=8, value_heads=16, dk=128, dv=128)
    inputs = family.make_inputs(problem)
    q, k, v, g, beta, state = (np.array(a) for a in inputs)
    groups = problem.value_heads // problem.key_heads

    def numpy_step():
        kh, qh = np.repeat(k[0, 0], groups, axis=0), np.repeat(q[0, 0], groups, axis=0)
        s = state[0] * g[0, 0][:, None, None]
        delta = (v[0, 0] - np.einsum("hvk,hk->hv", s, kh)) * beta[0, 0][:, None]
        s = s + delta[:, :, None] * kh[:, None, :]
        return np.einsum("hvk,hk->hv", s, qh), s

    report("simd_sum-heavy gated-delta decode, Hv=16 D=128",
           interleaved(lambda: family.run("seq", inputs), numpy_step, rounds))


def bench_simdgroup_gemm(size: int, rounds: int) -> None:
    a = mx.random.normal((size, size))
    b = mx.random.normal((size, size))
    an, bn = np.array(a), np.array(b)
    k = mtwork.metal_kernel("bench_gemm", ["A", "B"], ["C"], GEMM)

    def emulator():
        return evaluated(k(inputs=[a, b], template=[("K", size), ("N", size)],
                           grid=(32 * size // 32, size // 32, 1), threadgroup=(32, 1, 1),
                           output_shapes=[(size, size)], output_dtypes=[mx.float32]))

    out = emulator()[0]
    assert mtwork.diff(out, an.astype(np.float64) @ bn).ok
    start = time.perf_counter()
    emulator()
    seconds = time.perf_counter() - start
    cores = os.cpu_count() or 1
    gflops = 2 * size**3 / seconds / 1e9
    report(f"simdgroup_matrix GEMM f32 {size}^3", interleaved(emulator, lambda: an @ bn, rounds))
    print(f"{'':<44} {gflops:.2f} GFLOP/s, {gflops / cores:.2f} per core "
          f"(target >= 1 per core: {'met' if gflops / cores >= 1 else 'NOT met'})")


def sanitizer_overhead(n: int, rounds: int) -> None:
    """Sanitized runs against plain runs of the same kernels (target: at most 20x)."""
    x = mx.random.normal((n,))
    cases = {
        "exp": (EXP, dict(grid=(n, 1, 1), output_shapes=[(n,)])),
        "tree sum": (TREE_SUM, dict(grid=(n, 1, 1), output_shapes=[(n // 256,)])),
        "softmax": (SOFTMAX, dict(template=[("N", 1024)], grid=(32, n // 1024, 1),
                                  threadgroup=(32, 1, 1), output_shapes=[(n // 1024, 1024)])),
    }
    for label, (body, extra) in cases.items():
        k = mtwork.metal_kernel(f"bench_sanitize_{label.replace(' ', '_')}", ["inp"], ["out"],
                                body)
        call = {"inputs": [x.reshape(-1, 1024) if label == "softmax" else x],
                "threadgroup": (256, 1, 1), "output_dtypes": [mx.float32], **extra}

        def sanitized(k=k, call=call):
            return evaluated(k(**call, sanitize=True))

        def plain(k=k, call=call):
            return evaluated(k(**call))

        ratios = interleaved(sanitized, plain, rounds)
        med = statistics.median(ratios)
        print(f"sanitizer overhead, {label:<10} {n:,} elements   sanitized/plain = {med:6.2f}x "
              f"[min {min(ratios):.2f}, max {max(ratios):.2f}]  (target <= 20x: "
              f"{'met' if med <= 20 else 'NOT met'})")


def simd_collective_ns(simdgroups: int = 256, repeats: int = 200) -> float:
    """Time of one simd_sum over a whole SIMD-group, from a loop of dependent reductions."""
    k = mtwork.metal_kernel("bench_collective", ["inp"], ["out"], """
        float x = inp[thread_position_in_grid.x];
        for (int r = 0; r < R; ++r) x = simd_sum(x) * 0.03125f;
        out[thread_position_in_grid.x] = x;
    """)

    def run(r: int) -> float:
        x = mx.ones((simdgroups * 32,))
        call = dict(inputs=[x], template=[("R", r)], grid=(simdgroups * 32, 1, 1),
                    threadgroup=(256, 1, 1), output_shapes=[x.shape],
                    output_dtypes=[mx.float32])
        evaluated(k(**call))
        start = time.perf_counter()
        evaluated(k(**call))
        return time.perf_counter() - start

    cores = os.cpu_count() or 1
    # Subtract the loop-free cost; cores run SIMD-groups in parallel, so scale back.
    per = (run(repeats) - run(0)) / (repeats * simdgroups) * min(cores, simdgroups // 8)
    return per * 1e9


def first_compile_seconds() -> float:
    """A new process with an empty cache compiles one kernel: runtime, headers, kernel."""
    code = (
        "import time, mlx.core as mx, mtwork; t = time.perf_counter();"
        "k = mtwork.metal_kernel('first', ['a'], ['o'], 'o[0] = a[0];');"
        "mx.eval(k(inputs=[mx.zeros((1,))], grid=(1,1,1), threadgroup=(1,1,1),"
        " output_shapes=[(1,)], output_dtypes=[mx.float32]));"
        "print(time.perf_counter() - t)"
    )
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "MTWORK_CACHE_DIR": cache, "MTWORK_BACKEND": "sim"}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def warm_compile_seconds(samples: int = 3) -> float:
    times = []
    for _ in range(samples):
        body = f"o[thread_position_in_grid.x] = a[0] * 2.0f; // {uuid.uuid4()}"
        k = mtwork.metal_kernel("warm", ["a"], ["o"], body)
        start = time.perf_counter()
        evaluated(k(inputs=[mx.zeros((1,))], grid=(32, 1, 1), threadgroup=(32, 1, 1),
                    output_shapes=[(32,)], output_dtypes=[mx.float32]))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cached_call_ms(calls: int = 200) -> float:
    k = mtwork.metal_kernel("tiny", ["a"], ["o"], "o[thread_position_in_grid.x] = a[0];")
    a = mx.zeros((1,))
    call = dict(inputs=[a], grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(32,)],
                output_dtypes=[mx.float32])
    evaluated(k(**call))
    start = time.perf_counter()
    for _ in range(calls):
        evaluated(k(**call))
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1 << 24)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("MTWORK_BACKEND", "sim")
    print(f"mtwork sim emulator vs numpy, {os.cpu_count()} cores; ratios are medians of "
          f"{args.rounds} interleaved rounds\n")
    bench_exp(args.size, args.rounds)
    bench_tree_sum(args.size, args.rounds)
    bench_softmax(args.size // 4, args.rounds)
    bench_gated_delta_decode(args.rounds)
    bench_simdgroup_gemm(512, max(1, args.rounds // 2))
    sanitizer_overhead(args.size // 16, args.rounds)
    ns = simd_collective_ns()
    print(f"one SIMD-group collective (simd_sum of 32 lanes) {ns:8.0f} ns per core "
          f"(target < 1000 ns: {'met' if ns < 1000 else 'NOT met'})")
    print()
    first = first_compile_seconds()
    print(f"first compile on an empty cache (new process)  {first:8.2f} s")
    warm = warm_compile_seconds()
    print(f"warm compile of a new small kernel             {warm:8.2f} s  "
          f"(target < 2 s: {'met' if warm < 2 else 'NOT met'})")
    call = cached_call_ms()
    print(f"cached call of a tiny kernel                   {call:8.3f} ms "
          f"(target < 1 ms: {'met' if call < 1 else 'NOT met'})")


if __name__ == "__main__":
    main()
