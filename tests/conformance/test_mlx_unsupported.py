"""What of MLX's kernel library `sim` does not run, and the error a user gets.

MLX's `*_nax` kernels use Metal 4's tensor operations (MetalPerformancePrimitives,
`mpp::tensor_ops`, on the GPUs that have neural accelerators), which the emulator does not
have: compiling one must stop with one error naming the feature, not a cascade. Each is
recorded as an unsupported row of the conformance page, with that error.
"""

from __future__ import annotations

import pytest

from mtwork import CompileError
from mtwork.msl.signature import KernelSignature

from .mlx_kernels import expect_unsupported, metal_library
from .sources import mlx_kernels_dir

METAL4 = r"Metal 4 tensor APIs \(MetalPerformancePrimitives, mpp::tensor_ops\) are not supported"


# The includes of MLX's *_nax.metal files, in order (the gated-delta ones are included
# by gated_delta_update's JIT source, after utils.h).
_GEMM_NAX = ("utils.h", "steel/gemm/gemm_nax.h")
NAX_LIBRARIES = {
    "fp_quantized_nax.h": ("utils.h", "steel/gemm/gemm.h", "quantized_utils.h",
                           "steel/gemm/nax.h", "fp_quantized_nax.h"),
    "quantized_nax.h": ("utils.h", "steel/gemm/gemm.h", "steel/gemm/nax.h",
                        "steel/gemm/loader.h", "quantized_nax.h"),
    "steel_attention_nax.h": ("utils.h", "steel/attn/kernels/steel_attention_nax.h"),
    **{name: (*_GEMM_NAX, f"steel/gemm/kernels/{name}") for name in (
        "steel_gemm_fused_nax.h", "steel_gemm_gather_nax.h", "steel_gemm_segmented_nax.h",
        "steel_gemm_splitk_nax.h", "steel_gemm_thin_nax.h")},
    "gated_delta_update_nax.h": ("utils.h", "gated_delta_update_nax.h"),
    "gated_delta_update_nax_vjp.h": ("utils.h", "gated_delta_update_nax_vjp.h"),
}


def test_every_nax_header_is_covered() -> None:
    root = mlx_kernels_dir()
    # Headers of helpers (nax.h, gemm_nax.h, gated_delta_nax_ops.h) define no kernels.
    with_kernels = {p.name for p in root.rglob("*_nax*.h") if "[[kernel" in p.read_text()}
    assert with_kernels == set(NAX_LIBRARIES)


def _placeholder_template(signature: KernelSignature) -> tuple[str, ...]:
    """Template arguments that instantiate anything: the compile stops at the include."""
    return tuple("float" if p.is_type else ("true" if p.kind == "bool" else "64")
                 for p in signature.template_params if p.default is None)


@pytest.mark.parametrize("header", list(NAX_LIBRARIES))
def test_metal4_kernels_stop_with_one_error(header) -> None:
    lib = metal_library(*NAX_LIBRARIES[header])
    assert lib.kernels, f"{header} lists no kernels"
    for function, signature in lib.kernels.items():
        kernel = lib.kernel(function, template=_placeholder_template(signature))
        error = expect_unsupported(f"{function} ({header})", CompileError, METAL4,
                                   kernel.compile)
        message = str(error)
        assert message.count("error:") == 1, f"{function}: more than one error:\n{message}"
