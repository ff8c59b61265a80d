"""The Metal sources of older llama-cpp-python and MLX releases, fetched as packages,
compile unchanged on sim, and pass the Metal front end: each leaned on something sim lacked
(llama.cpp's late-2024 flash attention divides a matrix by a scalar; MLX's early-2024
bf16.h tests `__HAVE_BFLOAT__`, which Apple's compiler defines from MSL 3.1; MLX's mid-2024
headers overload functions on address spaces after a macro definition, and must be found
before the installed MLX's headers of the same names).

The default run compiles one kernel of the 2023 llama.cpp source; the other releases and
every kernel are under `-m slow`.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mtwork

from .llama_cpp_sdist import Unavailable
from .releases import (
    LLAMA_2023,
    LLAMA_LATE_2024,
    MLX_EARLY_2024,
    MLX_MID_2024,
    llama_metal,
    mlx_include,
)


def _fetched(fetch, spec: str):
    try:
        return fetch(spec)
    except Unavailable as exc:
        pytest.fail(str(exc))


def llama_library(spec: str) -> mtwork.Library:
    return mtwork.load_metal(_fetched(llama_metal, spec))


def names(lib: mtwork.Library) -> list[str]:
    """The host names and the plain kernels of a library (what its host could ask for)."""
    plain = [n for n, s in lib.kernels.items() if not s.is_template]
    return [*lib.host_names, *[n for n in plain if n not in lib.host_names]]


def test_a_kernel_of_llama_cpp_2023_compiles_unchanged() -> None:
    lib = llama_library(LLAMA_2023)
    assert len(names(lib)) == 102
    lib.kernel("kernel_mul_mv_q4_0_f32").compile()


@pytest.mark.slow
@pytest.mark.parametrize("spec", [LLAMA_2023, LLAMA_LATE_2024])
def test_every_kernel_of_an_older_llama_cpp_compiles_unchanged(spec: str) -> None:
    lib = llama_library(spec)
    for name in names(lib):
        lib.kernel(name).compile()


@pytest.mark.slow
def test_llama_cpp_late_2024_flash_attention_divides_a_matrix_by_a_scalar() -> None:
    lib = llama_library(LLAMA_LATE_2024)
    for name in ("kernel_flash_attn_ext_f16_h64", "kernel_flash_attn_ext_vec_f16_h128"):
        lib.kernel(name).compile()


BF16_KERNEL = """#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/unary.h"
kernel void k(device const bfloat16_t* x [[buffer(0)]], device float* out [[buffer(1)]],
              uint i [[thread_position_in_grid]]) {
  out[i] = float(Exp()(x[i])) + float(Limits<bfloat16_t>::max > bfloat16_t(1.0f));
}
"""


@pytest.mark.slow
def test_mlx_early_2024_bf16_takes_metals_bfloat() -> None:
    lib = mtwork.load_metal(BF16_KERNEL, include_dirs=[_fetched(mlx_include, MLX_EARLY_2024)])
    assert any("mlx-0.4.0" in str(p) for p in lib.files)  # its headers, not the wheel's
    x = mx.array([0.0, 1.0, 2.0, -1.0], dtype=mx.bfloat16)
    out = lib.kernel("k")(buffers={"x": x, "out": np.zeros(4, np.float32)}, grid=(4,),
                          threads_per_threadgroup=(4,))["out"]
    expected = np.exp(np.array(x.astype(mx.float32))) + 1.0
    np.testing.assert_allclose(out, expected, rtol=2.0 ** -7)


QUANTIZED = """#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm.h"
#include "mlx/backend/metal/kernels/quantized.h"
"""


@pytest.mark.slow
@pytest.mark.parametrize(("function", "template"), [
    ("qmv_fast", ("float", 64, 4)), ("qmm_t", ("float", 64, 4, True)), ("qvm", ("half", 32, 8)),
])
def test_mlx_mid_2024_quantized_kernels_compile_from_its_own_headers(function, template) -> None:
    lib = mtwork.load_metal(QUANTIZED, include_dirs=[_fetched(mlx_include, MLX_MID_2024)])
    lib.kernel(function, template=template).compile()
