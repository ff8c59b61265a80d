"""What a kernel call costs as an operation of MLX's graph, side by side in one run.

For an elementwise `exp` kernel, tiny (256 floats) and large (16M floats), in this process
and isolated (in the worker process), three sides in interleaved rounds:

- operation: the call as users make it, `mx.eval(kernel(inputs=[x], ...)[0])`: an
  operation of MLX's graph, evaluated (isolated, its output is memory shared with the
  worker, written in place);
- eager: the same call made where kernels cannot be operations of MLX's graph (the graph
  layer reported unavailable, as where its extension cannot be built): it runs at the call
  and returns an `mx.array`, as calls ran before they were operations (isolated: the
  output copied out of shared memory into the array);
- mx.exp: MLX's own `exp` on the same data (MLX's CPU backend).

And, isolated, the operation given an earlier kernel's output (shared memory, read where
it is) against the operation given MLX's memory (copied in). Printed: time per call, and
the per-round ratios operation/eager, operation/mx.exp (median [min, max]).

    python bench/graph_call.py [--rounds 7] [--size 16777216] [--tiny 256]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

# The checkout this script belongs to, not whichever mtwork is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from _timing import Spread, interleaved_times, paired  # noqa: E402
from emulator import EXP  # noqa: E402

import mtwork  # noqa: E402
from mtwork import graph  # noqa: E402

# Tiny calls are timed in batches: one call is too short for the clock and the noise.
TINY_BATCH = 50


@contextlib.contextmanager
def graph_unavailable() -> Iterator[None]:
    """Kernel calls run at the call, as where the graph layer cannot be had."""
    real = graph.available
    graph.available = lambda: False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "runs kernels at the call"
            yield
    finally:
        graph.available = real


def sides(kernel: mtwork.MetalKernel, x: mx.array, isolate: bool, batch: int
          ) -> dict[str, Callable[[], mx.array]]:
    n = x.size
    call = dict(grid=(n, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(n,)],
                output_dtypes=[mx.float32], isolate=isolate)

    def repeated(one: Callable[[], mx.array]) -> Callable[[], mx.array]:
        def run() -> mx.array:
            for _ in range(batch - 1):
                one()
            return one()
        return run

    def operation() -> mx.array:
        out = kernel(inputs=[x], **call)[0]
        mx.eval(out)
        return out

    def eager() -> mx.array:
        with graph_unavailable():
            return kernel(inputs=[x], **call)[0]

    def mlx_exp() -> mx.array:
        out = mx.exp(x)
        mx.eval(out)
        return out

    return {"operation": repeated(operation), "eager": repeated(eager),
            "mx.exp": repeated(mlx_exp)}


def check(x: mx.array) -> Callable[[str, mx.array], None]:
    expected = np.exp(np.array(x).astype(np.float64))

    def same(side: str, out: mx.array) -> None:
        if not np.allclose(np.array(out), expected, rtol=2e-6, atol=0):
            raise AssertionError(f"the {side} side's output is wrong")

    return same


def row(label: str, times: dict[str, list[float]], batch: int) -> str:
    per_call = {side: Spread.of([t / batch for t in ts]) for side, ts in times.items()}
    ratios = [Spread.of(paired(times["operation"], times[other])).ratio_text()
              for other in ("eager", "mx.exp")]
    return (f"{label:<30}" + "".join(f"{per_call[s].time_text():>11}"
                                     for s in ("operation", "eager", "mx.exp"))
            + "".join(f"{r:>26}" for r in ratios))


def chained(kernel: mtwork.MetalKernel, x: mx.array, rounds: int) -> str:
    """Isolated: the operation given an earlier kernel's output against given MLX's."""
    n = x.size
    call = dict(grid=(n, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(n,)],
                output_dtypes=[mx.float32], isolate=True)
    small = x * 0.01
    shared = kernel(inputs=[small], **call)[0]  # exp(x/100): an output in shared memory
    own = mx.array(np.array(shared))  # the same values in MLX's memory
    mx.eval(shared, own)

    def given(inputs: mx.array) -> Callable[[], mx.array]:
        def run() -> mx.array:
            out = kernel(inputs=[inputs], **call)[0]
            mx.eval(out)
            return out
        return run

    times = interleaved_times({"shared": given(shared), "mlx": given(own)}, rounds)
    ratio = Spread.of(paired(times["shared"], times["mlx"])).ratio_text()
    return (f"isolated, {n:,} floats: input an earlier output "
            f"{Spread.of(times['shared']).time_text()}, input MLX's memory "
            f"{Spread.of(times['mlx']).time_text()}: shared/MLX's {ratio}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--size", type=int, default=1 << 24)
    parser.add_argument("--tiny", type=int, default=256)
    args = parser.parse_args()
    os.environ["MTWORK_BACKEND"] = "sim"
    mx.set_default_device(mx.cpu)
    kernel = mtwork.metal_kernel("bench_exp", ["inp"], ["out"], EXP)
    rng = np.random.default_rng(0)
    print(f"a kernel call as an MLX operation vs the eager call vs mx.exp, {os.cpu_count()} "
          f"cores, {args.rounds} interleaved rounds; times per call (medians), ratios "
          f"median [min, max] of per-round ratios; load average {os.getloadavg()[0]:.2f}")
    print(f"{'exp of':<30}{'operation':>11}{'eager':>11}{'mx.exp':>11}"
          f"{'operation/eager':>26}{'operation/mx.exp':>26}")
    for n, batch in ((args.tiny, TINY_BATCH), (args.size, 1)):
        x = mx.array(rng.standard_normal(n).astype(np.float32))
        for isolate in (False, True):
            times = interleaved_times(sides(kernel, x, isolate, batch), args.rounds,
                                      check=check(x))
            where = "isolated" if isolate else "in-process"
            print(row(f"{n:,} floats, {where}", times, batch), flush=True)
    x = mx.array(rng.standard_normal(args.size).astype(np.float32))
    print(chained(kernel, x, args.rounds))
    print(f"load average {os.getloadavg()[0]:.2f} after the run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
