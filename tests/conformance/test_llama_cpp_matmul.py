"""llama.cpp's matrix products: mul_mv.metal (mat-vec, its short and "ext" small-batch
variants) and mul_mm.metal (simdgroup_matrix mat-mat), for f32, f16, bf16, q4_0, q8_0,
q4_K and q6_K weights, chosen and dispatched as ggml_metal_op_mul_mat does, against
numpy in float64 on gguf's dequantisation of the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from .llama_cpp import built, check, fc, new, run
from .llama_cpp_structs import impl_define, pack
from .llama_cpp_tensors import Tensor, decode, encoded, random_blocks

SLOW = pytest.mark.slow
FLOATS = ("f32", "f16", "bf16")
# Weights whose small-batch kernels ("ext") take 2 to 8 rows of src1; the K-quants 4 to 8.
EXT_FROM_2 = (*FLOATS, "q4_0", "q8_0")
EXT_FROM_4 = ("q4_K", "q6_K")


@dataclass(frozen=True)
class Plan:
    """One dispatch of ggml_metal_op_mul_mat: kernel, function constants, argument struct
    and its fields, geometry and threadgroup memory."""

    kernel: str
    path: str
    constants: dict[int, object]
    struct: str
    fields: dict[str, int]
    groups: tuple[int, int, int]
    threads: tuple[int, int, int]
    smem: int


def _ext(w: Tensor, x: Tensor) -> Plan:
    """The small-batch kernel (ggml_metal_op_mul_mat's first branch): 2 SIMD-groups, nxpsg
    threads along a row, r1ptg src1 rows per threadgroup."""
    ne00, ne01, ne11 = w.ne[0], w.ne[1], x.ne[1]
    nsg = 2
    nxpsg = 16 if ne00 % 256 == 0 and ne11 < 3 else 8
    r0ptg = 32 // nxpsg * nsg
    r1ptg = {2: 2, 3: 3, 6: 3, 4: 4, 7: 4, 8: 4, 5: 5}[ne11]
    r2, r3 = x.ne[2] // w.ne[2], x.ne[3] // w.ne[3]
    return Plan(f"kernel_mul_mv_ext_{w.gtype}_f32_r1_{r1ptg}", "mul_mv_ext",
                {fc("FC_MUL_MV", 0): nsg, fc("FC_MUL_MV", 1): nxpsg,
                 fc("FC_MUL_MV", 2): x.ne[2], fc("FC_MUL_MV", 3): r2, fc("FC_MUL_MV", 4): r3},
                "ggml_metal_kargs_mul_mv_ext", {"r2": r2, "r3": r3},
                (-(-ne01 // r0ptg), -(-ne11 // r1ptg), x.ne[2] * x.ne[3]), (32, nsg, 1), 0)


def _mm(w: Tensor, x: Tensor) -> Plan:
    """simdgroup_matrix mat-mat without Metal 4 tensors: 64 x 32 tiles of dst, 4
    SIMD-groups, bounds checks as function constants (ggml_metal_library_get_pipeline_
    mul_mm)."""
    ne00, ne01, ne11 = w.ne[0], w.ne[1], x.ne[1]
    bc_inp, bc_out = ne00 % 32 != 0, ne01 % 64 != 0 or ne11 % 32 != 0
    r2, r3 = x.ne[2] // w.ne[2], x.ne[3] // w.ne[3]
    nsg = impl_define("N_MM_SIMD_GROUP_X") * impl_define("N_MM_SIMD_GROUP_Y")
    return Plan(f"kernel_mul_mm_{w.gtype}_f32", "mul_mm",
                {fc("FC_MUL_MM", 0): bc_inp, fc("FC_MUL_MM", 1): bc_out,
                 fc("FC_MUL_MM", 2): x.ne[2], fc("FC_MUL_MM", 3): x.ne[3],
                 fc("FC_MUL_MM", 4): r2, fc("FC_MUL_MM", 5): r3},
                "ggml_metal_kargs_mul_mm", {"r2": r2, "r3": r3},
                (-(-ne11 // 32), -(-ne01 // 64), x.ne[2] * x.ne[3]), (32, nsg, 1),
                8192 if bc_out else 4096 + 2048)


def _mv(w: Tensor, x: Tensor) -> Plan:
    """The mat-vec kernel (ggml_metal_library_get_pipeline_mul_mv): rows per SIMD-group
    nr0 and SIMD-groups nsg by weight type (N_R0_* / N_SG_* of ggml-metal-impl.h)."""
    ne00, ne01, ne11 = w.ne[0], w.ne[1], x.ne[1]
    suffix, smem = "", 0
    if w.gtype in FLOATS:
        if ne00 < 32:
            nsg, nr0, suffix = 1, 32, "_short"
        else:
            nsg, nr0 = min(4, (ne00 + 127) // 128), 2
            smem, suffix = 32 * 4 * nr0, "_4" if ne00 % 4 == 0 else ""
    else:
        name = w.gtype.upper()
        nsg, nr0 = impl_define(f"N_SG_{name}"), impl_define(f"N_R0_{name}")
        smem = 32 * 4 * nr0 if w.gtype == "q8_0" else 0
    r2, r3 = x.ne[2] // w.ne[2], x.ne[3] // w.ne[3]
    per_group = nr0 if w.gtype in (*FLOATS, "q8_0") else nr0 * nsg
    return Plan(f"kernel_mul_mv_{w.gtype}_f32{suffix}", "mul_mv",
                {fc("FC_MUL_MV", 0): nsg, fc("FC_MUL_MV", 2): x.ne[2],
                 fc("FC_MUL_MV", 3): r2, fc("FC_MUL_MV", 4): r3, fc("FC_MUL_MV", 5): False},
                "ggml_metal_kargs_mul_mv", {"nr0": nr0, "r2": r2, "r3": r3},
                (-(-ne01 // per_group), ne11, x.ne[2] * x.ne[3]), (32, nsg, 1), smem)


def plan(w: Tensor, x: Tensor) -> Plan:
    """The kernel ggml_metal_op_mul_mat picks for weights `w` and f32 activations `x` on
    a GPU with simdgroup_matrix (ggml_metal_op_mul_mat_use_mm: ne00 >= 64, ne11 > 8)."""
    ne00, ne11 = w.ne[0], x.ne[1]
    small = (w.gtype in EXT_FROM_2 and 2 <= ne11 <= 8) or (w.gtype in EXT_FROM_4
                                                            and 4 <= ne11 <= 8)
    if ne00 % 128 == 0 and small:
        return _ext(w, x)
    if ne00 >= 64 and ne11 > 8:
        return _mm(w, x)
    return _mv(w, x)


def mul_mat(w: Tensor, x: Tensor) -> tuple[np.ndarray, Plan, list]:
    """dst [.., N, M] = x [.., N, K] times w [.., M, K] transposed, on llama.cpp's kernel."""
    p = plan(w, x)
    b = built("mul_mm.metal" if p.path == "mul_mm" else "mul_mv.metal", p.kernel, p.constants)
    dst = encoded(np.zeros((*x.values.shape[:-1], w.ne[1])), "f32")
    args = pack(p.struct, w.locals("0"), x.locals("1"), dst.locals(""), **p.fields)
    out = run(b, {0: args, 1: w, 2: x, 3: new(dst.nbytes)}, p.groups, p.threads, p.smem)
    return decode(out[3], "f32", dst.values.shape), p, [b]


def _weights(gtype: str, shape: tuple[int, ...], g: np.random.Generator) -> Tensor:
    if gtype in ("q4_K", "q6_K"):
        return random_blocks(shape, gtype, g)
    return encoded(g.standard_normal(shape) * 0.5, gtype)


def _tile_rounded(values: np.ndarray, gtype: str) -> np.ndarray:
    """mul_mm stages both operands in threadgroup memory as half (bfloat for bf16
    weights) before its simdgroup_matrix products (the S0 / S1 template arguments)."""
    if gtype == "bf16":
        return encoded(values, "bf16").values
    return values.astype(np.float16).astype(np.float64)


CASES = [
    ("q4_0", 64, 256, 1, 1),
    ("f16", 64, 128, 32, 1),
    pytest.param("f32", 48, 256, 1, 1, marks=SLOW),
    pytest.param("f32", 33, 24, 1, 1, marks=SLOW),          # ne00 < 32: the short kernel
    pytest.param("f32", 40, 256, 4, 1, marks=SLOW),         # ext, r1ptg 4
    pytest.param("f32", 70, 96, 33, 1, marks=SLOW),         # mm with bounds checks
    pytest.param("f16", 24, 130, 1, 2, marks=SLOW),         # mv, no _4, broadcast r2 = 2
    pytest.param("f16", 32, 256, 2, 1, marks=SLOW),         # ext, nxpsg 16
    pytest.param("bf16", 40, 128, 1, 1, marks=SLOW),
    pytest.param("bf16", 64, 128, 32, 1, marks=SLOW),
    pytest.param("q4_0", 64, 256, 3, 1, marks=SLOW),        # ext, r1ptg 3
    pytest.param("q4_0", 128, 128, 40, 2, marks=SLOW),      # mm, bounds on N
    pytest.param("q8_0", 30, 128, 1, 1, marks=SLOW),
    pytest.param("q8_0", 64, 256, 32, 1, marks=SLOW),
    pytest.param("q8_0", 32, 128, 5, 1, marks=SLOW),        # ext, r1ptg 5
    pytest.param("q4_K", 20, 512, 1, 1, marks=SLOW),
    pytest.param("q4_K", 64, 256, 4, 1, marks=SLOW),        # ext of K-quants
    pytest.param("q4_K", 64, 256, 32, 1, marks=SLOW),
    pytest.param("q6_K", 12, 256, 1, 1, marks=SLOW),
    pytest.param("q6_K", 64, 512, 40, 1, marks=SLOW),
]


@pytest.mark.parametrize(("gtype", "m", "k", "n", "batch"), CASES)
def test_mul_mat(agreement, gtype, m, k, n, batch) -> None:
    g = np.random.default_rng(m * 1000 + k + n)
    w = _weights(gtype, (1, m, k), g)
    x = encoded(g.standard_normal((batch, n, k)), "f32")
    actual, p, parts = mul_mat(w, x)
    wv, xv = w.values, x.values
    if p.path == "mul_mm":
        wv, xv = _tile_rounded(wv, gtype), _tile_rounded(xv, gtype)
    expected = xv @ np.swapaxes(wv, -1, -2)  # [batch, n, k] x [1, k, m], broadcast
    # float32 sums of k products: errors measured relative to the sum of |products|.
    scale = np.maximum(np.abs(xv) @ np.abs(np.swapaxes(wv, -1, -2)), 1e-30)
    reference = "numpy float64 on gguf's dequantisation" + (
        ", operands rounded as the kernel stages them (half / bfloat tiles)"
        if p.path == "mul_mm" else "") + "; error / sum|products|"
    check(agreement, parts, f"{p.kernel} M={m} K={k} N={n} batch={batch}", actual / scale,
          expected / scale, reference, dtype="float64", atol=2e-6, rtol=0.0)
