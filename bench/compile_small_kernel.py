"""How long the emulator takes to compile: a first compile on an empty cache, and a warm
compile of a new small kernel, for a kernel that never blocks (the fiber engine's library
only) and for one with a barrier (the fiber engine's library and the fast engine's).

The first compile runs in a new process with an empty cache ($MTWORK_CACHE_DIR in a
temporary folder) and says where its time went: the runtime library (built once per
shim and runtime version), MLX's rewritten headers (once per MLX version), and the
kernel. The warm compiles use this process's cache, each with a kernel text never seen.
Targets: first compile < 5 s, warm compile < 0.3 s.

    python bench/compile_small_kernel.py [--samples 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import mlx.core as mx

import mtwork

PLAIN = "o[thread_position_in_grid.x] = a[0] * 2.0f; // {tag}"
BARRIER = """
threadgroup float t[32];
uint i = thread_position_in_threadgroup.x;
t[i] = a[i];
threadgroup_barrier(mem_flags::mem_threadgroup);
o[i] = t[31 - i]; // {tag}
"""

FIRST = """
import json, sys, time, uuid
import mlx.core as mx, mtwork
from mtwork.backends.sim import compiler
body = sys.argv[1].format(tag=uuid.uuid4())
t0 = time.perf_counter()
compiler.runtime_library()
t1 = time.perf_counter()
compiler.prelude_dir()
t2 = time.perf_counter()
k = mtwork.metal_kernel("first", ["a"], ["o"], body)
k(inputs=[mx.zeros((32,))], grid=(32, 1, 1), threadgroup=(32, 1, 1),
  output_shapes=[(32,)], output_dtypes=[mx.float32])
t3 = time.perf_counter()
print(json.dumps({"runtime": t1 - t0, "headers": t2 - t1, "kernel": t3 - t2,
                  "total": t3 - t0, "engine": k.last_engine.name}))
"""


def first_compile(body: str) -> dict[str, float | str]:
    """A new process with an empty cache compiles and runs one kernel."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "MTWORK_CACHE_DIR": cache, "MTWORK_BACKEND": "sim",
               "MTWORK_ISOLATE": "0"}
        out = subprocess.run([sys.executable, "-c", FIRST, body], env=env,
                             capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def warm_compile(body: str, samples: int) -> tuple[float, str]:
    """Median seconds of compiling and running a kernel whose text is new, and the engine
    that ran it."""
    times, engine = [], ""
    for _ in range(samples):
        k = mtwork.metal_kernel("warm", ["a"], ["o"], body.format(tag=uuid.uuid4()))
        start = time.perf_counter()
        k(inputs=[mx.zeros((32,))], grid=(32, 1, 1), threadgroup=(32, 1, 1),
          output_shapes=[(32,)], output_dtypes=[mx.float32])
        times.append(time.perf_counter() - start)
        engine = k.last_engine.name
    return statistics.median(times), engine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3, help="warm compiles (default 3)")
    args = parser.parse_args()
    if args.samples < 1:
        parser.error(f"--samples must be at least 1, got {args.samples}")
    os.environ["MTWORK_BACKEND"] = "sim"
    os.environ["MTWORK_ISOLATE"] = "0"
    mx.set_default_device(mx.cpu)
    print(f"compile latency on {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f}")
    for name, body in (("no barrier", PLAIN), ("a barrier", BARRIER)):
        first = first_compile(body)
        print(f"first compile, empty cache, kernel with {name} ({first['engine']}): "
              f"{first['total']:.2f} s (target < 5 s) = runtime {first['runtime']:.2f} s "
              f"+ MLX headers {first['headers']:.2f} s + kernel {first['kernel']:.2f} s")
    mtwork.metal_kernel("warmup", ["a"], ["o"], PLAIN.format(tag="warmup"))(
        inputs=[mx.zeros((32,))], grid=(32, 1, 1), threadgroup=(32, 1, 1),
        output_shapes=[(32,)], output_dtypes=[mx.float32])
    for name, body in (("no barrier", PLAIN), ("a barrier", BARRIER)):
        seconds, engine = warm_compile(body, args.samples)
        print(f"warm compile of a new small kernel with {name} ({engine}): "
              f"{seconds:.2f} s (target < 0.3 s), median of {args.samples}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
