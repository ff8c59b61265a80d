"""Elementwise kernels on the emulator against numpy, the kernel alone, side by side.

A kernel that never blocks runs as plain loops over each threadgroup's threads, which
clang vectorizes; on the fiber engine the same code runs one thread per call (the scalar
context). This benchmark times the kernel's library through the runtime's dispatch on
aligned buffers made once, so what a call adds around the kernel (sending its inputs to
the worker process, aligned copies of MLX's inputs) is left out; `vs_pocl.py`'s rows time
whole calls. For the math functions, the shim's inline code (`metal::exp`, ...) runs
beside libm's (`__builtin_expf`, `__builtin_sinf`, `__builtin_powf`, ..., the shim's
code before it had its own), in both contexts. Every output is checked against numpy's
float64 result in every round.

    python bench/plain_loops.py [--size 16777216] [--rounds 5] [--workers 1]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from _timing import Spread, interleaved_times, paired

import mtwork
from mtwork.backends import get
from mtwork.backends.sim.run import runtime


@dataclass(frozen=True)
class Workload:
    label: str
    inputs: int
    shim: str  # the kernel's body computing out[i] with metal:: functions
    libm: str | None  # the same with libm's functions, where the shim has its own
    numpy: Callable[..., np.ndarray]
    oracle: Callable[..., np.ndarray]  # float64


WORKLOADS = [
    Workload("exp", 1, "out[i] = metal::exp(a[i]);", "out[i] = __builtin_expf(a[i]);",
             np.exp, np.exp),
    Workload("log |x|", 1, "out[i] = metal::log(metal::abs(a[i]));",
             "out[i] = __builtin_logf(metal::abs(a[i]));",
             lambda a: np.log(np.abs(a)), lambda a: np.log(np.abs(a))),
    Workload("tanh", 1, "out[i] = metal::tanh(a[i]);", "out[i] = __builtin_tanhf(a[i]);",
             np.tanh, np.tanh),
    Workload("sin", 1, "out[i] = metal::sin(a[i]);", "out[i] = __builtin_sinf(a[i]);",
             np.sin, np.sin),
    Workload("cos", 1, "out[i] = metal::cos(a[i]);", "out[i] = __builtin_cosf(a[i]);",
             np.cos, np.cos),
    # b / 8 keeps every power of these inputs a finite float
    Workload("pow |a| b/8", 2, "out[i] = metal::pow(metal::abs(a[i]), 0.125f * b[i]);",
             "out[i] = __builtin_powf(metal::abs(a[i]), 0.125f * b[i]);",
             lambda a, b: np.power(np.abs(a), np.float32(0.125) * b),
             lambda a, b: np.power(np.abs(a), 0.125 * b)),
    Workload("a * b + c", 3, "out[i] = a[i] * b[i] + c[i];", None,
             lambda a, b, c: a * b + c, lambda a, b, c: a * b + c),
]
NAMES = ["a", "b", "c"]


def aligned(values: np.ndarray) -> np.ndarray:
    """A copy of `values` starting at a 64-byte boundary."""
    raw = np.empty(values.nbytes + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64
    out = raw[start:start + values.nbytes].view(values.dtype)
    out[:] = values
    return out


class Kernel:
    """One elementwise kernel's library on aligned buffers: call it as loops or fibers."""

    def __init__(self, name: str, body: str, inputs: list[np.ndarray]):
        n = inputs[0].size
        kernel = mtwork.metal_kernel(name, NAMES[:len(inputs)], ["out"],
                                     f"uint i = thread_position_in_grid.x; {body}",
                                     backend="sim")
        arrays = [mx.array(x) for x in inputs]
        program = kernel.program(kernel.generate(arrays, [mx.float32]))
        self.library = get("sim").compile(program).library  # type: ignore[attr-defined]
        self.name, self.grid = program.function, (n, 1, 1)
        self.buffers = [aligned(x) for x in inputs] + [aligned(np.zeros(n, np.float32))]
        self.table = (ctypes.c_void_p * len(self.buffers))(
            *(b.ctypes.data for b in self.buffers))

    def run(self, loops: bool, workers: int) -> np.ndarray:
        runtime.dispatch(self.library, self.name, self.table, self.grid, (256, 1, 1),
                         barrier_free=loops, workers=workers)
        return self.buffers[-1]


def sides(w: Workload, inputs: list[np.ndarray], workers: int
          ) -> dict[str, Callable[[], np.ndarray]]:
    shim = Kernel(f"loops_{w.label.split()[0]}", w.shim, inputs)
    out: dict[str, Callable[[], np.ndarray]] = {
        "loops": lambda: shim.run(True, workers), "fibers": lambda: shim.run(False, workers)}
    if w.libm:
        libm = Kernel(f"loops_{w.label.split()[0]}_libm", w.libm, inputs)
        out |= {"libm loops": lambda: libm.run(True, workers),
                "libm fibers": lambda: libm.run(False, workers)}
    out["numpy"] = lambda: w.numpy(*inputs)
    return out


def checker(w: Workload, inputs: list[np.ndarray]) -> Callable[[str, np.ndarray], None]:
    want = w.oracle(*(x.astype(np.float64) for x in inputs))

    def check(side: str, got: np.ndarray) -> None:
        report = mtwork.diff(np.asarray(got), want)
        if not report.ok:
            raise AssertionError(f"{w.label}, {side}: wrong output\n{report}")

    return check


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1 << 24, help="elements (default 16M)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--workers", type=int, default=1,
                        help="the runtime's OS threads (default 1, as numpy's one)")
    args = parser.parse_args()
    if args.size < 256 or args.size % 256:
        parser.error(f"--size must be a positive multiple of 256, got {args.size}")
    if args.rounds < 1 or args.workers < 1:
        parser.error(f"--rounds and --workers must be at least 1, got {args.rounds} and "
                     f"{args.workers}")
    rng = np.random.default_rng(0)
    print(f"mtwork from {os.path.dirname(mtwork.__file__)}")
    print(f"{args.size:,} float32 elements, {args.rounds} interleaved rounds, the runtime "
          f"on {args.workers} of {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f}; times are medians, ratios median [min, max] of "
          "per-round ratios")
    for w in WORKLOADS:
        inputs = [rng.standard_normal(args.size, dtype=np.float32) * 4
                  for _ in range(w.inputs)]
        calls = sides(w, inputs, args.workers)
        with np.errstate(divide="ignore"):  # log of an input that is 0
            times = interleaved_times(calls, args.rounds, check=checker(w, inputs))
        cells = [f"{name} {Spread.of(t).time_text()}" for name, t in times.items()]
        print(f"\n{w.label}: " + ", ".join(cells))
        numpy = times["numpy"]
        for name in ("loops", "fibers"):
            print(f"  {name}/numpy {Spread.of(paired(times[name], numpy)).ratio_text()}")
            if f"libm {name}" in times:
                ratio = Spread.of(paired(times[name], times[f"libm {name}"]))
                print(f"  {name}, shim/libm {ratio.ratio_text()}")
    print(f"\nload average {os.getloadavg()[0]:.2f} after the run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
