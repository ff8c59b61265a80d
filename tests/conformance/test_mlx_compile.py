"""The rest of MLX's kernel library, compiled unchanged: every kernel function of the
wheel's headers that no other test runs, instantiated as the first instantiation of its
`.metal` file does (the arguments are those of its `instantiate_*` lines), through the
include lines of that file.

These are compile checks, not agreement checks; the page lists them with the reference
"compiled only". The first kernel of each library runs by default, the rest under
`-m slow`. Together with the tests that run kernels, every kernel function of every
header (the Metal 4 ones aside, see test_mlx_unsupported.py) compiles at least once.
"""

from __future__ import annotations

import time

import pytest

from .conftest import source_text
from .mlx_kernels import MLX, metal_library
from .report import record

UTILS_GEMM = ("utils.h", "steel/gemm/gemm.h")
QUANTIZED = (*UTILS_GEMM, "quantized_utils.h", "quantized.h")
FP_QUANTIZED = (*UTILS_GEMM, "quantized_utils.h", "fp_quantized.h")
CONV = ("utils.h", "steel/gemm/mma.h", "steel/conv/conv.h", "steel/conv/params.h")

# (library includes, function, template arguments, function constants)
KERNELS = [
    (("utils.h", "sort.h", "searchsorted.h"), "searchsorted", ("float", False), {}),
    (("utils.h", "sort.h"), "block_sort_nc", ("float", "float", False, 32, 4), {}),
    (("utils.h", "gemv_masked.h"), "gemv_masked",
     ("float", "bool", "bool", 2, 1, 4, 8, 1, 4, False), {}),
    (("utils.h", "gemv_masked.h"), "gemv_t_masked",
     ("float", "bool", "bool", 1, 1, 8, 4, 4, 1, False), {}),
    (("gemv.h",), "gemv_gather", ("float", 4, 1, 1, 32, 1, 4), {}),
    (("gemv.h",), "gemv_t_gather", ("float", 1, 2, 8, 4, 4, 1), {}),
    (("gemv.h",), "gemv_wide_gather", ("half", 2, 16), {"gemv_wide_has_batch": False,
                                                        "gemv_wide_do_axpby": False}),
    ((*UTILS_GEMM, "steel/gemm/kernels/steel_gemm_masked.h"), "block_masked_gemm",
     ("half", "bool", "bool", 32, 32, 16, 2, 2, False, False, True, True), {}),
    ((*UTILS_GEMM, "steel/gemm/kernels/steel_gemm_segmented.h"), "segmented_mm",
     ("half", 64, 64, 16, 2, 2, False, False, "float"), {}),
    ((*UTILS_GEMM, "steel/gemm/kernels/steel_gemm_gather.h"), "gather_mm_rhs",
     ("half", 16, 64, 16, 1, 2, False, False, "float"), {}),
    ((*UTILS_GEMM, "steel/gemm/kernels/steel_gemm_splitk.h"), "gemm_splitk_accum_axpby",
     ("float", "bfloat16_t"), {}),
    ((*CONV, "steel/utils.h", "steel/conv/kernels/steel_conv_general.h"),
     "implicit_gemm_conv_2d_general", ("float", 32, 8, 16, 4, 1), {}),
    ((*CONV, "steel/conv/kernels/steel_conv_3d.h"), "implicit_gemm_conv_3d",
     ("float", 32, 8, 16, 4, 1, True), {}),
    ((*QUANTIZED,), "affine_gather_qmv_fast", ("float", 128, 2), {}),
    ((*QUANTIZED,), "affine_gather_qmm_n", ("float", 128, 2), {}),
    ((*QUANTIZED,), "affine_gather_qmm_t", ("float", 128, 2, True), {}),
    ((*QUANTIZED,), "affine_qmv_quad", ("float", 128, 2, 64, True), {}),
    ((*QUANTIZED,), "affine_qmv_wide", ("float", 128, 2, 2, 8, False), {}),
    ((*QUANTIZED,), "affine_qvm_split_k", ("float", 128, 2, 8), {}),
    ((*QUANTIZED,), "affine_qmm_t_splitk", ("float", 128, 2, True), {}),
    ((*QUANTIZED,), "affine_gather_qmm_rhs", ("float", 128, 2, 16, 32, 32, 1, 2, True), {}),
    ((*QUANTIZED,), "affine_gather_qmv", ("float", 128, 2), {}),
    ((*QUANTIZED,), "affine_gather_qvm", ("float", 128, 2), {}),
    ((*FP_QUANTIZED,), "fp_qvm", ("float", 16, 4, True), {}),
    ((*FP_QUANTIZED,), "fp_gather_qmv_fast", ("float", 16, 4), {}),
    ((*FP_QUANTIZED,), "fp_gather_qvm", ("float", 16, 4), {}),
    ((*FP_QUANTIZED,), "fp_gather_qmm_t", ("float", 16, 4, True), {}),
    ((*FP_QUANTIZED,), "fp_gather_qmm_n", ("float", 16, 4), {}),
    ((*FP_QUANTIZED,), "fp_qmm_t_splitk", ("float", 16, 4, True), {}),
    ((*FP_QUANTIZED,), "fp_qmm_n", ("float", 16, 4, True), {}),
    ((*FP_QUANTIZED,), "fp_gather_qmv", ("float", 16, 4), {}),
    ((*FP_QUANTIZED,), "fp_qmv_quad", ("float", 16, 4, 64, True), {}),
    ((*FP_QUANTIZED,), "fp_qmv_wide", ("float", 16, 4, 2, 16, False), {}),
    ((*FP_QUANTIZED,), "fp_qvm_split_k", ("float", 16, 4, 8), {}),
    ((*FP_QUANTIZED,), "fp_gather_qmm_rhs", ("float", 16, 4, 16, 32, 32, 1, 2, True), {}),
    ((*FP_QUANTIZED,), "fp_quantize_dequantize", ("float", 16, 4, False), {}),
    ((*FP_QUANTIZED,), "fp_quantize", ("float", 16, 4, False), {}),
    ((*FP_QUANTIZED,), "fp_dequantize", ("float", 16, 4, False), {}),
    (("utils.h", "sdpa_vector.h"), "sdpa_vector_2pass_1", ("float", 64, 64),
     {"has_mask": False, "query_transposed": False, "do_causal": False, "bool_mask": False,
      "float_mask": False, "has_sinks": False}),
    (("utils.h", "sdpa_vector.h"), "sdpa_vector_2pass_2", ("float", 64), {}),
    (("utils.h", "sdpa_vector.h"), "sdpa_vector_2pass_1_gqa", ("float", 64, 64, 4, 2),
     {"has_mask": False, "query_transposed": False, "do_causal": False, "bool_mask": False,
      "float_mask": False, "has_sinks": False}),
    (("utils.h", "sdpa_blocked.h"), "sdpa_blocked_scale_copy", ("float",), {}),
    (("utils.h", "sdpa_blocked.h"), "sdpa_blocked_causal_mask", ("float",), {}),
    (("utils.h", "unary_ops.h", "unary.h"), "unary_v2", ("float", "float", "Abs"), {}),
    (("utils.h", "binary_ops.h", "binary.h"), "binary_vv2", ("float", "float", "Add"), {}),
    (("utils.h", "binary_ops.h", "binary.h"), "binary_g_nd3", ("float", "float", "Add", "int"),
     {}),
    (("utils.h", "binary_ops.h", "binary_two.h"), "binary_sv2", ("float", "float", "DivMod"),
     {}),
    (("utils.h", "ternary_ops.h", "ternary.h"), "ternary_g", ("float", "Select", 1, "int64_t"),
     {}),
    (("utils.h", "ternary_ops.h", "ternary.h"), "ternary_v2", ("float", "Select", False, False),
     {}),
    (("utils.h", "copy.h"), "copy_v2", ("float", "half"), {}),
    (("utils.h", "copy.h"), "copy_gg_dynamic", ("float", "float", 1, "int64_t"), {}),
    (("defines.h", "fft.h"), "generate_bluestein_twiddles", None, {}),
    (("utils.h", "cross_entropy.h"), "cross_entropy", ("float",), {}),
    (("utils.h", "cross_entropy.h"), "cross_entropy_vjp", ("float",), {}),
    (("utils.h", "gated_delta_update_vjp.h"), "gated_delta_vjp_seq",
     ("float", 32, 16, 1, 2, 4), {}),
    (("utils.h", "indexing/gather_axis.h"), "gather_axis", ("float", "int", "int", True, True),
     {}),
    (("utils.h", "indexing/gather_front.h"), "gather_front", ("float", "int", "int", 2), {}),
    (("utils.h", "indexing/masked_scatter.h"), "masked_assign_impl", ("float", True), {}),
    (("utils.h", "atomic.h", "reduction/ops.h", "indexing/scatter.h"), "slice_update_op_impl",
     ("float", "int", "Sum<float>", True, True, False, 2, 2), {}),
    (("defines.h", "utils.h", "atomic.h", "reduction/ops.h", "reduce.h"), "init_reduce",
     ("float", "Sum<float>"), {}),
]




def _cases() -> list:
    """Every kernel; the first of each library runs by default, the rest under -m slow
    (each library compiled at least once in the default run)."""
    seen: set[tuple[str, ...]] = set()
    cases = []
    for headers, function, template, constants in KERNELS:
        marks = [pytest.mark.slow] if headers in seen else []
        seen.add(headers)
        cases.append(pytest.param(headers, function, template, constants, id=function,
                                  marks=marks))
    return cases


@pytest.mark.parametrize(("headers", "function", "template", "constants"), _cases())
def test_compiles_unchanged(headers, function, template, constants) -> None:
    kernel = metal_library(*headers).kernel(function, template=template, constants=constants)
    start = time.perf_counter()
    kernel.compile()
    record(suite=MLX, kernel=kernel.name, source=source_text(MLX), reference="compiled only",
           agreement=None, compile_s=time.perf_counter() - start, status="pass")
