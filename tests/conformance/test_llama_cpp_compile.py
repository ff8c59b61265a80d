"""Every kernel of llama.cpp's shipped Metal library compiles unchanged on sim.

Each library file of ggml-metal/kernels is loaded as the host compiles it and every host
name it lists (explicit instantiations and plain kernels, after the preprocessor) is
compiled with function-constant values the host sets for a common configuration
(ggml-metal-device.cpp, ``ggml_metal_library_get_pipeline_*``: 4 SIMD-groups, one batch,
no broadcast, f16 KV of head size 128, ...). A kernel that cannot compile becomes an
"unsupported" row of the report with the error a user gets; the test requires none. The
whole library (1066 host names in 0.3.36) is slow; the default run compiles the first
kernel of each file that its other tests leave uncompiled.
"""

from __future__ import annotations

import time

import pytest

import mtwork
from mtwork.errors import CompileError

from .llama_cpp import DEFINES, kernel_files, library, src
from .llama_cpp_sdist import source_label
from .report import record, record_unsupported

SUITE = "llama-cpp-python"

# Function constants by name, at values the host code sets for an ordinary model
# (ggml-metal-device.cpp; sizes that divide, e.g. r2 and r3, are 1, never 0).
HOST_VALUES: dict[str, int | bool] = {
    "FC_unary_op": 0, "FC_unary_cnt": False, "FC_sum_rows_op": 0,
    "FC_bin_op": 0, "FC_bin_f": 1, "FC_bin_rb": False, "FC_bin_cb": False,
    "FC_norm_use_scale": False, "FC_rope_is_imrope": False, "FC_rope_is_back": False,
    "FC_upscale_aa": False, "FC_pad_circular": False, "FC_count_equal_nsg": 4,
    "FC_mul_mv_nsg": 4, "FC_mul_mv_nxpsg": 16, "FC_mul_mv_ne12": 1, "FC_mul_mv_r2": 1,
    "FC_mul_mv_r3": 1, "FC_mul_mv_split": False,
    "FC_mul_mm_bc_inp": False, "FC_mul_mm_bc_out": False, "FC_mul_mm_ne12": 1,
    "FC_mul_mm_ne13": 1, "FC_mul_mm_r2": 1, "FC_mul_mm_r3": 1, "FC_mul_mm_id_amax": False,
    "FC_ssm_conv_bs": 2, "FC_ssm_conv_silu": False, "FC_ssm_conv_nc": 4,
    "FC_solve_tri_nsg": 8, "FC_solve_tri_n": 64, "FC_solve_tri_k": 16,
    "FC_gated_delta_net_ne20": 128, "FC_gated_delta_net_ne30": 1, "FC_gated_delta_net_K": 1,
    "FC_topk_moe_with_norm": False, "FC_topk_moe_n_expert": 8, "FC_topk_moe_top_k": 2,
    "FC_moe_reduce_n_expert_used": 2, "FC_dsv4_hc_n_hc": 4,
    "FC_flash_attn_ext_pad_has_mask": True, "FC_flash_attn_ext_pad_ncpsg": 64,
    "FC_flash_attn_ext_blk_nqptg": 8, "FC_flash_attn_ext_blk_ncpsg": 64,
    **{f"FC_flash_attn_ext{v}_{flag}": flag == "has_mask"
       for v in ("", "_vec") for flag in ("has_mask", "has_sinks", "has_bias", "has_scap",
                                          "has_kvpad")},
    "FC_flash_attn_ext_bc_mask": False, "FC_flash_attn_ext_vec_has_sparse": False,
    "FC_flash_attn_ext_ns10": 128, "FC_flash_attn_ext_ns20": 128, "FC_flash_attn_ext_nsg": 4,
    "FC_flash_attn_ext_vec_ns10": 128, "FC_flash_attn_ext_vec_ns20": 128,
    "FC_flash_attn_ext_vec_nsg": 1, "FC_flash_attn_ext_vec_nwg": 32,
    "FC_flash_attn_ext_vec_reduce_DV": 128, "FC_flash_attn_ext_vec_reduce_NWG": 32,
}


