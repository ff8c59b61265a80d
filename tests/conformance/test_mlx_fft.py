"""MLX's FFTs (fft.h: Stockham `fft`, `rader_fft`, `bluestein_fft`, `four_step_fft`) on
`sim`, against `mx.fft.fft` / `mx.fft.ifft` / `mx.fft.rfft` on the CPU (pocketfft).

The template arguments are those of fft.metal (`instantiate_fft(tg_mem_size, in_T,
out_T)`, ...: threadgroup memory sizes 256 to 4096, float and float2); function constants
(declared through MLX's STEEL_CONST macro, in fft.h), precomputed constants and geometry
follow fft.cpp (see `mlx_fft`). Tolerances are float32 rounding of an O(n log n) sum.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from .mlx_fft import fft_pass, plan_fft
from .mlx_kernels import MLX, rng


def _complex(batch: int, n: int) -> mx.array:
    g = rng()
    return mx.array((g.standard_normal((batch, n)) + 1j * g.standard_normal((batch, n)))
                    .astype(np.complex64))


@pytest.mark.parametrize(("n", "inverse", "algorithm"), [
    (64, False, "stockham"), (60, True, "stockham"), (34, False, "rader"),
    (47, False, "bluestein"),
])
def test_c2c_fft(agreement, n, inverse, algorithm) -> None:
    plan = plan_fft(n)
    kind = ("bluestein" if plan.bluestein_n > 0 else "rader" if plan.rader_n > 1
            else "stockham")
    assert kind == algorithm, f"length {n} plans as {kind}"
    x = _complex(5, n)
    out, compile_s = fft_pass(x, x.shape, mx.complex64, inverse=inverse, real=False, n=n)
    expected = mx.fft.ifft(x) if inverse else mx.fft.fft(x)
    name = f"{kind} fft n={n}" + (" inverse" if inverse else "")
    agreement(name, MLX, out, expected, reference=f"mx.fft.{'i' if inverse else ''}fft (CPU)",
              compile_s=compile_s, atol=1e-4 * np.sqrt(n), rtol=1e-4)


def test_rfft(agreement) -> None:
    # float in, float2 out (n / 2 + 1 bins): two real FFTs a thread batch, so the grid
    # halves.
    n = 64
    x = mx.array(rng().standard_normal((6, n)).astype(np.float32))
    out, compile_s = fft_pass(x, (6, n // 2 + 1), mx.complex64, inverse=False, real=True, n=n)
    agreement(f"stockham rfft n={n}", MLX, out, mx.fft.rfft(x), reference="mx.fft.rfft (CPU)",
              compile_s=compile_s, atol=1e-4 * np.sqrt(n), rtol=1e-4)


def test_four_step_fft(agreement) -> None:
    # n = 8192 > 4096, a power of two: four_step_fft in two passes, n1 = 128 columns with
    # stride n2 = 64 (step 0, with twiddles) into a complex64 temporary, then n2 = 64
    # rows (step 1).
    n = 8192
    plan = plan_fft(n)
    assert (plan.four_step, plan.n1, plan.n2) == (True, 128, 64)
    x = _complex(2, n)
    common = {"inverse": False, "real": False, "n1": plan.n1, "n2": plan.n2}
    temp, first_s = fft_pass(x, x.shape, mx.complex64, n=plan.n1, step=0, **common)
    out, second_s = fft_pass(temp, x.shape, mx.complex64, n=plan.n2, step=1, **common)
    agreement(f"four_step fft n={n}", MLX, out, mx.fft.fft(x), reference="mx.fft.fft (CPU)",
              compile_s=first_s + second_s, atol=1e-4 * np.sqrt(n), rtol=1e-4)
