"""The emulator's two engines against PoCL and numpy: vs_pocl.py's workloads, each run as
MSL on sim's fiber engine ($MTWORK_SIM_ENGINE=fibers) and on its fast engine (`fast`: its
library built at the first call), as OpenCL C on PoCL and as numpy, in interleaved rounds
whose starting side rotates.

Every round checks the sim and PoCL outputs against a float64 reference. Printed: median
times, then per-round ratios (median [min, max]): fibers/fast (the fast engine's
speed-up), fast/PoCL, fast/numpy, and, for the GEMM workloads, the fast engine's GFLOP/s.
The kernels run in this process (MTWORK_ISOLATE=0) so that each call picks its engine.

    python bench/engine.py [--quick] [--rounds 5] [--only NAME ...] [--pocl TEXT]
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import _workloads as workloads
import mlx.core as mx
from _pocl import find_pocl
from _timing import Spread, interleaved_times, paired

SIDES = ("fibers", "fast", "pocl", "numpy")
COLUMNS = (("fibers", 10), ("fast", 10), ("pocl", 10), ("numpy", 10), ("fibers/fast", 22),
           ("fast/pocl", 22), ("fast/numpy", 22))
GEMM_FLOP = {"gemm": 2, "simdgroup_gemm": 2}  # times the cube of the GEMM size


def on_engine(mode: str, side: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        os.environ["MTWORK_SIM_ENGINE"] = mode
        return side()

    return run


def measure(workload: workloads.Workload, rounds: int) -> dict[str, list[float]]:
    sides = {"fibers": on_engine("fibers", workload.sim), "fast": on_engine("fast", workload.sim),
             "numpy": workload.numpy}
    if workload.pocl is not None:
        sides["pocl"] = workload.pocl

    def check(side: str, result: Any) -> None:
        workload.check("sim" if side in ("fibers", "fast") else side, result)

    return interleaved_times(sides, rounds, check=check)


def row(label: str, times: dict[str, list[float]], gflop: float | None) -> str:
    cells = []
    for column, width in COLUMNS:
        if "/" in column:
            a, b = column.split("/")
            text = (Spread.of(paired(times[a], times[b])).ratio_text()
                    if a in times and b in times else "-")
        else:
            text = Spread.of(times[column]).time_text() if column in times else "-"
        cells.append(f"{text:>{width}}")
    rate = ""
    if gflop is not None:
        rate = f"  fast {gflop / Spread.of(times['fast']).median:.3g} GFLOP/s"
    return f"{label:<44}" + "".join(cells) + rate


def header() -> str:
    names = {"pocl": "PoCL", "fast/pocl": "fast/PoCL"}
    return f"{'workload':<44}" + "".join(f"{names.get(c, c):>{w}}" for c, w in COLUMNS)


def main() -> int:
    args = workloads.parse_arguments(__doc__.splitlines()[0])
    os.environ["MTWORK_BACKEND"] = "sim"
    os.environ["MTWORK_ISOLATE"] = "0"
    mx.set_default_device(mx.cpu)
    pocl, notes = find_pocl(args.pocl)
    print(f"sim's fiber and fast engines vs PoCL vs numpy on {os.cpu_count()} cores; "
          f"{args.rounds} interleaved rounds{' (--quick sizes)' if args.quick else ''}; "
          "times are medians, ratios median [min, max] of per-round ratios")
    print(f"load average {os.getloadavg()[0]:.2f} before the run")
    print(f"PoCL: {pocl.describe()}" if pocl else
          "PoCL: none usable, the PoCL column is skipped: " + "; ".join(notes))
    print()
    print(header())
    sizes = workloads.QUICK if args.quick else workloads.FULL
    failures = 0
    for name, build in workloads.BUILDERS.items():
        if args.only and name not in args.only:
            continue
        try:
            workload = build(sizes, pocl)
            gflop = GEMM_FLOP[name] * sizes.gemm ** 3 / 1e9 if name in GEMM_FLOP else None
            print(row(workload.label, measure(workload, args.rounds), gflop), flush=True)
        except workloads.Skipped as skip:
            print(f"{name:<44}skipped: {skip}", flush=True)
        except workloads.WrongOutput as wrong:
            failures += 1
            print(f"{name:<44}FAILED: {wrong}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} after the run")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
