"""`mtwork run` on the first run of a fresh clone: the notebooks one after another
(`--jobs 1`) and side by side (`--jobs N`, default the CPU count), in interleaved rounds
whose starting side rotates. Each run gets a fresh clone of this checkout's last commit
and an empty compile cache (the first run a user waits for). Printed per side: the median
wall time and processor time (user + system of `mtwork run` and every process under it),
the machine's load before each run, then side-by-side over one-after-another per round
(median [min, max]). On a machine shared with other work, the processor time is the
number to compare; the wall time is only meaningful on a quiet one.

    python bench/mtwork_run.py [--rounds 2] [--jobs N] [NOTEBOOK ...]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(jobs: int, notebooks: list[str]) -> tuple[float, float, str]:
    """(wall seconds, processor seconds, load before) of `mtwork run --jobs jobs` in a
    fresh clone with an empty cache."""
    with tempfile.TemporaryDirectory(prefix="mtwork-run-bench-") as folder:
        clone, cache = Path(folder) / "clone", Path(folder) / "cache"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        env = {**os.environ, "MTWORK_CACHE_DIR": str(cache), "PYTHONPATH": str(clone)}
        env.pop("MTWORK_BUILD_LOG", None)
        load = _load()
        cpu, start = _children_cpu(), time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "mtwork", "run", "--jobs", str(jobs),
                               "--out", str(Path(folder) / "out"), *notebooks],
                              cwd=clone, env=env, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - start, _children_cpu() - cpu
        if done.returncode != 0:
            raise SystemExit(f"mtwork run --jobs {jobs} failed:\n{done.stdout}{done.stderr}")
        shutil.rmtree(cache, ignore_errors=True)
    return wall, cpu, load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="notebooks side by side (default: the CPU count)")
    parser.add_argument("notebooks", nargs="*", help="notebooks to run (default: all)")
    args = parser.parse_args()
    sides = [1, args.jobs]
    times: dict[int, list[tuple[float, float]]] = {side: [] for side in sides}
    for n in range(args.rounds):
        for side in sides[n % 2:] + sides[:n % 2]:
            wall, cpu, load = run_once(side, args.notebooks)
            times[side].append((wall, cpu))
            print(f"round {n + 1}, --jobs {side}: {wall:6.1f} s wall, {cpu:6.1f} s "
                  f"processor (load before: {load})", flush=True)
    for side in sides:
        walls, cpus = zip(*times[side])
        print(f"--jobs {side}: median {statistics.median(walls):.1f} s wall, "
              f"{statistics.median(cpus):.1f} s processor")
    for i, name in ((0, "wall"), (1, "processor")):
        ratios = [b[i] / a[i] for a, b in zip(times[1], times[args.jobs])]
        print(f"--jobs {args.jobs} / --jobs 1, {name}: {statistics.median(ratios):.2f} "
              f"[{min(ratios):.2f}, {max(ratios):.2f}]")


if __name__ == "__main__":
    main()
