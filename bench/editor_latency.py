"""How long the editor takes from an edit to its result, with and without the GPU model,
measured side by side in one run.

Each round edits the kernel's text (a comment never seen before, so every edit compiles),
then runs the editor's step: compile, run, check against the oracle, time. With the model
(`gpu=None`, the default chip) the outcome is shown first and the profiled run follows;
both moments are reported: "shown" (the outcome the author sees) and "modelled" (when its
modelled time arrives).

    python bench/editor_latency.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from collections.abc import Callable

import mlx.core as mx
import numpy as np
from _timing import Spread, paired, seconds_text

import mtwork

N = 1024
SOURCE = "uint i = thread_position_in_grid.x; out[i] = inp[i] * 2.0f;"


def editor(gpu: object) -> Callable[[], tuple[float, float]]:
    """An editor on a small kernel, and one edit-and-run of it: (shown, modelled) s."""
    kernel = mtwork.metal_kernel("latency", ["inp"], ["out"], SOURCE)

    def build(config: dict) -> mtwork.Launch:
        return mtwork.Launch(kernel, grid=(N, 1, 1), threadgroup=(64, 1, 1),
                             output_shapes=[(N,)], output_dtypes=[mx.float32])

    x = mx.arange(N, dtype=mx.float32)
    edits = itertools.count(1)

    def oracle(inp: object) -> np.ndarray:
        return np.asarray(inp, np.float64) * 2

    ed = mtwork.editor(kernel, build, inputs=[x], oracle=oracle, bench_rounds=3, gpu=gpu)
    ed.loop.run()  # the runtime and the first build, outside the rounds

    def edit_and_run() -> tuple[float, float]:
        ed.loop.set_source(f"{SOURCE}  // edit {next(edits)} of {os.getpid()} {time.time()}")
        start = time.perf_counter()
        outcome = ed.loop.run()
        if outcome.status != "ok":
            raise SystemExit(f"the edited kernel did not pass: {outcome.status} "
                             f"{outcome.message}")
        return outcome.seconds, time.perf_counter() - start

    return edit_and_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    sides = {"no model": editor(False), "model": editor(None)}
    shown: dict[str, list[float]] = {name: [] for name in sides}
    whole: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for r in range(args.rounds):
        for name in names[r % 2:] + names[:r % 2]:  # the side that starts rotates
            first, total = sides[name]()
            shown[name].append(first)
            whole[name].append(total)
    print(f"editor: edit to result, a {N}-thread kernel, warm cache, "
          f"medians of {args.rounds} interleaved rounds (load {os.getloadavg()[0]:.2f})\n")
    for name in names:
        print(f"{name:9}  shown after {seconds_text(statistics.median(shown[name])):>8}   "
              f"modelled after {seconds_text(statistics.median(whole[name])):>8}")
    ratio = Spread.of(paired(shown["model"], shown["no model"]))
    print(f"\nshown, with the model / without = {ratio.ratio_text()}")


if __name__ == "__main__":
    main()