def host_names(lib: mtwork.Library) -> list[str]:
    """What the host can ask the library for: its host names and its plain kernels."""
    plain = [n for n, s in lib.kernels.items() if not s.is_template]
    return [*lib.host_names, *[n for n in plain if n not in lib.host_names]]


def constants_of(lib: mtwork.Library) -> dict[str, int | bool]:
    """The host's values of the function constants `lib` declares."""
    unknown = sorted(set(lib.function_constants) - set(HOST_VALUES))
    assert not unknown, f"no host value for function constants {unknown}"
    return {n: HOST_VALUES[n] for n in lib.function_constants}


def compile_all(file: str, names: list[str]) -> list[tuple[str, CompileError]]:
    """Compiles `names` of `file`; records the file's row and a row per kernel that stops
    with a CompileError; returns those."""
    lib = library(file)
    constants = constants_of(lib)
    failed = []
    start = time.perf_counter()
    for name in names:
        try:
            lib.kernel(name, constants=constants).compile()
        except CompileError as exc:
            failed.append((name, exc))
            record_unsupported(suite=SUITE, kernel=f"{file}: {name}", source=source_label(),
                               error=first_error(exc))
    record(suite=SUITE, kernel=f"{file} (every host name compiles)", source=source_label(),
           reference=f"compiled only: {len(names) - len(failed)} of {len(host_names(lib))} "
                     f"host names in this run", agreement=None,
           compile_s=round(time.perf_counter() - start, 2),
           status="fail" if failed else "pass")
    return failed


def first_error(exc: CompileError) -> str:
    """The compiler's first error line, without the file's path: what a user reads first."""
    for line in str(exc).splitlines():
        if "error:" in line:
            return "CompileError: " + line.split("error:", 1)[1].strip()
    return f"CompileError: {exc}"


def _report(failed: list[tuple[str, CompileError]]) -> str:
    return "\n".join(f"{n}: {first_error(e)}" for n, e in failed)


# Files whose kernels no test of the default run compiles (the others' tests run their
# kernels), and one quantised flash attention of each form for the seven KV types.
DEFAULT_FILES = ("conv.metal", "fa_q4_0.metal", "fa_vec_q4_0.metal", "misc.metal",
                 "pool.metal", "reduce.metal", "solve_tri.metal", "tri.metal", "upscale.metal",
                 "wkv.metal")


@pytest.mark.parametrize("file", [f for f in kernel_files() if f in DEFAULT_FILES])
def test_first_kernel_of_a_file_compiles(file: str) -> None:
    failed = compile_all(file, host_names(library(file))[:1])
    assert not failed, _report(failed)


@pytest.mark.slow
@pytest.mark.parametrize("file", kernel_files())
def test_every_kernel_compiles(file: str) -> None:
    failed = compile_all(file, host_names(library(file)))
    assert not failed, _report(failed)


def test_metal4_tensor_build_stops_with_a_named_error() -> None:
    """llama.cpp's build for GPUs with Metal 4 tensors (GGML_METAL_HAS_TENSOR, set by
    ggml-metal-device.m where the device has them) is refused with one CompileError that
    names the feature, recorded as unsupported."""
    root = src()
    lib = mtwork.load_metal(root / "ggml-metal" / "kernels" / "mul_mm.metal",
                            include_dirs=[root / "ggml-metal", root],
                            defines={**DEFINES, "GGML_METAL_HAS_TENSOR": 1})
    with pytest.raises(CompileError) as caught:
        lib.kernel("kernel_mul_mm_f16_f32", constants=constants_of(lib)).compile()
    error = first_error(caught.value)
    assert "Metal 4 tensor APIs" in error, error
    assert str(caught.value).count("error:") == 1, "one error, not a cascade"
    record_unsupported(suite=SUITE, kernel="mul_mm.metal with GGML_METAL_HAS_TENSOR",
                       source=source_label(), error=error)
