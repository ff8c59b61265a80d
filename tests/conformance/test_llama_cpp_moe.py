"""llama.cpp's mixture-of-experts products (ggml_mul_mat_id): each token's activations
times the weights of the experts its router picked. Few tokens run kernel_mul_mv_id (a
mat-vec per (token, expert slot)); a batch of 32 tokens or more runs kernel_mul_mm_id_map0
(which tokens each expert serves) and then kernel_mul_mm_id (simdgroup_matrix tiles per
expert), as ggml_metal_op_mul_mat_id dispatches them. References: numpy float64 on gguf's
dequantisation of the weights, expert by expert from the router's choices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from .llama_cpp import Built, built, check, fc, new, run
from .llama_cpp_structs import impl_define, pack
from .llama_cpp_tensors import Tensor, decode, encoded, integers, random_blocks

SLOW = pytest.mark.slow
FLOATS = ("f32", "f16", "bf16")
K_QUANTS = ("q4_K", "q6_K")  # gguf cannot quantise to them: random blocks
# float32 sums of K products: errors measured relative to the sum of |products|.
SUMS = {"dtype": "float64", "atol": 2e-6, "rtol": 0.0}


@dataclass(frozen=True)
class Moe:
    """ggml_mul_mat_id's operands: weights [experts, M, K], activations [tokens, ne11, K]
    (ne11 is 1 when every slot of a token reads the same row, else the slots used), and
    the router's choice [tokens, used] of distinct experts per token."""

    w: Tensor
    x: Tensor
    ids: Tensor

    @property
    def dst_shape(self) -> tuple[int, int, int]:
        tokens, used = self.ids.values.shape
        return tokens, used, self.w.ne[1]


def operands(gtype: str, experts: int, used: int, m: int, k: int, tokens: int,
             shared_row: bool) -> Moe:
    g = np.random.default_rng(experts * 1000 + m + k + tokens)
    shape = (experts, m, k)
    w = random_blocks(shape, gtype, g) if gtype in K_QUANTS else \
        encoded(g.standard_normal(shape) * 0.5, gtype)
    x = encoded(g.standard_normal((tokens, 1 if shared_row else used, k)), "f32")
    choice = np.argsort(g.random((tokens, experts)), axis=1)[:, :used]
    return Moe(w, x, integers(choice.astype(np.int32)))


def _as_half(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).astype(np.float64)


def _as_tile(values: np.ndarray, gtype: str) -> np.ndarray:
    """kernel_mul_mm_id stages both operands as half, or bfloat for bf16 weights (its S0
    and S1 template arguments)."""
    return encoded(values, "bf16").values if gtype == "bf16" else _as_half(values)


def reference(op: Moe, tiles: bool) -> tuple[np.ndarray, np.ndarray]:
    """dst[t, s] = W[ids[t, s]] x[t, s mod ne11], and the sum of |products| of each; with
    `tiles`, both operands rounded as kernel_mul_mm_id stages them."""
    w, x = op.w.values, op.x.values
    if tiles:
        w, x = _as_tile(w, op.w.gtype), _as_tile(x, op.w.gtype)
    ids = op.ids.values.astype(int)
    tokens, used = ids.shape
    out, scale = np.zeros(op.dst_shape), np.zeros(op.dst_shape)
    for t in range(tokens):
        for s in range(used):
            row, weights = x[t, s % x.shape[1]], w[ids[t, s]]
            out[t, s], scale[t, s] = weights @ row, np.abs(weights) @ np.abs(row)
    return out, np.maximum(scale, 1e-30)


