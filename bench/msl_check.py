"""What the Metal front end costs a warm compile on sim.

A warm compile is a kernel text never seen before, compiled when everything it starts
from is built (the runtime, MLX's rewritten headers, the precompiled headers, the check's
own): what the editor and a sweep pay at each edit. Each round compiles a new text of
each kernel twice, once by a backend without the check and once by one with it (the check
runs in a thread beside the build), the order alternating, and times the check alone on
a third new text. Printed per kernel, medians [min, max] over the rounds:

- the warm compile without the check, and with it (wall seconds) and their ratio: what
  the check adds to the wait;
- the check alone (wall and CPU seconds, the process and its clang children), and its
  CPU seconds over the compile's: what it costs the machine.

A compile of a kernel compiled before reads both verdicts from the cache (the check is
keyed by content like the kernel): it costs nothing there. `--cold` times instead the first
compile of the author's full-source kernel on an empty cache, without the check and with
it (each in a new process and cache folder, in turn): what the check's one-time work (its
copy of MLX's headers, its precompiled header) adds to the runtime's and the build's.

    python bench/msl_check.py [--rounds 7] [--cold]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mtwork  # noqa: E402
from mtwork.backends.sim import SimBackend  # noqa: E402
from mtwork.backends.sim.compile import frontend  # noqa: E402
from mtwork.dispatch import Program  # noqa: E402
from mtwork.msl.includes import mlx_include_dir  # noqa: E402

SMALL = "uint i = thread_position_in_grid.x;\no[i] = metal::exp(a[i]) * 2.0f; // {tag}"
HEADER_HELPERS = """
template <typename T> T clamp_to(T v, T lo, T hi) { return metal::min(metal::max(v, lo), hi); }
float gelu(float x) { return 0.5f * x * (1.0f + metal::precise::tanh(0.79788456f * x)); }
"""
THREADGROUP = """
threadgroup float tile[64];
uint t = thread_position_in_threadgroup.x;
tile[t] = gelu(a[thread_position_in_grid.x]);
threadgroup_barrier(mem_flags::mem_threadgroup);
o[thread_position_in_grid.x] = clamp_to(tile[63 - t], -1.0f, 1.0f); // {tag}
"""


def body_program(source: str, header: str = "") -> Callable[[str], Program]:
    def make(tag: str) -> Program:
        k = mtwork.metal_kernel("bench", ["a"], ["o"], source.format(tag=tag), header=header)
        return k.program(k.generate([mx.zeros((64,))], [mx.float32]))
    return make


AUTHOR_SOURCE = """
#include "mlx/backend/metal/kernels/utils.h"
using namespace metal;
// {tag}
template <typename T>
T row_max(const device T* row, uint n, uint lane, threadgroup float* partial, uint sg) {
  float m = -INFINITY;
  for (uint j = lane; j < n; j += 32) m = max(m, float(row[j]));
  m = simd_max(m);
  if (lane == 0) partial[sg] = m;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return T(simd_max(partial[lane % 4]));
}
[[kernel]] void scaled_softmax(const device float* x [[buffer(0)]],
                               device float* out [[buffer(1)]],
                               constant uint& n [[buffer(2)]],
                               constant float& scale [[buffer(3)]],
                               uint row [[threadgroup_position_in_grid]],
                               uint lane [[thread_index_in_simdgroup]],
                               uint sg [[simdgroup_index_in_threadgroup]]) {
  threadgroup float partial[4];
  const device float* in = x + row * n;
  float m = row_max(in, n, lane, partial, sg);
  float s = 0;
  for (uint j = lane; j < n; j += 32) s += fast::exp((in[j] - m) * scale);
  s = simd_sum(s);
  for (uint j = lane; j < n; j += 32) out[row * n + j] = fast::exp((in[j] - m) * scale) / s;
}
"""


def author_program(tag: str) -> Program:
    text = AUTHOR_SOURCE.replace("{tag}", tag)
    return mtwork.load_metal(text, name="author.metal").kernel("scaled_softmax").program


def mlx_program(headers: tuple[str, ...], function: str, template: tuple) -> Callable:
    kernels = "mlx/backend/metal/kernels/"

    def make(tag: str) -> Program:
        text = "".join(f'#include "{kernels}{h}"\n' for h in headers) + f"// {tag}\n"
        return mtwork.load_metal(text, name="bench.metal").kernel(
            function, template=template).program
    return make


KERNELS = {
    "small body-form kernel": body_program(SMALL),
    "body form, header helpers, threadgroup": body_program(THREADGROUP, HEADER_HELPERS),
    "an author's full-source kernel (includes MLX's utils.h)": author_program,
    "MLX softmax (full source)": mlx_program(("utils.h", "softmax.h"), "softmax_single_row",
                                             ("float", "float", 4)),
    "MLX steel GEMM (full source)": mlx_program(
        ("utils.h", "steel/gemm/gemm.h", "steel/gemm/kernels/steel_gemm_fused.h"), "gemm",
        ("float", 32, 32, 16, 2, 2, False, False)),
}


def cpu() -> float:
    """CPU seconds of this process and of its children so far: those waited for, and the
    live ones (the check's clang session runs on from one compile to the next, and is
    waited for only when it ends)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    live = sum(child_cpu(pid) for pid in children())
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + live


