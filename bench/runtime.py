"""The emulator runtime's own costs, measured side by side in one run.

- a threadgroup barrier, per thread (a loop of barriers against the same loop without);
- a fiber switch (a SIMD-group collective makes every lane block and resume once);
- stack probes (-fstack-clash-protection): the same kernels built with and without them,
  one with a large private array (probed page by page), one barrier-heavy tree sum.

    python bench/runtime.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import mlx.core as mx
import numpy as np

import mtwork
from mtwork.backends.sim.compile import compiler

THREADS = 256
GROUPS = 64
BARRIERS = 64
PROBE_FLAG = "-fstack-clash-protection"

BARRIER_LOOP = """
    threadgroup float shared[256];
    uint t = thread_position_in_threadgroup.x;
    float acc = inp[thread_position_in_grid.x];
    for (uint k = 0; k < ROUNDS; ++k) {
        shared[t] = acc;
        SYNC;
        acc += shared[(t + k) % 256];
    }
    out[thread_position_in_grid.x] = acc;
"""

SIMD_LOOP = """
    float acc = inp[thread_position_in_grid.x];
    for (uint k = 0; k < ROUNDS; ++k) acc = simd_sum(acc) * 0.5f;
    out[thread_position_in_grid.x] = acc;
"""

BIG_FRAME = """
    float scratch[4096];
    uint i = thread_position_in_grid.x;
    for (uint k = 0; k < 4096; k += 64) scratch[k] = inp[i] + float(k);
    float s = 0.0f;
    for (uint k = 0; k < 4096; k += 64) s += scratch[(k * 7) % 4096];
    out[i] = s;
"""

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


def timed(fn: Callable[[], object], rounds: int) -> list[float]:
    fn()  # warm-up (and compile)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def interleaved(a: Callable[[], object], b: Callable[[], object], rounds: int) -> list[float]:
    """Ratios time(a) / time(b), one per round, the side that starts alternating."""
    a(), b()
    ratios = []
    for r in range(rounds):
        times = {}
        for name, fn in ((("a", a), ("b", b)) if r % 2 == 0 else (("b", b), ("a", a))):
            start = time.perf_counter()
            fn()
            times[name] = time.perf_counter() - start
        ratios.append(times["a"] / times["b"])
    return ratios


def launcher(body: str, name: str, groups: int = GROUPS) -> Callable[[], object]:
    kernel = mtwork.metal_kernel(name, ["inp"], ["out"], body)
    n = groups * THREADS
    x = mx.array(np.random.default_rng(0).standard_normal(n).astype(np.float32))

    def run() -> object:
        outputs = kernel(inputs=[x], grid=(n, 1, 1), threadgroup=(THREADS, 1, 1),
                         output_shapes=[(n,)], output_dtypes=[mx.float32])
        mx.eval(outputs)  # an operation of MLX's graph runs when evaluated
        return outputs

    return run


def per_thread_ns(with_op: Callable[[], object], without: Callable[[], object],
                  rounds: int, ops: int) -> float:
    """Median extra time per thread and operation, in ns."""
    a = statistics.median(timed(with_op, rounds))
    b = statistics.median(timed(without, rounds))
    return (a - b) / (GROUPS * THREADS * ops) * 1e9


def with_flags(flags: tuple[str, ...], build: Callable[[], Callable[[], object]]):
    saved = compiler.COMMON_FLAGS
    compiler.COMMON_FLAGS = flags
    try:
        run = build()
        run()  # compile now, with these flags
    finally:
        compiler.COMMON_FLAGS = saved
    return run


def bench_probes(rounds: int) -> None:
    probed = compiler.COMMON_FLAGS + (() if PROBE_FLAG in compiler.COMMON_FLAGS else
                                      (PROBE_FLAG,))
    plain = tuple(f for f in compiler.COMMON_FLAGS if f != PROBE_FLAG)
    for label, body in (("16 KiB private array", BIG_FRAME), ("tree sum (barriers)", TREE_SUM)):
        tag = label.split()[0]
        a = with_flags(probed, lambda b=body, t=tag: launcher(f"// probed\n{b}", f"p_{t}"))
        b = with_flags(plain, lambda b=body, t=tag: launcher(f"// plain\n{b}", f"n_{t}"))
        ratios = interleaved(a, b, rounds)
        print(f"stack probes, {label:<24} probed/plain = {statistics.median(ratios):5.3f}x "
              f"[min {min(ratios):.3f}, max {max(ratios):.3f}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rounds = args.rounds
    loop = BARRIER_LOOP.replace("ROUNDS", str(BARRIERS))
    barrier = per_thread_ns(
        launcher(loop.replace("SYNC", "threadgroup_barrier(mem_flags::mem_threadgroup)"),
                 "barrier_loop"),
        launcher(loop.replace("SYNC", "(void)0"), "no_barrier_loop"), rounds, BARRIERS)
    print(f"threadgroup barrier: {barrier:7.1f} ns per thread "
          f"({THREADS} threads a threadgroup, {GROUPS} threadgroups, wall time on all cores)")
    simd = per_thread_ns(launcher(SIMD_LOOP.replace("ROUNDS", str(BARRIERS)), "simd_loop"),
                         launcher(SIMD_LOOP.replace("ROUNDS", "0"), "simd_none"), rounds,
                         BARRIERS)
    print(f"SIMD-group collective (a fiber switch per lane): {simd:7.1f} ns per thread")
    bench_probes(rounds)


if __name__ == "__main__":
    main()
