"""Where a cached isolated call of a tiny kernel spends its time, on both sides: cProfile
of mtwork's process and of the worker (through $MTWORK_WORKER_PROFILE) over the same
calls, run in a child interpreter so that its worker ends, and writes its statistics,
when the child does.

    python bench/isolation_profile.py [--calls 3000] [--top 25] [--sort tottime]
"""

from __future__ import annotations

import argparse
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import cProfile, sys
sys.path[:0] = [{root!r}, {bench!r}]
from isolation import _tiny
call = _tiny()["call"]
for _ in range(200):  # the worker starts, compiles and warms up outside the profile
    call(True)
profiler = cProfile.Profile()
profiler.enable()
for _ in range({calls}):
    call(True)
profiler.disable()
profiler.dump_stats({parent!r})
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--sort", default="tottime", choices=["tottime", "cumulative"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mtwork-profile-") as folder:
        parent, worker = Path(folder, "parent.prof"), Path(folder, "worker.prof")
        code = CHILD.format(root=str(ROOT), bench=str(ROOT / "bench"), calls=args.calls,
                            parent=str(parent))
        env = {**os.environ, "MTWORK_WORKER_PROFILE": str(worker), "MTWORK_BACKEND": "sim"}
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
        deadline = time.monotonic() + 10  # the worker ends once the child has
        while not worker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        print(f"{args.calls:,} cached isolated calls of a tiny kernel, load "
              f"{os.getloadavg()[0]:.2f} (cProfile's own cost is in every number)\n")
        for side, path in (("mtwork's process", parent), ("the worker", worker)):
            print(f"=== {side} " + "=" * 60)
            if not path.exists():
                print("(no statistics: the worker did not end in time)")
                continue
            pstats.Stats(str(path)).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
