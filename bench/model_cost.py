"""What the GPU model costs a sweep: the same sweep with the model (the default chip) and
without it (`gpu=False`), side by side in interleaved rounds whose starting side rotates.

Two sweeps a user waits for: the gated-delta notebook's WY sweep (chunk x rows at its
timed prefill, 3 rounds a setting) and a tiled GEMM over tile sizes and outputs per thread
(256^3, 3 rounds a setting). Each round's sweeps get inputs of their own (a seed per
round, new to each run), so the model counts every setting afresh (counters are kept by
argument values, in the process and the cache folder: a repeated configuration is never
counted twice, which would make the model free); the compile cache is warm after the
first, untimed round. The kernels run as a user runs them (in the worker process,
`$MTWORK_SIM_ENGINE` as set). Printed: each side's median time, then with/without per
round (median [min, max]); the target is at most 1.5.

    python bench/model_cost.py [--rounds 3] [--only wy gemm]
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Run as a script, Python puts bench/ first on the path: put this checkout's root first
# so `mtwork` is the one beside this file, not another installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from _timing import Spread, interleaved_times, paired  # noqa: E402

import mtwork  # noqa: E402

TARGET = 1.5
GEMM_SIZE = 256
# C = A B, a TILE x TILE tile of C per threadgroup, each thread WORK outputs of a row.
TILED_GEMM = """
    threadgroup float a_tile[TILE][TILE];
    threadgroup float b_tile[TILE][TILE * WORK];
    uint tx = thread_position_in_threadgroup.x, ty = thread_position_in_threadgroup.y;
    uint row = threadgroup_position_in_grid.y * TILE + ty;
    uint col0 = threadgroup_position_in_grid.x * TILE * WORK;
    float acc[WORK] = {};
    for (uint k0 = 0; k0 < N; k0 += TILE) {
        a_tile[ty][tx] = A[row * N + k0 + tx];
        for (uint w = 0; w < WORK; ++w)
            b_tile[ty][tx + w * TILE] = B[(k0 + ty) * N + col0 + tx + w * TILE];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint k = 0; k < TILE; ++k)
            for (uint w = 0; w < WORK; ++w) acc[w] += a_tile[ty][k] * b_tile[k][tx + w * TILE];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    for (uint w = 0; w < WORK; ++w) C[row * N + col0 + tx + w * TILE] = acc[w];
"""


def wy_sweep(seed: int, gpu: Any) -> Any:
    family = mtwork.load_family("gated_delta")
    problem = family.Problem(1, 256, 1, 4, dk=64, dv=64)
    inputs = family.make_inputs(problem, mx.float32, seed=seed)
    return mtwork.sweep(
        lambda c: family.wy_launch(problem, mx.float32, chunk=c["chunk"], rows=c["rows"]),
        {"chunk": [4, 8, 16, 32], "rows": [1, 2, 4, 8]}, inputs=list(inputs),
        oracle=lambda *arrays: list(family.recurrence(*arrays)),
        constraints=family.wy_constraints(problem), rounds=3, warmup=1, progress=False,
        gpu=gpu)


GEMM_KERNEL = mtwork.metal_kernel("bench_model_cost_gemm", ["A", "B"], ["C"], TILED_GEMM)


def gemm_sweep(seed: int, gpu: Any) -> Any:
    n = GEMM_SIZE
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))

    def build(c: dict) -> mtwork.Launch:
        t, w = c["tile"], c["work"]
        return mtwork.Launch(GEMM_KERNEL, grid=(n // w, n, 1), threadgroup=(t, t, 1),
                             template=[("TILE", t), ("WORK", w), ("N", n)],
                             output_shapes=[(n, n)], output_dtypes=[mx.float32])

    return mtwork.sweep(build, {"tile": [8, 16, 32], "work": [1, 2]},
                        inputs=[mx.array(a), mx.array(b)],
                        oracle=lambda x, y: np.asarray(x, np.float64) @ np.asarray(y, np.float64),
                        rounds=3, warmup=1, progress=False, gpu=gpu)


SWEEPS: dict[str, tuple[str, Callable[[int, Any], Any]]] = {
    "wy": ("gated-delta WY, 256 tokens: chunk x rows", wy_sweep),
    "gemm": (f"tiled GEMM {GEMM_SIZE}^3: tile x outputs per thread", gemm_sweep),
}


def measure(sweep: Callable[[int, Any], Any], rounds: int) -> tuple[dict[str, list[float]],
                                                                   int]:
    # Seeds new to this run: counters are kept in the cache folder too, so seeds an
    # earlier run used would find their settings counted already and make the model free.
    base = secrets.randbits(31)
    seeds = iter(range(base, base + 2 * (rounds + 1)))
    settings = []

    def side(gpu: Any) -> Callable[[], None]:
        def run() -> None:
            result = sweep(next(seeds), gpu)
            assert not result.failed, str(result)
            settings.append(len([r for r in result.records if r.ok]))
        return run

    times = interleaved_times({"with the model": side(None), "without": side(False)},
                              rounds, warmup=1)
    return times, settings[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=sorted(SWEEPS), default=list(SWEEPS))
    args = parser.parse_args()
    os.environ.setdefault("MTWORK_BACKEND", "sim")
    print(f"mtwork from {Path(mtwork.__file__).parent}; {os.cpu_count()} cores; "
          f"$MTWORK_SIM_ENGINE={os.environ.get('MTWORK_SIM_ENGINE', 'auto')}; medians of "
          f"{args.rounds} interleaved rounds after one untimed round\n")
    print(f"{'sweep':<48} {'settings':>8} {'with model':>11} {'without':>9} "
          f"{'with/without':>24}  target <= {TARGET}")
    for name in args.only:
        label, sweep = SWEEPS[name]
        times, settings = measure(sweep, args.rounds)
        ratio = Spread.of(paired(times["with the model"], times["without"]))
        verdict = "met" if ratio.median <= TARGET else "not met"
        print(f"{label:<48} {settings:>8} "
              f"{Spread.of(times['with the model']).time_text():>11} "
              f"{Spread.of(times['without']).time_text():>9} {ratio.ratio_text():>24}  "
              f"{verdict}", flush=True)


if __name__ == "__main__":
    main()
