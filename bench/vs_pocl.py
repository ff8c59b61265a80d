"""The emulator against PoCL and numpy: the same algorithms, measured side by side.

Each workload runs as MSL on mtwork's `sim` backend, as OpenCL C on PoCL (bench/vs_pocl.cl,
same algorithm and work-group geometry) and as numpy, in interleaved rounds whose starting
side rotates. Every round checks the sim and PoCL outputs against a float64 reference, so a
broken kernel cannot look fast. Printed: median times and the per-round ratios sim/PoCL and
sim/numpy (median [min, max]).

What a side's time covers: sim, one kernel call as a user makes it (inputs in memory,
outputs allocated and returned); PoCL, the kernel with inputs already in device buffers and
the read-back of its output; numpy, the computation from the same inputs.

    python bench/vs_pocl.py [--quick] [--rounds 5] [--only NAME ...] [--pocl TEXT]
"""

from __future__ import annotations

import os
import sys

import _workloads as workloads
import mlx.core as mx
from _pocl import find_pocl
from _timing import Spread, interleaved_times, paired

SIDES = ("sim", "pocl", "numpy")


def run(workload: workloads.Workload, rounds: int) -> dict[str, Spread | None]:
    """Median times and the ratios sim/PoCL, sim/numpy over interleaved rounds."""
    times = interleaved_times(workload.sides(), rounds, check=workload.check)
    result: dict[str, Spread | None] = {
        side: Spread.of(times[side]) if side in times else None for side in SIDES}
    result["sim/pocl"] = (Spread.of(paired(times["sim"], times["pocl"]))
                          if "pocl" in times else None)
    result["sim/numpy"] = Spread.of(paired(times["sim"], times["numpy"]))
    return result


COLUMNS = (("sim", 10), ("pocl", 10), ("numpy", 10), ("sim/pocl", 24), ("sim/numpy", 24))


def header() -> str:
    names = {"pocl": "PoCL", "sim/pocl": "sim/PoCL"}
    return f"{'workload':<44}" + "".join(f"{names.get(c, c):>{w}}" for c, w in COLUMNS)


def row(label: str, result: dict[str, Spread | None]) -> str:
    cells = []
    for column, width in COLUMNS:
        spread = result[column]
        text = "-" if spread is None else (
            spread.ratio_text() if "/" in column else spread.time_text())
        cells.append(f"{text:>{width}}")
    return f"{label:<44}" + "".join(cells)


def _load_line(when: str) -> str:
    """The 1-minute load average: near the core count, other work shared the machine."""
    return f"load average {os.getloadavg()[0]:.2f} {when} (other work on the cores adds noise)"


def main() -> int:
    args = workloads.parse_arguments(__doc__.splitlines()[0])
    os.environ["MTWORK_BACKEND"] = "sim"
    mx.set_default_device(mx.cpu)

    pocl, notes = find_pocl(args.pocl)
    print(f"mtwork sim vs PoCL vs numpy on {os.cpu_count()} cores; {args.rounds} interleaved "
          f"rounds{' (--quick sizes)' if args.quick else ''}; times are medians, ratios "
          "median [min, max] of per-round ratios")
    print(_load_line("before the run"))
    print("OpenCL platforms:")
    for note in notes:
        print(f"  {note}")
    print(f"PoCL: {pocl.describe()}" if pocl else
          "PoCL: none usable (see above), the PoCL column is skipped")
    print()
    print(header())
    failures, notes_by_label = 0, {}
    sizes = workloads.QUICK if args.quick else workloads.FULL
    for name, build in workloads.BUILDERS.items():
        if args.only and name not in args.only:
            continue
        try:
            workload = build(sizes, pocl)
            print(row(workload.label, run(workload, args.rounds)), flush=True)
            notes_by_label[workload.label] = workload.notes
        except workloads.Skipped as skip:
            print(f"{name:<44}skipped: {skip}", flush=True)
        except workloads.WrongOutput as wrong:
            failures += 1
            print(f"{name:<44}FAILED: {wrong}", flush=True)
    print(_load_line("after the run"))
    notes_lines = [(label, n) for label, ns in notes_by_label.items() for n in ns]
    if notes_lines:
        print("\nNotes:")
        for label, note in notes_lines:
            print(f"  {label}: {note}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