def _mv_params(w: Tensor) -> tuple[str, int, int, int]:
    """(kernel suffix, SIMD-groups, rows per SIMD-group, threadgroup memory) of
    ggml_metal_library_get_pipeline_mul_mv_id for the weight type."""
    if w.gtype in FLOATS:
        return ("_4" if w.ne[0] % 4 == 0 else ""), min(4, (w.ne[0] + 127) // 128), 2, 32 * 4 * 2
    name = w.gtype.upper()
    nr0 = impl_define(f"N_R0_{name}")
    return "", impl_define(f"N_SG_{name}"), nr0, 32 * 4 * nr0 if w.gtype == "q8_0" else 0


def mul_mv_id(op: Moe) -> tuple[np.ndarray, list[Built]]:
    """kernel_mul_mv_id_<type>_f32: one threadgroup z per (token, slot), its expert's
    mat-vec with the geometry of the plain mat-vec kernel."""
    w, x, ids = op.w, op.x, op.ids
    suffix, nsg, nr0, smem = _mv_params(w)
    b = built("mul_mv.metal", f"kernel_mul_mv_id_{w.gtype}_f32{suffix}",
              {fc("FC_MUL_MV", 0): nsg, fc("FC_MUL_MV", 2): 1, fc("FC_MUL_MV", 3): 1,
               fc("FC_MUL_MV", 4): 1, fc("FC_MUL_MV", 5): False})
    dst = encoded(np.zeros(op.dst_shape), "f32")
    args = pack("ggml_metal_kargs_mul_mv_id", w.locals("0"), x.locals("1"), dst.locals(""),
                nei0=ids.ne[0], nei1=ids.ne[1], nbi1=ids.nb[1], nr0=nr0)
    per_group = nr0 if w.gtype in (*FLOATS, "q8_0") else nr0 * nsg
    groups = (-(-w.ne[1] // per_group), 1, ids.ne[0] * ids.ne[1])
    out = run(b, {0: args, 1: w, 2: x, 3: new(dst.nbytes), 4: ids}, groups, (32, nsg, 1), smem)
    return decode(out[3], "f32", op.dst_shape), [b]


def map0(op: Moe) -> tuple[np.ndarray, np.ndarray, Built]:
    """kernel_mul_mm_id_map0_ne20_<used>: a thread per expert counts the tokens that chose
    it (tpe) and lists them as token * used + slot (ids, ne21 entries per expert, the
    first tpe[e] of them written)."""
    w, x, ids = op.w, op.x, op.ids
    experts, (tokens, used) = w.ne[2], op.ids.values.shape
    b = built("mul_mm.metal", f"kernel_mul_mm_id_map0_ne20_{used}")
    args = pack("ggml_metal_kargs_mul_mm_id_map0", ne02=experts, ne10=x.ne[0], ne11=x.ne[1],
                nb11=x.nb[1], nb12=x.nb[2], ne21=tokens, ne20=used, nb21=ids.nb[1])
    smem = -(-experts * used * 2 // 16) * 16
    # The host reserves ne21 entries per expert; an expert lists only its own tokens.
    hids = new(4 * experts * tokens, scratch=True)
    out = run(b, {0: args, 1: ids, 2: new(4 * experts), 3: hids},
              (1, 1, 1), (experts, 1, 1), smem)
    return out[2].view(np.uint32), out[3].view(np.int32).reshape(experts, tokens), b


def amax(x: Tensor) -> tuple[np.ndarray, list[Built]]:
    """GGML_PREC_F32's rescaling of the activations (kernel_mul_mm_id_amax_part_f32: the
    largest |x| of every N_MM_NPART_AMAX-th row, a threadgroup of 256 each; then
    kernel_mul_mm_id_amax_f32: 1 / scale and scale, a power of two that keeps |x| / scale
    within half's range). Returns the buffer: the two factors, then the partial maxima."""
    parts = impl_define("N_MM_NPART_AMAX")
    first = built("mul_mm.metal", "kernel_mul_mm_id_amax_part_f32")
    args = pack("ggml_metal_kargs_mul_mm_id_amax", ne00=x.ne[0], ne01=x.ne[1], ne02=x.ne[2],
                nb01=x.nb[1], nb02=x.nb[2])
    out = run(first, {0: args, 1: x, 2: new(8 + 4 * parts, scratch=True)}, (parts, 1, 1),
              (256, 1, 1), 32 * 4)
    second = built("mul_mm.metal", "kernel_mul_mm_id_amax_f32")
    out = run(second, {0: out[2]}, (1, 1, 1), (32, 1, 1))
    return out[0].view(np.float32), [first, second]


def amax_reference(x: np.ndarray) -> np.ndarray:
    """The factors (1 / s, s), s = 2^(ceil(log2 max|x|) - 15) above 32768 and 1 below, and
    the largest |x| of the rows r with r mod N_MM_NPART_AMAX = p, for each p."""
    rows = np.abs(x).reshape(-1, x.shape[-1]).max(axis=1)
    parts = np.zeros(impl_define("N_MM_NPART_AMAX"))
    np.maximum.at(parts, np.arange(rows.size) % parts.size, rows)
    top = parts.max()
    scale = 2.0 ** (np.ceil(np.log2(top)) - 15) if top > 32768 else 1.0
    return np.concatenate([[1 / scale, scale], parts])


def mul_mm_id(op: Moe, tpe: np.ndarray, hids: np.ndarray, factors: np.ndarray | None = None
              ) -> tuple[np.ndarray, list[Built]]:
    """kernel_mul_mm_id_<type>_f32 on map0's lists: 64 x 32 tiles of (rows, the expert's
    tokens), 128 threads, threadgroup z the expert. Activations are rescaled by amax's
    `factors` (GGML_PREC_F32); without them (GGML_PREC_DEFAULT) the host still binds the
    buffer."""
    w, x = op.w, op.x
    tokens = op.ids.ne[1]
    b = built("mul_mm.metal", f"kernel_mul_mm_id_{w.gtype}_f32",
              {fc("FC_MUL_MM", 0): w.ne[0] % 32 != 0, fc("FC_MUL_MM", 6): factors is not None})
    dst = encoded(np.zeros(op.dst_shape), "f32")
    args = pack("ggml_metal_kargs_mul_mm_id", w.locals("0"), x.locals("1"), dst.locals(""),
                ne20=op.ids.ne[0], ne21=tokens, r2=1, r3=1)
    scales = new(8 + 4 * impl_define("N_MM_NPART_AMAX"), scratch=True) if factors is None \
        else factors.view(np.uint8)
    groups = (-(-tokens // 32), -(-w.ne[1] // 64), w.ne[2])
    out = run(b, {0: args, 1: w, 2: x, 3: tpe.view(np.uint8), 4: hids.view(np.uint8).ravel(),
                  5: new(dst.nbytes), 6: scales}, groups, (128, 1, 1), 8192)
    return decode(out[5], "f32", op.dst_shape), [b]


def _name(kernel: str, op: Moe) -> str:
    tokens, used, m = op.dst_shape
    shared = " shared row" if op.x.ne[1] == 1 < used else ""
    return f"{kernel} experts={op.w.ne[2]}/{used} M={m} K={op.w.ne[0]} tokens={tokens}{shared}"


@pytest.mark.parametrize(("gtype", "experts", "used", "m", "k", "tokens", "shared"), [
    ("q4_0", 4, 2, 16, 64, 3, False),
    pytest.param("q4_0", 8, 4, 32, 256, 2, True, marks=SLOW),  # gate/up: one row per token
    pytest.param("f16", 4, 2, 24, 128, 3, False, marks=SLOW),   # float4 rows (_4)
    pytest.param("f16", 3, 2, 10, 70, 2, False, marks=SLOW),    # ne00 % 4 != 0: scalar rows
    pytest.param("q8_0", 4, 2, 16, 96, 3, False, marks=SLOW),
    pytest.param("f32", 5, 3, 8, 200, 2, False, marks=SLOW),    # 2 SIMD-groups
    pytest.param("bf16", 4, 2, 8, 64, 2, False, marks=SLOW),
    pytest.param("q4_K", 4, 2, 8, 256, 2, False, marks=SLOW),
    pytest.param("q6_K", 4, 2, 8, 512, 2, True, marks=SLOW),
])
def test_mul_mv_id(agreement, gtype, experts, used, m, k, tokens, shared) -> None:
    op = operands(gtype, experts, used, m, k, tokens, shared)
    actual, parts = mul_mv_id(op)
    expected, scale = reference(op, tiles=False)
    check(agreement, parts, _name(parts[0].kernel.name, op), actual / scale, expected / scale,
          "numpy float64 on gguf's dequantisation, per (token, expert); error / sum|products|",
          **SUMS)


def map0_reference(ids: np.ndarray, experts: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per expert: how many (token, slot) pairs chose it, and those pairs as token * used
    + slot, in token order."""
    used = ids.shape[1]
    lists = [np.array([t * used + s for t, s in zip(*np.nonzero(ids == e))], np.int32)
             for e in range(experts)]
    return np.array([len(p) for p in lists], np.uint32), lists


@pytest.mark.parametrize(("gtype", "experts", "used", "m", "k", "tokens", "shared"), [
    ("q4_0", 4, 2, 64, 64, 32, False),
    pytest.param("f16", 4, 2, 64, 128, 48, False, marks=SLOW),
    pytest.param("f16", 6, 2, 70, 80, 40, False, marks=SLOW),  # ne00 % 32: bounds on K, M
    pytest.param("q4_0", 8, 4, 64, 128, 64, True, marks=SLOW),  # one row per token
    pytest.param("q8_0", 4, 1, 128, 64, 36, False, marks=SLOW),
    pytest.param("f32", 4, 2, 32, 96, 33, False, marks=SLOW),
    pytest.param("bf16", 4, 2, 64, 64, 32, False, marks=SLOW),
    pytest.param("q4_K", 4, 2, 64, 256, 32, False, marks=SLOW),
    pytest.param("q6_K", 4, 2, 64, 256, 40, True, marks=SLOW),
])
def test_mul_mm_id(agreement, gtype, experts, used, m, k, tokens, shared) -> None:
    op = operands(gtype, experts, used, m, k, tokens, shared)
    tpe, hids, mapper = map0(op)
    want_tpe, want_lists = map0_reference(op.ids.values.astype(int), experts)
    listed = np.concatenate([tpe.astype(np.int64)] + [hids[e, :n] for e, n in
                                                      enumerate(want_tpe)])
    check(agreement, mapper, f"{mapper.kernel.name} experts={experts}/{used} tokens={tokens}",
          listed,
          np.concatenate([want_tpe.astype(np.int64), *want_lists]),
          "numpy: the router's choices listed per expert", bitwise=True)
    actual, parts = mul_mm_id(op, tpe, hids)
    expected, scale = reference(op, tiles=True)
    check(agreement, parts, _name(parts[0].kernel.name, op), actual / scale, expected / scale,
          "numpy float64 on gguf's dequantisation, per (token, expert), operands rounded as "
          "the kernel stages them (half or bfloat tiles); error / sum|products|", **SUMS)


@pytest.mark.slow
def test_mul_mm_id_rescaled_activations(agreement) -> None:
    # Activations past half's range (|x| up to ~1e6): GGML_PREC_F32 divides them by a power
    # of two before the half tiles and multiplies the products back.
    op = operands("f16", 4, 2, 64, 64, 32, False)
    op = Moe(op.w, encoded(op.x.values * 2.5e5, "f32"), op.ids)
    factors, scaling = amax(op.x)
    want = amax_reference(op.x.values)
    assert want[1] > 1  # the case rescales
    check(agreement, scaling, "kernel_mul_mm_id_amax_part_f32 + kernel_mul_mm_id_amax_f32 "
          f"rows={op.x.ne[1] * op.x.ne[2]} K={op.x.ne[0]}", factors.astype(np.float64), want,
          "numpy: max |x| per part, 2^(ceil(log2 max) - 15)", bitwise=True)
    tpe, hids, _ = map0(op)
    actual, parts = mul_mm_id(op, tpe, hids, factors)
    inv = float(want[0])
    x_half = _as_half(op.x.values * inv) / inv
    w_half = _as_half(op.w.values)
    expected, scale = reference(Moe(encoded(w_half, "f32"), encoded(x_half, "f32"), op.ids),
                                tiles=False)
    check(agreement, parts, _name(parts[0].kernel.name, op) + " amax", actual / scale,
          expected / scale, "numpy float64, activations scaled by 1 / s and rounded to half, "
          "weights to half, the products times s; error / sum|products|", **SUMS)
