"""MLX's FFT planning and dispatch (mlx/backend/metal/fft.cpp), restated for the tests:
which kernel a length takes (Stockham, Rader, Bluestein, four-step), its function
constants, its precomputed constants and its geometry.

The facts are MLX's (`plan_fft`, `plan_stockham_fft`, `compute_elems_per_thread`,
`compute_raders_constants`, `compute_bluestein_constants`, `fft_op`); the code is this
project's. The precomputed constants are made in float64 and rounded to complex64
(MLX makes Rader's in float32): they differ from MLX's in the last bits at most.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from mtwork import new_buffer

from .metal_path import run_both
from .mlx_kernels import build, ceil_div, metal_library, next_power_of_2

RADICES = (13, 11, 8, 7, 6, 5, 4, 3, 2)  # in MLX's order of preference
MAX_STOCKHAM = 4096
MAX_RADER = 2048
MIN_THREADGROUP_MEM = 256
MIN_COALESCE_WIDTH = 4


def _prime_factors(n: int) -> list[int]:
    factors, z = [], 2
    while z * z <= n:
        if n % z:
            z += 1
        else:
            factors.append(z)
            n //= z
    return factors + ([n] if n > 1 else [])


def _power_of_2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def stockham_steps(n: int) -> list[int]:
    """Steps of each radix (RADICES order); powers of two below 512 use radix 4 and 2."""
    steps = [0] * len(RADICES)
    rest = n
    for i, radix in enumerate(RADICES):
        if _power_of_2(n) and n < 512 and radix > 4:
            continue
        while rest % radix == 0 and rest > 1:
            steps[i] += 1
            rest //= radix
    if rest != 1:
        raise ValueError(f"{n} has no Stockham plan")
    return steps


@dataclass
class Plan:
    n: int
    stockham: list[int] = field(default_factory=lambda: [0] * len(RADICES))
    rader: list[int] = field(default_factory=lambda: [0] * len(RADICES))
    rader_n: int = 1
    bluestein_n: int = -1
    four_step: bool = False
    n1: int = 0
    n2: int = 0


def plan_fft(n: int) -> Plan:
    """MLX's plan for an FFT of length `n` (lengths up to 4096, or a four-step power of 2)."""
    plan = Plan(n)
    if n > MAX_STOCKHAM and _power_of_2(n):
        plan.four_step, plan.n2 = True, (1024 if n > 65536 else 64)
        plan.n1 = n // plan.n2
        return plan
    rest = n
    for factor in _prime_factors(n):
        if factor in RADICES:
            continue
        decomposable = all(f in RADICES for f in _prime_factors(factor - 1))
        if plan.rader_n > 1 or n > MAX_RADER or not decomposable:
            plan.bluestein_n = next_power_of_2(2 * n - 1)
            plan.stockham, plan.rader = stockham_steps(plan.bluestein_n), [0] * len(RADICES)
            return plan
        plan.rader, plan.rader_n = stockham_steps(factor - 1), factor
        rest //= factor
    plan.stockham = stockham_steps(rest)
    return plan


def elems_per_thread(plan: Plan) -> int:
    """MLX's `compute_elems_per_thread` for the lengths the tests use (its special cases
    for 3159, 3645, 3969 and 1982 aside)."""
    used = sorted({RADICES[i % len(RADICES)] for i, s in enumerate(plan.stockham + plan.rader)
                   if s})
    if 7 in used and (11 in used or 13 in used):
        return 7
    if 11 in used and 13 in used:
        return 11
    if len(used) == 1:
        return used[0]
    if len(used) == 2 and (11 in used or 13 in used):
        return sum(used) // 2
    return used[1]


