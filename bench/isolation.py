"""What running kernels in the worker process costs, measured side by side in one run.

- a cached call of a tiny kernel, isolated and in-process (target: isolated ≤ 0.5 ms),
  and the CPU time a call takes in each process (which a loaded machine changes less
  than the time it waits for a core);
- a large kernel, isolated / in-process (target: within 5%);
- 10,000 cached isolated calls: growth of this process's and the worker's resident memory
  (target: under 5 MB).

    python bench/isolation.py [--rounds 7] [--calls 10000]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

# The checkout this script belongs to, not whichever mtwork is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from _timing import Spread, evaluated, interleaved_times, paired  # noqa: E402
from emulator import TREE_SUM  # noqa: E402

import mtwork  # noqa: E402
from mtwork.backends import get  # noqa: E402


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _tiny() -> dict[str, object]:
    kernel = mtwork.metal_kernel("tiny", ["inp"], ["out"],
                                 "uint i = thread_position_in_grid.x; out[i] = inp[i] + 1.0f;")
    x = mx.arange(64, dtype=mx.float32)

    def call(isolate: bool) -> object:
        return evaluated(kernel(inputs=[x], grid=(64, 1, 1), threadgroup=(32, 1, 1),
                                output_shapes=[(64,)], output_dtypes=[mx.float32],
                                isolate=isolate))

    return {"call": call, "kernel": kernel}


# A tiny call's rounds are short batches, many of them: a loaded machine's bursts then
# spoil a few batches of either side instead of whole rounds of one.
TINY_BATCH = 20
TINY_BATCHES_PER_ROUND = 20


def tiny_calls(rounds: int, per_round: int = TINY_BATCH) -> dict[str, Spread]:
    """Seconds per cached tiny call, isolated and in-process, over `rounds` ×
    `TINY_BATCHES_PER_ROUND` interleaved batches of `per_round` calls."""
    call = _tiny()["call"]

    def batch(isolate: bool):
        def run() -> None:
            for _ in range(per_round):
                call(isolate)
        return run

    times = interleaved_times({"isolated": batch(True), "in-process": batch(False)},
                              rounds * TINY_BATCHES_PER_ROUND)
    return {name: Spread.of([t / per_round for t in ts]) for name, ts in times.items()} | {
        "ratio": Spread.of(paired(times["isolated"], times["in-process"]))}


def _cpu_seconds(pid: int) -> float:
    """CPU time of every thread of process `pid` so far (Linux's schedstat)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError):  # a thread that has just ended
            total += int(stat.read_text().split()[0])
    return total * 1e-9


def cpu_per_call(calls: int = 2000) -> dict[str, tuple[float, float]]:
    """CPU seconds per cached tiny call, (here, in the worker), isolated and in-process:
    the lowest of three runs."""
    call = _tiny()["call"]
    out = {}
    for name, isolate in (("isolated", True), ("in-process", False)):
        runs = []
        for _ in range(3):
            for _ in range(200):
                call(isolate)
            worker = get("sim").worker_pid
            before = _cpu_seconds(os.getpid()), _cpu_seconds(worker) if isolate else 0.0
            for _ in range(calls):
                call(isolate)
            after = _cpu_seconds(os.getpid()), _cpu_seconds(worker) if isolate else 0.0
            runs.append(((after[0] - before[0]) / calls, (after[1] - before[1]) / calls))
        out[name] = min(runs, key=sum)
    return out


def large_kernel(rounds: int, size: int) -> Spread:
    kernel = mtwork.metal_kernel("tree_sum", ["inp"], ["out"], TREE_SUM)
    x = mx.array(np.random.default_rng(0).standard_normal(size).astype(np.float32))
    expected = np.array(x).reshape(-1, 256).sum(axis=1)

    def side(isolate: bool):
        def run() -> object:
            return evaluated(kernel(inputs=[x], grid=(size, 1, 1), threadgroup=(256, 1, 1),
                                    output_shapes=[(size // 256,)],
                                    output_dtypes=[mx.float32], isolate=isolate))[0]
        return run

    def check(_name: str, out: object) -> None:
        np.testing.assert_allclose(np.array(out), expected, rtol=1e-4, atol=1e-3)

    times = interleaved_times({"isolated": side(True), "in-process": side(False)}, rounds,
                              check=check)
    return Spread.of(paired(times["isolated"], times["in-process"]))


def memory_growth(calls: int) -> tuple[int, int]:
    """(this process, the worker) resident-memory growth over `calls` cached calls."""
    call = _tiny()["call"]
    for _ in range(200):  # caches, arenas and pools reach their steady size
        call(True)
    worker = get("sim").worker_pid
    before = _rss_bytes(os.getpid()), _rss_bytes(worker)
    for _ in range(calls):
        call(True)
    after = _rss_bytes(os.getpid()), _rss_bytes(worker)
    return after[0] - before[0], after[1] - before[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=1 << 22)
    args = parser.parse_args()
    print(f"mtwork isolation costs ({Path(mtwork.__file__).parent}), {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.2f}; medians of {args.rounds} interleaved rounds "
          f"[min, max]\n")
    tiny = tiny_calls(args.rounds)
    print(f"(a tiny call: medians of {args.rounds * TINY_BATCHES_PER_ROUND} interleaved batches "
          f"of {TINY_BATCH} calls)")
    for name in ("isolated", "in-process"):
        s = tiny[name]
        print(f"cached call of a tiny kernel, {name:<10}  {s.median * 1e3:.3f} ms "
              f"[{s.low * 1e3:.3f}, {s.high * 1e3:.3f}]")
    met = "met" if tiny["isolated"].median <= 0.5e-3 else "NOT met"
    print(f"  isolated / in-process = {tiny['ratio'].ratio_text()}  "
          f"(target isolated <= 0.5 ms: {met})")
    cpu = cpu_per_call()
    for name, (here, worker) in cpu.items():
        in_worker = f" + {worker * 1e6:.0f} us in the worker" if name == "isolated" else ""
        print(f"  CPU per {name} call: {here * 1e6:.0f} us in this process{in_worker}")
    large = large_kernel(args.rounds, args.size)
    met = "met" if large.median <= 1.05 else "NOT met"
    print(f"tree sum of {args.size:,} floats, isolated / in-process = {large.ratio_text()}  "
          f"(target <= 1.05: {met})")
    start = time.perf_counter()
    own, worker = memory_growth(args.calls)
    met = "met" if max(own, worker) < 5 << 20 else "NOT met"
    print(f"{args.calls:,} cached isolated calls in {time.perf_counter() - start:.1f} s: "
          f"resident memory grew {own / 2**20:.2f} MiB here, {worker / 2**20:.2f} MiB in the "
          f"worker (target < 5 MiB: {met})")
    print(f"\nload after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