def children() -> list[int]:
    """This process's live children: Linux's list of each thread's (read in
    microseconds), else psutil's walk of every process."""
    tasks = Path(f"/proc/{os.getpid()}/task")
    try:
        return [int(pid) for task in tasks.iterdir()
                for pid in (task / "children").read_text().split()]
    except OSError:
        return [child.pid for child in psutil.Process().children()]


def child_cpu(pid: int) -> float:
    """A live child's CPU seconds: Linux's scheduler count in nanoseconds (the user and
    system times psutil reads are counted in 10 ms ticks), else psutil's; 0 when it has
    ended meanwhile (it is in RUSAGE_CHILDREN then)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    with contextlib.suppress(psutil.Error):
        times = psutil.Process(pid).cpu_times()
        return times.user + times.system
    return 0.0


def timed(step: Callable[[], object]) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), cpu()
    step()
    return time.perf_counter() - w0, cpu() - c0


def summary(values: list[float], digits: int = 3) -> str:
    return (f"{statistics.median(values):.{digits}f} "
            f"[{min(values):.{digits}f}, {max(values):.{digits}f}]")


def measure(make: Callable[[str], Program], rounds: int) -> dict[str, list[float]]:
    checked, unchecked = SimBackend(), SimBackend(checks=False)
    checked.compile(make("warm-up"))  # builds what every later compile starts from
    out: dict[str, list[float]] = {k: [] for k in ("plain", "checked", "check", "check_cpu",
                                                   "plain_cpu")}
    for r in range(rounds):
        order = [("plain", unchecked), ("checked", checked)]
        for name, backend in (order if r % 2 == 0 else order[::-1]):
            program = make(uuid.uuid4().hex)
            wall, spent = timed(lambda b=backend, p=program: b.compile(p))
            out[name].append(wall)
            if name == "plain":
                out["plain_cpu"].append(spent)
        program = make(uuid.uuid4().hex)
        wall, spent = timed(lambda p=program: frontend.violations(p))
        out["check"].append(wall)
        out["check_cpu"].append(spent)
    return out


def cold_compile(checks: bool) -> None:
    """One compile on the (empty) cache this process was given; prints its wall seconds."""
    program = author_program(uuid.uuid4().hex)
    wall, _ = timed(lambda: SimBackend(checks=checks).compile(program))
    print(f"{wall:.3f}")


def cold(rounds: int) -> None:
    times: dict[bool, list[float]] = {False: [], True: []}
    for r in range(rounds):
        for checks in ((False, True) if r % 2 == 0 else (True, False)):
            with tempfile.TemporaryDirectory() as cache:
                out = subprocess.run([sys.executable, __file__, "--cold-step", str(checks)],
                                     env={**os.environ, "MTWORK_CACHE_DIR": cache},
                                     capture_output=True, text=True, check=True)
                times[checks].append(float(out.stdout.strip().splitlines()[-1]))
    ratio = [c / p for c, p in zip(times[True], times[False])]
    print(f"cold compiles on sim (an empty cache), {rounds} rounds, medians [min, max]")
    print(f"  without the check  {summary(times[False])} s")
    print(f"  with the check     {summary(times[True])} s   with/without {summary(ratio, 2)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cold", action="store_true", help="first compiles, empty cache")
    parser.add_argument("--cold-step", choices=("False", "True"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if mlx_include_dir() is None:
        raise SystemExit("the installed mlx has no Metal kernel headers")
    if args.cold_step is not None:
        return cold_compile(args.cold_step == "True")
    if args.cold:
        return cold(args.rounds)
    print(f"warm compiles on sim, {args.rounds} rounds, medians [min, max]")
    for label, make in KERNELS.items():
        m = measure(make, args.rounds)
        added = [c / p for c, p in zip(m["checked"], m["plain"])]
        share = [c / p for c, p in zip(m["check_cpu"], m["plain_cpu"])]
        print(f"\n{label}")
        print(f"  compile without the check  {summary(m['plain'])} s")
        print(f"  compile with the check     {summary(m['checked'])} s   "
              f"with/without {summary(added, 2)}")
        print(f"  the check alone            {summary(m['check'])} s wall, "
              f"{summary(m['check_cpu'])} s CPU   CPU check/compile {summary(share, 2)}")


if __name__ == "__main__":
    main()
