"""What Metal's shader logging costs on sim: nothing for a kernel that does not log, and
how much for one that does.

1. A kernel without logging, called with its log kept (the default: the dispatch gets a
   log, which the kernel never writes) and with `log=False` (no log at all): a tiny call
   (256 floats, timed in batches) and a large one (16M floats), isolated and in-process.
2. A log line that never fires (`if (x < -1e30) os_log_default.log(...)`) against the
   same kernel without it: what a dormant logging call costs the plain loops.
3. A kernel that logs from every one of 65,536 threads against the same call with
   `log=False` (the same library, its logging calls doing nothing, on the plain loops):
   the price per message, fibers and printing into the log included.
4. Compiling a kernel with a logging call against the same kernel without one (a fresh
   build each round: a comment makes each text new).

Every pair runs interleaved round by round; ratios are per-round pairs, median [min, max].

    python bench/shader_logging.py [--rounds 7] [--size 16777216]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

# Run as a script, Python puts bench/ first on the path: put this checkout's root first
# so `mtwork` is the one beside this file, not another installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from _timing import Spread, evaluated, interleaved_times, paired, seconds_text  # noqa: E402

import mtwork  # noqa: E402
from mtwork.backends.sim import SimBackend  # noqa: E402

PLAIN = "uint i = thread_position_in_grid.x;\nout[i] = exp(inp[i]) * 0.5f;\n"
DORMANT = ("uint i = thread_position_in_grid.x;\nfloat x = inp[i];\n"
           'if (x < -1e30f) os_log_default.log("x=%f at %u", x, i);\n'
           "out[i] = exp(x) * 0.5f;\n")
EVERY = ("uint i = thread_position_in_grid.x;\nfloat x = inp[i];\n"
         'os_log_default.log("x=%f at %u", x, i);\nout[i] = exp(x) * 0.5f;\n')
BATCH = 50  # tiny calls timed together


def caller(kernel, x, **extra):
    n = x.size
    call = dict(inputs=[x], output_shapes=[(n,)], output_dtypes=[mx.float32],
                grid=(n, 1, 1), threadgroup=(256, 1, 1), **extra)
    return lambda: evaluated(kernel(**call))


def batched(call, times: int):
    def run():
        for _ in range(times):
            out = call()
        return out
    return run


def ratio(times: dict, a: str, b: str) -> str:
    return Spread.of(paired(times[a], times[b])).ratio_text()


def same_outputs(*calls) -> None:
    first = np.array(calls[0]()[0])
    for call in calls[1:]:
        if np.array(call()[0]).tobytes() != first.tobytes():
            raise SystemExit("the sides' outputs differ: the benchmark compares unlike calls")


def cpu_times(sides: dict, rounds: int) -> dict[str, list[float]]:
    """CPU seconds of this process (its threads: the runtime's workers in-process) per
    call of each side, interleaved as `interleaved_times` does: steadier than wall time
    on a loaded machine."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for r in range(rounds):
        for name in names[r % 2:] + names[:r % 2]:
            start = time.process_time()
            sides[name]()
            times[name].append(time.process_time() - start)
    return times


def unused(rounds: int, size: int) -> None:
    print("1. a kernel without logging: log kept (default) / log=False, wall and CPU time")
    plain = mtwork.metal_kernel("bench_log_plain", ["inp"], ["out"], PLAIN)
    for label, n, times in (("256 floats, x50", 256, BATCH), (f"{size:,} floats", size, 1)):
        x = mx.random.normal((n,))
        for isolate in (True, False):
            kept, off = (caller(plain, x, isolate=isolate, log=log) for log in (None, False))
            same_outputs(kept, off)
            sides = {"kept": batched(kept, times), "off": batched(off, times)}
            wall = interleaved_times(sides, rounds)
            cpu = cpu_times(sides, rounds)
            where = "isolated  " if isolate else "in-process"
            print(f"   {label:<17} {where}  wall {ratio(wall, 'kept', 'off'):>22}   "
                  f"CPU {ratio(cpu, 'kept', 'off'):>22}   "
                  f"(a call {seconds_text(Spread.of(wall['kept']).median / times)})")


def dormant(rounds: int, size: int) -> None:
    print("\n2. a log line that never fires / the same kernel without it "
          f"({size:,} floats, in-process)")
    x = mx.random.normal((size,))
    with_line = caller(mtwork.metal_kernel("bench_log_dormant", ["inp"], ["out"], DORMANT),
                       x, isolate=False)
    without = caller(mtwork.metal_kernel("bench_log_without", ["inp"], ["out"], PLAIN), x,
                     isolate=False)
    same_outputs(with_line, without)
    t = interleaved_times({"with": with_line, "without": without}, rounds)
    print(f"   {'ratio':<33} {ratio(t, 'with', 'without'):>24}   "
          f"(without: {seconds_text(Spread.of(t['without']).median)})")


def every_thread(rounds: int) -> None:
    n = 1 << 16
    print(f"\n3. every thread logs ({n:,} messages) / log=False (in-process)")
    os.environ["MTWORK_LOG_BUFFER_SIZE"] = str(16 << 20)
    kernel = mtwork.metal_kernel("bench_log_every", ["inp"], ["out"], EVERY)
    x = mx.random.normal((n,))
    logged, off = (caller(kernel, x, isolate=False, log=log) for log in (None, False))
    same_outputs(logged, off)
    t = interleaved_times({"logged": logged, "off": off}, rounds)
    logged()
    if len(kernel.last_log) + kernel.last_log.dropped != n or kernel.last_log.dropped:
        raise SystemExit(f"expected {n} messages kept, got {kernel.last_log.summary()}")
    extra = Spread.of([a - b for a, b in zip(t["logged"], t["off"])])
    print(f"   {'ratio':<33} {ratio(t, 'logged', 'off'):>24}   "
          f"(logged {seconds_text(Spread.of(t['logged']).median)}, "
          f"{seconds_text(extra.median / n)} a message)")


def compiling(rounds: int) -> None:
    print("\n4. compiling a kernel with a logging call / without (a new build each round)")
    backend, serial = SimBackend(), itertools.count()

    def build(body: str):
        def run():
            text = f"// build {os.getpid()}-{next(serial)}-{time.time_ns()}\n{body}"
            kernel = mtwork.metal_kernel("bench_log_compile", ["inp"], ["out"], text)
            backend.compile(kernel.program(kernel.generate([mx.zeros(256)], [mx.float32])))
        return run

    t = interleaved_times({"logging": build(DORMANT), "plain": build(PLAIN)}, rounds)
    print(f"   {'ratio':<33} {ratio(t, 'logging', 'plain'):>24}   "
          f"(plain {seconds_text(Spread.of(t['plain']).median)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--size", type=int, default=1 << 24)
    args = parser.parse_args()
    os.environ.setdefault("MTWORK_BACKEND", "sim")
    os.environ["MTWORK_LOG_PRINT"] = "0"
    print(f"shader logging on sim, {os.cpu_count()} cores; medians of {args.rounds} "
          f"interleaved rounds [min, max]\n")
    unused(args.rounds, args.size)
    dormant(args.rounds, args.size)
    every_thread(args.rounds)
    compiling(max(3, args.rounds // 2))


if __name__ == "__main__":
    main()
