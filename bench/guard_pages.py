"""What the guard pages of in-process runs cost, measured side by side in one run.

Run in this process (``isolate=False``), a dispatch's fresh outputs and aligned copies sit
in guarded memory of their own (`arena.Block`: each buffer ends at a page of slack before
an inaccessible page). The same captured dispatch runs with that memory and with fresh
outputs in plain numpy arrays, interleaved, for a tiny kernel and for large outputs.

    python bench/guard_pages.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os

import mlx.core as mx
import numpy as np
from _timing import Spread, interleaved_times, paired

import mtwork
from mtwork import dtypes
from mtwork.backends import get

COPY = "uint i = thread_position_in_grid.x; out[i] = inp[i] + 1.0f;"


def _captured(n: int) -> tuple[object, object]:
    """The `Program` and `Dispatch` of one in-process call on `n` floats."""
    sim = get("sim")
    kernel = mtwork.metal_kernel("plus_one", ["inp"], ["out"], COPY)
    captured = {}
    real = sim.dispatch_here

    def capture(program, call, place=None):
        captured.update(program=program, call=call)
        return real(program, call, place)

    sim.dispatch_here = capture
    try:
        mx.eval(kernel(inputs=[mx.arange(n, dtype=mx.float32)], grid=(n, 1, 1),
                       threadgroup=(256, 1, 1), output_shapes=[(n,)],
                       output_dtypes=[mx.float32], isolate=False))
    finally:
        del sim.dispatch_here
    return captured["program"], captured["call"]


def _plain(_index: int, fresh) -> np.ndarray:
    return np.empty(tuple(fresh.shape), dtypes.storage_numpy_dtype(fresh.dtype))


def guarded_over_plain(n: int, rounds: int, per_round: int) -> tuple[Spread, Spread]:
    """(seconds per guarded call, guarded / plain per round) for `n` floats."""
    sim = get("sim")
    program, call = _captured(n)
    expected = np.arange(n, dtype=np.float32) + 1

    def side(place):
        def run() -> object:
            for _ in range(per_round):
                done = sim.dispatch_here(program, call, place)
            return done
        return run

    def check(_name: str, done) -> None:
        assert np.array_equal(done.buffers[1], expected)

    times = interleaved_times({"guarded": side(None), "plain": side(_plain)}, rounds,
                              check=check)
    per_call = Spread.of([t / per_round for t in times["guarded"]])
    return per_call, Spread.of(paired(times["guarded"], times["plain"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"guard pages of in-process runs, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.2f}; medians of {args.rounds} interleaved rounds [min, max]\n")
    for n, per_round in ((64, 200), (1 << 16, 50), (1 << 22, 3)):
        per_call, ratio = guarded_over_plain(n, args.rounds, per_round)
        print(f"{n:>9,} floats in, {n:>9,} out: {per_call.time_text():>9} a call, "
              f"guarded / plain = {ratio.ratio_text()}")
    print(f"\nload after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