def constants(plan: Plan, n: int, inverse: bool, real: bool) -> dict[str, Any]:
    """The function constants fft_op sets, by their names in fft.h."""
    fft_size = plan.bluestein_n if plan.bluestein_n > 0 else n
    values: dict[str, Any] = {"inv_": inverse, "is_power_of_2_": _power_of_2(fft_size),
                              "elems_per_thread_": elems_per_thread(plan),
                              "rader_m_": n // plan.rader_n}
    for radix, steps in zip(RADICES, plan.stockham):
        values[f"radix_{radix}_steps_"] = steps
    for radix, steps in zip(RADICES, plan.rader):
        values[f"rader_{radix}_steps_"] = steps
    if plan.bluestein_n > 0 and not real:
        values["use_bluestein_twiddle_table_"] = False  # only for 4096-point plans
    return values


def rader_constants(p: int) -> dict[str, np.ndarray]:
    """b_q (the FFT of the permuted twiddles), g_q and g_minus_q for prime `p`."""
    factors = _prime_factors(p - 1)
    root = next(r for r in range(2, p - 1)
                if all(pow(r, (p - 1) // f, p) != 1 for f in factors))
    inverse = pow(root, p - 2, p)
    g_q = np.array([pow(root, i, p) for i in range(p - 1)], np.int16)
    g_minus_q = np.array([pow(inverse, i, p) for i in range(p - 1)], np.int16)
    b_q = np.fft.fft(np.exp(-2j * np.pi * g_minus_q.astype(np.float64) / p))
    return {"raders_b_q": b_q.astype(np.complex64), "raders_g_q": g_q,
            "raders_g_minus_q": g_minus_q}


def bluestein_constants(n: int, bluestein_n: int) -> dict[str, np.ndarray]:
    """w_q (the FFT of the chirp, padded to bluestein_n) and w_k (the chirp)."""
    i = np.arange(-n + 1, n, dtype=np.float64)
    w_q = np.zeros(bluestein_n, np.complex128)
    w_q[: 2 * n - 1] = np.exp(1j * np.pi * i * i / n)
    k = np.arange(n, dtype=np.float64)
    return {"w_q": np.fft.fft(w_q).astype(np.complex64),
            "w_k": np.exp(-1j * np.pi * k * k / n).astype(np.complex64)}


@dataclass(frozen=True)
class Geometry:
    threadgroup_batch: int
    threadgroup_mem: int
    grid: tuple[int, int, int]
    threads: tuple[int, int, int]


def geometry(plan: Plan, fft_size: int, total_batch: int, real: bool,
             four_step: bool) -> Geometry:
    """fft_op's threadgroup batching, threadgroup memory size and grid."""
    per_fft = ceil_div(fft_size, elems_per_thread(plan))
    batch = max(MIN_THREADGROUP_MEM // fft_size, 1)
    if four_step:
        batch = max(batch, min(MIN_COALESCE_WIDTH, MAX_STOCKHAM // fft_size))
    groups = ceil_div(total_batch, batch)
    if real and not four_step:
        groups = ceil_div(groups, 2)  # two real FFTs at once
    return Geometry(batch, next_power_of_2(batch * fft_size), (groups, batch, per_fft),
                    (1, batch, per_fft))


def _type(dtype: mx.Dtype) -> str:
    return "float" if dtype == mx.float32 else "float2"


def fft_pass(x: Any, out_shape: tuple[int, ...], out_dtype: mx.Dtype, *, inverse: bool,
             real: bool, n: int, step: int | None = None, n1: int = 0, n2: int = 0
             ) -> tuple[np.ndarray, float]:
    """One of fft_op's dispatches over the last axis of `x`: the FFT of length `n`
    (`step` 0 or 1: a pass of the four-step FFT of n1 * n2); returns the output and the
    compile time."""
    plan = plan_fft(n)
    in_dtype = x.dtype if isinstance(x, mx.array) else mx.complex64
    size = int(np.prod(out_shape)) if out_dtype == mx.float32 else int(np.prod(x.shape))
    total_batch = size // n
    fft_size = plan.bluestein_n if plan.bluestein_n > 0 else n
    geo = geometry(plan, fft_size, total_batch, real, step is not None)
    types = (geo.threadgroup_mem, _type(in_dtype), _type(out_dtype))
    buffers: dict[str, Any] = {"in": x, "out": new_buffer(out_shape, out_dtype)}
    if plan.bluestein_n > 0:
        function = "bluestein_fft"
        buffers |= {**bluestein_constants(n, plan.bluestein_n), "length": n,
                    "n": plan.bluestein_n, "batch_size": total_batch}
    elif plan.rader_n > 1:
        function = "rader_fft"
        buffers |= {**rader_constants(plan.rader_n), "n": n, "batch_size": total_batch,
                    "rader_n": plan.rader_n}
    elif step is not None:
        function, types = "four_step_fft", (*types, step, real)
        buffers |= {"n1": n1, "n2": n2, "batch_size": total_batch}
    else:
        function = "fft"
        buffers |= {"n": n, "batch_size": total_batch}
    built = build(metal_library("defines.h", "fft.h"), function, types,
                  constants(plan, n, inverse, real))
    out = run_both(built.kernel, buffers=buffers, grid=geo.grid,
                   threads_per_threadgroup=geo.threads)
    return out["out"], built.compile_s
