"""How long `sim` takes to compile kernels of MLX's big libraries, against the targets
(a further kernel of a library already used: under 3 s; a first one: under 20 s, on 2
cores), with and without debug information side by side.

A library here is what one of MLX's `.metal` files makes (quantized.metal: utils.h, the
steel GEMM headers, quantized.h: some 6,000 lines after includes). For each, on a cache
that has the emulator runtime and MLX's rewritten headers but no kernel yet, it times the
first kernel (listing the library through the preprocessor, then compiling) and two more
kernels of the same library in the same process. Each measurement runs in a fresh
process on a fresh copy of that cache; the two variants alternate which goes first.

    python bench/compile_latency.py [--rounds 3]

Also printed once: a cold start on an empty cache, by stage (the runtime built, MLX's
headers rewritten, quantized's first kernel), the wait of a first kernel call ever.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
K = "mlx/backend/metal/kernels/"

# (library, its .metal file's includes, three (function, template) kernels of it).
LIBRARIES = {
    "quantized": (("utils.h", "steel/gemm/gemm.h", "quantized_utils.h", "quantized.h"), [
        ("affine_qmm_t", ("float", 64, 4, True, False)),
        ("affine_qmv", ("float", 64, 4, False)),
        ("affine_qvm", ("float", 64, 4, False))]),
    "fp_quantized": (("utils.h", "steel/gemm/gemm.h", "quantized_utils.h", "fp_quantized.h"), [
        ("fp_qmm_t", ("float", 32, 4, True, False)),
        ("fp_qmv_fast", ("float", 32, 4, False)),
        ("fp_qmv", ("float", 16, 4, False))]),
    "steel_attention": (("utils.h", "steel/attn/kernels/steel_attention.h"), [
        ("attention", ("float", 32, 16, 64, 64, 4, 1)),
        ("attention", ("float", 32, 32, 128, 128, 4, 1)),
        ("attention", ("half", 32, 16, 64, 64, 4, 1))]),
    "fft": (("defines.h", "fft.h"), [
        ("fft", (256, "float2", "float2")),
        ("rader_fft", (512, "float2", "float2")),
        ("bluestein_fft", (1024, "float2", "float2"))]),
}
VARIANTS = {"debug info (zig's default)": True, "no debug info (-g0)": False}


def _newest_library_bytes() -> int:
    kernels = Path(os.environ["MTWORK_CACHE_DIR"]) / "kernels"
    return max(kernels.glob("*.so"), key=lambda p: p.stat().st_mtime).stat().st_size


def _measure(debug_info: bool, libraries: list[str], count: int) -> dict:
    """Runs in a fresh process: times the first `count` kernels of each library."""
    import mtwork
    from mtwork.backends.sim.compile import compiler

    if debug_info:
        compiler.NO_DEBUG_INFO = ()
    out = {}
    for name in libraries:
        headers, kernels = LIBRARIES[name]
        start = time.perf_counter()
        text = "".join(f'#include "{K}{h}"\n' for h in headers)
        lib = mtwork.load_metal(text, name=f"{name}.metal")
        times, sizes = [], []
        for function, template in kernels[:count]:
            lib.kernel(function, template=template).compile()
            times.append(time.perf_counter() - start)
            sizes.append(_newest_library_bytes())
            start = time.perf_counter()
        out[name] = {"first": times[0], "further": times[1:], "so_bytes": max(sizes)}
    return out


def _run(cache: Path, *args: str) -> dict:
    env = {**os.environ, "MTWORK_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cold_start(work: Path) -> dict[str, float]:
    """An empty cache: the runtime, MLX's rewritten headers, then quantized's first kernel,
    each timed, in one fresh process."""
    env = {**os.environ, "MTWORK_CACHE_DIR": str(work / "cold"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, __file__, "--cold-worker"], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cold_stages() -> dict[str, float]:
    """Runs in a fresh process on an empty cache."""
    from mtwork.backends.sim.compile import compiler

    stages = {}
    start = time.perf_counter()
    compiler.runtime_library()
    stages["runtime"] = time.perf_counter() - start
    start = time.perf_counter()
    compiler.prelude_dir()
    stages["MLX headers"] = time.perf_counter() - start
    stages["first kernel"] = _measure(False, ["quantized"], 1)["quantized"]["first"]
    return stages


def _base_cache(work: Path) -> Path:
    """A cache with the runtime and MLX's rewritten headers, and no kernel."""
    base = work / "base"
    env = {**os.environ, "MTWORK_CACHE_DIR": str(base), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", "from mtwork.backends.sim import compiler; "
                    "compiler.runtime_library(); compiler.prelude_dir()"],
                   env=env, check=True, capture_output=True)
    return base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cold-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--debug-info", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--libraries", default=",".join(LIBRARIES), help=argparse.SUPPRESS)
    parser.add_argument("--kernels", type=int, default=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_measure(args.debug_info, args.libraries.split(","), args.kernels)))
        return
    if args.cold_worker:
        print(json.dumps(_cold_stages()))
        return
    with tempfile.TemporaryDirectory(prefix="mtwork-compile-bench-") as tmp:
        work = Path(tmp)
        cold = _cold_start(work)
        base = _base_cache(work)
        results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
        names = list(VARIANTS)
        for r in range(args.rounds):
            for variant in names[r % 2:] + names[: r % 2]:
                cache = work / f"round{r}-{VARIANTS[variant]}"
                shutil.copytree(base, cache, symlinks=True)
                flags = ["--worker"] + (["--debug-info"] if VARIANTS[variant] else [])
                results[variant].append(_run(cache, *flags))
                shutil.rmtree(cache)
    _report(results, cold, args.rounds)


FURTHER_TARGET_S, FIRST_TARGET_S = 3.0, 20.0


def _report(results: dict[str, list[dict]], cold: dict[str, float], rounds: int) -> None:
    stages = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in cold.items())
    print(f"cold start (empty cache): {sum(cold.values()):.1f} s ({stages})")
    print(f"\nmedian of {rounds} rounds, seconds (2 cores, a shared machine); targets: "
          f"first < {FIRST_TARGET_S:g} s, further < {FURTHER_TARGET_S:g} s")
    print(f"{'library':<16}" + "".join(f"{v + ': first / further':>44}{'.so':>9}"
                                       for v in results))
    ratios, worst_first, worst_further = [], 0.0, 0.0
    for name in LIBRARIES:
        row = f"{name:<16}"
        firsts = []
        for runs in results.values():
            first = statistics.median(run[name]["first"] for run in runs)
            further = statistics.median(t for run in runs for t in run[name]["further"])
            size = statistics.median(run[name]["so_bytes"] for run in runs)
            row += f"{first:>29.2f} / {further:>5.2f}{'':>8}{size / 1e6:>7.2f}MB"
            firsts.append(first)
            worst_first, worst_further = max(worst_first, first), max(worst_further, further)
        print(row)
        ratios.append(firsts[1] / firsts[0])
    print(f"\nfirst kernel, -g0 / debug info: median ratio {statistics.median(ratios):.2f} "
          f"[{min(ratios):.2f}, {max(ratios):.2f}] over the libraries")
    met = worst_first < FIRST_TARGET_S and worst_further < FURTHER_TARGET_S
    print(f"slowest first kernel {worst_first:.2f} s, slowest further kernel "
          f"{worst_further:.2f} s: targets {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
