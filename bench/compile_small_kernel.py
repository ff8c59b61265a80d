"""How long the emulator takes to compile a small kernel: a first compile on an empty
cache, and a warm compile of a new small kernel, for a kernel that never blocks and for
one with a barrier.

The first compile runs in a new process with an empty cache ($MTWORK_CACHE_DIR in a
temporary folder, zig's own cache inside it) and times the first kernel call, which
builds everything: the runtime library (once per shim and runtime version), MLX's
rewritten headers (once per MLX version), the precompiled header, the kernel. Its stages
are then timed one by one, on another empty cache, to say where the time goes (in the
first call they overlap: the runtime builds in a thread of its own; a checkout from
before that builds them in turn). The warm compiles
run in a new process on the warmed cache, each with a kernel text never seen (median).
CPU seconds (the process and its clang children) are printed beside wall seconds: on a
shared machine they say more than the wall clock. Targets: first compile < 5 s, warm
compile < 0.3 s.

`--baseline CHECKOUT` times another checkout of mtwork (an older commit, say) the same
way, the two alternating, and prints each figure's ratio to it.

    python bench/compile_small_kernel.py [--samples 5] [--rounds 1] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PLAIN = "o[thread_position_in_grid.x] = a[0] * 2.0f; // {tag}"
BARRIER = """
threadgroup float t[32];
uint i = thread_position_in_threadgroup.x;
t[i] = a[i];
threadgroup_barrier(mem_flags::mem_threadgroup);
o[i] = t[31 - i]; // {tag}
"""
BODIES = {"no barrier": PLAIN, "a barrier": BARRIER}

# Run in a fresh interpreter: argv = [mode, body, samples]. Prints one JSON line.
WORKER = """
import json, resource, statistics, sys, time, uuid
def cpu():
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
mode, body, samples = sys.argv[1], sys.argv[2], int(sys.argv[3])
import mlx.core as mx, mtwork
mx.set_default_device(mx.cpu)
def call(tag):
    k = mtwork.metal_kernel("small", ["a"], ["o"], body.format(tag=tag))
    mx.eval(k(inputs=[mx.zeros((32,))], grid=(32, 1, 1), threadgroup=(32, 1, 1),
              output_shapes=[(32,)], output_dtypes=[mx.float32]))
    return k.last_engine.name
if mode == "stages":
    from mtwork.backends.sim.compile import compiler
    out = {}
    for name, step in (("runtime", compiler.runtime_library),
                       ("MLX headers", compiler.prelude_dir),
                       ("kernel", lambda: call(uuid.uuid4()))):
        t0, c0 = time.perf_counter(), cpu()
        step()
        out[name] = [time.perf_counter() - t0, cpu() - c0]
    print(json.dumps(out))
    raise SystemExit
if mode == "warm":
    call("warmup")
runs = []
for _ in range(samples if mode == "warm" else 1):
    t0, c0 = time.perf_counter(), cpu()
    engine = call(uuid.uuid4())
    runs.append((time.perf_counter() - t0, cpu() - c0))
print(json.dumps({"wall": statistics.median(r[0] for r in runs),
                  "cpu": statistics.median(r[1] for r in runs), "engine": engine}))
"""


def _worker(checkout: Path, cache: Path, mode: str, body: str, samples: int = 1) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "ZIG_GLOBAL_CACHE_DIR"}
    env.update(MTWORK_CACHE_DIR=str(cache), MTWORK_BACKEND="sim", MTWORK_ISOLATE="0",
               PYTHONPATH=str(checkout))
    done = subprocess.run([sys.executable, "-c", WORKER, mode, body, str(samples)], env=env,
                          capture_output=True, text=True, check=False, cwd=checkout)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} compile with {checkout} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _measure(checkout: Path, body: str, samples: int) -> dict[str, dict]:
    """The first compile on an empty cache, then warm compiles on that cache."""
    with tempfile.TemporaryDirectory(prefix="mtwork-compile-") as tmp:
        first = _worker(checkout, Path(tmp), "first", body)
        warm = _worker(checkout, Path(tmp), "warm", body, samples)
    return {"first": first, "warm": warm}


def _stages(checkout: Path, body: str) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="mtwork-compile-") as tmp:
        return _worker(checkout, Path(tmp), "stages", body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5, help="warm compiles (default 5)")
    parser.add_argument("--rounds", type=int, default=1, help="first compiles (default 1)")
    parser.add_argument("--baseline", type=Path, help="another mtwork checkout to compare")
    args = parser.parse_args()
    for name in ("samples", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.baseline is not None and not (args.baseline / "mtwork").is_dir():
        parser.error(f"--baseline must be an mtwork checkout, got {args.baseline}")
    checkouts = {"this": ROOT} | ({"baseline": args.baseline.resolve()}
                                  if args.baseline else {})
    print(f"compile latency on {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f}; wall / CPU seconds, medians")
    for name, body in BODIES.items():
        runs: dict[str, list[dict]] = {c: [] for c in checkouts}
        order = list(checkouts)
        for r in range(args.rounds):
            for c in order[r % 2:] + order[: r % 2]:
                runs[c].append(_measure(checkouts[c], body, args.samples))
        _report(name, runs)
        for c, checkout in checkouts.items():
            stages = _stages(checkout, body)
            print(f"  {c}: stages one by one, empty cache: " + ", ".join(
                f"{stage} {wall:.2f} / {cpu:.2f}" for stage, (wall, cpu) in stages.items()))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


LABELS = {"first": ("first compile, empty cache", 5.0),
          "warm": ("warm compile, new kernel", 0.3)}


def _report(name: str, runs: dict[str, list[dict]]) -> None:
    for kind, (label, goal) in LABELS.items():
        cells = {c: (statistics.median(r[kind]["wall"] for r in rs),
                     statistics.median(r[kind]["cpu"] for r in rs), rs[-1][kind]["engine"])
                 for c, rs in runs.items()}
        wall, cpu, engine = cells["this"]
        line = (f"{label}, kernel with {name} ({engine}): {wall:.2f} / {cpu:.2f} s "
                f"(target < {goal:g} s)")
        if "baseline" in cells:
            b_wall, b_cpu, _ = cells["baseline"]
            line += (f"; baseline {b_wall:.2f} / {b_cpu:.2f} s, ratio {wall / b_wall:.2f} "
                     f"/ {cpu / b_cpu:.2f}")
        print(line)


if __name__ == "__main__":
    sys.exit(main())
