"""The profiler's overhead next to the sanitizer's, on the three kernels of emulator.py.

Each kernel runs plain, sanitized and profiled, interleaved round by round; the ratios
sanitized/plain and profiled/plain are per-round pairs (median [min, max]). Both
instrumented modes are compiled before timing: the ratios are of running, not compiling.

    python bench/profile.py [--size 1048576] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

# Run as a script, Python puts bench/ first on the path: put this checkout's root first
# so `mtwork` is the one beside this file, not another installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402
from _timing import evaluated, interleaved_times, paired  # noqa: E402
from emulator import EXP, SOFTMAX, TREE_SUM  # noqa: E402

import mtwork  # noqa: E402


def cases(n: int) -> dict[str, tuple[str, dict]]:
    return {
        "exp": (EXP, dict(grid=(n, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(n,)])),
        "tree sum": (TREE_SUM, dict(grid=(n, 1, 1), threadgroup=(256, 1, 1),
                                    output_shapes=[(n // 256,)])),
        "softmax": (SOFTMAX, dict(template=[("N", 1024)], grid=(32, n // 1024, 1),
                                  threadgroup=(32, 1, 1), output_shapes=[(n // 1024, 1024)])),
    }


def spread(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):7.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("MTWORK_BACKEND", "sim")
    x = mx.random.normal((args.size,))
    print(f"profiler and sanitizer overhead, {args.size:,} elements, {os.cpu_count()} cores; "
          f"medians of {args.rounds} interleaved rounds\n")
    print(f"{'kernel':<10} {'sanitized/plain':>26} {'profiled/plain':>26}")
    for label, (body, extra) in cases(args.size).items():
        k = mtwork.metal_kernel(f"bench_profile_{label.replace(' ', '_')}", ["inp"], ["out"],
                                body)
        call = {"inputs": [x.reshape(-1, 1024) if label == "softmax" else x],
                "output_dtypes": [mx.float32], **extra}
        times = interleaved_times({
            "plain": lambda k=k, call=call: evaluated(k(**call)),
            "sanitized": lambda k=k, call=call: k(**call, sanitize=True),
            "profiled": lambda k=k, call=call: k(**call, profile=True),
        }, args.rounds)
        print(f"{label:<10} {spread(paired(times['sanitized'], times['plain'])):>26} "
              f"{spread(paired(times['profiled'], times['plain'])):>26}")


if __name__ == "__main__":
    main()
